"""A constraint no point can meet, read from its atoms' signs (by every backend before its run,
`Backend.solve`, and by the `cvxpy` backend before its solvers): `g(w) <= c` where g is positive at every point of its domain (built from eˣ and
log(1 + eˣ), which never reach 0) and the constant c is ≤ 0 — Neyman-Pearson with a class-1 loss threshold 0. Its infimum 0 may be
approached (separable data: w running off to infinity) but is never attained, so the model is
infeasible; CVXPY's solvers fail or stop "inaccurate" on it (SCS's point read "converged" with
a relative KKT residual of 1) after minutes of iterations. Read without evaluating client data."""
from __future__ import annotations

import numpy as np

from .atoms.arithmetic import Add, Multiply
from .atoms.elementwise import Exp, Logistic
from .atoms.sums import Sum
from .constraints import Equality, Inequality
from .errors import DataError
from .expression import is_sparse

POSITIVE_ATOMS = (Exp, Logistic)     # f(x) > 0 for every finite x


def _positive(expr) -> bool:
    """Whether `expr` is > 0 entry by entry at every point where it is defined (a sufficient
    reading: False means only 'not shown')."""
    if isinstance(expr, POSITIVE_ATOMS):
        return True
    if isinstance(expr, Sum):           # mean too (a Sum): every entry positive, at least one
        return expr.args[0].size > 0 and _positive(expr.args[0])
    if isinstance(expr, Add):           # nonnegative terms, one of them positive everywhere
        return all(a.is_nonneg() for a in expr.args) and any(_positive(a) for a in expr.args)
    if isinstance(expr, Multiply):      # a positive constant times a positive expression
        for factor, other in (expr.args, expr.args[::-1]):
            value = _constant(factor)
            if value is not None and value.size and np.all(value > 0) and _positive(other):
                return True
        return False
    value = _constant(expr)
    return value is not None and value.size > 0 and bool(np.all(value > 0))


def _constant(expr) -> np.ndarray | None:
    """The value of a constant expression (Parameters at their current values), else None."""
    if not expr.is_constant():
        return None
    try:
        value = expr.value
    except DataError:       # (data held on a client, e.g. a loader's on a Ray or Flower node)
        return None
    return None if value is None or is_sparse(value) else np.asarray(value, dtype=float)


def never_met(problem) -> str | None:
    """A message naming the first constraint of `problem` that no point meets (`g <= c` or
    `g == c` with g positive everywhere and c ≤ 0; `c >= g` alike), or None."""
    for constraint in problem.constraints:
        if not isinstance(constraint, (Inequality, Equality)):
            continue
        pairs = [(constraint.lhs, constraint.rhs)]
        if isinstance(constraint, Equality):
            pairs.append((constraint.rhs, constraint.lhs))
        for positive, bound in pairs:
            value = _constant(bound)
            if value is not None and np.any(value <= 0) and _positive(positive):
                return (f"constraint {constraint!r} can never hold: its left side is positive at "
                        f"every point (exp and logistic never reach 0) and its bound is "
                        f"{float(np.min(value)):g} ≤ 0: the model is infeasible" + (
                            ". Its infimum 0 may be approached (e.g. separable data, w running "
                            "off to infinity) but is not attained; a positive bound (e.g. 1e-3) "
                            "may make it feasible" if np.max(value) == 0 else ""))
    return None
