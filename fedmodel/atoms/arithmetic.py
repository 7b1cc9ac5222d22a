"""Arithmetic atoms: sums (`+`), negation (`−`) and elementwise products (`*`).

The constructor functions (`add`, `neg`, `multiply`) simplify trivial cases (x + 0, 1·x, a
broadcast of a shape onto itself) so derived gradients stay as lean as hand-written ones.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..expression import Constant, Expression, Shape, as_expr, check_crossing
from .base import (AFFINE, DECREASING, INCREASING, NONMONOTONE, UNKNOWN, Atom, broadcast_error,
                   broadcast_shapes)
from .broadcasting import BroadcastTo, broadcast_to, broadcastable, sum_to


def _is_plain_constant(expr: Expression, value: float) -> bool:
    return (type(expr) is Constant and expr.value.size == 1 and expr.value.item() == value)


# ------------------------------------------------------------------------------------------
class Add(Atom):
    display = "add"

    def shape_from_args(self) -> Shape:
        shape = self.args[0].shape
        for arg in self.args[1:]:
            if not broadcastable(shape, arg.shape):
                raise broadcast_error("add", self.args[0], arg)
            shape = tuple(np.broadcast_shapes(shape, arg.shape))
        return shape

    def numeric(self, *values):
        out = values[0]
        for v in values[1:]:
            out = out + v
        return out

    def vjp(self, index, upstream):
        return sum_to(upstream, self.args[index].shape)

    def monotonicity(self, index):
        return INCREASING

    def sign(self):
        signs = [a.sign() for a in self.args]
        return (all(s[0] for s in signs), all(s[1] for s in signs))

    def render(self):
        parts = [str(self.args[0])]
        for arg in self.args[1:]:
            text = str(arg)
            parts.append(f"- {text[1:]}" if text.startswith("-") else f"+ {text}")
        return "(" + " ".join(parts) + ")"


def add(*terms: Any) -> Expression:
    """Sum of expressions with numpy broadcasting; flattens nested sums and drops zeros."""
    flat: list[Expression] = []
    for term in map(as_expr, terms):
        if isinstance(term, Add):
            flat.extend(term.args)
        elif not _is_plain_constant(term, 0.0):
            flat.append(term)
    shape: Shape = ()
    for term in map(as_expr, terms):
        if not broadcastable(shape, term.shape):
            raise broadcast_error("add", as_expr(terms[0]), term)
        shape = tuple(np.broadcast_shapes(shape, term.shape))
    if not flat:
        return Constant(np.zeros(shape))
    if len(flat) == 1:
        return broadcast_to(flat[0], shape)
    result = Add(*flat)
    return broadcast_to(result, shape)


# ------------------------------------------------------------------------------------------
class Neg(Atom):
    display = "neg"

    def numeric(self, x):
        return -x

    def vjp(self, index, upstream):
        return neg(upstream)

    def monotonicity(self, index):
        return DECREASING

    def sign(self):
        nonneg, nonpos = self.args[0].sign()
        return (nonpos, nonneg)

    def render(self):
        return f"-{self.args[0]}"


def neg(x: Any) -> Expression:
    """−x (also unary `-`); folds double negations, constants and scalar factors."""
    x = as_expr(x)
    if isinstance(x, Neg):
        return x.args[0]
    if type(x) is Constant:
        return Constant(-x.value)
    if isinstance(x, Multiply) and x.args[0].shape == () and x.args[1].shape == x.shape:
        return multiply(neg(x.args[0]), x.args[1])  # -(c·v) = (-c)·v: negate the scalar, not v
    return Neg(x)


# ------------------------------------------------------------------------------------------
class Product(Atom):
    """A bilinear product of two arguments (`*` here, `@` in `linear`): affine when one side
    is constant, monotone in one factor as the other (constant) factor's sign says."""

    @property
    def curvature(self):
        return AFFINE if any(a.is_constant() for a in self.args) else UNKNOWN

    def monotonicity(self, index):
        other = self.args[1 - index]
        if not other.is_constant():
            return NONMONOTONE
        nonneg, nonpos = other.sign()
        return INCREASING if nonneg else DECREASING if nonpos else NONMONOTONE

    def sign(self):
        (p0, n0), (p1, n1) = self.args[0].sign(), self.args[1].sign()
        return ((p0 and p1) or (n0 and n1), (p0 and n1) or (n0 and p1))


class Multiply(Product):
    """Elementwise product with broadcasting; affine when one side is constant."""

    display = "multiply"

    def shape_from_args(self):
        return broadcast_shapes(self.args[0], self.args[1], "multiply")

    def numeric(self, a, b):
        return a * b

    def vjp(self, index, upstream):
        other = self.args[1 - index]
        return sum_to(multiply(upstream, other), self.args[index].shape)

    def render(self):
        a, b = self.args
        if a.shape == () or b.shape == ():
            return f"{a} * {b}"
        return f"multiply({a}, {b})"


def multiply(a: Any, b: Any) -> Expression:
    """Elementwise product (numpy broadcasting; also `a * b`); folds scalar constants. A
    product of two non-constant expressions is allowed (it is how nonconvex models are
    written) but is not DCP."""
    check_crossing("*", a, b)       # fm.multiply(X @ w, y) with y an (m, 1) column: a warning
    a, b = as_expr(a), as_expr(b)
    shape = broadcast_shapes(a, b, "multiply")
    for x, y in ((a, b), (b, a)):
        if _is_plain_constant(x, 1.0):
            return broadcast_to(y, shape)
        if _is_plain_constant(x, 0.0):
            return Constant(np.zeros(shape))
        if isinstance(x, BroadcastTo) and x.args[0].shape == () and y.shape == shape:
            return multiply(x.args[0], y)  # scalar · y, without materializing the broadcast
    if type(a) is Constant and a.value.size == 1 and isinstance(b, Multiply) \
            and type(b.args[0]) is Constant and b.args[0].value.size == 1:
        folded = multiply(Constant(a.value.item() * b.args[0].value.item()), b.args[1])
        return broadcast_to(folded, shape)   # a (1, 1) factor still adds its axes
    if type(b) is Constant and b.value.size == 1 and not (type(a) is Constant):
        a, b = b, a  # scalar constant first: c * x
    if isinstance(b, Neg):
        return neg(multiply(a, b.args[0]))
    return Multiply(a, b)
