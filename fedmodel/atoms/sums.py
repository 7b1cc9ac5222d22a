"""Sums and means of the entries, in all or along one axis."""
from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from ..errors import FedModelError, ShapeError
from ..expression import Constant, Expression, as_expr
from .arithmetic import multiply
from .base import Atom, EntryMap
from .broadcasting import broadcast_to
from .linear import reshape


def normalize_axis(axis: int | None, x: Expression) -> int | None:
    """`axis` of `x` as a nonnegative int (None: all entries); a ShapeError when out of range."""
    if axis is None:
        return None
    ndim = x.ndim
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"axis {axis!r} is out of range for {x} (shape {x.shape}, {ndim} "
                         f"dimension{'s' if ndim != 1 else ''}); use None or an axis in "
                         f"[{-ndim}, {max(ndim - 1, 0)}]")
    return int(axis) % ndim if ndim else None


def keep_reduced_axis(upstream: Expression, shape: tuple, axis: int | None) -> Expression:
    """The adjoint of a reduction along `axis` of an argument of `shape`, with the reduced
    axis kept as 1 so that it broadcasts back onto the argument."""
    if axis is not None and axis > 0:
        return reshape(upstream, shape[:axis] + (1,) + shape[axis + 1:])
    return upstream


class AlongAxis(Atom):
    """An atom of one argument taken along `axis` (None: over all its entries); its value has
    the argument's shape less that axis (sum, mean, log-sum-exp)."""

    def __init__(self, x: Any, axis: int | None = None):
        self.axis = axis
        super().__init__(x)

    def params(self) -> tuple:
        return (self.axis,)

    def shape_from_args(self) -> tuple:
        shape = self.args[0].shape
        return () if self.axis is None else shape[:self.axis] + shape[self.axis + 1:]


class Sum(AlongAxis, EntryMap):
    display = "sum"

    def numeric(self, x):
        return np.add.reduce(x, axis=self.axis)   # np.sum without its wrapper (same numbers)

    def vjp(self, index, upstream):
        shape = self.args[0].shape
        return broadcast_to(keep_reduced_axis(upstream, shape, self.axis), shape)

    def render(self):   # also Mean's, by its display
        return f"{self.display}({self.args[0]}{'' if self.axis is None else f', axis={self.axis}'})"


def _expression_items(x: Any) -> bool:
    """Whether `x` is a list or tuple holding expressions (as_expr would read it as one
    constant array and fail with a misleading 'not numeric')."""
    return isinstance(x, (list, tuple)) and builtins.any(isinstance(e, Expression) for e in x)


def sum(x: Any, axis: int | None = None) -> Expression:  # noqa: A001 - numpy-style name
    """Sum of the entries (optionally along one axis); a list of expressions is added item by
    item, as CVXPY's `cp.sum([...])` does (Python's `sum`)."""
    if _expression_items(x):
        if axis is not None:
            raise FedModelError(f"fm.sum of a list of {len(x)} expressions adds them item by item "
                                "(as CVXPY); axis applies to one expression: write "
                                "fm.sum(fm.sum(items), axis=...)")
        return builtins.sum(x[1:], as_expr(x[0]))
    x = as_expr(x)
    axis = normalize_axis(axis, x)
    if x.shape == () and axis is None:
        return x
    return Sum(x, axis)


def mean(x: Any, axis: int | None = None) -> Expression:
    """Mean of the entries (optionally along one axis): `sum(x, axis) / count`."""
    if _expression_items(x):
        raise FedModelError(f"fm.mean takes one expression, not a list of {len(x)}: write "
                            "fm.sum(items) / len(items) for their elementwise mean")
    x = as_expr(x)
    axis = normalize_axis(axis, x)
    count = x.size if axis is None else x.shape[axis]
    return Mean(x, axis, count)


class Mean(Sum):
    """`sum / count` kept as one node so it renders, lowers and prints as a mean."""

    display = "mean"

    def __init__(self, x, axis, count):
        self.count = count
        super().__init__(x, axis)

    def numeric(self, x):
        return np.add.reduce(x, axis=self.axis) / self.count   # what np.mean computes

    def vjp(self, index, upstream):
        return super().vjp(index, multiply(Constant(1.0 / self.count), upstream))
