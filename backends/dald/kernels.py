"""DALD's compiled kernels: the multiplier steps (15) and (21), the Fed-DALD-CC server's
residual and Σμ mirror, the Fed-DALD-DC residual (80), the consensus terms of (20) and a whole
Gauss–Seidel sweep of (20) built from them, each one pass over the (n, d) stacks (conventions:
`fedmodel.runtime.kernels`).

Stacks of fewer than `NUMPY_ROWS` rows (nodes, edges) take `numpy_loops`: the same
numbers bit for bit without loading numba, whose import and the loops' load from the on-disk
cache are ~0.3 s CPU a process (a first compilation seconds), more than a small run's whole
server side; the one-pass compiled loops pay off with many rows. A numpy call costs ~20–40 µs
more than a compiled one (DALD-DC on a 6-ring), so after `NUMPY_CALLS` of them (about numba's
load) the process takes the compiled loops, as it does once they are loaded anyway: the numbers
do not change.
"""
from __future__ import annotations

from functools import cache

import numpy as np

from fedmodel.runtime.kernels import column_bounds, exact_shape, flags, indices, operand

#: stacks with fewer rows than this (nodes and edges) take the numpy loops (module docstring)
NUMPY_ROWS = 64
#: numpy calls in a process after which the compiled loops take over (module docstring)
NUMPY_CALLS = 10_000
_numpy_calls = [0]


@cache
def _compiled():
    """The compiled loops (`compiled_loops`), imported on first use (numba loads then)."""
    from . import compiled_loops
    return compiled_loops


def _loops(*rows: int):
    """The loops for stacks of these numbers of rows: `numpy_loops` below NUMPY_ROWS while the
    process has made fewer than NUMPY_CALLS numpy calls and not loaded the compiled loops."""
    if max(rows) < NUMPY_ROWS and _numpy_calls[0] < NUMPY_CALLS and not _compiled.cache_info().currsize:
        _numpy_calls[0] += 1
        from . import numpy_loops
        return numpy_loops
    return _compiled()


def consensus_dual(MU: np.ndarray, X: np.ndarray, xhat, weight) -> np.ndarray:
    """μ_i + w_i∘(x̂_i − x_i) for every row, as a new array (xhat: (d,) or (n, d)).

    >>> consensus_dual(np.zeros((2, 1)), np.array([[1.0], [3.0]]), np.array([2.0]), 2.0).ravel().tolist()
    [2.0, -2.0]
    """
    n, d = X.shape
    out = np.empty((n, d))
    _loops(n).consensus_dual(exact_shape(MU, (n, d)), exact_shape(X, (n, d)), operand(xhat, n, d, widen=True),
                               operand(weight, n, d), out)
    return out


def edge_dual(X: np.ndarray, MU: np.ndarray, tail: np.ndarray, head: np.ndarray, weight,
              move: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(new edge multipliers, ‖x_tail − x_head‖∞ per edge) of DALD-DC's step (21)."""
    m, d = MU.shape
    n = len(X)
    out, size = np.empty((m, d)), np.empty(m)
    _loops(n, m).edge_dual(exact_shape(X, (n, d)), exact_shape(MU, (m, d)), indices(tail, n, m), indices(head, n, m),
                          operand(weight, m, d), flags(move, m), out, size)
    return out, size


def _adjacency(adjacency, n: int, m: int):
    """(ptr, edge, nbr, sign) checked for n nodes and m edges, as the compiled loops take them."""
    ptr, edge, nbr, sign = adjacency
    ptr = indices(ptr, len(edge) + 1, n + 1)
    if np.any(np.diff(ptr) < 0) or ptr[0] != 0 or ptr[-1] != len(edge):
        raise ValueError("adjacency pointers must rise from 0 to the number of ends")
    return ptr, indices(edge, m), indices(nbr, n, len(edge)), operand(sign, 1, len(edge), widen=True).ravel()


def edge_terms(X: np.ndarray, MU: np.ndarray, rows: np.ndarray, adjacency, weight
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The consensus terms of (20) of the nodes `rows` (rows of X), each from its edges
    (adjacency = (ptr, edge, nbr, sign), CSR over X's rows) with the neighbour models X[nbr]:
    (linear Σ_e sign_e μ_e, total Σ_e w_e, anchor Σ_e w_e∘x_e / total), (k, d) each, so that
    node i's local problem is linear_iᵀx + ½Σ_j total_ij (x_j − anchor_ij)². weight: 2ρ_e² per
    edge, (m, 1) or (m, d). A node without edges: 0, 0 and its own x.

    >>> ptr, edge, nbr, sign = np.array([0, 2, 2, 2]), np.array([0, 1]), np.array([1, 2]), np.array([1.0, -1.0])
    >>> X, MU = np.array([[0.0], [1.0], [4.0]]), np.array([[3.0], [1.0]])
    >>> [a.ravel().tolist() for a in edge_terms(X, MU, np.array([0]), (ptr, edge, nbr, sign), np.ones((2, 1)))]
    [[2.0], [2.0], [2.5]]
    """
    n, d = X.shape
    m = len(MU)
    rows = indices(rows, n)
    ptr, edge, nbr, sign = _adjacency(adjacency, n, m)
    out = np.empty((3, len(rows), d))
    _loops(n, m).edge_terms(exact_shape(X, (n, d)), exact_shape(MU, (m, d)), rows, np.full(n, -1, dtype=np.intp),
                           ptr, edge, nbr, sign, operand(weight, m, d), out)
    return out[0], out[1], out[2]


def gauss_seidel_sweep(X: np.ndarray, G: np.ndarray, MU: np.ndarray, order: np.ndarray, adjacency,
                       weight: np.ndarray, step: float, threshold: np.ndarray,
                       cols: slice = slice(0, 0), prox_row=None) -> np.ndarray:
    """A Fed-DALD-DC sweep over the nodes `order` (see `dc_nodes._sweep_block`): the new (n, d)
    model stack (nodes outside `order` keep theirs). adjacency = (ptr, edge, nbr, sign), each
    node's edges in CSR layout; weight: 2ρ_e² per edge, (m, 1) or (m, d). `prox_row(z, i)`, if
    given, is node i's prox step on its new row z, in place (node by node, after the kernel).
    Each node's step is its consensus terms (`edge_terms`, with the newest neighbour models)
    and one proximal-gradient step of its local problem: the numbers of `dald_dc_solve` on the
    node with the same neighbour models and gradient.

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
    order = indices(order, n)
    rank = np.full(n, -1, dtype=np.intp)
    rank[order] = np.arange(len(order))
    if np.count_nonzero(rank >= 0) != len(order):
        raise ValueError("a node appears twice in the sweep order")
    B = np.empty((n, d)) if len(order) == n else np.array(X, dtype=float)
    args = (exact_shape(X, (n, d)), exact_shape(G, (n, d)), exact_shape(MU, (m, d)))
    rest = (rank, *_adjacency(adjacency, n, m), operand(weight, m, d), float(step),
            operand(threshold, 1, n, widen=True).ravel())
    run = _loops(n, m).gauss_seidel_sweep
    if prox_row is None:
        run(*args, order, *rest, *column_bounds(cols, d), B)
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
    largest = _loops(n).consensus_gap(exact_shape(X, (n, d)), operand(xhat, 1, d, widen=True), operand(weight, n, d),
                                        flags(member, n), total)
    return total, float(largest)


def largest_change(X: np.ndarray, previous: np.ndarray, member: np.ndarray) -> tuple[float, bool]:
    """(max_(member i) ‖x_i − previous_i‖∞, whether X is all finite) in one pass: Fed-DALD-DC's
    dual residual (80) and its divergence check. member: bool per row.

    >>> largest_change(np.array([[1.0], [np.inf]]), np.zeros((2, 1)), np.array([True, False]))
    (1.0, False)
    """
    largest, finite = _loops(len(X)).largest_change(exact_shape(X, X.shape), exact_shape(previous, X.shape),
                                                 flags(member, len(X)))
    return float(largest), bool(finite)
