"""Affine and structural atoms: +, −, elementwise ×, @, transpose, indexing, reshapes, sums.

The constructor functions (`add`, `multiply`, …) simplify trivial cases (x + 0, 1·x, a
broadcast of a shape onto itself) so derived gradients stay as lean as hand-written ones.
"""
from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from ..errors import FedModelError, ShapeError
from ..expression import Constant, Data, Expression, Shape, as_expr, as_shape
from .base import (AFFINE, DECREASING, INCREASING, NONMONOTONE, UNKNOWN, Atom, broadcast_shapes,
                   constant_value, elementwise_sign, vectorize_sympy)


def _sign(expr: Expression) -> tuple[bool, bool]:
    from ..analysis import sign
    return sign(expr)


def _is_plain_constant(expr: Expression, value: float) -> bool:
    return (type(expr) is Constant and expr.value.size == 1 and expr.value.item() == value)


# ------------------------------------------------------------------------------------------
class Add(Atom):
    display = "add"

    def shape_from_args(self) -> Shape:
        shape = self.args[0].shape
        for arg in self.args[1:]:
            if not _broadcastable(shape, arg.shape):
                _raise_shape("add", self.args[0], arg)
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
        signs = [_sign(a) for a in self.args]
        return (all(s[0] for s in signs), all(s[1] for s in signs))

    def to_cvxpy(self, *args):
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out

    def to_sympy(self, *args):
        from ..lowering.to_sympy import broadcast
        import sympy
        if not self.shape:
            return sympy.Add(*args)
        return sympy.MatAdd(*[broadcast(v, a.shape, self.shape) for v, a in zip(args, self.args)])

    def to_sympy_explicit(self, *args):
        out = args[0]
        for a in args[1:]:
            out = out + a
        return np.asarray(out, dtype=object)

    def render(self):
        parts = [str(self.args[0])]
        for arg in self.args[1:]:
            text = str(arg)
            parts.append(f"- {text[1:]}" if text.startswith("-") else f"+ {text}")
        return "(" + " ".join(parts) + ")"


def _broadcastable(a: Shape, b: Shape) -> bool:
    if a == b or a == () or b == ():     # the usual cases, without numpy's µs per call
        return True
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def _raise_shape(op: str, a: Expression, b: Expression):
    raise ShapeError(f"cannot {op} {a} (shape {a.shape}) and {b} (shape {b.shape}): the shapes "
                     "do not broadcast; reshape one operand or index it")


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
        if not _broadcastable(shape, term.shape):
            _raise_shape("add", as_expr(terms[0]), term)
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
        nonneg, nonpos = _sign(self.args[0])
        return (nonpos, nonneg)

    def to_cvxpy(self, x):
        return -x

    def to_sympy(self, x):
        return -x

    def to_sympy_explicit(self, x):
        return -x

    def render(self):
        return f"-{self.args[0]}"


def neg(x: Any) -> Expression:
    x = as_expr(x)
    if isinstance(x, Neg):
        return x.args[0]
    if type(x) is Constant:
        return Constant(-x.value)
    if isinstance(x, Multiply) and x.args[0].shape == () and x.args[1].shape == x.shape:
        return multiply(neg(x.args[0]), x.args[1])  # -(c·v) = (-c)·v: negate the scalar, not v
    return Neg(x)


# ------------------------------------------------------------------------------------------
class Multiply(Atom):
    """Elementwise product with broadcasting; affine when one side is constant."""

    display = "multiply"

    def shape_from_args(self):
        return broadcast_shapes(self.args[0], self.args[1], "multiply")

    @property
    def curvature(self):
        return AFFINE if any(a.is_constant() for a in self.args) else UNKNOWN

    def numeric(self, a, b):
        return a * b

    def vjp(self, index, upstream):
        other = self.args[1 - index]
        return sum_to(multiply(upstream, other), self.args[index].shape)

    def monotonicity(self, index):
        other = self.args[1 - index]
        if not other.is_constant():
            return NONMONOTONE
        nonneg, nonpos = _sign(other)
        return INCREASING if nonneg else DECREASING if nonpos else NONMONOTONE

    def sign(self):
        (p0, n0), (p1, n1) = _sign(self.args[0]), _sign(self.args[1])
        return ((p0 and p1) or (n0 and n1), (p0 and n1) or (n0 and p1))

    def to_cvxpy(self, a, b):
        import cvxpy as cp
        if np.ndim(a) == 0 or np.ndim(b) == 0 or getattr(a, "shape", ()) == () or getattr(b, "shape", ()) == ():
            return a * b
        return cp.multiply(a, b)

    def to_sympy(self, a, b):
        import sympy
        from ..lowering.to_sympy import as_scalar, broadcast
        a, b = (as_scalar(v) if e.size == 1 else v for v, e in zip((a, b), self.args))
        if _is_matrix(a) and _is_matrix(b):
            return sympy.HadamardProduct(broadcast(a, self.args[0].shape, self.shape),
                                         broadcast(b, self.args[1].shape, self.shape))
        return a * b

    def to_sympy_explicit(self, a, b):
        return np.asarray(a * b, dtype=object)

    def render(self):
        a, b = self.args
        if a.shape == () or b.shape == ():
            return f"{a} * {b}"
        return f"multiply({a}, {b})"


def _is_matrix(x) -> bool:
    return bool(getattr(x, "is_Matrix", False))


def multiply(a: Any, b: Any) -> Expression:
    """Elementwise product (numpy broadcasting); folds scalar constants."""
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


def scalar_or_elementwise_mul(a: Any, b: Any) -> Expression:
    """`a * b`: elementwise (numpy semantics). A product of two non-constant expressions is
    allowed (it is how nonconvex models are written) but is not DCP."""
    return multiply(a, b)


def divide(a: Any, b: Any) -> Expression:
    a, b = as_expr(a), as_expr(b)
    value = constant_value(b)
    if value is not None:
        if np.any(value == 0):
            raise FedModelError(f"division of {a} by {b}, which has zero entries")
        return multiply(Constant(1.0 / value), a)
    from .elementwise import power
    return multiply(a, power(b, -1))


# ------------------------------------------------------------------------------------------
class MatMul(Atom):
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

    @property
    def curvature(self):
        return AFFINE if any(a.is_constant() for a in self.args) else UNKNOWN

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

    def monotonicity(self, index):
        other = self.args[1 - index]
        if not other.is_constant():
            return NONMONOTONE
        nonneg, nonpos = _sign(other)
        return INCREASING if nonneg else DECREASING if nonpos else NONMONOTONE

    def sign(self):
        (p0, n0), (p1, n1) = _sign(self.args[0]), _sign(self.args[1])
        return ((p0 and p1) or (n0 and n1), (p0 and n1) or (n0 and p1))

    def to_cvxpy(self, a, b):
        return a @ b

    def to_sympy(self, a, b):
        import sympy
        a_vec, b_vec = self.args[0].ndim == 1, self.args[1].ndim == 1
        if a_vec:
            a = sympy.Transpose(a) if _is_matrix(a) else a
        out = sympy.MatMul(a, b) if (_is_matrix(a) or _is_matrix(b)) else a * b
        if a_vec and not b_vec and _is_matrix(out):
            return sympy.Transpose(out)
        if not self.shape:
            from ..lowering.to_sympy import as_scalar
            return as_scalar(out)
        return out

    def to_sympy_explicit(self, a, b):
        return np.asarray(np.dot(a, b), dtype=object)

    def render(self):
        return f"{_wrap(self.args[0])} @ {_wrap(self.args[1])}"


def _wrap(expr: Expression) -> str:
    text = str(expr)
    compound = isinstance(expr, Multiply) or (   # an Add renders its own parentheses
        isinstance(expr, Neg) and isinstance(expr.args[0], (Add, Multiply, MatMul)))
    return f"({text})" if compound else text


def matmul(a: Any, b: Any) -> Expression:
    return MatMul(as_expr(a), as_expr(b))


# ------------------------------------------------------------------------------------------
class Transpose(Atom):
    display = "transpose"

    def shape_from_args(self):
        return self.args[0].shape[::-1]

    def numeric(self, x):
        return x.T

    def vjp(self, index, upstream):
        return transpose(upstream)

    def monotonicity(self, index):
        return INCREASING

    def sign(self):
        return _sign(self.args[0])

    def to_cvxpy(self, x):
        return x.T

    def to_sympy(self, x):
        import sympy
        return sympy.Transpose(x) if _is_matrix(x) else x

    def to_sympy_explicit(self, x):
        return x.T

    def render(self):
        return f"{_wrap(self.args[0])}.T"


def transpose(x: Any) -> Expression:
    x = as_expr(x)
    if x.ndim < 2:
        return x
    if isinstance(x, Transpose):
        return x.args[0]
    return Transpose(x)


# ------------------------------------------------------------------------------------------
def _normalize_key(key: Any, shape: Shape) -> tuple:
    """Basic indexing only (ints, slices); returns a hashable tuple key."""
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


def _numpy_key(key: tuple) -> tuple:
    return tuple(list(k) if isinstance(k, tuple) else k for k in key)


def _hashable(key: tuple) -> tuple:
    return tuple((k.start, k.stop, k.step) if isinstance(k, slice) else k for k in key)


class Index(Atom):
    display = "index"

    def __init__(self, x, key):
        self.key = key
        super().__init__(x)

    def shape_from_args(self):
        if builtins.sum(isinstance(k, tuple) for k in self.key) > 1:
            raise ShapeError("at most one integer-list index per expression")
        return np.empty(self.args[0].shape)[_numpy_key(self.key)].shape

    def params(self):
        return (_hashable(self.key),)

    def numeric(self, x):
        return x[_numpy_key(self.key)]

    def vjp(self, index, upstream):
        return IndexAdjoint(upstream, self.key, self.args[0].shape)

    def monotonicity(self, index):
        return INCREASING

    def sign(self):
        return _sign(self.args[0])

    def to_cvxpy(self, x):
        return x[_numpy_key(self.key)]

    def to_sympy(self, x):
        from ..lowering.to_sympy import function
        if builtins.any(isinstance(k, tuple) or (isinstance(k, slice) and k.step < 0)
                        for k in self.key) or not _is_matrix(x):   # beyond sympy's slices
            return function("index", self.shape, x, *map(str, _hashable(self.key)))
        key = self.key + (slice(None),) * (2 - len(self.key))   # vectors are n×1 columns
        if self.args[0].ndim == 1:
            key = (self.key[0], 0)
        out = x[key]
        if self.shape and len(self.shape) == 1 and isinstance(key[0], int):
            import sympy
            return sympy.Transpose(out)      # a row X[i, :] has our shape (n,): a column
        return out

    def to_sympy_explicit(self, x):
        return np.asarray(x[_numpy_key(self.key)], dtype=object)

    def render(self):
        def fmt(k):
            if isinstance(k, slice):
                stop = "" if k.stop is None else k.stop
                return f"{k.start}:{stop}" + (f":{k.step}" if k.step != 1 else "")
            return str(list(k)) if isinstance(k, tuple) else str(k)
        return f"{_wrap(self.args[0])}[{', '.join(fmt(k) for k in self.key)}]"


class IndexAdjoint(Atom):
    """Scatter of `g` into zeros of `shape` at `key` (the adjoint of indexing); internal."""

    display = "scatter"
    internal = True

    def __init__(self, g, key, shape):
        self.key, self.target = key, shape
        super().__init__(g)

    def shape_from_args(self):
        return self.target

    def params(self):
        return (_hashable(self.key), self.target)

    def numeric(self, g):
        out = np.zeros(self.target)
        np.add.at(out, _numpy_key(self.key), g)
        return out

    def vjp(self, index, upstream):
        return Index(upstream, self.key)

    def monotonicity(self, index):
        return INCREASING

    def to_sympy_explicit(self, g):
        import sympy
        out = np.full(self.target, sympy.Integer(0), dtype=object)
        np.add.at(out, _numpy_key(self.key), g)   # repeated indices accumulate, as in numeric
        return out


def index(x: Any, key: Any) -> Expression:
    x = as_expr(x)
    if not x.shape:
        raise ShapeError(f"cannot index the scalar {x}")
    try:
        return Index(x, _normalize_key(key, x.shape))
    except ShapeError as exc:
        raise ShapeError(f"cannot index {x} (shape {x.shape}) with {key!r}: {exc}") from None


# ------------------------------------------------------------------------------------------
class Reshape(Atom):
    display = "reshape"

    def __init__(self, x, shape):
        self.target = shape
        super().__init__(x)

    def shape_from_args(self):
        return self.target

    def params(self):
        return (self.target,)

    def numeric(self, x):
        return np.reshape(x, self.target)

    def vjp(self, index, upstream):
        return reshape(upstream, self.args[0].shape)

    def monotonicity(self, index):
        return INCREASING

    def sign(self):
        return _sign(self.args[0])

    def to_cvxpy(self, x):
        import cvxpy as cp
        return cp.reshape(x, self.target, order="C")

    def to_sympy(self, x):
        from ..lowering.to_sympy import function
        if len(self.target) <= 1 and self.args[0].ndim <= 1:
            return x                          # (n,) ↔ (n,) or scalars: the same sympy object
        return function("reshape", self.target, x)

    def to_sympy_explicit(self, x):
        return np.reshape(x, self.target)

    def render(self):
        return str(self.args[0])


def reshape(x: Any, shape: int | tuple) -> Expression:
    x = as_expr(x)
    target = as_shape(shape) if shape != () else ()
    if int(np.prod(target)) != x.size:
        raise ShapeError(f"cannot reshape {x} of shape {x.shape} (size {x.size}) to {target}")
    if target == x.shape:
        return x
    if isinstance(x, Reshape):
        return reshape(x.args[0], target)
    return Reshape(x, target)


# ------------------------------------------------------------------------------------------
class BroadcastTo(Atom):
    display = "broadcast"

    def __init__(self, x, shape):
        self.target = shape
        super().__init__(x)

    def shape_from_args(self):
        return self.target

    def params(self):
        return (self.target,)

    def numeric(self, x):
        return np.broadcast_to(x, self.target)

    def vjp(self, index, upstream):
        return sum_to(upstream, self.args[0].shape)

    def monotonicity(self, index):
        return INCREASING

    def sign(self):
        return _sign(self.args[0])

    def to_cvxpy(self, x):
        import cvxpy as cp
        if getattr(x, "shape", ()) == self.target:
            return x
        if np.ndim(x) == 0 or getattr(x, "shape", None) == ():
            return x * np.ones(self.target)
        return cp.broadcast_to(x, self.target) if hasattr(cp, "broadcast_to") \
            else x + np.zeros(self.target)

    def to_sympy(self, x):
        from ..lowering.to_sympy import broadcast
        return broadcast(x, self.args[0].shape, self.target)

    def to_sympy_explicit(self, x):
        return np.asarray(np.broadcast_to(x, self.target), dtype=object)

    def render(self):
        return str(self.args[0])


def broadcast_to(x: Any, shape: Shape) -> Expression:
    x = as_expr(x)
    shape = tuple(shape)
    if x.shape == shape:
        return x
    if not _broadcastable(x.shape, shape) or tuple(np.broadcast_shapes(x.shape, shape)) != shape:
        raise ShapeError(f"cannot broadcast {x} of shape {x.shape} to {shape}")
    if type(x) is Constant and x.size > 1:
        return Constant(np.broadcast_to(x.value, shape).copy())
    return BroadcastTo(x, shape)  # scalars stay lazy so `multiply` can drop the broadcast


class SumTo(Atom):
    """Sum over broadcast axes back to `shape` (the adjoint of broadcasting); internal."""

    display = "sum_to"
    internal = True

    def __init__(self, x, shape):
        self.target = shape
        super().__init__(x)

    def shape_from_args(self):
        return self.target

    def params(self):
        return (self.target,)

    def numeric(self, x):
        return _sum_to(np.asarray(x), self.target)

    def vjp(self, index, upstream):
        return broadcast_to(upstream, self.args[0].shape)

    def monotonicity(self, index):
        return INCREASING

    def to_sympy_explicit(self, x):
        return _sum_to(x, self.target)


def _sum_to(x: np.ndarray, shape: Shape) -> np.ndarray:
    lead = x.ndim - len(shape)
    if lead:
        x = x.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    if axes:
        x = x.sum(axis=axes, keepdims=True)
    return x


def sum_to(x: Expression, shape: Shape) -> Expression:
    if x.shape == tuple(shape):
        return x
    return SumTo(x, tuple(shape))


# ------------------------------------------------------------------------------------------
def _axis(axis: int | None, x: Expression) -> int | None:
    if axis is None:
        return None
    ndim = x.ndim
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"axis {axis!r} is out of range for {x} (shape {x.shape}, {ndim} "
                         f"dimension{'s' if ndim != 1 else ''}); use None or an axis in "
                         f"[{-ndim}, {max(ndim - 1, 0)}]")
    return int(axis) % ndim if ndim else None


class Sum(Atom):
    display = "sum"

    def __init__(self, x, axis=None):
        self.axis = axis
        super().__init__(x)

    def shape_from_args(self):
        shape = self.args[0].shape
        if self.axis is None:
            return ()
        return shape[:self.axis] + shape[self.axis + 1:]

    def params(self):
        return (self.axis,)

    def numeric(self, x):
        return np.add.reduce(x, axis=self.axis)   # np.sum without its wrapper (same numbers)

    def vjp(self, index, upstream):
        shape = self.args[0].shape
        if self.axis is not None and self.axis > 0:   # keep the reduced axis as 1 so it broadcasts
            upstream = reshape(upstream, shape[:self.axis] + (1,) + shape[self.axis + 1:])
        return broadcast_to(upstream, shape)

    def monotonicity(self, index):
        return INCREASING

    def sign(self):
        return _sign(self.args[0])

    def to_cvxpy(self, x):
        import cvxpy as cp
        return cp.sum(x, axis=self.axis)

    def to_sympy(self, x):
        from ..lowering.to_sympy import function
        extra = () if self.axis is None else (self.axis,)
        return function(self.display, self.shape, x, *extra)

    def to_sympy_explicit(self, x):
        out = np.sum(x, axis=self.axis)
        return np.asarray(out, dtype=object)

    def render(self):
        return f"sum({self.args[0]}{'' if self.axis is None else f', axis={self.axis}'})"


def sum(x: Any, axis: int | None = None) -> Expression:  # noqa: A001 - numpy-style name
    """Sum of the entries (optionally along one axis)."""
    x = as_expr(x)
    axis = _axis(axis, x)
    if x.shape == () and axis is None:
        return x
    return Sum(x, axis)


def mean(x: Any, axis: int | None = None) -> Expression:
    """Mean of the entries (optionally along one axis): `sum(x, axis) / count`."""
    x = as_expr(x)
    axis = _axis(axis, x)
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

    def to_cvxpy(self, x):
        return super().to_cvxpy(x) / self.count

    def to_sympy_explicit(self, x):
        import sympy
        return np.asarray(np.sum(x, axis=self.axis) * sympy.Rational(1, self.count), dtype=object)

    def render(self):
        return f"mean({self.args[0]}{'' if self.axis is None else f', axis={self.axis}'})"


__all__ = ["Add", "Neg", "Multiply", "MatMul", "Transpose", "Index", "IndexAdjoint", "Reshape",
           "BroadcastTo", "SumTo", "Sum", "Mean", "add", "neg", "multiply", "divide", "matmul",
           "transpose", "index", "reshape", "broadcast_to", "sum_to", "sum", "mean",
           "scalar_or_elementwise_mul", "Data", "elementwise_sign", "vectorize_sympy"]
