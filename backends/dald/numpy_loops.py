"""DALD's kernels in numpy, for stacks of few rows (`kernels.NUMPY_ROWS`): the functions of
`compiled_loops` with the same arguments, the same arithmetic in the same order (rows and
edges one after another, sums from their first term as the loops have them), so the same
numbers bit for bit, without loading numba (its import and the loops' load from the on-disk
cache were ~0.3 s CPU a process, a first compilation seconds: more than a small run's whole
server side). Elementwise steps are vectorized over columns; the sums over rows and edges
stay sequential, as numpy's own reductions may pair terms differently. Like the compiled
loops they do not warn about inf or NaN (a diverging run's report says so)."""
import functools

import numpy as np


def _quiet(fn):
    """`fn` without numpy's floating-point warnings."""
    @functools.wraps(fn)
    def run(*args):
        with np.errstate(all="ignore"):
            return fn(*args)
    return run


def _row(A: np.ndarray, i: int) -> np.ndarray:
    """Row i of an operand with one row per row, or its only row (`compiled_loops.pick`)."""
    return A[i] if A.shape[0] > 1 else A[0]


def _largest_abs(diff: np.ndarray) -> float:
    """max |diff| from 0.0, NaN if any entry is NaN (the loops' `larger`/`max_abs_diff`)."""
    return float(np.max(np.abs(diff))) if diff.size else 0.0


@_quiet
def consensus_dual(MU, X, xhat, weight, out):
    """out ← μ + w∘(x̂ − x), elementwise as (x̂ − x)·w + μ."""
    out[...] = (xhat - X) * weight + MU


@_quiet
def consensus_gap(X, xhat, weight, member, total):
    """total ← Σ_(member i) w_i∘(x̂ − x_i), row after row; returns max_i ‖x̂ − x_i‖∞."""
    diff = xhat[0] - X
    for i in np.flatnonzero(member):
        total += _row(weight, i) * diff[i]
    return _largest_abs(diff)


@_quiet
def edge_dual(X, MU, tail, head, weight, move, out, size):
    """Per edge: C = x_tail − x_head, size ← ‖C‖∞, out ← μ + C∘w where `move`, else μ."""
    C = X[tail] - X[head]
    size[...] = np.max(np.abs(C), axis=1) if C.shape[1] else 0.0
    out[...] = np.where(move[:, None], MU + C * weight, MU)


def edge_terms_row(i, X, B, rank, ptr, edge, nbr, sign, MU, weight):
    """(linear, total, anchor) of node i's consensus terms of (20), edge after edge
    (`compiled_loops.edge_terms_row`: the newest neighbour model, B[j] when j came earlier in the
    sweep; a node without edges: 0, 0 and x_i)."""
    d = X.shape[1]
    if ptr[i] == ptr[i + 1]:
        return np.zeros(d), np.zeros(d), X[i].copy()
    wide = weight.shape[1] > 1
    for k in range(ptr[i], ptr[i + 1]):
        e, j = edge[k], nbr[k]
        other = B[j] if 0 <= rank[j] < rank[i] else X[j]
        w = _row(weight, e) if wide else _row(weight, e)[0]
        step = sign[k] * MU[e]
        if k == ptr[i]:
            linear, total, anchor = step, w, w * other
        else:
            linear, total, anchor = linear + step, total + w, anchor + w * other
    return linear, np.full(d, total) if not wide else total, anchor / total


@_quiet
def edge_terms(X, MU, rows, rank, ptr, edge, nbr, sign, weight, out):
    """out[:, k] ← (linear, total, anchor) of node rows[k], neighbours from X."""
    for k in range(rows.shape[0]):
        out[:, k] = edge_terms_row(rows[k], X, X, rank, ptr, edge, nbr, sign, MU, weight)


def _prox_grad_row(z, g, total, anchor, linear, step, threshold, lo, hi):
    """`compiled_loops.prox_grad_step` on one row (sign 1, every column shared), then its
    soft-thresholding on columns lo:hi (`shrink`: z − clip(z, −t, t) in np.clip's order)."""
    o = z - (((z - anchor) * total + 1.0 * linear) + g) * step
    if threshold >= 0.0:
        part = o[lo:hi]
        clipped = np.where(part < -threshold, -threshold, part)
        o[lo:hi] = part - np.where(clipped > threshold, threshold, clipped)
    return o


@_quiet
def gauss_seidel_sweep(X, G, MU, order, rank, ptr, edge, nbr, sign, weight, step, threshold, lo, hi, B):
    """Nodes `order` of a sweep of (20) into B, node after node (`compiled_loops.gauss_seidel_sweep`)."""
    for i in order:
        linear, total, anchor = edge_terms_row(i, X, B, rank, ptr, edge, nbr, sign, MU, weight)
        B[i] = _prox_grad_row(X[i], G[i], total, anchor, linear, step, threshold[i], lo, hi)


@_quiet
def largest_change(X, previous, member):
    """(max_(member i) ‖x_i − previous_i‖∞, whether every entry of X is finite)."""
    return _largest_abs(X[member] - previous[member]), bool(np.all(np.isfinite(X)))
