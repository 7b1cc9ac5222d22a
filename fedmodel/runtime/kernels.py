"""Compiled loops (numba) for the batched executor's elementwise parts, and the conventions
that backends' own kernels share (wrappers that check shapes before a compiled loop runs).

numpy makes one pass over memory per operation (with n = 1000 clients and d = 784 each (n, d)
array is 6.3 MB, so most passes miss the cache). A kernel does the same arithmetic in one
compiled pass: here, a proximal-gradient step with its soft-thresholding. numba is imported on
first use (≈ 0.5 s) and the kernels are compiled once and cached on disk, so `import fedmodel`
does not pay for it (`compiled`).

Conventions: model stacks are (n, d) float arrays. An operand that is the same for every row
(x̂, a scalar weight) is passed with one row, a per-row number with one column: the wrappers
hand the kernels C-ordered float arrays of shape (1 or n, 1 or d) (`operand`), so each kernel
is compiled for one signature. A threshold < 0 means "no prox step" for that row;
soft-thresholding of z at t is z − clip(z, −t, t) (= sign(z)·max(|z| − t, 0)), applied to the
columns lo ≤ c < hi (`column_bounds`).
"""
from __future__ import annotations

from functools import cache

import numpy as np


@cache
def _compiled():
    """The compiled loops (`compiled_loops`), imported on first use."""
    from . import compiled_loops
    return compiled_loops


def operand(a, rows: int, cols: int, widen: bool = False) -> np.ndarray:
    """`a` (a scalar, a (cols,) row, or an array broadcastable to (rows, cols)) as a C-ordered,
    writable float array of shape (1 or rows, 1 or cols); `widen`: always cols columns. Large
    operands are the caller's own stacks and pass through without a copy; a broadcast view
    (stride 0) is reduced to its one row or column first."""
    a = np.asarray(a, dtype=float)
    a = a.reshape(1, -1) if a.ndim < 2 else a
    if a.ndim == 2 and a.shape[0] > 1 and a.strides[0] == 0:
        a = a[:1]
    if a.ndim == 2 and a.shape[1] > 1 and a.strides[1] == 0:
        a = a[:, :1]
    if a.ndim != 2 or a.shape[0] not in (1, rows) or a.shape[1] not in (1, cols):
        raise ValueError(f"operand of shape {a.shape} does not broadcast to ({rows}, {cols})")
    if widen and a.shape[1] != cols:
        a = np.broadcast_to(a, (a.shape[0], cols))
    return writable(a)


def exact_shape(X: np.ndarray, shape: tuple) -> np.ndarray:
    """An input X of exactly `shape` (see `writable`). The kernels do not check bounds: the
    wrappers check every shape and index."""
    if np.shape(X) != tuple(shape):
        raise ValueError(f"array of shape {np.shape(X)} where {tuple(shape)} is needed")
    return writable(X)


def writable(a) -> np.ndarray:
    """`a` as a C-ordered writable float array, so that each kernel has one signature: no copy
    for the executor's own stacks, nor for a read-only view of one (group replies are read-only
    views; the kernels only read their inputs)."""
    if isinstance(a, np.ndarray) and a.flags.c_contiguous and a.dtype == float:
        if a.flags.writeable:
            return a
        view = a.view()
        try:
            view.flags.writeable = True      # allowed when the memory underneath is writable
            return view
        except ValueError:
            pass
    return np.array(a, dtype=float, order="C")


def indices(a, bound: int, size: int | None = None) -> np.ndarray:
    """Indices into `bound` rows (and `size` of them, if given) as a C-ordered intp array."""
    a = np.ascontiguousarray(a, dtype=np.intp).ravel()
    if (size is not None and len(a) != size) or (len(a) and (a.min() < 0 or a.max() >= bound)):
        raise ValueError(f"{len(a)} indices in [{a.min() if len(a) else 0}, {a.max() if len(a) else 0}] "
                         f"where {size if size is not None else 'any number of'} in [0, {bound}) are needed")
    return a


def prox_grad_step(Z: np.ndarray, G: np.ndarray, weight, anchor, linear, sign: float, step: float,
                   n_x: int, threshold: np.ndarray, cols: slice = slice(0, 0)) -> np.ndarray:
    """One step z ← prox(z − α(∇ + w∘(x − anchor) + sign·linear)) for every row of Z (G: ∇ at
    Z; x: the first n_x columns of z), as a new array; the proximal term is λ_i‖·‖₁ on `cols`
    with threshold[i] = αλ_i (< 0: none). weight: scalar, (n, 1) or (n, n_x).

    >>> prox_grad_step(np.ones((1, 2)), np.zeros((1, 2)), 1.0, np.zeros(2), np.zeros(2), 1.0,
    ...                0.5, 2, np.array([0.1]), slice(0, 1)).tolist()   # 1 − 0.5·1, shrunk in column 0
    [[0.4, 0.5]]
    """
    n = Z.shape[0]
    out = np.empty(Z.shape)
    if not 0 <= n_x <= Z.shape[1]:
        raise ValueError(f"n_x = {n_x} for {Z.shape[1]} columns")
    _compiled().prox_grad_step(exact_shape(Z, Z.shape), exact_shape(G, Z.shape), operand(weight, n, n_x),
                               operand(anchor, n, n_x, widen=True), operand(linear, n, n_x, widen=True),
                               float(sign), float(step), int(n_x), operand(threshold, 1, n, widen=True).ravel(),
                               *column_bounds(cols, Z.shape[1]), out)
    return out


def flags(a, size: int) -> np.ndarray:
    """One bool per row (`size` of them) as a C-ordered bool array."""
    a = np.ascontiguousarray(a, dtype=np.bool_).ravel()
    if len(a) != size:
        raise ValueError(f"{len(a)} flags for {size} rows")
    return a


def column_bounds(cols: slice, width: int) -> tuple[int, int]:
    """(lo, hi) of a contiguous column slice of an array `width` columns wide."""
    lo, hi, stride = cols.indices(width)
    if stride != 1:
        raise ValueError("prox columns must be a contiguous slice")
    return lo, hi
