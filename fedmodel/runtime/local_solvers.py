"""The local solvers of a node program: a table from name to function (`SOLVERS`).

`NodeProgram.solve_local` builds the local problem — P_i(x, y) + linearᵀx + ½ Σ_j weight_j
(x_j − anchor_j)², warm-started at (x0, y) — and `choose` picks a table entry by the problem's
size and kind; adding a solver is one entry. Each entry is `solve(program, problem) -> (z,
steps, residual)` with z = (x, y) the solution and residual its ‖∇‖∞ (or prox residual).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from ..errors import FedModelError
from . import ball_newton, local_al, low_rank, solvers
from .active_set import feature_sign, l1_residual

# a `program.NodeProgram` (which imports this module: the layer test allows no cycle)
NodeProgram = Any

ACTIVE_SET_MAX = 500    # unknowns up to which a quadratic + λ‖w‖₁ subproblem is solved exactly
# unknowns up to which a solve inside sets (`_inside`) takes dense chord Newton: its Hessian
# and inverse, 2 × 32 MB a node at 2,000, are kept across solves; Newton-CG beyond
CHORD_NEWTON_MAX = 2000


@dataclass
class LocalProblem:
    """One local solve: `fun_grad(z) -> (value, gradient)` of the objective above, the start
    z0, the tolerance, the weights on x, and the step options of the first-order solvers."""
    fun_grad: Callable
    z0: np.ndarray
    tol: float
    weight_x: np.ndarray
    max_steps: int
    lr: float | None


def _prox(program: NodeProgram, lp: LocalProblem):
    """A merit whose Hessian is c·I (`_closed_form`): one prox step. Prox terms all λ‖w‖₁ (and
    not too many unknowns): exact feature-sign search for a
    quadratic merit, proximal Newton otherwise; one Euclidean ball: Newton inside the ball
    (`ball_newton`, with k = 1: the batched executor's stacked code); other sets, none active
    at the warm start: Newton on the smooth part, kept if it ends inside the sets (`_inside`);
    FISTA for other terms or when those fail (from the ball Newton's point)."""
    terms = program.merit_ir.prox_terms
    z0 = lp.z0
    closed = _closed_form(program, lp)
    if closed is not None:
        return closed
    if terms and all(t.kind == "norm1" for t in terms) and z0.size <= ACTIVE_SET_MAX and \
            solvers.dense_fits(z0.size):
        solve = _quadratic_l1 if program.quadratic else _prox_newton
        exact = solve(program, lp.fun_grad, z0, lp.tol, lp.weight_x)
        if exact is not None:
            return exact
    tried = 0
    ball = ball_newton.solve_one(program, lp) if terms and terms[0].kind == "ball2" else None
    if ball is not None:        # one ball: Newton inside it (the batched executor's code, k = 1)
        z, tried, residual, settled = ball
        if settled:
            return z, tried, residual
        lp = replace(lp, z0=z)
    elif terms and all(t.constraint is not None for t in terms):
        found, tried = _inside(program, lp)
        if found is not None:
            return found
    z, steps, residual = _fista(program, lp)
    return z, steps + tried, residual


def _fista(program: NodeProgram, lp: LocalProblem):
    """FISTA (`solvers.prox_gradient`) on the smooth part and the prox terms; the end of
    "prox" when its Newton solvers do not settle (also for a group's unsettled rows)."""
    lipschitz = float(np.max(lp.weight_x, initial=1.0))
    return solvers.prox_gradient(lp.fun_grad, program.apply_prox, lp.z0, lp.tol, lipschitz,
                                 max_steps=100_000)


def _closed_form(program: NodeProgram, lp: LocalProblem) -> tuple | None:
    """A quadratic merit with Hessian c·I and no private variables (a client whose only term is
    a prox term: λ‖w − a‖₂ of a geometric median, λ‖w − a‖₁, λ‖w‖₁, beside the proximal and
    linear terms of the method): P(z) = P(z0) + g0ᵀ(z − z0) + (c/2)‖z − z0‖², so the minimizer
    of P + h is prox_{h/c}(z0 − g0/c) (a shifted block soft-threshold for ‖· − a‖₂, a shifted
    soft-threshold for ‖· − a‖₁) — FISTA's own fixed point, reached in one step instead of its
    ~10–20 (docs/BENCHMARKS.md, branch geomed). None when the merit is not of that form."""
    n = lp.z0.size
    if not program.quadratic or program.n_private or \
            not (solvers.dense_fits(n) or low_rank.applies(program)):     # (packed: O(n) here)
        return None
    if program._hessian_cache is None:
        try:
            program._hessian_cache, program._factor_cache = fresh_hessian(program, lp.z0), None
        except BeyondBudget:
            return None
    H = program._hessian_cache
    if H.ndim == 1:         # packed (`low_rank`): c·I only without a product through data
        diagonal, core = low_rank.unpack(H)
        if core.size:
            return None
    else:
        diagonal = np.diagonal(H)
    c = float(diagonal[0] + lp.weight_x[0])
    if not c > 0 or np.max(np.abs(diagonal + lp.weight_x - c)) > 1e-12 * c or \
            (H.ndim == 2 and np.count_nonzero(H) != np.count_nonzero(diagonal)):  # (the diagonal first: O(n))
        return None
    g0 = lp.fun_grad(lp.z0)[1]
    z = program.apply_prox(lp.z0 - g0 / c, 1.0 / c)
    residual = solvers.norm_inf(program.prox_remainder(z, lp.fun_grad(z)[1]))
    return (z, 1, residual) if residual <= lp.tol else None


def _inside(program: NodeProgram, lp: LocalProblem) -> tuple[tuple | None, int]:
    """A local solve whose prox terms are all sets (client balls, bounds: `client_sets`), by
    the smooth solver when no set is active at the warm start (the normal cones add nothing to
    the gradient there): the smooth part's minimizer, if it lies in the sets with ‖∇‖∞ ≤ tol,
    is the constrained one to the same tolerance (0 is in the normal cone of any point of a
    set). Dense chord Newton up to `CHORD_NEWTON_MAX` unknowns and within the dense budget (the
    Hessian kept across the ADMM's solves: a solve is then a few evaluations), Newton-CG beyond. FISTA needed
    ~1,300 steps a solve at the tolerances of ProxAL's last outer iterations on the MNIST
    clients (d = 784, ball inactive; docs/BENCHMARKS.md). Returns ((z, steps, residual) or
    None when a set is active or the minimizer is outside them, the steps tried)."""
    n_x = program.n_shared
    g0 = lp.fun_grad(lp.z0)[1][:n_x]
    if not np.array_equal(program.prox_remainder(lp.z0[:n_x], g0), g0):
        return None, 0                  # a set active at the warm start: projected steps
    if lp.z0.size > CHORD_NEWTON_MAX:   # (not `choose`: its low-rank analysis would go unused)
        name = "exact-cg" if program.quadratic else "newton-cg"
    else:
        name = choose(program, "exact" if program.quadratic else "newton")     # (the dense budget)
    z, steps, residual = SOLVERS[name](program, lp)
    if residual <= lp.tol and np.array_equal(program.apply_prox(z, 1.0), z):
        return (z, steps, residual), steps
    return None, steps


def _newton_with(fresh_matrices: bool, exact: bool):
    """Dense Newton on `newton_matrix` (chord rule: a fresh ∇²P_i only when `solvers.newton`
    asks and `fresh_matrices`); `exact`: a quadratic, solved in one step and one refinement
    whatever tolerance was allowed — it costs the same."""
    def solve(program: NodeProgram, lp: LocalProblem):
        def hess(z, fresh):
            return newton_matrix(program, z, lp.weight_x, fresh and fresh_matrices)
        tol, max_steps = (0.0, 2) if exact else (lp.tol, lp.max_steps)
        try:
            return solvers.newton(lp.fun_grad, hess, lp.z0, tol, max_steps)
        except BeyondBudget:       # a packed form beyond the dense budget failed: no d × d
            return SOLVERS["exact-cg" if exact else "newton-cg"](program, lp)
    return solve


class BeyondBudget(Exception):
    """A Newton matrix that only its packed form (`low_rank`) could hold — beyond
    `solvers.DENSE_NEWTON_FLOATS` — had none (the form's check failed, or some λ + w ≤ 0)."""


def _newton_cg_with(exact: bool):
    """Newton-CG on compiled Hessian-vector products (`exact`: CG to 1e-12, for a quadratic)."""
    def solve(program: NodeProgram, lp: LocalProblem):
        n_x = program.n_shared

        def hvp(z, v):
            out = program.hvp(z, v)
            out[:n_x] += lp.weight_x * v[:n_x]
            return out
        return solvers.newton_cg(lp.fun_grad, hvp, lp.z0, lp.tol, lp.max_steps, exact=exact)
    return solve


def _local_al(program: NodeProgram, lp: LocalProblem):
    """The client's held constraints by the method of multipliers (`local_al.solve`), each
    round solved by the method `choose` picks without them."""
    rest = SOLVERS[choose(program, "auto", local=False)]
    return local_al.solve(program, lp, lambda problem: rest(program, problem))


def _gd(program: NodeProgram, lp: LocalProblem):
    return solvers.gradient_descent(lp.fun_grad, lp.z0, lp.lr, int(lp.max_steps))


def _lbfgs(program: NodeProgram, lp: LocalProblem):
    return solvers.lbfgs(lp.fun_grad, lp.z0, lp.tol, lp.max_steps)


SOLVERS: dict[str, Callable[[NodeProgram, LocalProblem], tuple]] = {
    "prox": _prox,
    "fista": _fista,
    "exact": _newton_with(fresh_matrices=False, exact=True),
    "newton": _newton_with(fresh_matrices=True, exact=False),
    "exact-cg": _newton_cg_with(exact=True),
    "newton-cg": _newton_cg_with(exact=False),
    "gd": _gd,
    "lbfgs": _lbfgs,
    "local-al": _local_al,
}


def choose(program: NodeProgram, method: str, local: bool = True) -> str:
    """The local method for `method` ("auto" or a name) by the size rule: a dense Newton
    matrix ("exact", "newton") only while it fits `solvers.DENSE_NEWTON_FLOATS`; beyond,
    Newton-CG on Hessian-vector products ("exact-cg": CG to 1e-12 for a quadratic).
    "auto" keeps today's choices within the budget (Newton up to 200 unknowns, L-BFGS-B
    above) and takes Newton-CG beyond it. A client whose solves hold its constraints
    (`NodeProgram.local_names`) takes "local-al" for "auto" and "prox" (with `local`; its
    rounds solve by the method chosen without)."""
    n = program.n_shared + program.n_private
    if local and method in ("auto", "prox") and program.local_names:
        return "local-al"
    if method == "auto":
        if program.merit_ir.prox_terms:
            return "prox"
        if program.quadratic:
            method = "exact"
        elif n <= 200 and solvers.dense_fits(n):
            return "newton"
        else:   # beyond the budget Newton-CG: 3-6× faster than L-BFGS-B on a9a's hashed
            # logistic clients (d = 16,507, β = 10 and 300, tol 1e-6 and 1e-9)
            return "lbfgs" if solvers.dense_fits(n) else "newton-cg"
    if method in ("exact", "newton") and not solvers.dense_fits(n) and not low_rank.applies(program):
        return "exact-cg" if method == "exact" else "newton-cg"
    return method      # (beyond the budget with a packed Hessian: Woodbury, O(N r) memory)


def solve(program: NodeProgram, method: str, lp: LocalProblem) -> tuple[np.ndarray, int, float]:
    """Solve `lp` with the table's entry `choose(program, method)`."""
    name = choose(program, method)
    solver = SOLVERS.get(name)
    if solver is None:
        raise FedModelError(f"unknown local solver {name!r}; choose 'auto' or one of {sorted(SOLVERS)}")
    return solver(program, lp)


# ---- pieces of the entries ------------------------------------------------------------------
def newton_matrix(program: NodeProgram, z: np.ndarray, weight_x: np.ndarray,
                  fresh: bool) -> solvers.Inverse:
    """The inverse (`solvers.Inverse`) of ∇²P_i + diag(weight). ∇²P_i is kept in the node's
    state until a Newton step asks for a fresh one (the chord rule in `solvers.newton`), also
    across parameter changes: an earlier Hessian is only a chord matrix, and the first step that
    makes too little progress replaces it. A quadratic merit's Hessian is constant until β
    or a proximal weight changes, so "exact" costs one inversion per change and one
    matrix-vector product per solve. A uniform weight on a node without private variables
    (an ADMM's ρ_i, which residual balancing changes) is a shift of the whole matrix: the
    Hessian is eigendecomposed once and each weight is a `SpectralInverse` (no factorization
    per weight): ProxAL on the MNIST clients (d = 784) inverted 826 matrices for 32 Hessians,
    103 of its 171 s."""
    if fresh or program._hessian_cache is None:
        program._hessian_cache, program._factor_cache = fresh_hessian(program, z), None
    key = weight_x.tobytes()
    cached = program._factor_cache
    if cached is None or cached[0] != key:
        H = program._hessian_cache
        if H.ndim == 1:         # packed diagonal + low rank: Woodbury, else its dense matrix
            inverse = low_rank.inverse(H, low_rank.basis_of(program), weight_x)
            if inverse is not None:
                program._factor_cache = (key, inverse, None)
                return inverse
            if not solvers.dense_fits(weight_x.size):
                program._hessian_cache = program._factor_cache = None   # (no stale packed form)
                raise BeyondBudget()
            H = low_rank.dense(H, low_rank.basis_of(program))
        spectrum = cached[2] if cached is not None else None
        # (a function of the Hessian and the weight only, not of the weights before: a node
        # resumed from its saved state, Hessian and all, takes the same steps bitwise)
        if weight_x.size == H.shape[0] and bool(np.all(weight_x == weight_x[0])):
            spectrum = spectrum if spectrum is not None else np.linalg.eigh(H)
            inverse = SpectralInverse(*spectrum, float(weight_x[0]))
        else:
            A = H.copy()
            A[np.diag_indices(program.n_shared)] += weight_x
            inverse, spectrum = solvers.Inverse(A), None
        program._factor_cache = (key, inverse, spectrum)
    return program._factor_cache[1]


def fresh_hessian(program: NodeProgram, z: np.ndarray) -> np.ndarray:
    """∇²P_i(z) to keep: packed diagonal + low rank for a client with few data rows
    (`low_rank.hessian`, a flat array), else the dense matrix."""
    packed = low_rank.hessian(program, z)
    if packed is None and not solvers.dense_fits(z.size):
        program._hessian_cache = program._factor_cache = None       # (no stale packed form)
        raise BeyondBudget()
    return program.hessian(z) if packed is None else packed


class SpectralInverse(solvers.Inverse):
    """(H + w I)⁻¹ from H's eigendecomposition (values λ, vectors V): applied as
    V diag(1/(λ + w)) Vᵀ, two matrix-vector products, the cost of `Inverse`'s one product of
    an explicit inverse twice over, with no O(n³) work per new w. Singular (None) where some
    λ + w is 0; a shift that leaves the matrix indefinite gives −A⁻¹g as `Inverse` does."""

    __slots__ = ()

    def __init__(self, values: np.ndarray, vectors: np.ndarray, weight: float):
        denominator = values + weight
        self.matrix = _Spectral(vectors, 1.0 / denominator) if np.all(denominator != 0) else None


class _Spectral:
    """The operator V diag(scale) Vᵀ (`SpectralInverse.matrix`: `matrix @ g` as for an array)."""

    __slots__ = ("vectors", "scale")

    def __init__(self, vectors: np.ndarray, scale: np.ndarray):
        self.vectors, self.scale = vectors, scale

    def __matmul__(self, g: np.ndarray) -> np.ndarray:
        return self.vectors @ (self.scale * (self.vectors.T @ g))


def _quadratic_l1(program: NodeProgram, fun_grad, z0, tol, weight_x):
    """A quadratic merit whose prox terms are all λ‖w‖₁: solved exactly by feature-sign
    search on the kept Hessian (`active_set`), or None if that fails (then FISTA)."""
    if program._hessian_cache is None:
        program._hessian_cache, program._factor_cache = fresh_hessian(program, z0), None
    H = program._hessian_cache
    H = low_rank.dense(H, low_rank.basis_of(program)) if H.ndim == 1 else H.copy()
    H[np.diag_indices(program.n_shared)] += weight_x
    c = fun_grad(z0)[1] - H @ z0
    return feature_sign(H, c, _l1_weights(program, z0.size), z0, tol)


def _prox_newton(program: NodeProgram, fun_grad, z0, tol, weight_x, max_steps=100):
    """A smooth non-quadratic merit whose prox terms are all λ‖w‖₁ (a logistic or
    constrained client with an ℓ1 term): proximal Newton — each step minimizes the quadratic
    model plus λ‖w‖₁ exactly (feature-sign search) and backtracks on f + λ‖w‖₁ — else None
    (then FISTA, whose step count grows with the AL penalty's curvature: ~10⁴ steps at β = 300)."""
    lam = _l1_weights(program, z0.size)
    z = z0.copy()
    f, g = fun_grad(z)
    residual, refined = solvers.norm_inf(l1_residual(z, g, lam)), False
    for step in range(max_steps):
        # at tol, one more (quadratically convergent) step: a gradient residual of tol leaves
        # the point tol/curvature away, which consensus methods at eps = tol would not reach
        if residual <= tol and (refined or residual <= 1e-3 * tol):
            return z, step, residual
        refined = residual <= tol
        H = program.hessian(z)
        H[np.diag_indices(program.n_shared)] += weight_x
        model = feature_sign(H, g - H @ z, lam, z, 0.1 * min(residual, tol))
        if model is None:
            return (z, step, residual) if refined else None
        direction = model[0] - z
        decrease = g @ direction + lam @ (np.abs(model[0]) - np.abs(z))   # < 0 unless optimal
        total, t = f + lam @ np.abs(z), 1.0
        while True:
            candidate = z + t * direction
            new_f, new_g = fun_grad(candidate)
            new_residual = solvers.norm_inf(l1_residual(candidate, new_g, lam))
            if solvers.accepted(new_f + lam @ np.abs(candidate), total, t, decrease,
                                new_residual, residual):
                break
            t *= 0.5
            if t < 1e-10:
                return (z, step, residual) if refined else None
        z, f, g, residual = candidate, new_f, new_g, new_residual
    return None


def _l1_weights(program: NodeProgram, size: int) -> np.ndarray:
    """λ per unknown of (x, y): the node's λ‖w‖₁ weights on the shared entries, 0 elsewhere."""
    lam = np.zeros(size)
    shared = program.shared
    for term in program.merit_ir.prox_terms:
        i = shared.variables.index(term.variable)
        lam[shared.offsets[i]:shared.offsets[i + 1]] += term.weight()
    return lam
