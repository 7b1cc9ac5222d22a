"""Compiled loops (numba) for the batched executor's sequential and elementwise parts.

numpy makes one pass over memory per operation (with n = 1000 clients and d = 784 each (n, d)
array is 6.3 MB, so most passes miss the cache) and one Python call per node of a sequential
loop. These kernels do the same arithmetic in one compiled pass: a proximal-gradient step with
its soft-thresholding, the multiplier steps, the residuals, and a whole Gauss–Seidel sweep.
numba is imported on first use (≈ 0.5 s) and the kernels are compiled once and cached on disk,
so `import fedmodel` does not pay for it.

Conventions: model stacks are (n, d) float arrays. An operand that is the same for every row
(x̂, a scalar weight) is passed with one row, a per-row number with one column: the wrappers
hand the kernels C-ordered float arrays of shape (1 or n, 1 or d) (`_operand`), so each kernel
is compiled for one signature. A threshold < 0 means "no prox step" for that row;
soft-thresholding of z at t is z − clip(z, −t, t) (= sign(z)·max(|z| − t, 0)), applied to the
columns lo ≤ c < hi.
"""
from __future__ import annotations

from functools import cache

import numpy as np


@cache
def _compiled():
    """The compiled loops (`_compiled_kernels`), imported on first use."""
    from . import _compiled_kernels
    return _compiled_kernels


def _operand(a, rows: int, cols: int, widen: bool = False) -> np.ndarray:
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
    return _writable(a)


def _stack(X: np.ndarray, shape: tuple) -> np.ndarray:
    """An input X of exactly `shape` (see `_writable`). The kernels do not check bounds: the
    wrappers check every shape and index."""
    if np.shape(X) != tuple(shape):
        raise ValueError(f"array of shape {np.shape(X)} where {tuple(shape)} is needed")
    return _writable(X)


def _writable(a) -> np.ndarray:
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


def _index(a, bound: int, size: int | None = None) -> np.ndarray:
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
    _compiled().prox_grad_step(_stack(Z, Z.shape), _stack(G, Z.shape), _operand(weight, n, n_x),
                               _operand(anchor, n, n_x, widen=True), _operand(linear, n, n_x, widen=True),
                               float(sign), float(step), int(n_x), _operand(threshold, 1, n, widen=True).ravel(),
                               *_bounds(cols, Z.shape[1]), out)
    return out


def consensus_dual(MU: np.ndarray, X: np.ndarray, xhat, weight) -> np.ndarray:
    """μ_i + w_i∘(x̂_i − x_i) for every row, as a new array (xhat: (d,) or (n, d)).

    >>> consensus_dual(np.zeros((2, 1)), np.array([[1.0], [3.0]]), np.array([2.0]), 2.0).ravel().tolist()
    [2.0, -2.0]
    """
    n, d = X.shape
    out = np.empty((n, d))
    _compiled().consensus_dual(_stack(MU, (n, d)), _stack(X, (n, d)), _operand(xhat, n, d, widen=True),
                               _operand(weight, n, d), out)
    return out


def edge_dual(X: np.ndarray, MU: np.ndarray, tail: np.ndarray, head: np.ndarray, weight,
              move: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(new edge multipliers, ‖x_tail − x_head‖∞ per edge) of DALD-DC's step (21)."""
    m, d = MU.shape
    n = len(X)
    out, size = np.empty((m, d)), np.empty(m)
    _compiled().edge_dual(_stack(X, (n, d)), _stack(MU, (m, d)), _index(tail, n, m), _index(head, n, m),
                          _operand(weight, m, d), _flags(move, m), out, size)
    return out, size


def gauss_seidel_sweep(X: np.ndarray, G: np.ndarray, MU: np.ndarray, order: np.ndarray, adjacency,
                       weight: np.ndarray, step: float, threshold: np.ndarray,
                       cols: slice = slice(0, 0), prox_row=None) -> np.ndarray:
    """A Fed-DALD-DC sweep over the nodes `order` (see `batched_dc.dc_sweep`): the new (n, d)
    model stack (nodes outside `order` keep theirs). adjacency = (ptr, edge, nbr, sign), each
    node's edges in CSR layout; weight: 2ρ_e² per edge, (m, 1) or (m, d). `prox_row(z, i)`, if
    given, is node i's prox step on its new row z, in place (node by node, after the kernel).

    A 3-node chain x = (0, 1, 2), no gradients or multipliers, 2ρ² = 1, α = 0.5, order 0, 1, 2:
    node 0 moves half way to node 1 (0.5), node 1 to the mean of its neighbours' newest models,
    0.5 and 2 (1.25), node 2 half way to 1.25 (1.625):

    >>> ptr, edge = np.array([0, 1, 3, 4]), np.array([0, 0, 1, 1])
    >>> nbr, sign = np.array([1, 0, 2, 1]), np.array([1.0, -1.0, 1.0, -1.0])
    >>> X = np.array([[0.0], [1.0], [2.0]])
    >>> B = gauss_seidel_sweep(X, np.zeros((3, 1)), np.zeros((2, 1)), np.arange(3),
    ...                        (ptr, edge, nbr, sign), np.full((2, 1), 1.0), 0.5, -np.ones(3))
    >>> B.ravel().tolist()
    [0.5, 1.25, 1.625]
    """
    n, d = X.shape
    m = len(MU)
    order = _index(order, n)
    rank = np.full(n, -1, dtype=np.intp)
    rank[order] = np.arange(len(order))
    if np.count_nonzero(rank >= 0) != len(order):
        raise ValueError("a node appears twice in the sweep order")
    B = np.empty((n, d)) if len(order) == n else np.array(X, dtype=float)
    ptr, edge, nbr, sign = adjacency
    ptr = _index(ptr, len(edge) + 1, n + 1)
    if np.any(np.diff(ptr) < 0) or ptr[0] != 0 or ptr[-1] != len(edge):
        raise ValueError("adjacency pointers must rise from 0 to the number of ends")
    args = (_stack(X, (n, d)), _stack(G, (n, d)), _stack(MU, (m, d)))
    rest = (rank, ptr, _index(edge, m), _index(nbr, n, len(edge)), _operand(sign, 1, len(edge), widen=True).ravel(),
            _operand(weight, m, d), float(step), _operand(threshold, 1, n, widen=True).ravel())
    run = _compiled().gauss_seidel_sweep
    if prox_row is None:
        run(*args, order, *rest, *_bounds(cols, d), B)
        return B
    for s in range(len(order)):
        run(*args, order[s:s + 1], *rest, 0, 0, B)
        prox_row(B[order[s]], int(order[s]))
    return B


def consensus_gap(X: np.ndarray, xhat: np.ndarray, weight, member: np.ndarray) -> tuple[np.ndarray, float]:
    """(Σ_(member i) w_i∘(x̂ − x_i), max_i ‖x̂ − x_i‖∞ over all rows) in one pass over X: the
    Fed-DALD-CC server's multiplier mirror (w = 2ρ_i∘ρ_i) and primal residual. weight: scalar,
    (n, 1) or (n, d); member: bool per row.

    >>> consensus_gap(np.array([[1.0, 2.0], [3.0, 2.0]]), np.array([2.0, 2.0]), 2.0, np.array([True, False]))
    (array([2., 0.]), 1.0)
    """
    n, d = X.shape
    total = np.zeros(d)
    largest = _compiled().consensus_gap(_stack(X, (n, d)), _operand(xhat, 1, d, widen=True), _operand(weight, n, d),
                                        _flags(member, n), total)
    return total, float(largest)


def largest_change(X: np.ndarray, previous: np.ndarray, member: np.ndarray) -> tuple[float, bool]:
    """(max_(member i) ‖x_i − previous_i‖∞, whether X is all finite) in one pass: Fed-DALD-DC's
    dual residual (80) and its divergence check. member: bool per row.

    >>> largest_change(np.array([[1.0], [np.inf]]), np.zeros((2, 1)), np.array([True, False]))
    (1.0, False)
    """
    largest, finite = _compiled().largest_change(_stack(X, X.shape), _stack(previous, X.shape),
                                                 _flags(member, len(X)))
    return float(largest), bool(finite)


def _flags(a, size: int) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.bool_).ravel()
    if len(a) != size:
        raise ValueError(f"{len(a)} flags for {size} rows")
    return a


def _bounds(cols: slice, width: int) -> tuple[int, int]:
    lo, hi, stride = cols.indices(width)
    if stride != 1:
        raise ValueError("prox columns must be a contiguous slice")
    return lo, hi
