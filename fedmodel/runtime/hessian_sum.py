"""Σ_i ∇²P_i over members of a group (`batched_group.Group`) in the memory of a few N × N
matrices, whatever their number: what a server that needs only the clients' summed Hessian
asks of a group (`Executor.map_sum` on the batched executor, whose forms may sum their
members' replies instead of returning n of them).

A member whose Hessian is diagonal plus a product through few data rows (`low_rank`:
diag(λ_i) + Q_i C_i Q_iᵀ, checked on a random direction) adds λ_i to one diagonal and its
Q_i C_i Q_iᵀ = M₊M₊ᵀ − M₋M₋ᵀ (C_i's eigenpairs) to blocks of about N/2 columns, each block one
symmetric rank-k update (BLAS syrk, half the flops of a product): in one BLAS call instead of n
(each of which also writes N × N: mnist-ball n = 200, 10 rows a client, spent 70 % of its run
there). Any other member adds its own dense Hessian (`Group.hessian` of one row: the serial
numbers, also on the JAX engine, whose vmapped Hessians of every member at once would hold n
of them). N × N is 4.9 MB at MNIST's d = 784: n of them were 0.98 GB at n = 200.
"""
from __future__ import annotations

import numpy as np

from . import low_rank


def hessian_sum(group, X: np.ndarray, Y: np.ndarray, rows) -> np.ndarray:
    """Σ over the members `rows` of ∇²P_i at (X[i], Y[i]): (N, N), N = n_x + n_y."""
    N = group.n_x + group.n_y
    total, diagonal = np.zeros((N, N)), np.zeros(N)
    upper = np.zeros((N, N), order="F")         # Σ of the low-rank parts (upper triangle, `_rank_k`)
    pending: list[tuple[np.ndarray, np.ndarray]] = []       # (Q_i, C_i) of a block
    width = 0
    for row in np.asarray(rows, dtype=np.intp):
        program = group.programs[row]
        packed = low_rank.hessian(program, np.concatenate([X[row], Y[row]])) \
            if low_rank.applies(program) else None
        if packed is None:
            total += group.hessian(X, Y, np.array([row]))[0]
            continue
        lam, C = low_rank.unpack(packed)
        diagonal += lam
        pending.append((low_rank.basis_of(program).dense(), C))
        width += C.shape[0]
        if width >= N // 2:                     # a block: N × N/2 and its copy
            _rank_k(upper, pending)
            pending, width = [], 0
    _rank_k(upper, pending)
    total += upper                              # (its lower triangle is 0: no N × N copy)
    total += upper.T
    total[np.diag_indices(N)] -= np.diagonal(upper)
    total[np.diag_indices(N)] += diagonal
    return 0.5 * (total + total.T)


def _rank_k(upper: np.ndarray, pending: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """upper += Σ_i Q_i C_i Q_iᵀ (upper triangle, in place, Fortran order) as M₊M₊ᵀ − M₋M₋ᵀ,
    M± = Q V± |e±|^½ from each C_i's eigenpairs: a symmetric rank-k update (BLAS syrk) is half
    the flops of the product [Q C][Q]ᵀ (mnist-ball n = 40: 44 % of the run). The eigenpairs of
    equal-sized C_i in one stacked call (1,000 clients of 3 rows: one call, not 1,000)."""
    from scipy.linalg.blas import dsyrk     # (scipy: not at import time)
    signed: list[tuple[np.ndarray, bool]] = []
    for r in sorted({C.shape[0] for _, C in pending}):
        members = [(Q, C) for Q, C in pending if C.shape[0] == r]
        values, vectors = np.linalg.eigh(np.stack([C for _, C in members]))
        for (Q, _), e, V in zip(members, values, vectors):
            M = Q @ (V * np.sqrt(np.abs(e)))
            signed += [(M[:, e > 0], True), (M[:, e < 0], False)]
    for sign in (True, False):
        parts = [M for M, s in signed if s is sign and M.shape[1]]
        if parts:
            found = dsyrk(1.0 if sign else -1.0, np.asfortranarray(np.hstack(parts)), beta=1.0, c=upper,
                          overwrite_c=True)
            if found is not upper:          # (in place for a Fortran float64 `upper`; else a copy)
                upper[...] = found
