"""Lower a whole `Problem` to one centralized `cvxpy.Problem`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..constraints import Equality
from .to_cvxpy import CvxpyContext, to_cvxpy

if TYPE_CHECKING:
    from ..problem import Problem


def lower_problem(problem: "Problem") -> tuple[Any, CvxpyContext, dict[str, Any]]:
    """(cvxpy problem, leaf context, {constraint name: cvxpy constraint})."""
    import cvxpy as cp
    context = CvxpyContext()
    for var in problem.variables():
        context.variable(var)
    objective = to_cvxpy(problem.objective, context)
    lowered = {}
    for constraint in problem.constraints:
        expr = to_cvxpy(constraint.expr, context)
        lowered[constraint.name] = (expr == 0) if isinstance(constraint, Equality) else (expr <= 0)
    return cp.Problem(cp.Minimize(objective), list(lowered.values())), context, lowered
