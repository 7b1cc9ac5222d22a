"""Newton's method for the local problems of many clients at once (`Group.solve_newton`, the
batched and JAX executors' form of `NodeProgram.solve_local`'s "newton" and "exact").

`newton_batched` is `solvers.newton` with its rules (`solvers.descent`, `accepted`, `MIN_STEP`,
`stale`, `progress`) taken per client with masks. `NewtonMatrices` serves its directions as
`local_solvers.newton_matrix` serves the serial solve's: ∇²P_i is the chord Hessian the client's
program keeps, and the matrix ∇²P_i + diag(weight_i) is factored — here inverted, stacked, in a
`FactorStack` kept with the group across steps and solves — only for the clients whose Hessian
or weight changed; every step then costs one stacked matrix-vector product.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import solvers
from .solvers import MIN_STEP, accepted, descent, progress, stale

# a group's stacked Newton matrices (k × N² floats, N = n_x + n_y) are held twice over (the
# clients' Hessians and their inverses), up to four times while inverted: above this many floats
# per stack (200 MB) a caller serves the clients one by one
MAX_HESSIAN_FLOATS = 25_000_000


def stack_fits(k: int, N: int) -> bool:
    """k clients' Newton matrices of N unknowns can be solved as one stack (`MAX_HESSIAN_FLOATS`),
    and each one may be formed at all (`solvers.dense_fits`: else the clients' solves are
    Hessian-free, one by one)."""
    return k * N * N <= MAX_HESSIAN_FLOATS and solvers.dense_fits(N)


# fun_grad(Z, which): values (k,) and gradients (k, N) at Z of the rows `which` (None: all)
StackFunGrad = Callable[[np.ndarray, "np.ndarray | None"], tuple[np.ndarray, np.ndarray]]
# direction(Z, G, active, fresh): the Newton directions (k, N) of the `active` rows
Directions = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def newton_batched(fun_grad: StackFunGrad, direction: Directions, Z0: np.ndarray, tol,
                   max_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`solvers.newton` for k problems from Z0 (k, N): (Z, steps, ‖∇‖∞) per problem, each the
    serial solve's decisions (direction or −∇, backtracking, chord refresh, stop); `tol`: a
    number or (k,), one per problem."""
    Z = np.array(Z0, dtype=float)
    k = len(Z)
    value, G = fun_grad(Z, None)
    residual = norm_rows(G)
    steps = np.zeros(k, dtype=int)
    fresh = np.zeros(k, dtype=bool)
    running = np.ones(k, dtype=bool)
    with np.errstate(invalid="ignore", over="ignore"):
        while True:
            active = running & (residual > tol) & (steps < max_steps)
            if not active.any():
                break
            D, slope = direction(Z, G, active, fresh), np.zeros(k)
            idx = np.flatnonzero(active)    # (finished rows keep D = 0: no step off their point)
            D[idx], slope[idx] = descent(G[idx], D[idx])
            new_Z, new_value, new_G, stuck = backtrack_rows(fun_grad, Z, value, G, residual, D, slope, active)
            gained = progress(new_value, value, norm_rows(new_G), residual)
            running &= ~((stuck | ~gained) & fresh)     # no descent (or gain) with a fresh H: it stops
            moved = active & running        # (with a chord H it stays where it is: H is refreshed)
            Z[moved], value[moved], G[moved] = new_Z[moved], new_value[moved], new_G[moved]
            new_residual = norm_rows(G)
            fresh[moved] = stale(new_residual[moved], residual[moved])
            residual[moved] = new_residual[moved]
            steps[moved] += 1
    return Z, steps, residual


def backtrack_rows(fun_grad: StackFunGrad, Z: np.ndarray, value: np.ndarray, G: np.ndarray,
                   residual: np.ndarray, D: np.ndarray, slope: np.ndarray, active: np.ndarray,
                   measure: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> tuple:
    """Each active client's halving line search along its D: its accepted point, value and
    gradient (the old ones where none was accepted), and which clients found no step.
    `measure(C, G)`: the residual per row that `accepted` compares (default ‖G‖∞; a
    constrained solve's prox residual, `ball_newton`)."""
    measure = measure or (lambda C, cG: norm_rows(cG))
    t = np.ones(len(Z))
    searching = active.copy()
    stuck = np.zeros(len(Z), dtype=bool)
    new_Z, new_value, new_G = Z.copy(), value.copy(), G.copy()
    while searching.any():
        C = Z + t[:, None] * D
        cv, cG = fun_grad(C, searching)
        ok = searching & accepted(cv, value, t, slope, measure(C, cG), residual)
        new_Z[ok], new_value[ok], new_G[ok] = C[ok], cv[ok], cG[ok]
        searching &= ~ok
        t[searching] *= 0.5
        small = searching & (t < MIN_STEP)
        stuck |= small
        searching &= ~small
    return new_Z, new_value, new_G, stuck


def norm_rows(G: np.ndarray) -> np.ndarray:
    """‖g_j‖∞ per row (NaN propagates, as `solvers.norm_inf`)."""
    return np.abs(G).max(axis=1) if G.shape[1] else np.zeros(len(G))


class FactorStack:
    """(∇²P_i + diag(w_i))⁻¹ of a group's clients `rows`, stacked, each kept with the Hessian
    object and the weights it was computed from: `bind` inverts only the clients whose Hessian
    (by identity: a program replaces, never edits, its chord Hessian) or weight changed."""

    def __init__(self, n_x: int, N: int):
        self.n_x, self.N = n_x, N
        self.rows = np.zeros(0, dtype=np.intp)
        self.hessians: list = []
        self.weights = np.zeros((0, n_x))
        self.inverse = np.zeros((0, N, N))
        self.singular = np.zeros(0, dtype=bool)

    def bind(self, rows: np.ndarray, hessians: list, W: np.ndarray) -> None:
        """Hold the factors of clients `rows` (group rows) with Hessians `hessians` (None: not
        known yet) and weights W (k, n_x): kept where still valid, the others computed."""
        if not np.array_equal(rows, self.rows):
            self._select(rows)
        changed = np.any(self.weights != W, axis=1) | \
            np.array([h is not kept for h, kept in zip(hessians, self.hessians)], dtype=bool)
        self.weights = np.array(W, dtype=float)
        self.refactor(np.flatnonzero(changed), [hessians[j] for j in np.flatnonzero(changed)])

    def refactor(self, idx: np.ndarray, hessians: list) -> None:
        """New Hessians for the clients at positions `idx` (None: not known yet): invert
        their Newton matrices."""
        known = [j for j, H in zip(idx, hessians) if H is not None]
        for j, H in zip(idx, hessians):
            self.hessians[j] = H
        if not known:
            return
        A = np.array([self.hessians[j] for j in known], dtype=float)
        diag = np.arange(self.n_x)
        A[:, diag, diag] += self.weights[known]
        if len(known) == len(self.rows):        # all of them: the new stack itself
            self.inverse, self.singular = _invert(A)
        else:
            self.inverse[known], self.singular[known] = _invert(A)

    def directions(self, G: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """−A_j⁻¹g_j of the rows idx of G; −g_j where A_j is singular (as
        `solvers._newton_direction`)."""
        inverse = self.inverse if len(idx) == len(self.inverse) else self.inverse[idx]
        D = -np.matmul(inverse, G[idx][..., None])[..., 0]
        singular = self.singular[idx]
        D[singular] = -G[idx][singular]
        return D

    def _select(self, rows: np.ndarray) -> None:
        """Hold clients `rows` instead: the factors of those held before are kept."""
        old = {int(r): j for j, r in enumerate(self.rows)}
        keep = [(j, old[int(r)]) for j, r in enumerate(rows) if int(r) in old]
        inverse = np.zeros((len(rows), self.N, self.N))
        hessians, weights = [None] * len(rows), np.full((len(rows), self.n_x), np.nan)
        singular = np.zeros(len(rows), dtype=bool)
        for new, j in keep:
            inverse[new], hessians[new], weights[new], singular[new] = \
                self.inverse[j], self.hessians[j], self.weights[j], self.singular[j]
        self.rows, self.inverse, self.hessians, self.weights, self.singular = \
            np.array(rows, dtype=np.intp), inverse, hessians, weights, singular


def _invert(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(A_j⁻¹, singular_j) for a stack of matrices (a singular A_j: zeros, True)."""
    try:
        return np.linalg.inv(A), np.zeros(len(A), dtype=bool)
    except np.linalg.LinAlgError:
        out, singular = np.zeros_like(A), np.zeros(len(A), dtype=bool)
        for j in range(len(A)):
            try:
                out[j] = np.linalg.inv(A[j])
            except np.linalg.LinAlgError:
                singular[j] = True
        return out, singular


class NewtonMatrices:
    """The Newton directions of a group's clients `rows` for `newton_batched`, as
    `local_solvers.newton_matrix` gives each client's serial solve: ∇²P_i is the chord Hessian
    the client's program keeps (`_hessian_cache`), evaluated afresh by one group `hessian`
    call for the clients that have none, or whose last step asked for one when `chord` is on
    ("newton"; "exact" keeps its Hessian), and then stored in the program, so that a later
    serial solve continues exactly. The factors live in the group's `FactorStack`."""

    def __init__(self, group: Any, rows: np.ndarray, W: np.ndarray, chord: bool):
        """group: a `batched_group.Group` (not imported: that module imports this one)."""
        self.group, self.rows, self.chord = group, rows, chord
        self.programs = [group.programs[i] for i in rows]
        factors = group.memo.get("newton_factors")
        if factors is None:
            factors = group.memo["newton_factors"] = FactorStack(group.n_x, group.n_x + group.n_y)
        hessians = [p._hessian_cache for p in self.programs]
        factors.bind(rows, hessians, W)
        self.factors = factors
        # which clients have a chord Hessian: only `_refresh` gives one during a solve (read
        # once, not n program attributes per Newton step)
        self.known = np.array([H is not None for H in hessians], dtype=bool)

    def __call__(self, Z: np.ndarray, G: np.ndarray, active: np.ndarray, fresh: np.ndarray) -> np.ndarray:
        need = active & (~self.known | (fresh & self.chord))
        if need.any():
            self._refresh(Z, np.flatnonzero(need))
        idx = np.flatnonzero(active)
        D = np.zeros_like(Z)
        D[idx] = self.factors.directions(G, idx)
        return D

    def _refresh(self, Z: np.ndarray, idx: np.ndarray) -> None:
        """∇²P_i at Z of the clients at positions idx, into their programs and the factors."""
        group, n_x = self.group, self.group.n_x
        full = np.empty((group.n, Z.shape[1]))
        full[:] = Z[idx[0]]                     # other rows: any valid point (not evaluated)
        full[self.rows[idx]] = Z[idx]
        # one copy per client: a view would keep the refresh's whole (k, N, N) stack alive as
        # long as any of its clients keeps its chord Hessian (stack_fits counts each once)
        H = [h.copy() for h in group.hessian(full[:, :n_x], full[:, n_x:], self.rows[idx])]
        for j, Hj in zip(idx, H):
            self.programs[j]._hessian_cache, self.programs[j]._factor_cache = Hj, None
        self.known[idx] = True
        self.factors.refactor(idx, H)
