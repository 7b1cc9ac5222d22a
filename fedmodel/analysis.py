"""DCP analysis: curvature and smoothness of expressions, by CVXPY's composition rules (a
node's sign is its own `sign()`, composed by the atoms from their arguments' signs).

The rules are generic: they compose what each node says of itself (`Node` below) over the
DAG. Leaves and atoms answer for themselves, so this module sits below the IR
(`fedmodel.expression`) and the atoms and imports neither.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

CONSTANT = "constant"
CONVEX, CONCAVE, AFFINE, UNKNOWN = "convex", "concave", "affine", "unknown"
INCREASING, DECREASING, NONMONOTONE = "increasing", "decreasing", "nonmonotone"


class Node(Protocol):
    """What the rules read of a node of the IR; a leaf is a node without `args`."""

    args: Sequence["Node"]
    curvature: str              # of the node's own function (a leaf: its curvature)
    smooth: bool                # differentiable everywhere on its domain
    squares: bool               # the node is its argument squared (x², ‖x‖², x**2)
    smooth_when_squared: bool   # its only kink is one a square smooths out ([x]₊² is C¹)
    curvature_jumps: bool       # C¹ but its second derivative jumps (huber at ±M)

    def monotonicity(self, index: int) -> str: ...

    def sign(self) -> tuple[bool, bool]: ...


# Results are memoized per node: expressions are immutable after construction.
_curvature_cache: dict[int, tuple[Node, str]] = {}


def curvature(expr: Node) -> str:
    """One of "constant", "affine", "convex", "concave", "unknown" (DCP rules)."""
    cached = _curvature_cache.get(id(expr))
    if cached is not None and cached[0] is expr:
        return cached[1]
    result = _curvature(expr)
    if len(_curvature_cache) > 100_000:
        _curvature_cache.clear()
    _curvature_cache[id(expr)] = (expr, result)
    return result


def _curvature(expr: Node) -> str:
    if not expr.args:
        return expr.curvature     # a leaf: a Variable is affine, every other leaf constant
    arg_curvatures = [curvature(a) for a in expr.args]
    if all(c == CONSTANT for c in arg_curvatures):
        return CONSTANT
    fc = expr.curvature
    if fc == UNKNOWN:
        return UNKNOWN
    convex = fc in (CONVEX, AFFINE)
    concave = fc in (CONCAVE, AFFINE)
    affine = fc == AFFINE
    for i, c in enumerate(arg_curvatures):
        if c in (CONSTANT, AFFINE):
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


def elementwise_sign(value: Any) -> tuple[bool, bool]:
    """(nonnegative, nonpositive) of a known value, entry by entry (None: unknown)."""
    if value is None:
        return (False, False)
    return (bool(np.all(value >= 0)), bool(np.all(value <= 0)))


def _atoms(expr: Node, children: Callable[[Node], Sequence[Node]] = lambda node: node.args):
    """Every atom of `expr`'s DAG once (leaves skipped), descending to `children(node)`."""
    stack, seen = [expr], set()
    while stack:
        node = stack.pop()
        if id(node) in seen or not node.args:
            continue
        seen.add(id(node))
        yield node
        stack.extend(children(node))


def curvature_jumps(expr: Node) -> bool:
    """True when the expression's curvature can jump between two points: a C¹ atom that is not
    C² (huber), a square of a kink ([x]₊²), or any nonsmooth atom. A Hessian read at one point
    then bounds nothing beyond the next jump (the Newton readings of
    `backends/proxal_certificate.landed`)."""
    return any(getattr(node, "curvature_jumps", False) or not node.smooth
               or node.squares and node.args[0].smooth_when_squared for node in _atoms(expr))


def is_smooth(expr: Node) -> bool:
    """True when every atom is differentiable on its domain."""
    # ([x]₊² is C¹: the inequality AL term is smooth, so a square of such a kink reads on below it)
    return all(node.smooth for node in _atoms(expr, lambda node: (node.args[0].args[0],)
                                              if node.squares and node.args[0].smooth_when_squared else node.args))
