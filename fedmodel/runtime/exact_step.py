"""Quadratic local problems in one step: the "exact" local solve of a group's clients as one
linear solve (ProxAL's (19) on a least-squares client; paper 1, He, Peng, Sun).

A merit P_i of polynomial degree ≤ 2 with no prox term and no held constraint (what
`local_solvers.choose` solves by "exact") has an affine gradient, so the minimizer of
P_i(z) + linearᵀx + ½ Σ_j w_j (x_j − a_j)² from any z0 is z0 − A⁻¹ g(z0), g the gradient of
that sum at z0 and A = ∇²P_i + diag(w): one gradient and one product with the kept inverse of A,
which changes only with β, ω (the program's Hessian key, `NodeProgram._forget_hessian`) and w
(an ADMM's ρ_i): `local_solvers.newton_matrix` per client on one node, the group's stacked
`batched_newton.FactorStack` on the batched and JAX executors. This is the first step of the
"exact" Newton solve, bit for bit; that solve then takes a second step at round-off level
(|Δz| ~ 1e-16·cond(A)) with a line search each: 3 evaluations where this takes 1 (the 500
least-squares clients of docs/BENCHMARKS.md, section stepcost). The step is written once,
over rows of clients (`solve`); the group supplies A⁻¹ (`exact_directions`).

It is taken only where the caller reads no final residual (`solve_local(residual=False)`):
the residual at the new point would cost the evaluation this saves. A row whose A is singular
or whose step is no descent direction (a merit that is not convex) sends the call back to the
Newton solve (its rules: −g, backtracking).
"""
from __future__ import annotations

from typing import Any

import numpy as np


def applies(group: Any, rows: np.ndarray, chosen: str) -> bool:
    """The members `rows` of `group` (a `batched_group.Group`: same structure) are solved by
    "exact" on a quadratic merit without held constraints."""
    program = group.programs[rows[0]]
    return chosen == "exact" and program.quadratic and not program.local_names and \
        not program.merit_ir.prox_terms     # (a caller's explicit "exact" beside a prox term)


def solve(group: Any, Z0: np.ndarray, rows: np.ndarray, linear, weight, anchor
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """argmin over z of P_i(z) + linear_iᵀx + ½ Σ_j W_ij (x_j − anchor_ij)² for the clients
    `rows` from Z0 (k, N) = (x, y) rows: (Z, steps = 1, residual NaN: not evaluated), or None
    when some row's A is singular or its step no descent (then the caller's Newton path)."""
    k, n_x = len(rows), group.n_x
    X0 = Z0[:, :n_x]
    W = np.asarray(weight, float)
    if W.ndim < 2:                                   # a number, or (k,): one ρ_i a client
        W = np.broadcast_to(W.reshape(-1, 1), (k, 1))
    if k == group.n and (k == 1 or bool(np.all(rows[1:] > rows[:-1]))):
        full = Z0                                    # the whole group in its order (one node)
    else:
        full = np.empty((group.n, Z0.shape[1]))
        full[:] = Z0[0]                              # non-members: any valid point (values unused)
        full[rows] = Z0
    G = group.grad(full[:, :n_x], full[:, n_x:])
    G = np.array(G if full is Z0 else G[rows], dtype=float)
    G[:, :n_x] += linear + W * (X0 - anchor)        # (as the Newton path's objective adds them)
    D, regular = group.exact_directions(Z0, G, rows, W)
    # a singular A, an ascent direction (a merit that is not convex) or a non-finite step:
    # Newton's rules (a row already at its minimizer, G = 0, has D = 0 and slope 0)
    slope = np.einsum("ij,ij->i", G, D)
    if not (regular.all() and np.isfinite(slope).all() and
            bool(np.all((slope < 0) | ~G.any(axis=1)))):
        return None
    return Z0 + D, np.ones(k, dtype=int), np.full(k, np.nan)
