"""NewtonInner's clients that eliminate their own epigraph slacks (the hinge SVM, the pinball
loss, least absolute deviations after `fedmodel.compiler.epigraph`).

The epigraph rewrite gives a client one private slack t per row of each loss, with rows
t ≥ piece_k(w) (smooth convex pieces of the shared variables) and c·Σ_e ω_e t_e in its
objective. In ProxAL's merit P_{i,k}(w, t) (13) each t_e then appears only in its own rows' AL
terms, in c·ω_e t_e and in the proximal term (1/2β)(t_e − t̄_e)²: for a fixed w, P is a sum of
one-dimensional convex piecewise-quadratic functions of the t_e, whose derivative g_e(t) is
increasing, piecewise linear and concave (a row's AL term switches off as t grows past it).
So each client minimizes over its slacks itself (`minimized_slacks`: Newton on g, every row at
once; from any start at most one step beyond the root, then monotone, finitely many steps),
and sends what a client without private variables sends (`proxal_newton._evaluate`):

- the value ψ(w) = min_t P(w, t) (at trial points too);
- the reduced gradient ∇ψ(w) = ∇_w P(w, t*) (Danskin: ∇_t P(w, t*) = 0);
- the reduced Hessian, the Schur complement H_ww − H_wt H_tt⁻¹ H_tw (H_tt diagonal: a row's
  slack meets no other row), still d + d(d+1)/2 floats.

Minimizing ψ over w is ProxAL's subproblem over (w, t), so the server's certificate reads the
true KKT residual there; the client keeps t* of the run's last point (`settle`, one message at
each subproblem's end) for the multiplier update, the outer tests and the next proximal center.
`refusal` tells the structure from the model (slacks only of the epigraph rewrite, each row's
constraint reading one slack of its shape); anything else keeps Algorithm 2.

Measured (docs/BENCHMARKS.md, branch hinge): bcw's hinge SVM, n = 5, under `prob.solve()`:
converged and verified in 276 round trips (80 Newton steps, 10 outer), where Algorithm 2 ran to
max_iterations after 14,483. Its CPU is the slack solves' (a few gradient evaluations per point,
trial points included): 88 s against main's 82 s, at load ~4.
"""
from __future__ import annotations

import numpy as np

from fedmodel.constraints import Inequality
from fedmodel.errors import FedModelError
from fedmodel.runtime import solvers
from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram
from .proxal_newton_model import prox_value, upper_mask

# ProxAL's β growth and cap where clients eliminate slacks (`proxal_inner.for_slacks`): bcw's SVM at
# ×4 converged in 276 round trips; NewtonInner's ×100 steepens ψ's kinks faster (not re-measured on
# the final code, docs/BENCHMARKS.md, branch hinge); a prototype's subproblems at β ≥ 6.5e5 ran to
# their step cap, hence 1e6
SLACK_BETAS = (4.0, 1e6)
SLACK_STEPS = 60        # Newton steps on the slacks' derivatives at most (finite: a few per piece)
SLACK_TOL = 1e-13       # ... to |∂P/∂t_e| ≤ SLACK_TOL × (the row's scale of ∂P/∂t), or round-off


def refusal(private: list, constraints: list) -> str:
    """Why these private variables cannot be eliminated row by row ("" when they can): every
    one an epigraph slack (`epigraph_slope`, set by `compiler.epigraph` alone), every
    constraint reading one an inequality reading that one alone, of its shape."""
    if not private:
        return ""
    plain = [v.name for v in private if getattr(v, "epigraph_slope", None) is None]
    if plain:
        return f"private variables other than an epigraph's slacks ({', '.join(plain[:3])})"
    uids = {v.uid for v in private}
    for c in constraints:
        mine = [v for v in c.expr.variables() if v.uid in uids]
        if mine and (not isinstance(c, Inequality) or len({v.uid for v in mine}) > 1
                     or c.expr.shape != mine[0].shape or not c.expr.is_convex()):
            return f"constraint {c.name!r} reads a slack outside the epigraph's row pattern"
    return ""


def block_refusal(block) -> str:
    """`refusal` of a client block of the model (`proxal_inner.newton_reading`)."""
    return refusal(list(getattr(block, "private_variables", [])), list(block.constraints))


def program_refusal(program: NodeProgram) -> str:
    """`refusal` of a node program, naming it (`proxal_newton._terms`)."""
    why = refusal(list(program.private.variables), list(program.all_constraints))
    size = program.n_shared + program.n_private
    if not why and program.n_private and not solvers.dense_fits(size):   # (`reduced` forms it whole)
        why = f"its {size} × {size} Hessian with its slacks is beyond the dense Newton budget"
    return f"node {program.name!r}: {why}" if why else ""


def _slack_gradient(program: NodeProgram, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """∂P/∂t at (x, y)."""
    return program.compiled.gradient_z(x, y)[program.n_shared:]


def minimized_slacks(program: NodeProgram, x: np.ndarray, y0: np.ndarray) -> np.ndarray:
    """t* = argmin_t P(x, t) from y0: Newton on the rows' increasing concave piecewise-linear
    derivatives g_e, each slope the secant over a short step to the left (at least the slope to
    the right, so the tangent lies above g: after one step every row approaches its root from
    the left, entering a new piece each step, and lands on it in its piece)."""
    y = np.array(y0, dtype=float)
    g = _slack_gradient(program, x, y)
    scale = np.abs(g) + 1.0
    for _ in range(SLACK_STEPS):
        if not np.max(np.abs(g) / scale, initial=0.0) > SLACK_TOL:
            break
        h = 1e-6 * np.maximum(1.0, np.abs(y))
        slope = (g - _slack_gradient(program, x, y - h)) / h
        if not np.all(slope > 0):
            raise FedModelError(f"node {program.name!r}: its merit is not strictly convex in its "
                                "epigraph slacks (no proximal term on them)")
        # rows already at their root stay (their step would be round-off)
        y = np.where(np.abs(g) / scale > SLACK_TOL, y - g / slope, y)
        g = _slack_gradient(program, x, y)
    return y


def reduced(program: NodeProgram, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(P, ∇_x P, H_xx − H_xy diag(H_yy)⁻¹ H_yx) at (x, y = t*): ψ's value, gradient and Hessian."""
    value, g = program.value_grad(x, y)
    n = program.n_shared
    H = program.hessian(np.concatenate([x, y]))
    cross, diagonal = H[:n, n:], np.diag(H)[n:]
    off = H[n:, n:] - np.diag(diagonal)
    if np.any(off) or not np.all(diagonal > 0):
        raise FedModelError(f"node {program.name!r}: its slacks' Hessian block is not a positive "
                            "diagonal (not the epigraph's rows)")
    return float(value), g[:n].copy(), H[:n, :n] - (cross / diagonal) @ cross.T


def _at(program: NodeProgram, x: np.ndarray, y0: np.ndarray, d: np.ndarray) -> tuple[float, float]:
    """(ψ(x) + the node's prox terms, ψ's derivative along d at x): t from y0."""
    value, g = program.value_grad(x, minimized_slacks(program, x, y0))
    return float(value) + prox_value(program, x), float(g[:program.n_shared] @ d)


def group_replies(group, members: list[str], rows, z: np.ndarray, request: dict, summed: bool) -> dict:
    """`replies` as `proxal_newton._evaluate` sends them (the Hessian's upper triangle), per
    member or summed over them (`_evaluate_sum`)."""
    each = replies(group, rows, z, request)
    for r in each:
        r["hessian"] = r["hessian"][upper_mask(group.n_x)]
    if summed:
        return {key: sum(r[key] for r in each) for key in each[0]}
    return dict(zip(members, each))


def replies(group, rows, z: np.ndarray, request: dict) -> list[dict]:
    """`proxal_newton._evaluate`'s numbers of the members `rows` that eliminate their slacks:
    per member {"value": ψ + λ‖z‖₁, "grad", "hessian" (d × d), "values" (ψ + λ‖·‖₁ at the
    request's trial points z + o_j·d, when it has a direction)}."""
    out = []
    direction = request.get("direction")
    for r in rows:
        program = group.programs[r]
        y = minimized_slacks(program, z, program.y)
        value, grad, hessian = reduced(program, z, y)
        found = {"value": value + prox_value(program, z), "grad": grad, "hessian": hessian}
        if direction is not None:
            d = np.asarray(direction, float)
            at = [_at(program, z + o * d, y, d) for o in np.ravel(np.asarray(request["offsets"], float))]
            found["values"] = np.array([v for v, _ in at])
            found["slopes"] = np.array([s for _, s in at])
        out.append(found)
    return out


@procedure("proxal_newton_settle", {"x": "x"}, {})
def settle(program: NodeProgram, x) -> dict:
    """The client's slacks to their minimizer at the subproblem's answer x (`minimized_slacks`):
    the state ProxAL's multiplier update and outer tests read, and the next proximal center."""
    if program.n_private:
        program.y = minimized_slacks(program, np.asarray(x, float), program.y)
        program.compiled.forget()
    return {}
