"""Lower a whole model (a `fedmodel.problem.Problem`) to one centralized `cvxpy.Problem`."""
from __future__ import annotations

from typing import Any, Protocol

from ..constraints import Constraint, Equality
from ..expression import Constant, Expression, Leaf, Variable, is_sparse, postorder
from .to_cvxpy import CvxpyContext, to_cvxpy

# constants up to this many entries are compared by value (`structural_key`), larger ones by
# identity: a data-reading constraint's matrix is not hashed byte by byte
COMPARED_BY_VALUE = 4096


class CentralModel(Protocol):
    """What the lowering reads of a model: its variables, total objective and constraints (the
    problem layer sits above this one and is not imported here)."""

    @property
    def objective(self) -> Expression: ...

    @property
    def constraints(self) -> list[Constraint]: ...

    def variables(self) -> list[Variable]: ...


def lower_problem(problem: CentralModel) -> tuple[Any, CvxpyContext, dict[str, Any]]:
    """(cvxpy problem, leaf context, {constraint name: cvxpy constraint}).

    A constraint written again with the same expression (the same ball on every client) is
    lowered once and its name maps to that one cvxpy constraint: k copies of an active
    constraint have no unique multipliers, and Clarabel stopped "inaccurate" on them (five
    clients' ‖w‖ ≤ r at data ×1e-6 came back 8.4e-3 off, newuser13). A caller reading
    multipliers splits the one constraint's among the names that share it (`sharing`)."""
    import cvxpy as cp
    context = CvxpyContext()
    for var in problem.variables():
        context.variable(var)
    objective = to_cvxpy(problem.objective, context)
    lowered, by_key = {}, {}
    for constraint in problem.constraints:
        key = (isinstance(constraint, Equality), structural_key(constraint.expr))
        if key not in by_key:
            expr = to_cvxpy(constraint.expr, context)
            by_key[key] = (expr == 0) if isinstance(constraint, Equality) else (expr <= 0)
        lowered[constraint.name] = by_key[key]
    return cp.Problem(cp.Minimize(objective), list(by_key.values())), context, lowered


def sharing(lowered: dict[str, Any]) -> dict[str, int]:
    """{name: how many names share its cvxpy constraint} (`lower_problem`'s duplicates)."""
    counts: dict[int, int] = {}
    for constraint in lowered.values():
        counts[id(constraint)] = counts.get(id(constraint), 0) + 1
    return {name: counts[id(constraint)] for name, constraint in lowered.items()}


def structural_key(expr: Expression) -> tuple:
    """A hashable key equal for two expressions that compute the same thing the same way: the
    atoms and their parameters, the same variables and Parameters, constants of equal value
    (small ones by value, large ones by identity)."""
    keys: dict[int, tuple] = {}
    for node in postorder([expr]):
        if isinstance(node, Constant):
            value = node.value
            small = not is_sparse(value) and value.size <= COMPARED_BY_VALUE
            keys[id(node)] = ("constant", value.shape, value.tobytes() if small else id(value))
        elif isinstance(node, Leaf):
            keys[id(node)] = (type(node).__name__, node.uid)
        else:
            keys[id(node)] = (type(node), node.params(), tuple(keys[id(a)] for a in node.args))
    return keys[id(expr)]
