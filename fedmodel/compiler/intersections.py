"""Compiler pass: several sets on one variable — their intersection as one projected set
(`merge_sets`, Dykstra's algorithm in `compiler.projection`), refused when it holds no point
(`check_boxes_meet`, `check_sets_meet`), and whether one node's prox terms applied in turn are the
prox of their sum (`prox_conflict`). The sets themselves are recognized in `compiler.sets`."""
from __future__ import annotations

import numpy as np

from ..errors import FedModelError
from . import projection
from .projection import Box, Subspace
from .sets import ProxTerm, pieces_term


def check_boxes_meet(sets: list[ProxTerm]) -> None:
    """Refuse bounds of one block on one variable that leave no point (a lower bound above an
    upper one): projecting on each in turn would return a point that violates one of them, and
    every backend would report it as a solution."""
    by_variable: dict[int, list[ProxTerm]] = {}
    for term in sets:
        if term.box is not None:
            by_variable.setdefault(term.variable.uid, []).append(term)
    for terms in by_variable.values():
        shape = terms[0].variable.shape
        lower = np.max([np.broadcast_to(t.box[0], shape) for t in terms], axis=0)
        upper = np.min([np.broadcast_to(t.box[1], shape) for t in terms], axis=0)
        if np.any(lower > upper):
            entry = tuple(int(i) for i in np.unravel_index(int(np.argmax(lower - upper)), shape))
            where = f"{terms[0].variable.label}[{', '.join(map(str, entry))}]" if entry else \
                terms[0].variable.label
            names = ", ".join(repr(t.constraint.name) for t in terms)
            raise FedModelError(
                f"the constraints {names} leave no feasible point: they bound {where} below by "
                f"{float(lower[entry]) + 0.0:g} and above by {float(upper[entry]) + 0.0:g}; the "
                "model is infeasible")


BOXES = ("upper", "lower", "ballinf", "box")   # intervals per entry: projected on in turn, exactly


def merge_sets(sets: list[ProxTerm]) -> list[ProxTerm]:
    """The set terms with several sets on one variable, not all boxes, replaced by one term for
    their intersection (projected by Dykstra's algorithm; its bounds as one box piece): projecting
    on each set in turn would return a point of the last set, not the projection onto all.
    Boxes alone are left as they are (clipping entry by entry in turn is exact)."""
    by_variable: dict[int, list[ProxTerm]] = {}
    for term in sets:
        by_variable.setdefault(term.variable.uid, []).append(term)
    out: list[ProxTerm] = []
    for terms in by_variable.values():
        if len(terms) == 1 or all(t.kind in BOXES for t in terms):
            out.extend(terms)
            continue
        var = terms[0].variable
        boxes = [p for t in terms for p in t.pieces if isinstance(p, Box)]
        pieces = _distinct([p for t in terms for p in t.pieces if not isinstance(p, Box)])
        if boxes:
            pieces.insert(0, Box(np.max([b.lower for b in boxes], axis=0),
                                 np.min([b.upper for b in boxes], axis=0)))
        subspaces = [p for p in pieces if isinstance(p, Subspace)]
        if len(subspaces) > 1:      # equalities together: one affine subspace, in closed form
            pieces = [p for p in pieces if not isinstance(p, Subspace)] + [Subspace(
                np.vstack([s.Q for s in subspaces]), np.concatenate([s.Q @ s.point for s in subspaces]))]
        out.append(pieces_term(var, tuple(pieces), " ∩ ".join(t.label for t in terms),
                               terms[0].constraint, "intersection", members=tuple(terms)))
    return out


def _distinct(pieces: list) -> list:
    """`pieces` with repeats of one constant set dropped: n clients' equal balls moved to one
    server were n projections per Dykstra sweep (half of a Newton run's time at n = 200); the
    projection is the same. A piece whose numbers are Parameters (`Parametric`) is kept."""
    seen, out = set(), []
    for piece in pieces:
        key = None
        if not isinstance(piece, projection.Parametric):
            try:
                key = (type(piece).__name__, *((k, np.shape(v), np.asarray(v, float).tobytes())
                                               for k, v in sorted(vars(piece).items())
                                               if not k.startswith("_")))   # (caches: derived)
            except (TypeError, ValueError):
                key = None
        if key is None or key not in seen:
            out.append(piece)
            seen.add(key)
    return out


def check_sets_meet(sets: list[ProxTerm]) -> None:
    """Refuse an intersection of sets on one variable that holds no point (`projection.is_empty`):
    Dykstra's algorithm would not converge on it, and no backend could return a feasible point."""
    for term in sets:
        if len(term.pieces) > 1 and projection.is_empty(list(term.pieces)):
            names = ", ".join(repr(t.constraint.name) for t in term.members) if term.members \
                else repr(term.constraint.name)
            raise FedModelError(
                f"the constraints {names} on {term.variable.label} leave no feasible point "
                f"({term.label}); the model is infeasible")


# sets whose projection after λ‖x‖₁'s prox is the joint prox: each shrinks entries toward 0
# keeping their signs (an ellipsoid's x = y/(1 + θe²) too: the joint KKT is x = S_λ(y)/(1 + θe²))
FACTORING = ("ball2", "ellipsoid", "ball1") + BOXES


def prox_conflict(terms: list[ProxTerm]) -> str | None:
    """Why applying `terms` (one node's) in turn is not the prox of their sum, or None: λ‖x‖₁
    with a set on the same variable factors only for balls and boxes (soft-thresholding, then
    the projection); with a halfspace, a subspace or an intersection it does not."""
    for term in terms:
        if term.kind != "norm1":
            continue
        other = [t for t in terms if t.variable is term.variable and t.constraint is not None
                 and t.kind not in FACTORING]
        if other:
            return (f"{term.label} and the set {other[0].label} on {term.variable.label}: their "
                    "proxes applied in turn are not the prox of their sum; write the ℓ1 term as "
                    "a constraint (norm1(w) <= r), or use backends.ProxAL")
    return None
