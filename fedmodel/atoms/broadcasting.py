"""Broadcasting and its adjoint: `broadcast_to` lifts an expression to a larger shape by
numpy's rules, `sum_to` sums the broadcast axes back (what derivatives of broadcasting
operations need)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..expression import Constant, Expression, Shape, as_expr
from ..errors import ShapeError
from .base import INCREASING, EntryMap, Retarget


def broadcastable(a: Shape, b: Shape) -> bool:
    """Whether numpy broadcasts shapes `a` and `b` together."""
    if a == b or a == () or b == ():     # the usual cases, without numpy's µs per call
        return True
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


class BroadcastTo(Retarget, EntryMap):
    """x copied to the larger shape `target` by numpy's broadcasting; printed as x."""

    display = "broadcast"

    def numeric(self, x):
        return np.broadcast_to(x, self.target)

    def vjp(self, index, upstream):
        return sum_to(upstream, self.args[0].shape)

    def render(self):
        return str(self.args[0])


def broadcast_to(x: Any, shape: Shape) -> Expression:
    """`x` lifted to `shape` by numpy's broadcasting (x itself when it has that shape)."""
    x = as_expr(x)
    shape = tuple(shape)
    if x.shape == shape:
        return x
    if not broadcastable(x.shape, shape) or tuple(np.broadcast_shapes(x.shape, shape)) != shape:
        raise ShapeError(f"cannot broadcast {x} of shape {x.shape} to {shape}")
    if type(x) is Constant and x.size > 1:
        return Constant(np.broadcast_to(x.value, shape).copy())
    return BroadcastTo(x, shape)  # scalars stay lazy so `multiply` can drop the broadcast


class SumTo(Retarget):
    """Sum over broadcast axes back to `shape` (the adjoint of broadcasting); internal."""

    display = "sum_to"

    def numeric(self, x):
        return sum_to_shape(np.asarray(x), self.target)

    def vjp(self, index, upstream):
        return broadcast_to(upstream, self.args[0].shape)

    def monotonicity(self, index):
        return INCREASING


def sum_to_shape(x: np.ndarray, shape: Shape) -> np.ndarray:
    """`x` summed over the axes that broadcasting `shape` to `x.shape` added or stretched
    (any numpy array, sympy object arrays too)."""
    lead = x.ndim - len(shape)
    if lead:
        x = x.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    if axes:
        x = x.sum(axis=axes, keepdims=True)
    return x


def sum_to(x: Expression, shape: Shape) -> Expression:
    """`x` summed back to `shape` over the axes broadcasting added (the adjoint of
    `broadcast_to`; x itself when it has that shape)."""
    if x.shape == tuple(shape):
        return x
    return SumTo(x, tuple(shape))
