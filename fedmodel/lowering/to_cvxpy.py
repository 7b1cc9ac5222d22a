"""Lower expressions to CVXPY, atom by atom, so DCP structure is preserved."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..expression import Constant, Expression, Leaf, Parameter, Variable
from ..compiler.codegen import _postorder


class CvxpyContext:
    """Maps our leaves (by uid, never by name) to CVXPY leaves, so one model lowers to one
    consistent problem; CVXPY names are the labels (`c3.s` for client c3's private `s`)."""

    def __init__(self):
        self.leaves: dict[int, Any] = {}

    def leaf(self, node: Leaf) -> Any:
        import cvxpy as cp
        if node.uid not in self.leaves:
            if isinstance(node, Variable):
                self.leaves[node.uid] = cp.Variable(node.shape, name=node.label)
            elif isinstance(node, Parameter):
                param = cp.Parameter(node.shape, name=node.label)
                if node.value is not None:
                    param.value = node.value
                self.leaves[node.uid] = param
            else:
                value = node.value
                self.leaves[node.uid] = cp.Constant(value) if np.ndim(value) else float(value)
        return self.leaves[node.uid]

    def variable(self, var: Variable) -> Any:
        return self.leaf(var)


def to_cvxpy(expr: Expression, context: CvxpyContext | None = None) -> Any:
    """The CVXPY expression of `expr` (variables are created once per `context`).

    >>> import fedmodel as fm
    >>> w = fm.Variable(2, name="w")
    >>> fm.to_cvxpy(fm.norm1(w)).is_convex()
    True
    """
    import cvxpy as cp
    context = context or CvxpyContext()
    memo: dict[int, Any] = {}
    for node in _postorder([expr]):
        if isinstance(node, Leaf):
            memo[id(node)] = context.leaf(node)
        else:
            memo[id(node)] = node.to_cvxpy(*[memo[id(a)] for a in node.args])
    result = memo[id(expr)]
    if not isinstance(result, cp.Expression):   # scalar constants are kept as floats inside
        result = cp.Constant(result)
    return result
