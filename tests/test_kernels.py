"""The compiled kernels of the batched executor (fedmodel/runtime/kernels.py) against plain
numpy implementations of the formulas in their docstrings, on random inputs, and the operand
conventions that every kernel wrapper shares (DALD's own kernels: tests/test_dald_kernels.py).

The kernels do the serial procedures' operations in the same order, so every comparison is
exact (`assert_array_equal`)."""
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedmodel.runtime import kernels
from fedmodel.runtime.kernels import operand

FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _shrink(v, t):
    """Soft-thresholding as the docstrings define it: v − clip(v, −t, t)."""
    return v - np.clip(v, -t, t)


def _frozen(*arrays):
    return [np.array(a, copy=True) for a in arrays]


def _unchanged(before, after):
    for b, a in zip(before, after):
        np.testing.assert_array_equal(np.asarray(a), b)


# ---- prox_grad_step ---------------------------------------------------------------------------
def _per_row(kind, rng, n, n_x):
    """An operand in one of the layouts the wrappers accept."""
    if kind == "scalar":
        return float(rng.uniform(0.1, 2.0))
    if kind == "zero":
        return 0.0
    if kind == "column":
        return rng.uniform(0.1, 2.0, size=(n, 1))
    if kind == "row":
        return rng.normal(size=n_x)
    if kind == "broadcast":
        return np.broadcast_to(rng.normal(size=n_x), (n, n_x))
    return rng.normal(size=(n, n_x))                            # "full"


def _prox_grad_reference(Z, G, weight, anchor, linear, sign, step, n_x, threshold, cols):
    n = Z.shape[0]
    w = np.broadcast_to(np.asarray(weight, float), (n, n_x))
    a = np.broadcast_to(np.asarray(anchor, float), (n, n_x))
    lin = np.broadcast_to(np.asarray(linear, float), (n, n_x))
    out = np.empty(Z.shape)
    x = Z[:, :n_x]
    out[:, :n_x] = x - step * ((((x - a) * w) + sign * lin) + G[:, :n_x])
    out[:, n_x:] = Z[:, n_x:] - step * G[:, n_x:]
    for i in range(n):
        if threshold[i] >= 0:
            out[i, cols] = _shrink(out[i, cols], threshold[i])
    return out


@FEW
@given(n=st.integers(1, 6), n_x=st.integers(1, 5), extra=st.integers(0, 3),
       weight=st.sampled_from(["scalar", "column", "full"]),
       anchor=st.sampled_from(["row", "full", "broadcast"]),
       linear=st.sampled_from(["zero", "row", "full"]),
       sign=st.sampled_from([1.0, -1.0]), fortran=st.booleans(),
       bounds=st.tuples(st.integers(0, 8), st.integers(0, 8)), seed=st.integers(0, 2**32 - 1))
def test_prox_grad_step_equals_its_formula(n, n_x, extra, weight, anchor, linear, sign, fortran,
                                            bounds, seed):
    """z − α((((z − a)·w) + sign·l) + g) on the first n_x columns, z − αg on the private ones,
    then v − clip(v, −t_i, t_i) on the prox columns of rows with t_i ≥ 0; inputs untouched."""
    rng = np.random.default_rng(seed)
    n_z = n_x + extra
    Z, G = rng.normal(size=(n, n_z)), rng.normal(size=(n, n_z))
    if fortran:                                   # not C-ordered: the wrapper copies it
        Z = np.asfortranarray(Z)
    w, a, lin = (_per_row(kind, rng, n, n_x) for kind in (weight, anchor, linear))
    threshold = rng.uniform(0.0, 1.0, size=n)
    threshold[rng.random(n) < 0.3] = -1.0         # no prox step on these rows
    lo, hi = sorted(min(b, n_z) for b in bounds)
    cols, step = slice(lo, hi), float(rng.uniform(0.01, 1.0))
    before = _frozen(Z, G, w, a, lin, threshold)
    got = kernels.prox_grad_step(Z, G, w, a, lin, sign, step, n_x, threshold, cols)
    want = _prox_grad_reference(Z, G, w, a, lin, sign, step, n_x, threshold, cols)
    np.testing.assert_array_equal(got, want)
    _unchanged(before, (Z, G, w, a, lin, threshold))


def test_prox_grad_step_thresholds_only_the_listed_rows_and_columns():
    """A hand-checked case: large entries shrink by t inside the slice, small ones go to 0,
    rows with t < 0 and columns outside the slice are the plain gradient step."""
    Z = np.array([[3.0, -3.0, 0.5, 2.0], [3.0, -3.0, 0.5, 2.0]])
    out = kernels.prox_grad_step(Z, np.zeros_like(Z), 0.0, np.zeros(2), 0.0, 1.0, 1.0, 2,
                                 np.array([1.0, -1.0]), slice(1, 3))
    np.testing.assert_array_equal(out, [[3.0, -2.0, 0.0, 2.0], [3.0, -3.0, 0.5, 2.0]])

# ---- operand ----------------------------------------------------------------------------------
def testoperand_reduces_a_broadcast_view_without_copying_its_rows():
    """A stride-0 view of one row (or column) becomes that one row (column); n rows are never
    materialized (40 MB if they were)."""
    n, d = 100_000, 50
    row = np.linspace(-1.0, 1.0, d)
    view = np.broadcast_to(row, (n, d))
    tracemalloc.start()
    try:
        out = operand(view, n, d)
        widened = operand(view, n, d, widen=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    assert out.shape == (1, d) and widened.shape == (1, d)
    np.testing.assert_array_equal(out[0], row)
    column = operand(np.broadcast_to(np.arange(4.0)[:, None], (4, d)), 4, d)
    assert column.shape == (4, 1)
    np.testing.assert_array_equal(column[:, 0], np.arange(4.0))
    for a in (out, column):
        assert a.flags.c_contiguous and a.flags.writeable and a.dtype == float


def testoperand_layouts():
    """Scalars and rows become one row (`widen`: all columns); an (n, d) float stack of the
    caller's passes through as the same object."""
    stack = np.arange(12.0).reshape(3, 4)
    assert operand(stack, 3, 4) is stack
    assert operand(2.0, 3, 4).shape == (1, 1)
    np.testing.assert_array_equal(operand(2.0, 3, 4, widen=True), np.full((1, 4), 2.0))
    np.testing.assert_array_equal(operand(np.arange(4), 3, 4), [[0.0, 1.0, 2.0, 3.0]])
    assert operand(np.ones((3, 1)), 3, 4).shape == (3, 1)
    assert operand(np.ones((3, 1)), 3, 4, widen=True).shape == (3, 4)


@pytest.mark.parametrize("shape", [(4, 4), (2, 4), (3, 5), (5,), (3, 2), (3, 4, 1)])
def testoperand_refuses_a_shape_that_does_not_broadcast(shape):
    with pytest.raises(ValueError, match="does not broadcast"):
        operand(np.ones(shape), 3, 4)


