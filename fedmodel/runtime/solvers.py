"""Local solvers for a node's smooth, strongly convex subproblems (paper 1, eqs. 18–19).

Each stops on the ∞-norm of the gradient (or of a subgradient for prox steps), warm-started:
- `exact`: quadratic subproblems, one linear solve with the (constant) Hessian;
- `newton`: Newton with the Hessian assembled from derived Hessian-vector products, for small
  dimensions, with backtracking;
- `newton_cg`: truncated Newton (conjugate gradients on Hessian-vector products) for
  dimensions whose d × d matrix exceeds `DENSE_NEWTON_FLOATS` (`dense_fits`): no matrix formed;
- `lbfgs`: scipy's L-BFGS-B with analytic gradients (its `gtol` is an ∞-norm test);
- `gd`: a fixed number of gradient steps (FedAvg/FedADMM-style local work);
- `prox_gradient`: accelerated proximal gradient for a smooth part plus a prox-able term.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

FunGrad = Callable[[np.ndarray], tuple[float, np.ndarray]]

# The most floats one dense Newton matrix may hold (160 MB; a factorization keeps up to three
# such arrays alive: the Hessian, the shifted copy and its factor). Local solves with more
# unknowns N (N² > this, N > 4472) are Hessian-free (`newton_cg`, L-BFGS): a d × d matrix at
# d = 16,507 is 2.2 GB, and the factorization's copies crashed the interpreter (issue 25).
# A module attribute, read at each call: set `solvers.DENSE_NEWTON_FLOATS` to change it.
DENSE_NEWTON_FLOATS = 20_000_000


def dense_fits(n: int, count: int = 1) -> bool:
    """Whether `count` dense n × n Newton matrices fit `DENSE_NEWTON_FLOATS` floats."""
    return count * n * n <= DENSE_NEWTON_FLOATS


def lbfgs(fun_grad: FunGrad, x0: np.ndarray, tol: float, max_steps: int = 1000) -> tuple[np.ndarray, int, float]:
    from scipy.optimize import minimize
    value, g = fun_grad(x0)
    if np.max(np.abs(g), initial=0.0) <= tol:
        return x0, 0, float(np.max(np.abs(g), initial=0.0))
    res = minimize(fun_grad, x0, jac=True, method="L-BFGS-B",
                   options={"gtol": tol, "ftol": 1e-15, "maxiter": max_steps, "maxcor": 20})
    _, g = fun_grad(res.x)
    return res.x, int(res.nit), float(np.max(np.abs(g), initial=0.0))


def newton(fun_grad: FunGrad, hessian: Callable[[np.ndarray, bool], np.ndarray], x0: np.ndarray,
           tol: float, max_steps: int = 100) -> tuple[np.ndarray, int, float]:
    """Damped Newton with Armijo backtracking; a gradient step when H is not positive definite.

    `hessian(x, fresh)` returns H or its `Inverse`; it may be computed at an earlier point (a chord step, which
    saves assembling H in every step of a warm-started sequence of similar subproblems); it is
    asked for a fresh one (`fresh=True`) when a step cuts the gradient by less than half.
    It stops when a step with a fresh H gains nothing (`progress`). Its rules (`descent`,
    `accepted`, `MIN_STEP`, `stale`, `progress`) are `batched_newton.newton_batched`'s."""
    x = x0.copy()
    value, g = fun_grad(x)
    residual = norm_inf(g)
    steps, fresh = 0, False
    while residual > tol and steps < max_steps:
        direction, slope = descent(g, _newton_direction(hessian(x, fresh), g))
        found = backtrack(fun_grad, x, value, residual, direction, slope)
        if found is None:       # no descent left at this precision: fresh H, or stop if it was fresh
            if fresh:
                return x, steps, residual
            found = x, value, g, residual
        candidate, new_value, new_g, new_residual = found
        if fresh and not progress(new_value, value, new_residual, residual):
            return x, steps, residual       # a fresh H and nothing gained: round-off level
        x, value, g = candidate, new_value, new_g
        fresh = bool(stale(new_residual, residual))
        residual = new_residual
        steps += 1
    return x, steps, residual


MIN_STEP = 1e-10        # backtracking below this step finds no descent at double precision


def backtrack(fun_grad: FunGrad, x: np.ndarray, value: float, residual: float,
              direction: np.ndarray, slope: float):
    """The first of the steps t = 1, ½, ¼, … along `direction` that `accepted` takes, as
    (point, value, gradient, ‖gradient‖∞); None below MIN_STEP."""
    t = 1.0
    while t >= MIN_STEP:
        candidate = x + t * direction
        new_value, new_g = fun_grad(candidate)
        new_residual = norm_inf(new_g)
        if accepted(new_value, value, t, slope, new_residual, residual):
            return candidate, new_value, new_g, new_residual
        t *= 0.5
    return None


def newton_cg(fun_grad: FunGrad, hvp: Callable[[np.ndarray, np.ndarray], np.ndarray], x0: np.ndarray,
              tol: float, max_steps: int = 100, exact: bool = False) -> tuple[np.ndarray, int, float]:
    """Truncated Newton for large smooth convex problems: each direction solves H d = −g by
    conjugate gradients on `hvp(x, v)` = ∇²f(x)·v (no matrix is formed: memory O(n)), to the
    relative residual η = min(0.5, √(‖g‖∞/‖g₀‖∞)) (superlinear near the solution) and never
    much below what `tol` needs; a negative-curvature direction ends CG (−g if it is the
    first). Steps are backtracked with `solvers.newton`'s rules (`descent`, `accepted`). With
    `exact` (a quadratic: the "exact" method) CG goes to a relative residual of 1e-12, so one
    step solves it, and at most 3 steps are taken. Returns (x, Newton steps, ‖∇‖∞)."""
    x = np.array(x0, dtype=float)
    value, g = fun_grad(x)
    residual = first = norm_inf(g)
    if exact:
        max_steps = min(max_steps, 3)
    steps = 0
    while residual > tol and steps < max_steps:
        eta = 1e-12 if exact else min(0.5, np.sqrt(residual / first)) if first > 0 else 0.5
        target = max(eta * residual, 0.1 * tol)
        direction, slope = descent(g, conjugate_gradients(lambda v: hvp(x, v), g, target))
        found = backtrack(fun_grad, x, value, residual, direction, slope)
        if found is None:        # no descent left at this precision
            return x, steps, residual
        x, value, g, residual = found
        steps += 1
    return x, steps, residual


def conjugate_gradients(apply: Callable[[np.ndarray], np.ndarray], g: np.ndarray, target: float,
                         max_iterations: int | None = None) -> np.ndarray:
    """An approximate solution d of H d = −g by CG (H = `apply`, symmetric), stopped when
    ‖H d + g‖∞ ≤ target, at negative or zero curvature (the iterate so far; −g at the start),
    or after `max_iterations` (default min(n, 1000) + 20)."""
    n = g.size
    limit = max_iterations if max_iterations is not None else min(n, 1000) + 20
    d = np.zeros(n)
    r = -g.copy()                    # residual −g − H d
    p = r.copy()
    rr = float(r @ r)
    for _ in range(limit):
        if norm_inf(r) <= target:
            break
        Hp = apply(p)
        curvature = float(p @ Hp)
        if not curvature > 0.0:      # (also NaN) not positive definite along p
            return d if d.any() else -g
        alpha = rr / curvature
        d += alpha * p
        r -= alpha * Hp
        rr_new = float(r @ r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return d


def descent(g: np.ndarray, direction: np.ndarray) -> tuple:
    """(direction, slope gᵀdirection), with −g (slope −‖g‖²) where the direction is not one of
    descent (slope ≥ 0): for one vector, or per row of stacks (k, N) (slopes (k,))."""
    if g.ndim == 1:
        slope = float(g @ direction)
        if slope >= 0:
            return -g, -float(g @ g)
        return direction, slope
    slope = np.einsum("ij,ij->i", g, direction)
    ascent = slope >= 0
    if ascent.any():
        direction = np.where(ascent[:, None], -g, direction)
        slope = np.where(ascent, -np.einsum("ij,ij->i", g, g), slope)
    return direction, slope


def accepted(new_value, value, t, slope, new_residual, residual) -> "bool | np.ndarray":
    """Backtracking's test of a step t·direction: Armijo's sufficient decrease; or, near the
    solution where values stop resolving, a full step that halves the gradient. Floats, or
    arrays elementwise (one entry per client)."""
    return (new_value <= value + 1e-4 * t * slope) | ((t == 1.0) & (new_residual <= 0.5 * residual))


def progress(new_value, value, new_residual, residual) -> "bool | np.ndarray":
    """Whether an accepted step gained anything: the value fell, or ‖∇‖∞ fell by a tenth. At
    round-off level Armijo's test accepts a step that leaves the value equal (x + t·d == x,
    or a step below the values' resolution), and Newton then took `max_steps` such steps at
    4 evaluations each (ProxAL on tests/test_stalled_not_solution.py's mixed-units box, its
    box in the augmented Lagrangian at β = 1e6: 1,000 steps, ~25,000 evaluations a solve,
    ‖∇‖∞ 8.58e-15 throughout against a tolerance of 1.3e-15). With a fresh H that is the end.
    Floats, or arrays elementwise."""
    return (new_value < value) | (new_residual <= 0.9 * residual)


def stale(new_residual, residual) -> "bool | np.ndarray":
    """The chord rule: a step that cut ‖∇‖∞ by less than half asks for a fresh Hessian
    (also when a residual is NaN). Floats, or arrays elementwise."""
    return np.logical_not(new_residual <= 0.5 * residual)


def norm_inf(v: np.ndarray) -> float:
    """‖v‖∞ (0 for an empty v; NaN if v has one), without np.max's per-call overhead."""
    return float(np.abs(v).max()) if v.size else 0.0


class Inverse:
    """A Newton matrix A = ∇²f + diag(w) held as A⁻¹ (None where A is singular): each direction
    is then one matrix-vector product, as in the batched executor's `FactorStack`. numpy's
    inversion, not scipy's Cholesky: `scipy.linalg` was a third of a cold solve's imports
    (~0.3 s CPU) for one factorization per Hessian; a matrix that is not positive definite
    gets the direction −A⁻¹g as before (`descent` turns an ascent direction into −g)."""

    __slots__ = ("matrix",)

    def __init__(self, A: np.ndarray):
        try:
            self.matrix: np.ndarray | None = np.linalg.inv(A)
        except np.linalg.LinAlgError:
            self.matrix = None


def _newton_direction(H, g: np.ndarray) -> np.ndarray:
    """−H⁻¹g for an `Inverse` or a matrix; −g when H is singular."""
    if isinstance(H, Inverse):
        return -g if H.matrix is None else -(H.matrix @ g)
    try:
        return -np.linalg.solve(H, g)
    except np.linalg.LinAlgError:
        return -g


def gradient_descent(fun_grad: FunGrad, x0: np.ndarray, lr: float, steps: int) -> tuple[np.ndarray, int, float]:
    x = x0.copy()
    g = fun_grad(x)[1]
    for _ in range(steps):
        x = x - lr * g
        g = fun_grad(x)[1]
    return x, steps, float(np.max(np.abs(g), initial=0.0))


def prox_gradient(fun_grad: FunGrad, prox: Callable[[np.ndarray, float], np.ndarray],
                  x0: np.ndarray, tol: float, lipschitz: float, max_steps: int = 10_000
                  ) -> tuple[np.ndarray, int, float]:
    """FISTA with backtracking on L. Stops when the subgradient
    ∇g(x⁺) − ∇g(y) + L(y − x⁺) ∈ ∂(g + h)(x⁺) is ≤ tol in the ∞-norm."""
    x, y, t_k = x0.copy(), x0.copy(), 1.0
    L = max(lipschitz, 1e-12)
    residual = np.inf
    steps = 0
    for steps in range(1, max_steps + 1):
        fy, gy = fun_grad(y)
        while True:
            x_new = prox(y - gy / L, 1.0 / L)
            f_new, g_new = fun_grad(x_new)
            diff = x_new - y
            if f_new <= fy + gy @ diff + 0.5 * L * (diff @ diff) + 1e-12 * abs(fy):
                break
            if not (np.isfinite(fy) and np.isfinite(L)):   # no descent to find: stop, the
                return x_new, steps, float("inf")          # caller sees a non-finite residual
            L *= 2.0
        residual = float(np.max(np.abs(g_new - gy - L * diff), initial=0.0))
        t_next = 0.5 * (1 + np.sqrt(1 + 4 * t_k * t_k))
        y = x_new + ((t_k - 1) / t_next) * (x_new - x)
        x, t_k = x_new, t_next
        if residual <= tol:
            break
    return x, steps, residual
