"""Linear maps: the matrix product (`@`), transposition (`.T`) and reshaping."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ShapeError
from ..expression import Expression, as_expr, as_shape
from .arithmetic import Add, Multiply, Neg, Product, multiply
from .base import EntryMap, Retarget


def operand_text(expr: Expression) -> str:
    """`expr` rendered as the operand of `@`, `.T` or `[…]`: parenthesized when compound."""
    text = str(expr)
    compound = isinstance(expr, Multiply) or (   # an Add renders its own parentheses
        isinstance(expr, Neg) and isinstance(expr.args[0], (Add, Multiply, MatMul)))
    return f"({text})" if compound else text


# ------------------------------------------------------------------------------------------
class MatMul(Product):
    """Matrix product with numpy's 1-D/2-D semantics."""

    display = "matmul"

    def shape_from_args(self):
        a, b = self.args
        sa, sb = a.shape, b.shape
        if not sa or not sb:
            raise ShapeError(f"matmul of a scalar: {a} (shape {sa}) @ {b} (shape {sb}); use *")
        if sa[-1] != sb[0]:
            raise ShapeError(f"cannot matmul {a} (shape {sa}) with {b} (shape {sb}): inner "
                             f"dimensions {sa[-1]} and {sb[0]} differ")
        return sa[:-1] + sb[1:]

    def numeric(self, a, b):
        return a @ b

    def vjp(self, index, upstream):
        a, b = self.args
        g = upstream
        if index == 0:
            if a.ndim == 2 and b.ndim == 2:
                return matmul(g, transpose(b))
            if a.ndim == 2:          # (m,d)@(d,) -> (m,): outer(g, b)
                return multiply(reshape(g, (a.shape[0], 1)), reshape(b, (1, b.shape[0])))
            if b.ndim == 2:          # (d,)@(d,k) -> (k,)
                return matmul(b, g)
            return multiply(g, b)    # (d,)@(d,) -> ()
        if a.ndim == 2 and b.ndim == 2:
            return matmul(transpose(a), g)
        if a.ndim == 2:
            return matmul(transpose(a), g)
        if b.ndim == 2:              # (d,)@(d,k): outer(a, g)
            return multiply(reshape(a, (a.shape[0], 1)), reshape(g, (1, g.shape[0])))
        return multiply(g, a)

    def render(self):
        return f"{operand_text(self.args[0])} @ {operand_text(self.args[1])}"


def matmul(a: Any, b: Any) -> Expression:
    """The matrix product `a @ b` (numpy's rules for vectors and matrices)."""
    return MatMul(as_expr(a), as_expr(b))


# ------------------------------------------------------------------------------------------
class Transpose(EntryMap):
    display = "transpose"

    def shape_from_args(self):
        return self.args[0].shape[::-1]

    def numeric(self, x):
        return x.T

    def vjp(self, index, upstream):
        return transpose(upstream)

    def render(self):
        return f"{operand_text(self.args[0])}.T"


def transpose(x: Any) -> Expression:
    """The transpose of a matrix (also `x.T`); scalars and vectors are returned as they are."""
    x = as_expr(x)
    if x.ndim < 2:
        return x
    if isinstance(x, Transpose):
        return x.args[0]
    return Transpose(x)


# ------------------------------------------------------------------------------------------
class Reshape(Retarget, EntryMap):
    """x's entries in row-major order laid out in the shape `target`; printed as x."""

    display = "reshape"

    def numeric(self, x):
        return np.reshape(x, self.target)

    def vjp(self, index, upstream):
        return reshape(upstream, self.args[0].shape)

    def render(self):
        return str(self.args[0])


def reshape(x: Any, shape: int | tuple) -> Expression:
    """x's entries in row-major (numpy's default) order laid out in `shape` (same size)."""
    x = as_expr(x)
    target = as_shape(shape) if shape != () else ()
    if int(np.prod(target)) != x.size:
        raise ShapeError(f"cannot reshape {x} of shape {x.shape} (size {x.size}) to {target}")
    if target == x.shape:
        return x
    if isinstance(x, Reshape):
        return reshape(x.args[0], target)
    return Reshape(x, target)
