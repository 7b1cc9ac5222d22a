"""Symbolic differentiation on the IR (reverse mode).

`grad(f, x)` returns ∇ₓf as a new expression of x's shape; `vjp(c, x, v)` returns the
transposed-Jacobian product ∇c(x)ᵀv for a vector-valued c. Both are ordinary expressions:
printable, compilable, and differentiable again.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..atoms import Atom
from ..atoms.elementwise import Elementwise
from ..errors import FedModelError, ShapeError
from ..expression import Constant, Expression, Leaf, Variable, as_expr, postorder
from ..lowering.rules import MethodRules

# The derivative target: an atom's vector-Jacobian product is its own `vjp` method, written in the
# IR (an elementwise atom's from its `derivative`); tests/test_atom_rules.py checks every atom has
# one. The error is the one `Atom.vjp` raised before this table.
DERIVATIVE_RULES = MethodRules(lambda node: NotImplementedError(
    f"{node.display} has no derivative rule"),
    [("vjp", Atom), ("derivative", Elementwise)], name="derivative")


def vjp(expr: Expression, wrt: Variable | Any, upstream: Any) -> Expression:
    """∇expr(wrt)ᵀ · upstream: adjoint of `wrt` when the output's adjoint is `upstream`."""
    from ..atoms import add
    upstream = as_expr(upstream)
    if upstream.shape != expr.shape:
        raise ShapeError(f"the adjoint has shape {upstream.shape} but {expr} has shape {expr.shape}")
    if not isinstance(wrt, Leaf):
        raise FedModelError(f"can only differentiate with respect to a Variable or Parameter, not {wrt}")
    order = postorder([expr])
    depends = _depends_on(order, wrt)
    adjoints: dict[int, list[Expression]] = {id(expr): [upstream]}
    for node in reversed(order):
        contributions = adjoints.pop(id(node), None)
        if not contributions or isinstance(node, Leaf):
            if node is wrt and contributions:
                adjoints[id(node)] = contributions
            continue
        g = contributions[0] if len(contributions) == 1 else add(*contributions)
        for i, arg in enumerate(node.args):
            if id(arg) not in depends:
                continue
            contribution = DERIVATIVE_RULES(node, i, g)
            if contribution is not None:
                adjoints.setdefault(id(arg), []).append(contribution)
    total = adjoints.get(id(wrt))
    if not total:
        return Constant(np.zeros(wrt.shape))
    return total[0] if len(total) == 1 else add(*total)


def _depends_on(order: list[Expression], wrt: Leaf) -> set[int]:
    depends: set[int] = set()
    for node in order:
        if node is wrt or any(id(a) in depends for a in node.args):
            depends.add(id(node))
    return depends


def grad(expr: Any, wrt: Variable) -> Expression:
    """Gradient of a scalar expression with respect to a variable, as an expression.

    >>> import fedmodel as fm
    >>> w = fm.Variable(3, name="w")
    >>> print(fm.grad(fm.sum_squares(w), w))
    2 * w
    """
    expr = as_expr(expr)
    if expr.shape != ():
        raise ShapeError(f"grad needs a scalar expression; {expr} has shape {expr.shape} "
                         "(use fm.vjp for the transposed-Jacobian product of a vector function)")
    return vjp(expr, wrt, Constant(1.0))
