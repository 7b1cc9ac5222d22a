"""Indexing (`x[key]`, basic: ints, slices, one integer list) and its adjoint, the scatter
of a gradient into zeros."""
from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..expression import Expression, Shape, as_expr
from .base import INCREASING, Atom, EntryMap
from .linear import operand_text


def normalize_key(key: Any, shape: Shape) -> tuple:
    """`key` checked against `shape` as a hashable tuple: ints (made nonnegative), slices
    (resolved to start/stop/step) and 1-D integer lists (as tuples); anything else, an out-of-
    range index or an empty slice is a ShapeError."""
    if not isinstance(key, tuple):
        key = (key,)
    if len(key) > len(shape):
        raise ShapeError(f"too many indices {key} for shape {shape}")
    normalized = []
    for k, n in zip(key, shape):
        if isinstance(k, (int, np.integer)):
            if not -n <= k < n:
                raise ShapeError(f"index {k} is out of range for an axis of length {n}")
            normalized.append(int(k) % n)
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step < 0 and stop < 0:
                stop = None               # runs down to index 0; a stop of -1 would mean n − 1
            if len(range(*k.indices(n))) == 0:
                raise ShapeError(f"the slice {k} selects no entries of an axis of length {n}")
            normalized.append(slice(start, stop, step))
        elif isinstance(k, (list, np.ndarray)):
            arr = np.asarray(k)
            if arr.dtype == bool or arr.ndim != 1 or (arr.size and (arr.min() < -n or arr.max() >= n)):
                raise ShapeError(f"index array {k!r} must be 1-D integers in range for length {n}")
            normalized.append(tuple(int(i) % n for i in arr))
        else:
            raise ShapeError(f"unsupported index {k!r}: use ints, slices or 1-D integer lists")
    return tuple(normalized)


def numpy_key(key: tuple) -> tuple:
    """A normalized key as numpy indexes with it (integer lists as lists)."""
    return tuple(list(k) if isinstance(k, tuple) else k for k in key)


def hashable_key(key: tuple) -> tuple:
    """A normalized key with slices as (start, stop, step) triples."""
    return tuple((k.start, k.stop, k.step) if isinstance(k, slice) else k for k in key)


class Index(EntryMap):
    display = "index"

    def __init__(self, x, key):
        self.key = key
        super().__init__(x)

    def shape_from_args(self):
        if builtins.sum(isinstance(k, tuple) for k in self.key) > 1:
            raise ShapeError("at most one integer-list index per expression")
        return np.empty(self.args[0].shape)[numpy_key(self.key)].shape

    def params(self):
        return (hashable_key(self.key),)

    def numeric(self, x):
        return x[numpy_key(self.key)]

    def vjp(self, index, upstream):
        return IndexAdjoint(upstream, self.key, self.args[0].shape)

    def render(self):
        def fmt(k):
            if isinstance(k, slice):
                stop = "" if k.stop is None else k.stop
                return f"{k.start}:{stop}" + (f":{k.step}" if k.step != 1 else "")
            return str(list(k)) if isinstance(k, tuple) else str(k)
        return f"{operand_text(self.args[0])}[{', '.join(fmt(k) for k in self.key)}]"


class IndexAdjoint(Atom):
    """Scatter of `g` into zeros of `shape` at `key` (the adjoint of indexing); internal."""

    display = "scatter"

    def __init__(self, g, key, shape):
        self.key, self.target = key, shape
        super().__init__(g)

    def shape_from_args(self):
        return self.target

    def params(self):
        return (hashable_key(self.key), self.target)

    def numeric(self, g):
        out = np.zeros(self.target)
        np.add.at(out, numpy_key(self.key), g)
        return out

    def vjp(self, index, upstream):
        return Index(upstream, self.key)

    def monotonicity(self, index):
        return INCREASING


def index(x: Any, key: Any) -> Expression:
    """`x[key]`: numpy indexing and slicing of a vector or matrix (a ShapeError when `key`
    does not fit x's shape)."""
    x = as_expr(x)
    if not x.shape:
        raise ShapeError(f"cannot index the scalar {x}")
    try:
        return Index(x, normalize_key(key, x.shape))
    except ShapeError as exc:
        raise ShapeError(f"cannot index {x} (shape {x.shape}) with {key!r}: {exc}") from None
