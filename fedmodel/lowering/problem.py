"""Lower a whole model (a `fedmodel.problem.Problem`) to one centralized `cvxpy.Problem`."""
from __future__ import annotations

from typing import Any, Protocol

from ..constraints import Constraint, Equality
from ..expression import Expression, Variable
from .to_cvxpy import CvxpyContext, to_cvxpy


class CentralModel(Protocol):
    """What the lowering reads of a model: its variables, total objective and constraints (the
    problem layer sits above this one and is not imported here)."""

    @property
    def objective(self) -> Expression: ...

    @property
    def constraints(self) -> list[Constraint]: ...

    def variables(self) -> list[Variable]: ...


def lower_problem(problem: CentralModel) -> tuple[Any, CvxpyContext, dict[str, Any]]:
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
