"""Newton's method inside a Euclidean ball, written once over a stack of k local problems.

A client whose only prox term is a ball ‖x‖₂ ≤ r on all its unknowns (`radius`) solves
min F(x) = P(x) + linearᵀx + ½ w‖x − a‖² over the ball (`NodeProgram.solve_local`'s "prox").
Each step minimizes F's quadratic model on the ball exactly: with A = ∇²P + wI = V diag(λ) Vᵀ
(the chord Hessian's eigendecomposition, kept in the program as `local_solvers.newton_matrix`
keeps it: a new weight w costs nothing), the model's minimizer on the ball is
u(μ) = −V (b / (λ + μ)), b = Vᵀ(g − A x), with μ ≥ 0 the ball's one multiplier: 0 when the
unconstrained minimizer is inside, else the root of 1/‖u(μ)‖ = 1/r (Newton from 0: monotone,
no overshoot for a positive definite A). The step u − x is backtracked with `solvers.newton`'s
rules (`accepted`, `progress`, `stale`: the chord rule), measured by the prox residual the
callers read (`remainder`: g plus the normal cone's element closest to −g). Every point stays
in the ball (the ball is convex, u and x are in it).

FISTA took ~17 steps × 2 evaluations per local solve with the ball active (docs/BENCHMARKS.md,
branch vecstep); this takes a few evaluations. The serial executor runs it with k = 1 from
`local_solvers._prox` (`solve_one`), the batched executor with a group's rows (`solve_rows`):
the same code. Rows it does not settle (a Hessian that is not positive definite, no progress
at a fresh Hessian short of the tolerance) are handed back unsettled: the caller finishes them
by FISTA.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..compiler.projection import Ball
from ..compiler.sets import ACTIVE
from . import low_rank, solvers
from .batched_newton import backtrack_rows, norm_rows, stack_fits
from .solvers import progress, stale

# unknowns up to which a ball's local solve takes this dense Newton (its eigendecomposition is
# kept per client: 2 N² floats); Newton-CG and FISTA beyond (`local_solvers._inside`)
BALL_NEWTON_MAX = 2000
SECULAR_STEPS = 60      # Newton steps on the multiplier's equation (quadratic: ~5 suffice)


def radius(program: Any) -> float | None:
    """r of a program whose only prox term is a Euclidean ball on all its unknowns (no
    private variables, no data-sized packed Hessian: `low_rank`), within the dense budget;
    else None (the other solvers)."""
    terms = program.merit_ir.prox_terms
    if len(terms) != 1 or terms[0].kind != "ball2" or program.n_private or \
            terms[0].variable.size != program.n_shared or len(terms[0].pieces) != 1 or \
            not isinstance(terms[0].pieces[0], Ball):
        return None
    n = program.n_shared
    if n > BALL_NEWTON_MAX or not solvers.dense_fits(n) or low_rank.applies(program):
        return None
    return terms[0].pieces[0].radius


def radii(group: Any, rows: np.ndarray) -> np.ndarray | None:
    """The radii (k,) of the clients `rows` of a group (a `batched_group.Group`) when each has
    one ball (`radius`) and their solves hold no constraint (`local_names`, read on the
    first as the group's forms do); else None. Kept in the group's memo: a compiled ball's
    radius does not change (a Parameter's is no `Ball` piece: `radius` is None)."""
    known = group.memo.get("ball_radii")
    if known is None:
        known = group.memo["ball_radii"] = np.array(
            [np.nan if (r := radius(p)) is None else r for p in group.programs], dtype=float)
    out = known[rows]
    return None if np.isnan(out).any() or group.programs[rows[0]].local_names else out


def uniform(weight: np.ndarray) -> np.ndarray | None:
    """The one weight per row of `weight` ((k,) or (k, n)), or None when a row's differ."""
    W = np.asarray(weight, float)
    if W.ndim <= 1:
        return W.reshape(-1)
    return W[:, 0].copy() if bool(np.all(W == W[:, :1])) else None


def remainder(Z: np.ndarray, G: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Per row, G plus the element of the ball's normal cone at Z closest to −G (the ball
    term's `remainder` of `compiler.sets`, stacked): G inside (‖z‖ < r(1 − ACTIVE)), 0 at the
    point {0}, G + max(0, −Gᵀz/‖z‖) z/‖z‖ on the boundary."""
    norm = np.sqrt(np.einsum("ij,ij->i", Z, Z))
    edge = ~(norm < r * (1 - ACTIVE))
    if not edge.any():
        return G
    unit = Z / np.where(norm > 0, norm, 1.0)[:, None]
    push = np.where(edge, np.maximum(0.0, -np.einsum("ij,ij->i", G, unit)), 0.0)
    out = G + push[:, None] * unit
    point = edge & ((r == 0) | (norm == 0))
    if point.any():
        out[point] = 0.0
    return out


def project(Z: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Each row of Z on its ball (a copy)."""
    norm = np.sqrt(np.einsum("ij,ij->i", Z, Z))
    scale = np.where(norm > r, r / np.where(norm > 0, norm, 1.0), 1.0)
    return Z * scale[:, None]


class Spectra:
    """The eigendecompositions of the chord Hessians ∇²P_j of k programs, as the programs keep
    them: the Hessian in `_hessian_cache`, its spectrum in `_factor_cache`'s third slot (where
    `local_solvers.newton_matrix` keeps it for a uniform weight; computed here when absent).
    `hessians(Z, idx)` evaluates fresh ones (the program's own plan, or a group's)."""

    def __init__(self, programs: list, hessians: Callable[[np.ndarray, np.ndarray], np.ndarray],
                 chord: bool):
        self.programs, self.hessians, self.chord = programs, hessians, chord
        k, n = len(programs), programs[0].n_shared
        self.values, self.vectors = np.zeros((k, n)), np.zeros((k, n, n))
        self.known = np.zeros(k, dtype=bool)
        missing = []
        for j, p in enumerate(programs):
            kept = p._factor_cache[2] if p._factor_cache is not None else None
            if kept is not None and p._hessian_cache is not None:
                self.values[j], self.vectors[j] = kept
                self.known[j] = True
            elif p._hessian_cache is not None and p._hessian_cache.ndim == 2:
                missing.append(j)
        if missing:
            self._store(np.array(missing), np.array([programs[j]._hessian_cache for j in missing]))

    def __call__(self, Z: np.ndarray, idx: np.ndarray, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(eigenvalues (m, n), eigenvectors (m, n, n)) of the rows idx, refreshed at Z where
        unknown or (with the chord rule) asked `fresh`."""
        need = idx[~self.known[idx] | (fresh[idx] & self.chord)]
        if len(need):
            H = np.asarray(self.hessians(Z, need), dtype=float)
            for j, Hj in zip(need, H):
                self.programs[j]._hessian_cache, self.programs[j]._factor_cache = Hj.copy(), None
            self._store(need, H)
        return self.values[idx], self.vectors[idx]

    def _store(self, idx: np.ndarray, H: np.ndarray) -> None:
        values, vectors = np.linalg.eigh(H)
        self.values[idx], self.vectors[idx], self.known[idx] = values, vectors, True
        for j, v, V in zip(idx, values, vectors):      # (copies: no view keeps the stack alive)
            p = self.programs[j]
            kept = p._factor_cache
            p._factor_cache = (kept[0], kept[1], (v.copy(), V.copy())) if kept is not None \
                else (None, None, (v.copy(), V.copy()))


def model_steps(Z: np.ndarray, G: np.ndarray, lam: np.ndarray, V: np.ndarray, r: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the minimizer u − z of gᵀd + ½ dᵀA d over ‖z + d‖ ≤ r, A = V diag(lam) Vᵀ, and
    whether A is positive definite (else the row's step is 0)."""
    p = np.matmul(Z[:, None, :], V)[:, 0, :]                  # Vᵀz
    b = np.matmul(G[:, None, :], V)[:, 0, :] - lam * p        # Vᵀ(g − A z)
    regular = lam.min(axis=1) > 0
    if not regular.all():
        lam = np.where(regular[:, None], lam, 1.0)
    coef = b / lam
    norm2 = np.einsum("ij,ij->i", coef, coef)
    outside = (norm2 > r * r) & (r > 0) & regular
    if outside.any():                   # Newton on 1/‖u(μ)‖ − 1/r from μ = 0: increasing
        mu = np.zeros(len(Z))
        going = outside.copy()          # a row stops when it converges, so its numbers do not
        for _ in range(SECULAR_STEPS):  # depend on the other rows of the stack (serial: k = 1)
            s = np.sqrt(norm2)
            cubic = np.einsum("ij,ij->i", coef * coef, 1.0 / (lam + mu[:, None]))
            mu += np.where(going, norm2 * (s / np.where(r > 0, r, 1.0) - 1.0) / cubic, 0.0)
            coef = np.where(going[:, None], b / (lam + mu[:, None]), coef)
            norm2 = np.einsum("ij,ij->i", coef, coef)
            going &= np.abs(np.sqrt(norm2) - r) > 1e-14 * r
            if not going.any():
                break
    coef[r == 0] = 0.0                  # the point {0}
    D = np.matmul(V, (-coef - p)[:, :, None])[:, :, 0]
    D[~regular] = 0.0
    return D, regular


def solve(fun_grad: Callable, spectra: Spectra, Z0: np.ndarray, weight: np.ndarray, r: np.ndarray,
          tol, max_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The k problems from Z0 (k, n), projected on their balls: (Z, steps, residual, settled),
    settled where residual ≤ tol. fun_grad(Z, which) -> (values (k,), gradients (k, n)) of
    P_j + linear + ½ w‖· − a‖² (`batched_newton.StackFunGrad`); weight (k,); r (k,); tol a
    number or (k,)."""
    Z = project(Z0, r)
    k = len(Z)
    value, G = fun_grad(Z, None)

    def measure(C: np.ndarray, CG: np.ndarray) -> np.ndarray:
        return norm_rows(remainder(C, CG, r))
    residual = measure(Z, G)
    steps, fresh = np.zeros(k, dtype=int), np.zeros(k, dtype=bool)
    running = np.ones(k, dtype=bool)
    with np.errstate(invalid="ignore", over="ignore"):
        while True:
            active = running & (residual > tol) & (steps < max_steps)
            idx = np.flatnonzero(active)
            if not len(idx):
                break
            lam, V = spectra(Z, idx, fresh)
            D, slope = np.zeros_like(Z), np.zeros(k)
            D[idx], regular = model_steps(Z[idx], G[idx], lam + weight[idx, None], V, r[idx])
            running[idx[~regular]] = False
            active &= running
            slope[idx] = np.einsum("ij,ij->i", G[idx], D[idx])
            D[slope >= 0] = 0.0             # no descent left in the model: stop, or fresh H
            slope = np.minimum(slope, 0.0)
            new_Z, new_value, new_G, stuck = backtrack_rows(fun_grad, Z, value, G, residual, D, slope,
                                                            active, measure)
            new_residual = measure(new_Z, new_G)
            gained = progress(new_value, value, new_residual, residual)
            running &= ~((stuck | ~gained) & fresh)
            moved = active & running
            Z[moved], value[moved], G[moved] = new_Z[moved], new_value[moved], new_G[moved]
            fresh[moved] = stale(new_residual[moved], residual[moved])
            residual[moved] = new_residual[moved]
            steps[moved] += 1
    return project(Z, r), steps, residual, residual <= tol


def solve_one(program: Any, lp: Any) -> tuple[np.ndarray, int, float, bool] | None:
    """`solve` with k = 1 for one program's `local_solvers.LocalProblem` (its own plans):
    (z, steps, residual, settled), or None where it does not apply (`radius`, a weight
    that is not one number)."""
    r = radius(program)
    w = uniform(lp.weight_x[None, :])
    if r is None or w is None:
        return None

    def fun_grad(Z, which=None):
        value, g = lp.fun_grad(Z[0])
        return np.array([value]), g[None, :]
    spectra = Spectra([program], lambda Z, idx: program.hessian(Z[0])[None], chord=not program.quadratic)
    Z, steps, residual, settled = solve(fun_grad, spectra, lp.z0[None, :], w, np.array([r]), lp.tol,
                                        int(lp.max_steps))
    return Z[0], int(steps[0]), float(residual[0]), bool(settled[0])


def solve_rows(group: Any, chosen: str, Z0: np.ndarray, rows: np.ndarray, linear, weight, anchor, tol,
               max_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`Group.solve_local` for the rows `rows` of a `batched_group.Group` when the method it
    chose is "prox" and its clients each have one ball (`radius`): `solve` on the group's
    stacked evaluations and Hessians, its unsettled rows finished by each client's FISTA
    (`local_solvers._prox`'s order). (Z, steps, residual), or None where it does not apply."""
    if chosen != "prox":
        return None
    programs = [group.programs[i] for i in rows]
    k, n = len(rows), group.n_x
    r = radii(group, rows)      # (each row's: a group's signature does not tell a set's kind)
    if r is None or not stack_fits(k, n):
        return None
    weight = np.asarray(weight, float)
    w = uniform(np.broadcast_to(weight if weight.ndim == 0 else weight.reshape(k, -1), (k, n)))
    if w is None:
        return None
    W = np.broadcast_to(w[:, None], (k, n))
    linear = np.broadcast_to(np.asarray(linear, float), (k, n))
    anchor = np.broadcast_to(np.asarray(anchor, float), (k, n))
    fun_grad = group._penalized(rows, linear, W, anchor, Z0[0])

    def hessians(Z: np.ndarray, idx: np.ndarray) -> np.ndarray:
        full = np.empty((group.n, n))
        full[:] = Z[idx[0]]                 # other rows: any valid point (not evaluated)
        full[rows[idx]] = Z[idx]
        return group.hessian(full, np.zeros((group.n, 0)), rows[idx])
    spectra = Spectra(programs, hessians, chord=not programs[0].quadratic)
    Z, steps, residual, settled = solve(fun_grad, spectra, Z0, w, r, tol, max_steps)
    left = np.flatnonzero(~settled)
    if len(left):
        tols = np.broadcast_to(np.asarray(tol, float), (k,))[left]
        Z[left], more, residual[left] = group._solve_each(Z[left], rows[left], linear[left], w[left],
                                                          anchor[left], tols, "fista", max_steps, None)
        steps[left] += more
    return Z, steps, residual
