"""Compiler pass: recognize simple constraints on a shared variable — a Euclidean ball however
it is written (`norm2(x) <= r`, `sum_squares(x) <= r**2`, `quad_form(x, I) <= r**2`,
`norm2(x)**2 <= r**2`, `r >= norm2(x)`, `2*norm2(x) <= 2*r`), `norm1(x) <= r`,
`norm_inf(x) <= r`, the same norms of e∘x (e > 0 per entry: an ellipsoid, a weighted ℓ1 ball,
a box — how the equilibration writes a ball on column-scaled w = D v, `set_scaling`), bounds `x <= u`, `x >= l` (also on entries: `x[0] <= 1`), nonnegativity and,
where the caller asks for them (`simple_set(..., affine=True)`), halfspaces `a @ x <= b`,
polyhedra `A @ x <= b` with few rows and affine subspaces `A @ x == b` — so a backend can handle
them by projection (a prox step) instead of the augmented Lagrangian, and the KKT certificate can
use their normal cones exactly. Several sets on one variable are projected on as one set, their
intersection, by Dykstra's algorithm (`compiler.intersections`, `compiler.projection`).

Each prox-able piece (these sets, and terms like λ‖x‖₁) is a `ProxTerm` with the same small
interface: `prox(v, t)`, `value(x)`, `remainder(x, g)` (g + the element of t∂ closest to −g),
and a `kind` ("norm1", "ball2", "ellipsoid", "ball1", "ballinf", "upper", "lower", "halfspace",
"polyhedron", "subspace", "intersection") with, for "norm1", the current weight λ (`weight()`),
so vectorized code can apply the prox without inspecting it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..atoms import Multiply, Norm1, Norm2, NormInf, Power, QuadForm, Square, SumSquares
from ..atoms.prox import soft_threshold
from ..constraints import Constraint, Equality, Inequality
from ..errors import FedModelError
from ..expression import Constant, Expression, Parameter, Variable
from . import projection
from .parameter_sets import coefficient_value, parametric_affine, parametric_parts, parametric_set
from .terms import flatten
from .projection import Ball, Ball1, Box, Ellipsoid, Halfspace, Piece, Subspace, project_l1_ball

AFFINE_ROWS = 64   # a polyhedron A @ x <= b with more rows stays in the augmented Lagrangian

# The certificate's normal cones: a point within ACTIVE (relative) of a set's boundary has the
# boundary's normal cone. Iterative runs stop a few 1e-7 inside a ball (DALD on one node: 5.5e-7
# of the radius), and at 1e-7 such a point read as interior: its whole gradient, 22 % relative
# stationarity, "not a solution" 1e-5 from CVXPY's answer. 1e-5 is two orders below verify's 1e-3.
ACTIVE = 1e-5
ZERO = 1e-8   # |x_j| ≤ ZERO·max(1, ‖x‖∞) counts as 0 in the subdifferential of a nonsmooth term


@dataclass
class ProxTerm:
    variable: Variable
    prox: Callable[[np.ndarray, float], np.ndarray]
    value: Callable[[np.ndarray], float]
    remainder: Callable[[np.ndarray, np.ndarray], np.ndarray]
    label: str
    constraint: Constraint | None = None
    kind: str = ""
    weight: Callable[[], float] | None = None   # λ of a "norm1" term, at its current value
    box: tuple[Any, Any] | None = None          # (lower, upper) per entry, for sets that are boxes
    pieces: tuple[Piece, ...] = ()              # the set as `projection` pieces (flat entries)
    members: tuple["ProxTerm", ...] = ()        # an intersection's sets, as recognized
    # (x, g, zero) -> `residual`, for terms whose kinks are away from 0 (`norm_terms`)
    kinked: Callable[[np.ndarray, np.ndarray, float], np.ndarray] | None = None

    def residual(self, x: np.ndarray, g: np.ndarray, zero: float = ZERO) -> np.ndarray:
        """`remainder` at x with entries within `zero`·max(1, ‖x‖∞) of 0 read as 0 for a term
        (not a set): an iterative method leaves 1e-12 where the answer has 0, and scoring
        sign(1e-12) would charge the full weight λ (the smaller of the two residuals, i.e.
        the exact residual of a point within `zero`); a shifted norm's kinks at its shift
        (`kinked`). Sets' normal cones have their own ACTIVE."""
        x = np.asarray(x, dtype=float)
        if self.kinked is not None:
            return self.kinked(x, g, zero)
        if self.constraint is None:
            tol = zero * max(1.0, float(np.max(np.abs(x), initial=0.0)))
            x = np.where(np.abs(x) <= tol, 0.0, x)
        return self.remainder(x, g)


def norm1_term(var: Variable, weight: Any) -> ProxTerm:
    """λ‖var‖₁; `weight` is a float or a scalar expression over Parameters (read at each use,
    so changing a Parameter's value needs no recompile)."""
    if isinstance(weight, (int, float, np.floating)):
        weight = float(weight)

    def lam() -> float:
        value = coefficient_value(weight)
        if not value >= 0:      # a Parameter set negative after compiling: no longer convex
            raise FedModelError(f"the weight of {weight}·norm1({var.name}) is now {value:g}; "
                                "λ‖w‖₁ needs λ ≥ 0")
        return value

    def remainder(x, g):
        w = lam()
        return np.where(x != 0, g + w * np.sign(x), soft_threshold(g, w))
    label = f"{weight:g}" if isinstance(weight, float) else f"({weight})"
    return ProxTerm(var, lambda v, t: Norm1.prox(v, t * lam()),
                    lambda x: lam() * float(np.abs(x).sum()), remainder,
                    f"{label}·norm1({var.name})", kind="norm1", weight=lam)


def _ball(var: Variable, radius: float, constraint: Constraint) -> ProxTerm:
    def project(v, t):
        norm = np.linalg.norm(v)
        return v if norm <= radius else v * (radius / norm)

    def remainder(x, g):
        norm = np.linalg.norm(x)
        if norm < radius * (1 - ACTIVE):
            return g
        if radius == 0 or norm == 0:     # the point {0}: its normal cone is every direction
            return np.zeros_like(g)
        unit = x / norm
        return g + max(0.0, -float(np.vdot(g, unit))) * unit
    return ProxTerm(var, project, lambda x: 0.0, remainder, f"‖{var.name}‖₂ ≤ {radius:g}",
                    constraint, kind="ball2", pieces=(Ball(radius),))


def _ellipsoid(var: Variable, weights: np.ndarray, radius: float, constraint: Constraint) -> ProxTerm:
    """‖e∘x‖₂ ≤ radius (e = `weights` > 0, x's shape): projected exactly (`Ellipsoid`); on its
    boundary the normal cone is {λe²∘x : λ ≥ 0}, so the remainder adds the part of −g along it."""
    piece = Ellipsoid(weights, radius)

    def remainder(x, g):
        if np.linalg.norm(weights * x) < radius * (1 - ACTIVE):
            return g
        normal = weights ** 2 * x
        size = np.linalg.norm(normal)
        if radius == 0 or size == 0:     # the point {0}
            return np.zeros_like(g)
        return g + max(0.0, -float(np.vdot(g, normal / size))) * (normal / size)
    return ProxTerm(var, _flat(piece.project), lambda x: 0.0, remainder,
                    f"‖e∘{var.name}‖₂ ≤ {radius:g}", constraint, kind="ellipsoid", pieces=(piece,))


def _ball1(var: Variable, radius: float, constraint: Constraint, weights: Any = None) -> ProxTerm:
    """‖x‖₁ ≤ radius, or Σ e_i|x_i| ≤ radius with `weights` e > 0 (x's shape)."""
    e = 1.0 if weights is None else weights

    def remainder(x, g):
        # N(x) = {λ e∘s : λ ≥ 0, s ∈ ∂‖x‖₁} on the boundary: the λ that minimizes ‖g + λ e∘s‖∞
        if np.sum(e * np.abs(x)) < radius * (1 - ACTIVE):
            return g
        if radius == 0:                  # the point {0}
            return np.zeros_like(g)
        zero = np.abs(x) <= ACTIVE * max(1.0, float(np.max(np.abs(x))))

        def residual(lam):
            return np.where(zero, soft_threshold(g, lam * e), g + lam * e * np.sign(x))
        from scipy.optimize import minimize_scalar   # a convex function of one variable
        worst = lambda lam: float(np.max(np.abs(residual(lam)), initial=0.0))  # noqa: E731
        top = float(np.max(np.abs(g) / e, initial=0.0))
        found = minimize_scalar(worst, bounds=(0.0, top), method="bounded",
                                options={"xatol": 1e-12 * max(1.0, top)}).x if top > 0 else 0.0
        return residual(min((0.0, found), key=worst))
    flat = None if weights is None else np.ravel(weights)
    return ProxTerm(var, lambda v, t: project_l1_ball(v, radius, flat), lambda x: 0.0, remainder,
                    f"‖{'' if flat is None else 'e∘'}{var.name}‖₁ ≤ {radius:g}", constraint,
                    kind="ball1", pieces=(Ball1(radius, flat),))


def _ballinf(var: Variable, radius: Any, constraint: Constraint) -> ProxTerm:
    """‖x‖∞ ≤ radius; with `radius` per entry (‖e∘x‖∞ ≤ r: radius r/e), a box."""
    def remainder(x, g):
        if np.all(radius == 0):          # the point {0}
            return np.zeros_like(g)
        active = np.abs(x) >= radius * (1 - ACTIVE)
        return np.where(active, g + np.maximum(0.0, -g * np.sign(x)) * np.sign(x), g)
    limit = np.ravel(np.broadcast_to(radius, var.shape))
    label = f"{radius:g}" if np.ndim(radius) == 0 else "r/e"
    return ProxTerm(var, lambda v, t: np.clip(v, -radius, radius), lambda x: 0.0, remainder,
                    f"‖{var.name}‖∞ ≤ {label}", constraint, kind="ballinf", box=(-radius, radius),
                    pieces=(Box(-limit, limit.copy()),))


def _upper(var: Variable, bound: np.ndarray, constraint: Constraint) -> ProxTerm:
    def remainder(x, g):
        active = x >= bound - ACTIVE * np.maximum(1.0, np.abs(bound))
        return np.where(active, np.maximum(g, 0.0), g)
    return ProxTerm(var, lambda v, t: np.minimum(v, bound), lambda x: 0.0, remainder,
                    f"{var.name} ≤ u", constraint, kind="upper", box=(-np.inf, bound),
                    pieces=(Box(np.full(var.size, -np.inf), np.ravel(bound)),))


def _lower(var: Variable, bound: np.ndarray, constraint: Constraint) -> ProxTerm:
    def remainder(x, g):
        active = x <= bound + ACTIVE * np.maximum(1.0, np.abs(bound))
        return np.where(active, np.minimum(g, 0.0), g)
    return ProxTerm(var, lambda v, t: np.maximum(v, bound), lambda x: 0.0, remainder,
                    f"{var.name} ≥ l", constraint, kind="lower", box=(bound, np.inf),
                    pieces=(Box(np.ravel(bound), np.full(var.size, np.inf)),))


def _flat(function: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray, float], np.ndarray]:
    """A prox (v, t) ↦ … of a set from a projection of flat vectors, for v of any shape."""
    return lambda v, t: function(np.ravel(np.asarray(v, float))).reshape(np.shape(v))


def pieces_term(var: Variable, pieces: tuple[Piece, ...], label: str, constraint: Constraint | None,
                kind: str, box: tuple | None = None, members: tuple = ()) -> ProxTerm:
    """The ProxTerm of the set ∩ `pieces` on `var`: one piece projected in closed form, several
    by Dykstra's algorithm; its remainder from the pieces' tangent cones (`projection`), or,
    where a piece has none (an ℓ1 ball), the members' remainders in turn (an upper bound)."""
    def remainder(x, g):
        shape = np.shape(g)
        # the certificate's ACTIVE, as the single sets' remainders: an iterate 4e-7 inside one
        # of several client balls read as interior at projection.ACTIVE = 1e-7
        found = projection.intersection_residual(list(pieces), np.ravel(np.asarray(x, float)),
                                                 np.ravel(np.asarray(g, float)), ACTIVE)
        if found is not None:
            return found.reshape(shape)
        for member in members:
            g = member.remainder(x, g)
        return g
    return ProxTerm(var, _flat(lambda v: projection.project_intersection(list(pieces), v)),
                    lambda x: 0.0, remainder, label, constraint, kind=kind, box=box,
                    pieces=tuple(pieces), members=tuple(members))


def _scalar_value(terms) -> np.ndarray | None:
    """The sum of `terms` (canonical `Term`s) when they are all plain constants, else None."""
    total = np.zeros(())
    for term in terms:
        if not term.atom.is_constant() or term.atom.parameters() or term.atom.data_owners() \
                or not isinstance(term.coefficient, float):
            return None
        total = total + term.coefficient * np.asarray(term.atom.value, float)
    return total


def _squared_norm_of(atom: Expression) -> tuple[Expression, float] | None:
    """(x, s) when `atom` is s·‖x‖₂² however written: sum_squares(x), quad_form(x, s·I) (s > 0),
    norm2(x)**2, square(norm2(x))."""
    if isinstance(atom, SumSquares):
        return atom.args[0], 1.0
    if isinstance(atom, (Power, Square)) and isinstance(atom.args[0], Norm2) \
            and (isinstance(atom, Square) or atom.p == 2.0):
        return atom.args[0].args[0], 1.0
    if isinstance(atom, QuadForm):
        P = atom.fixed_P()
        if P is not None and P.shape[0] and P[0, 0] > 0 and np.array_equal(P, P[0, 0] * np.eye(P.shape[0])):
            return atom.args[0], float(P[0, 0])
    return None


def _shared(expr: Expression) -> bool:
    return isinstance(expr, Variable) and expr.owner is None


def scaled_shared(expr: Expression) -> tuple[Variable, np.ndarray] | None:
    """(x, d) when `expr` is a shared variable x (d = 1) or d ∘ x with d > 0 constant (a scalar
    or x's shape): how the equilibration writes w = D v (`scaling`), so a set on w is read as
    the set on v it is (a ball of radius r/δ, bounds ÷ D)."""
    if _shared(expr):
        return expr, np.ones(())
    if isinstance(expr, Multiply) and type(expr.args[0]) is Constant and _shared(expr.args[1]):
        d = np.asarray(expr.args[0].value, float)
        if expr.shape == expr.args[1].shape and np.all(d > 0) and np.all(np.isfinite(d)):
            return expr.args[1], d
    return None


def simple_set(constraint: Constraint, affine: bool = False) -> ProxTerm | None:
    """A ProxTerm for a simple constraint on a shared variable, else None: a ball (‖·‖₂ however
    written, ‖·‖₁, ‖·‖∞), bounds; with `affine` also halfspaces, small polyhedra and affine
    subspaces with constant coefficients (`affine_set`). The radius, bounds or offset may be
    Parameters (`parametric_set`)."""
    if isinstance(constraint, (Inequality, Equality)) and (found := parametric_parts(constraint)):
        return parametric_set(constraint, *found, lambda frozen: simple_set(frozen, affine))
    if not isinstance(constraint, Inequality):
        return affine_set(constraint) if affine and isinstance(constraint, Equality) else None
    terms = flatten(constraint.expr)
    others = [t for t in terms if not t.atom.is_constant()]
    offset = _scalar_value([t for t in terms if t.atom.is_constant()])
    if len(others) != 1 or offset is None or not isinstance(others[0].coefficient, float):
        return affine_set(constraint) if affine else None
    c, core = others[0].coefficient, others[0].atom
    bound = -offset / c if c != 0 else None           # c·core + offset <= 0
    # a radius 0 is the point {0}: its projection is 0 (each ball's form handles it); a ball
    # of δ·x (one scalar δ > 0) is the ball of radius r/δ on x, of e∘x an ellipsoid, a
    # weighted ℓ1 ball, a box (`_weighted_ball`)
    ball = scaled_shared(core.args[0]) if type(core) in (Norm2, Norm1, NormInf) else None
    if ball is not None and offset.size == 1 and c > 0 and bound >= 0:
        return _weighted_ball(type(core), ball, float(bound.item()), constraint)
    squared = _squared_norm_of(core)
    ball = scaled_shared(squared[0]) if squared is not None else None
    if ball is not None and offset.size == 1 and c > 0 and bound >= 0:
        return _weighted_ball(Norm2, ball, float(np.sqrt(bound.item() / squared[1])), constraint)
    box = scaled_shared(core)            # bounds on d ∘ x: bounds ÷ d on x
    if box is not None and c != 0 and np.broadcast_shapes(np.shape(bound), core.shape) == core.shape:
        var, limit = box[0], np.broadcast_to(bound / box[1], core.shape).copy()
        return _upper(var, limit, constraint) if c > 0 else _lower(var, limit, constraint)
    return affine_set(constraint) if affine else None


def _weighted_ball(norm: type, found: tuple[Variable, np.ndarray], bound: float,
                   constraint: Constraint) -> ProxTerm:
    """The set norm(d∘x) ≤ bound, `found` = (x, d): with d one number (or all its entries
    equal) the ball of radius bound/d; else (d per entry) an ellipsoid, a weighted ℓ1 ball, or
    for ‖·‖∞ the box |x| ≤ bound/d."""
    var, d = found
    flat = np.ravel(d)
    if flat.size == 1 or np.all(flat == flat[0]):
        return {Norm2: _ball, Norm1: _ball1, NormInf: _ballinf}[norm](
            var, float(bound / flat[0]), constraint)
    d = np.broadcast_to(d, var.shape)
    return _ballinf(var, bound / d, constraint) if norm is NormInf else \
        _ellipsoid(var, d, bound, constraint) if norm is Norm2 else _ball1(var, bound, constraint, d)


def _affine_map(constraint: Constraint) -> tuple[Variable, np.ndarray, np.ndarray] | None:
    """(x, A, b) with `constraint.expr` = A·vec(x) + b, when it is affine in one shared variable x
    with constant coefficients (no Parameter; data only the server's), else None."""
    expr = constraint.expr
    variables = expr.variables()
    if len(variables) != 1 or not _shared(variables[0]) or not expr.is_affine() \
            or expr.parameters() or expr.data_owners() - {"server"}:
        return None
    from ..atoms import multiply, sum as sum_
    from .codegen import Plan
    from .differentiate import grad
    var, rows = variables[0], expr.size
    if isinstance(constraint, Inequality) and rows > AFFINE_ROWS:
        return None
    weights = Parameter(expr.shape, name="row")        # A's row i = ∇ₓ eᵢᵀ(A x + b)
    plan = Plan([expr, grad(sum_(multiply(weights, expr)) if expr.shape else expr, var)], [var])
    zero = np.zeros(var.shape)
    A = np.empty((rows, var.size))
    for i in range(rows):
        unit = np.zeros(rows)
        unit[i] = 1.0
        weights.value = unit.reshape(expr.shape)
        b, row = plan(zero)
        A[i] = np.ravel(np.broadcast_to(row, var.shape))
    return var, A, np.ravel(np.broadcast_to(np.asarray(b, float), expr.shape)).astype(float)


def affine_set(constraint: Constraint) -> ProxTerm | None:
    """A ProxTerm for an affine constraint on one shared variable (`_affine_map`): A x + b <= 0
    as bounds when every row reads one entry ("box"), else a halfspace per row ("halfspace",
    "polyhedron": Dykstra); A x + b == 0 as an affine subspace ("subspace", closed form)."""
    found = _affine_map(constraint)
    if found is None:          # Parameters multiplying the variable: the set at their values
        return parametric_affine(constraint, affine_set) if constraint.expr.parameters() else None
    var, A, b = found
    nonzero = A != 0
    if not np.all(np.any(nonzero, axis=1)):       # a row without x: a constant, not a set
        return None
    label = repr(constraint)
    if isinstance(constraint, Equality):
        return pieces_term(var, (Subspace(A, -b),), label, constraint, "subspace")
    pieces = tuple(Halfspace(a, -bi) for a, bi in zip(A, b))
    return pieces_term(var, pieces, label, constraint, "halfspace" if len(pieces) == 1 else "polyhedron")


AFFINE = ("halfspace", "polyhedron", "subspace")   # the kinds only `affine=True` recognizes


def affine_multipliers(term: ProxTerm, x: np.ndarray, normal: np.ndarray) -> dict[str, np.ndarray]:
    """Multipliers, by constraint name, of the affine constraints (kinds `AFFINE`) a projecting
    backend handled in `term` (one set, or an intersection), from `normal`, an element of the
    set's normal cone at x (flat): the nonnegative (halfspaces; equalities: free) combination of
    the active constraints' normals — with the active balls' and bounds' — closest to it. The
    KKT certificate reads affine constraints through their multipliers (the other backends keep
    them in their augmented Lagrangian), so a backend that projects reports them."""
    from scipy.optimize import lsq_linear
    x, normal = np.ravel(np.asarray(x, float)), np.ravel(np.asarray(normal, float))
    columns, lower, owners = [], [], []       # owners: (constraint, row) or None (not reported)
    for member in term.members or (term,):
        reported = member.kind in AFFINE
        for row, piece in enumerate(p.current() for p in member.pieces):
            if isinstance(piece, Halfspace) and piece.active(x):
                columns.append(piece.a), lower.append(0.0)
                owners.append((member.constraint, row) if reported else None)
            elif isinstance(piece, Subspace):
                for j, a in enumerate(piece.rows):
                    columns.append(a), lower.append(-np.inf)
                    owners.append((member.constraint, j) if reported else None)
            elif isinstance(piece, Ball) and np.linalg.norm(x) >= piece.radius * (1 - projection.ACTIVE):
                columns.append(x / np.linalg.norm(x)), lower.append(0.0)
                owners.append(None)
            elif isinstance(piece, Ellipsoid) and \
                    np.linalg.norm(piece.weights * x) >= piece.radius * (1 - projection.ACTIVE):
                outward = piece.weights ** 2 * x         # the ellipsoid's normal at x
                columns.append(outward / np.linalg.norm(outward)), lower.append(0.0)
                owners.append(None)
            elif isinstance(piece, Box):
                scale = projection.ACTIVE * np.maximum(1.0, np.abs(x))
                for j in np.flatnonzero(x <= piece.lower + scale):
                    columns.append(-np.eye(x.size)[j]), lower.append(0.0), owners.append(None)
                for j in np.flatnonzero(x >= piece.upper - scale):
                    columns.append(np.eye(x.size)[j]), lower.append(0.0), owners.append(None)
    out = {m.constraint.name: np.zeros(m.constraint.shape) for m in term.members or (term,)
           if m.kind in AFFINE}
    if not out or not columns:
        return out
    found = lsq_linear(np.column_stack(columns), normal, bounds=(np.array(lower), np.inf)).x
    for owner, value in zip(owners, found):
        if owner is not None:
            constraint, row = owner
            out[constraint.name].flat[row] += value
    return out
