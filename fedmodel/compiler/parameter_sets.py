"""Compiler pass: simple sets (`sets.simple_set`) whose radius, bounds or offset hold
Parameters — `norm2(w) <= r`, `w >= l`, `a @ w <= b` with r, l, b Parameters or expressions
of Parameters and constants (`2 * r - 1`, `r ** 2`). The set is the constant one at the
Parameters' present values, read at each projection (a Parameter changes between solves without
recompiling, API.md §2); only the numbers may be Parameters, not the variable's coefficients."""
from __future__ import annotations

from copy import copy
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ..atoms import add
from ..constraints import Constraint
from ..errors import FedModelError
from ..expression import Constant, Parameter
from . import projection
from .terms import flatten


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


def parametric_parts(constraint: Constraint) -> tuple[list, Callable[[], np.ndarray]] | None:
    """(the terms with the variable, the sum of the others as a function of the Parameters'
    present values) when `constraint.expr` is a Parameter-free function of a variable plus
    constants and Parameters (not data) with at least one Parameter, else None."""
    terms = flatten(constraint.expr)
    fixed = [t for t in terms if t.atom.is_constant()]
    moving = [t for t in terms if not t.atom.is_constant()]
    if not moving or not any(t.atom.parameters() or not isinstance(t.coefficient, float) for t in fixed) \
            or any(t.atom.parameters() or not isinstance(t.coefficient, float) for t in moving) \
            or any(t.atom.data_owners() for t in fixed):
        return None

    def offset() -> np.ndarray:
        total = np.zeros(())
        for t in fixed:
            if t.atom.value is None:
                raise FedModelError(f"{constraint.name}: {t.atom} has no value; give its "
                                    "Parameters a value before solving")
            total = total + coefficient_value(t.coefficient) * np.asarray(t.atom.value, float)
        return total
    return moving, offset


def parametric_set(constraint: Constraint, moving: list, offset: Callable[[], np.ndarray],
                   recognize: Callable[[Constraint], Any]) -> Any:
    """The set of `constraint` whose radius, bounds or offset hold Parameters: the constant set
    (`recognize`, i.e. `sets.simple_set`: a `ProxTerm` or None) of `moving` + offset() at the
    Parameters' present values, built again when they change (read at each projection; no
    recompile), or None when it is not a simple set.
    A value that leaves no such set (a radius < 0) is a FedModelError when it is read."""
    cache: dict = {}

    def at(value: np.ndarray):
        key = (value.shape, value.tobytes())
        if cache.get("key") != key:
            frozen = copy(constraint)
            frozen.expr = add(*[t.expression() for t in moving], Constant(value))
            cache.update(key=key, term=recognize(frozen))
        return cache["term"]
    value = offset()
    first = at(value)
    if first is None:    # not a set at this value: a ball's form with a radius ≤ 0 reads as one at −1
        first = at(-np.ones_like(value))
        if first is None or first.kind not in ("ball2", "ellipsoid", "ball1", "ballinf"):
            return None

    def current():
        term = at(offset())
        if term is None or term.kind != first.kind:
            raise FedModelError(f"{constraint.name}: {constraint} at its Parameters' present "
                                "values is not a norm ball of radius ≥ 0 (a radius < 0 leaves no "
                                "point: the model is infeasible); give the radius a value ≥ 0")
        return term
    if first.kind in ("ball2", "ellipsoid", "ball1", "ballinf"):
        current()                        # a radius < 0 now: refused at compile time
    pieces = tuple(projection.Parametric(lambda i=i: current().pieces[i])
                   for i in range(len(first.pieces)))
    return replace(first, prox=lambda v, t: current().prox(v, t), label=repr(constraint),
                   remainder=lambda x, g: current().remainder(x, g), constraint=constraint,
                   pieces=pieces)          # (`box`: the bounds now, for `check_boxes_meet`)


def parametric_affine(constraint: Constraint, recognize: Callable[[Constraint], Any]) -> Any:
    """The affine set of `constraint` (`recognize`: `sets.affine_set`) when Parameters multiply
    the variable (`a @ w <= b` with `a` a Parameter; no client data): the constant set at the
    Parameters' present values, rebuilt when they change (read at each projection, as
    `parametric_set`), or None when it is not an affine set at the present values."""
    expr = constraint.expr
    parameters = expr.parameters()
    if not parameters or expr.data_owners() - {"server"} or any(p.value is None for p in parameters):
        return None
    cache: dict = {}

    def at():
        key = tuple(np.asarray(p.value, float).tobytes() for p in parameters)
        if cache.get("key") != key:
            frozen = copy(constraint)
            frozen.expr = _frozen(expr)
            cache.update(key=key, term=recognize(frozen))
        return cache["term"]
    first = at()
    if first is None:
        return None

    def current():
        term = at()
        if term is None or term.kind != first.kind or len(term.pieces) != len(first.pieces):
            raise FedModelError(f"{constraint.name}: {constraint} at its Parameters' present values "
                                "is no longer an affine set of the same rows (a row of zeros?); "
                                "give the Parameters values that keep every row")
        return term
    pieces = tuple(projection.Parametric(lambda i=i: current().pieces[i])
                   for i in range(len(first.pieces)))
    return replace(first, prox=lambda v, t: current().prox(v, t), label=repr(constraint),
                   remainder=lambda x, g: current().remainder(x, g), constraint=constraint,
                   pieces=pieces)


def _frozen(expr: Any) -> Any:
    """`expr` with each Parameter replaced by a constant of its present value."""
    if isinstance(expr, Parameter):
        return Constant(np.asarray(expr.value, float))
    if not expr.args:
        return expr
    args = [_frozen(a) for a in expr.args]
    return expr if all(a is b for a, b in zip(args, expr.args)) else expr.with_args(*args)
