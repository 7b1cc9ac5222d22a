"""Compiler pass: do the sets that read no client data meet? (issue 25, item 4)

Within one node the compiler refuses an empty intersection of the sets it projects on
(`intersections.check_sets_meet`). Across nodes nothing did: `c0.subject_to(w <= -1)`,
`c1.subject_to(w >= 1)` ran every backend to a cap or a blow-up ("diverged" after 1,200 ADMM
iterations, FedADMM's 1,000 rounds). `sets_apart` intersects, per shared variable, every
node's *data-free* sets on it — a box, a Euclidean ball (centred, or `norm2(w - c) <= r`),
a halfspace, a small polyhedron, an affine subspace, whose numbers are constants, Parameters
(at their present values) or the server's own data — and says which constraints leave no
common point. A constraint that reads a client's data is never looked at: the server must not
learn it (privacy), and the run decides it as before.

What it proves (sound, not complete): the sets' intersection is empty even after each is
widened by MARGIN of the largest number that defines them (bounds, radii, offsets, centres), so
constants equal up to round-off (`w <= 0.3`, `w >= 0.1 * 3`) and sets that touch in one point
(`w <= 0`, `w >= 0`; a ball and a tangent halfspace) are never called apart, and sets apart by
less than MARGIN are left to the run (whose verdict is what it was). The linear part and the
centred balls go to `projection.is_empty` (a linear program, then the least-norm point of the
polyhedron against the smallest ball), in units where the largest number is 1 so that the LP's
absolute tolerance (1e-7) is below the margin; a shifted ball is apart from the rest when its
centre is farther than its radius from one of the other sets (exact projections) or from
another ball's centre by more than the two radii. ℓ1 balls are not checked.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..atoms import Norm2
from ..constraints import Constraint, Equality, Inequality
from ..expression import Variable
from . import projection
from .parameter_sets import coefficient_value
from .norm_terms import shifted_norm
from .projection import Ball, Box, Halfspace, Subspace
from .sets import AFFINE_ROWS, simple_set
from .terms import flatten

MARGIN = 1e-6      # sets nearer than this (relative to the variable's largest number) may meet
NAMED = 64         # with more sets on a variable, all are named (no search for the few that clash)


@dataclass
class Shifted:
    """‖x − centre‖₂ ≤ radius over a variable's flat entries."""
    centre: np.ndarray
    radius: float


@dataclass
class Apart:
    """The constraints whose sets on `variable` have no common point, and why in words."""
    variable: Variable
    constraints: list[Constraint] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.constraints]

    @property
    def message(self) -> str:
        listed = "; ".join(f"{c.name!r} of {c.owner} ({c.lhs} {c.relation} {c.rhs})"
                           for c in self.constraints)
        return (f"the constraints {listed} leave no common point of {self.variable.label}: the "
                "model is infeasible (decided before the run, from the sets that read no client "
                "data; no iterations were run)")


def sets_apart(problem) -> Apart | None:
    """The first shared variable whose data-free sets (module docstring) do not meet, with the
    fewest of its constraints that still do not meet (a deletion search), or None."""
    found: dict[int, list[tuple[Constraint, list]]] = {}
    variables: dict[int, Variable] = {}
    for constraint in problem.constraints:
        recognized = _data_free_set(constraint)
        if recognized is not None:
            var, pieces = recognized
            variables[var.uid] = var
            found.setdefault(var.uid, []).append((constraint, pieces))
    for uid, items in found.items():
        if sum(len(pieces) for _, pieces in items) < 2:     # one set (a polyhedron's rows: several)
            continue
        items = _in_unit_scale(items)
        if not _empty([p for _, pieces in items for p in pieces]):
            continue
        if len(items) <= NAMED:     # drop each set whose removal leaves the rest still apart
            for item in list(items):
                rest = [other for other in items if other is not item]
                if _empty([p for _, pieces in rest for p in pieces]):
                    items = rest
        return Apart(variables[uid], [c for c, _ in items])
    return None


def feasible_by_its_sets(problem) -> bool:
    """The model has a point: its constraints are sets that read no data and meet (`sets_meet`)
    and its objective is defined everywhere (no log, sqrt or power off {2, 4, …}: a domain can
    empty a model whose sets meet). A run's "infeasible" on such a model is not the truth."""
    return all(map(_defined_everywhere, problem.objective_terms)) and sets_meet(problem)


def _defined_everywhere(expr) -> bool:
    """No atom of `expr` has a restricted domain (`Atom.defined_everywhere`)."""
    return getattr(expr, "defined_everywhere", True) and \
        all(_defined_everywhere(arg) for arg in getattr(expr, "args", ()))


def sets_meet(problem) -> bool:
    """Whether the model is feasible as far as its sets decide it: every constraint is a
    data-free set on one shared variable (`_data_free_set`) and each variable's sets meet —
    within MARGIN, so sets apart by less are taken to meet; a verdict this overturns becomes
    "stalled", never "converged". False (undecided) when a constraint reads client data,
    couples variables or holds a private one, or when there is none."""
    found: dict[int, list[tuple[Constraint, list]]] = {}
    for constraint in problem.constraints:
        recognized = _data_free_set(constraint)
        if recognized is None:
            return False
        found.setdefault(recognized[0].uid, []).append((constraint, recognized[1]))
    for items in found.values():
        raw = [p for _, pieces in items for p in pieces]
        # (ℓ1 balls, which `_in_unit_scale` drops, and a zero row are not decided here)
        if not all(isinstance(p, (Box, Ball, Shifted, Halfspace, Subspace)) for p in raw) or \
                any(isinstance(p, Halfspace) and not p.norm2 > 0 for p in raw):
            return False
        pieces = [p for _, pieces in _in_unit_scale(items) for p in pieces]
        fixed = [p for p in pieces if isinstance(p, (Box, Ball, Halfspace))]
        # (`_empty` reads one fixed piece as meeting: a lone box or halfspace is checked here)
        if _empty(pieces) or (len(fixed) == 1 and _fixed_empty(fixed)):
            return False
    return bool(found)


def _data_free_set(constraint: Constraint) -> tuple[Variable, list] | None:
    """(shared variable, pieces) of a constraint that is a simple set on one shared variable and
    reads no client's data, else None (a set the compiler cannot read — a Parameter radius < 0,
    rows it cannot factor — is left to the run, which says what is wrong with it: the check
    never makes a solve fail that ran before)."""
    expr = constraint.expr
    variables = expr.variables()
    if len(variables) != 1 or variables[0].owner is not None or expr.data_owners() - {"server"} \
            or (isinstance(constraint, Equality) and constraint.size > AFFINE_ROWS):   # (an SVD of it)
        return None
    try:
        term = simple_set(constraint, affine=True)
        if term is not None:
            return term.variable, [p.current() for p in term.pieces]
        return _shifted_ball(constraint)
    except (ValueError, ArithmeticError):     # FedModelError and numpy's LinAlgError among them
        return None


def _shifted_ball(constraint: Constraint) -> tuple[Variable, list] | None:
    """λ‖w − a‖₂ + offset ≤ 0 (`norm_terms.shifted_norm` reads c·‖k·w + b‖₂ so; a, offset
    constants or Parameters): the ball of centre a, radius −offset/λ, when that radius is ≥ 0."""
    if not isinstance(constraint, Inequality):
        return None
    terms = flatten(constraint.expr)
    moving = [t for t in terms if not t.atom.is_constant()]
    found = shifted_norm(moving[0]) if len(moving) == 1 and isinstance(moving[0].atom, Norm2) else None
    offset = _total([t for t in terms if t.atom.is_constant()])
    if found is None or np.size(offset) != 1:
        return None
    var, norm = found
    lam = norm.lam()
    radius = -float(np.ravel(offset)[0]) / lam if lam > 0 else -1.0
    if not radius >= 0:
        return None
    return var, [Shifted(np.ravel(norm.shift()), radius)]


def _total(terms) -> np.ndarray:
    """The value of a sum of constant terms at the Parameters' present values."""
    total = np.zeros(())
    for t in terms:
        total = total + coefficient_value(t.coefficient) * np.asarray(t.atom.value, float)
    return total


def _in_unit_scale(items: list[tuple[Constraint, list]]) -> list[tuple[Constraint, list]]:
    """The pieces divided by the variable's largest number S and widened by MARGIN (units where
    S is 1): boxes, balls and halfspaces (rows of norm 1) as such, an affine subspace as a slab
    of halfspaces, ℓ1 balls dropped (not checked)."""
    scale = max([_size(p) for _, pieces in items for p in pieces] + [0.0]) or 1.0
    out = []
    for constraint, pieces in items:
        widened = []
        for p in pieces:
            if isinstance(p, Box):
                widened.append(Box(p.lower / scale - MARGIN, p.upper / scale + MARGIN))
            elif isinstance(p, Ball):
                widened.append(Ball(p.radius / scale + MARGIN))
            elif isinstance(p, Shifted):
                widened.append(Shifted(p.centre / scale, p.radius / scale + MARGIN))
            elif isinstance(p, Halfspace):
                norm = np.sqrt(p.norm2)
                widened.append(Halfspace(p.a / norm, p.b / norm / scale + MARGIN))
            elif isinstance(p, Subspace):
                for q, value in zip(p.Q, p.Q @ p.point):
                    widened += [Halfspace(q, value / scale + MARGIN), Halfspace(-q, -value / scale + MARGIN)]
        out.append((constraint, widened))
    return out


def _size(piece) -> float:
    """The largest finite number that defines a piece (0 for a cone at the origin)."""
    if isinstance(piece, Box):
        bounds = np.concatenate([piece.lower, piece.upper])
        return float(np.max(np.abs(bounds[np.isfinite(bounds)]), initial=0.0))
    if isinstance(piece, Shifted):
        return max(piece.radius, float(np.max(np.abs(piece.centre), initial=0.0)))
    if isinstance(piece, Halfspace):
        return abs(piece.b) / np.sqrt(piece.norm2)
    if isinstance(piece, Subspace):
        return float(np.max(np.abs(piece.point), initial=0.0))
    return getattr(piece, "radius", 0.0)


def _empty(pieces: list) -> bool:
    """Whether the (widened, unit-scale) pieces provably have no common point."""
    fixed = [p for p in pieces if isinstance(p, (Box, Ball, Halfspace))]
    shifted = [p for p in pieces if isinstance(p, Shifted)]
    if len(fixed) > 1 and _fixed_empty(fixed):
        return True
    for i, ball in enumerate(shifted):
        # a lower bound on the distance from the centre to ∩ fixed: its largest to one piece
        if any(float(np.linalg.norm(ball.centre - p.project(ball.centre))) > ball.radius for p in fixed):
            return True
        if any(float(np.linalg.norm(ball.centre - other.centre)) > ball.radius + other.radius
               for other in shifted[i + 1:]):
            return True
    return False


def _fixed_empty(pieces: list) -> bool:
    """Boxes and centred balls alone in closed form (the box's least-norm point against the
    smallest ball; no LP to import), anything with a halfspace by `projection.is_empty`."""
    if any(isinstance(p, Halfspace) for p in pieces):
        return projection.is_empty(pieces)
    boxes = [p for p in pieces if isinstance(p, Box)]
    if not boxes:
        return False                      # centred balls all hold 0
    lower = np.max([b.lower for b in boxes], axis=0)
    upper = np.min([b.upper for b in boxes], axis=0)
    if np.any(lower > upper):
        return True
    radii = [p.radius for p in pieces if isinstance(p, Ball)]
    return bool(radii) and float(np.linalg.norm(np.clip(0.0, lower, upper))) > min(radii)
