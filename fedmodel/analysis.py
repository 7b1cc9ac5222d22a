"""DCP analysis: curvature, sign and smoothness of expressions, by CVXPY's composition rules."""
from __future__ import annotations

from .expression import Constant, Expression, Leaf, Parameter, Variable
from .atoms.base import AFFINE, CONCAVE, CONVEX, DECREASING, INCREASING, UNKNOWN, elementwise_sign

# Results are memoized per node: expressions are immutable after construction.
_curvature_cache: dict[int, tuple[Expression, str]] = {}


def curvature(expr: Expression) -> str:
    """One of "constant", "affine", "convex", "concave", "unknown" (DCP rules)."""
    cached = _curvature_cache.get(id(expr))
    if cached is not None and cached[0] is expr:
        return cached[1]
    result = _curvature(expr)
    if len(_curvature_cache) > 100_000:
        _curvature_cache.clear()
    _curvature_cache[id(expr)] = (expr, result)
    return result


def _curvature(expr: Expression) -> str:
    if isinstance(expr, Variable):
        return AFFINE
    if isinstance(expr, Leaf):
        return "constant"
    arg_curvatures = [curvature(a) for a in expr.args]
    if all(c == "constant" for c in arg_curvatures):
        return "constant"
    fc = expr.curvature
    if fc == UNKNOWN:
        return UNKNOWN
    convex = fc in (CONVEX, AFFINE)
    concave = fc in (CONCAVE, AFFINE)
    affine = fc == AFFINE
    for i, c in enumerate(arg_curvatures):
        if c in ("constant", AFFINE):
            continue
        affine = False
        mono = expr.monotonicity(i)
        convex = convex and ((mono == INCREASING and c == CONVEX) or (mono == DECREASING and c == CONCAVE))
        concave = concave and ((mono == INCREASING and c == CONCAVE) or (mono == DECREASING and c == CONVEX))
    if affine:
        return AFFINE
    if convex:
        return CONVEX
    if concave:
        return CONCAVE
    return UNKNOWN


def sign(expr: Expression) -> tuple[bool, bool]:
    """(nonnegative, nonpositive) as far as the rules can tell."""
    if isinstance(expr, Constant):
        return elementwise_sign(expr.value)
    if isinstance(expr, (Variable, Parameter)):
        return (False, False)
    return expr.sign()


def is_smooth(expr: Expression) -> bool:
    """True when every atom is differentiable on its domain."""
    stack, seen = [expr], set()
    while stack:
        node = stack.pop()
        if id(node) in seen or isinstance(node, Leaf):
            continue
        seen.add(id(node))
        if not node.smooth:
            return False
        if _is_squared_pos(node):  # [x]₊² is C¹: the inequality AL term is smooth
            stack.append(node.args[0].args[0])
            continue
        stack.extend(node.args)
    return True


def _is_squared_pos(node: Expression) -> bool:
    from .atoms import Pos, Power, Square, SumSquares
    squares = isinstance(node, (Square, SumSquares)) or (isinstance(node, Power) and node.p == 2)
    return squares and isinstance(node.args[0], Pos)
