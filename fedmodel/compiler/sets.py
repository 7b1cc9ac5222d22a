"""Compiler pass: recognize simple constraints on a shared variable — a norm ball
`norm2(x) <= r`, bounds `x <= u`, `x >= l`, nonnegativity — so a backend can handle them by
projection (a prox step on the server) instead of the augmented Lagrangian, and the KKT
certificate can use their normal cones exactly.

Each prox-able piece (these sets, and terms like λ‖x‖₁) is a `ProxTerm` with the same small
interface: `prox(v, t)`, `value(x)`, `remainder(x, g)` (g + the element of t∂ closest to −g).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..atoms import Add, Neg, Norm1, Norm2
from ..constraints import Constraint, Inequality
from ..expression import Constant, Expression, Variable

ACTIVE = 1e-7


@dataclass
class ProxTerm:
    variable: Variable
    prox: Callable[[np.ndarray, float], np.ndarray]
    value: Callable[[np.ndarray], float]
    remainder: Callable[[np.ndarray, np.ndarray], np.ndarray]
    label: str
    constraint: Constraint | None = None


def norm1_term(var: Variable, weight: float) -> ProxTerm:
    def remainder(x, g):
        return np.where(x != 0, g + weight * np.sign(x), np.sign(g) * np.maximum(np.abs(g) - weight, 0.0))
    return ProxTerm(var, lambda v, t: Norm1.prox(v, t * weight),
                    lambda x: weight * float(np.abs(x).sum()), remainder, f"{weight:g}·norm1({var.name})")


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
    return ProxTerm(var, project, lambda x: 0.0, remainder, f"‖{var.name}‖₂ ≤ {radius:g}", constraint)


def _upper(var: Variable, bound: np.ndarray, constraint: Constraint) -> ProxTerm:
    def remainder(x, g):
        active = x >= bound - ACTIVE * np.maximum(1.0, np.abs(bound))
        return np.where(active, np.maximum(g, 0.0), g)
    return ProxTerm(var, lambda v, t: np.minimum(v, bound), lambda x: 0.0, remainder,
                    f"{var.name} ≤ u", constraint)


def _lower(var: Variable, bound: np.ndarray, constraint: Constraint) -> ProxTerm:
    def remainder(x, g):
        active = x <= bound + ACTIVE * np.maximum(1.0, np.abs(bound))
        return np.where(active, np.minimum(g, 0.0), g)
    return ProxTerm(var, lambda v, t: np.maximum(v, bound), lambda x: 0.0, remainder,
                    f"{var.name} ≥ l", constraint)


def _constant(expr: Expression) -> np.ndarray | None:
    if type(expr) is Constant:
        return np.asarray(expr.value, float)
    return None


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
    if isinstance(core, Norm2) and shared(core.args[0]) and offset.size == 1 and -offset > 0:
        return _ball(core.args[0], float(-offset.item()), constraint)
    if shared(core):                                   # x + c <= 0  ->  x <= -c
        return _upper(core, np.broadcast_to(-offset, core.shape).copy(), constraint)
    if isinstance(core, Neg) and shared(core.args[0]):  # -x + c <= 0  ->  x >= c
        var = core.args[0]
        return _lower(var, np.broadcast_to(offset, var.shape).copy(), constraint)
    return None
