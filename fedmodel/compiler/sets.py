"""Compiler pass: recognize simple constraints on a shared variable — a norm ball
`norm2(x) <= r`, `norm1(x) <= r`, `norm_inf(x) <= r`, bounds `x <= u`, `x >= l`,
nonnegativity — so a backend can handle them by
projection (a prox step on the server) instead of the augmented Lagrangian, and the KKT
certificate can use their normal cones exactly.

Each prox-able piece (these sets, and terms like λ‖x‖₁) is a `ProxTerm` with the same small
interface: `prox(v, t)`, `value(x)`, `remainder(x, g)` (g + the element of t∂ closest to −g),
and a `kind` ("norm1", "ball2", "ball1", "ballinf", "upper", "lower") with, for "norm1", the
current weight λ (`weight()`), so vectorized code can apply the prox without inspecting it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..atoms import Add, Neg, Norm1, Norm2, NormInf
from ..atoms.prox import soft_threshold
from ..constraints import Constraint, Inequality
from ..errors import FedModelError
from ..expression import Constant, Expression, Variable

ACTIVE = 1e-7
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

    def residual(self, x: np.ndarray, g: np.ndarray, zero: float = ZERO) -> np.ndarray:
        """`remainder` at x with entries within `zero`·max(1, ‖x‖∞) of 0 read as 0 for a term
        (not a set): an iterative method leaves 1e-12 where the answer has 0, and scoring
        sign(1e-12) would charge the full weight λ (the smaller of the two residuals, i.e.
        the exact residual of a point within `zero`). Sets' normal cones have their own ACTIVE."""
        x = np.asarray(x, dtype=float)
        if self.constraint is None:
            tol = zero * max(1.0, float(np.max(np.abs(x), initial=0.0)))
            x = np.where(np.abs(x) <= tol, 0.0, x)
        return self.remainder(x, g)


def coefficient_value(c: Any) -> float:
    """The current value of a coefficient: a float, or a scalar expression over Parameters
    (at their present value)."""
    if isinstance(c, float):
        return c
    value = c.value
    if value is None:
        raise FedModelError(f"the coefficient {c} has no value: give its Parameters a value "
                            "before compiling")
    return float(np.asarray(value).item())


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
        unit = x / norm
        return g + max(0.0, -float(np.vdot(g, unit))) * unit
    return ProxTerm(var, project, lambda x: 0.0, remainder, f"‖{var.name}‖₂ ≤ {radius:g}",
                    constraint, kind="ball2")


def project_l1_ball(v: np.ndarray, radius: float) -> np.ndarray:
    """Euclidean projection onto {x : ‖x‖₁ ≤ radius} (sort-based, Duchi et al. 2008)."""
    a = np.abs(np.ravel(v))
    if a.sum() <= radius:
        return v
    u = np.sort(a)[::-1]
    cumulative = np.cumsum(u) - radius
    k = np.nonzero(u * np.arange(1, u.size + 1) > cumulative)[0][-1]
    theta = cumulative[k] / (k + 1.0)
    return soft_threshold(v, theta)


def _ball1(var: Variable, radius: float, constraint: Constraint) -> ProxTerm:
    def remainder(x, g):
        # N(x) = {λ s : λ ≥ 0, s ∈ ∂‖x‖₁} on the boundary: the λ that minimizes ‖g + λ s‖∞
        if np.abs(x).sum() < radius * (1 - ACTIVE):
            return g
        zero = np.abs(x) <= ACTIVE * max(1.0, float(np.max(np.abs(x))))

        def residual(lam):
            return np.where(zero, soft_threshold(g, lam), g + lam * np.sign(x))
        from scipy.optimize import minimize_scalar   # a convex function of one variable
        worst = lambda lam: float(np.max(np.abs(residual(lam)), initial=0.0))  # noqa: E731
        top = float(np.max(np.abs(g), initial=0.0))
        found = minimize_scalar(worst, bounds=(0.0, top), method="bounded",
                                options={"xatol": 1e-12 * max(1.0, top)}).x if top > 0 else 0.0
        return residual(min((0.0, found), key=worst))
    return ProxTerm(var, lambda v, t: project_l1_ball(v, radius), lambda x: 0.0, remainder,
                    f"‖{var.name}‖₁ ≤ {radius:g}", constraint, kind="ball1")


def _ballinf(var: Variable, radius: float, constraint: Constraint) -> ProxTerm:
    def remainder(x, g):
        active = np.abs(x) >= radius * (1 - ACTIVE)
        return np.where(active, g + np.maximum(0.0, -g * np.sign(x)) * np.sign(x), g)
    return ProxTerm(var, lambda v, t: np.clip(v, -radius, radius), lambda x: 0.0, remainder,
                    f"‖{var.name}‖∞ ≤ {radius:g}", constraint, kind="ballinf", box=(-radius, radius))


def _upper(var: Variable, bound: np.ndarray, constraint: Constraint) -> ProxTerm:
    def remainder(x, g):
        active = x >= bound - ACTIVE * np.maximum(1.0, np.abs(bound))
        return np.where(active, np.maximum(g, 0.0), g)
    return ProxTerm(var, lambda v, t: np.minimum(v, bound), lambda x: 0.0, remainder,
                    f"{var.name} ≤ u", constraint, kind="upper", box=(-np.inf, bound))


def _lower(var: Variable, bound: np.ndarray, constraint: Constraint) -> ProxTerm:
    def remainder(x, g):
        active = x <= bound + ACTIVE * np.maximum(1.0, np.abs(bound))
        return np.where(active, np.minimum(g, 0.0), g)
    return ProxTerm(var, lambda v, t: np.maximum(v, bound), lambda x: 0.0, remainder,
                    f"{var.name} ≥ l", constraint, kind="lower", box=(bound, np.inf))


def _constant(expr: Expression) -> np.ndarray | None:
    if type(expr) is Constant:
        return np.asarray(expr.value, float)
    return None


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


def simple_set(constraint: Constraint) -> ProxTerm | None:
    """A ProxTerm for a simple inequality on a shared variable, else None."""
    if not isinstance(constraint, Inequality):
        return None
    expr = constraint.expr
    parts = list(expr.args) if isinstance(expr, Add) else [expr]
    constants = [p for p in parts if _constant(p) is not None]
    others = [p for p in parts if _constant(p) is None]
    if len(others) != 1 or len(constants) > 1:
        return None
    offset = _constant(constants[0]) if constants else np.zeros(())
    core = others[0]
    shared = lambda e: isinstance(e, Variable) and e.owner is None  # noqa: E731
    balls = {Norm2: _ball, Norm1: _ball1, NormInf: _ballinf}
    if type(core) in balls and shared(core.args[0]) and offset.size == 1 and -offset > 0:
        return balls[type(core)](core.args[0], float(-offset.item()), constraint)
    if shared(core):                                   # x + c <= 0  ->  x <= -c
        return _upper(core, np.broadcast_to(-offset, core.shape).copy(), constraint)
    if isinstance(core, Neg) and shared(core.args[0]):  # -x + c <= 0  ->  x >= c
        var = core.args[0]
        return _lower(var, np.broadcast_to(offset, var.shape).copy(), constraint)
    return None
