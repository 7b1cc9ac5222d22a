"""Σ_i ∇²P_i over members of a group (`batched_group.Group`) in the memory of a few N × N
matrices, whatever their number: what a server that needs only the clients' summed Hessian
asks of a group (`Executor.map_sum` on the batched executor, whose forms may sum their
members' replies instead of returning n of them).

A member whose Hessian is diagonal plus a product through few data rows (`low_rank`:
diag(λ_i) + Q_i C_i Q_iᵀ, checked on a random direction) adds λ_i to one diagonal and its
Q_i C_i, Q_i to blocks of about N/2 columns, each block one matrix product [Q_i C_i]·[Q_i]ᵀ: the
same flops as n dense Hessians' products through the data, in one BLAS call instead of n
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
    left: list[np.ndarray] = []
    right: list[np.ndarray] = []
    for row in np.asarray(rows, dtype=np.intp):
        program = group.programs[row]
        packed = low_rank.hessian(program, np.concatenate([X[row], Y[row]])) \
            if low_rank.applies(program) else None
        if packed is None:
            total += group.hessian(X, Y, np.array([row]))[0]
            continue
        lam, C = low_rank.unpack(packed)
        Q = low_rank.basis_of(program).dense()
        diagonal += lam
        left.append(Q @ C)
        right.append(Q)
        if sum(q.shape[1] for q in right) >= N // 2:    # a block: its 4 copies 2 N × N
            total += np.hstack(left) @ np.hstack(right).T
            left, right = [], []
    if right:
        total += np.hstack(left) @ np.hstack(right).T
    total[np.diag_indices(N)] += diagonal
    return 0.5 * (total + total.T)
