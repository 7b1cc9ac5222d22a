"""The elementwise maximum of two expressions and its selector (the derivative's mask)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..expression import Expression, as_expr
from .arithmetic import add, multiply, neg
from .base import CONVEX, INCREASING, UNKNOWN, Atom, broadcast_shapes
from .broadcasting import sum_to


class Maximum(Atom):
    """Elementwise maximum of two expressions (broadcasting)."""

    display, curvature, smooth = "maximum", CONVEX, False

    def shape_from_args(self):
        return broadcast_shapes(self.args[0], self.args[1], "take the maximum of")

    def numeric(self, a, b):
        return np.maximum(a, b)

    def vjp(self, index, upstream):
        a, b = self.args
        mask = GreaterEqual(a, b)
        if index == 1:
            mask = add(1.0, neg(mask))
        return sum_to(multiply(upstream, mask), self.args[index].shape)

    def monotonicity(self, index):
        return INCREASING

    def sign(self):
        (p0, n0), (p1, n1) = self.args[0].sign(), self.args[1].sign()
        return (p0 or p1, n0 and n1)


def maximum(a: Any, b: Any) -> Expression:
    """The elementwise maximum of `a` and `b` (numpy broadcasting); convex, nonsmooth."""
    return Maximum(as_expr(a), as_expr(b))


class GreaterEqual(Atom):
    """1 where a ≥ b, else 0 (the selector in the derivative of `maximum`)."""

    display, curvature, smooth = "ge", UNKNOWN, False

    def shape_from_args(self):
        return broadcast_shapes(self.args[0], self.args[1], "compare")

    def numeric(self, a, b):
        return (a >= b).astype(float)

    def vjp(self, index, upstream):
        return None

    def sign(self):
        return (True, False)
