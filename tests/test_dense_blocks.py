"""`DenseBlocks`: diag(X_1, …, X_n) of dense same-width client data multiplies exactly as the
CSR block-diagonal matrix it replaces (same summation order: equal bit for bit), and the batched
plans use it for dense data only."""
import numpy as np
import pytest
import scipy.linalg

import fedmodel as fm
from fedmodel.runtime.batched_plan import BatchedPlan, _block_diag
from fedmodel.runtime.dense_blocks import DenseBlocks
from fedmodel.runtime.program import compile_programs


@pytest.mark.parametrize("d", [1, 4, 10, 37])
def test_products_equal_the_csr_matrix_bitwise_and_the_dense_matrix(d):
    rng = np.random.default_rng(d)
    sizes = [3, 0, 7, 1, 5, 4, 2]                       # ragged, an empty client, odd row counts
    blocks = [rng.normal(size=(m, d)) for m in sizes]
    dense = DenseBlocks.of(blocks)
    csr = _block_diag(blocks)
    full = scipy.linalg.block_diag(*blocks)
    assert dense.shape == csr.shape == full.shape and dense.T.shape == full.T.shape
    v, t = rng.normal(size=full.shape[1]), rng.normal(size=full.shape[0])
    np.testing.assert_array_equal(dense @ v, csr @ v)
    np.testing.assert_array_equal(dense.T @ t, csr.T @ t)
    np.testing.assert_allclose(dense @ v, full @ v, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(dense.T @ t, full.T @ t, rtol=1e-13, atol=1e-13)


def test_sparse_ragged_width_or_vector_blocks_keep_csr():
    rng = np.random.default_rng(0)
    sparse = [rng.normal(size=(6, 5)) * (rng.random((6, 5)) < 0.3) for _ in range(3)]
    assert DenseBlocks.of(sparse) is None                                   # mostly zeros
    assert DenseBlocks.of([rng.normal(size=(3, 4)), rng.normal(size=(3, 5))]) is None   # widths
    assert DenseBlocks.of([rng.normal(size=4), rng.normal(size=4)]) is None             # 1-D
    with pytest.raises(ValueError, match="operand of shape"):
        DenseBlocks.of([rng.normal(size=(3, 4))]) @ np.ones(5)


def _programs(dense: bool, n: int = 6, d: int = 4):
    rng = np.random.default_rng(3)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    for i in range(n):
        m = 5 + i % 3
        X = rng.normal(size=(m, d)) * (1.0 if dense else rng.random((m, d)) < 0.2)
        c = prob.add_client(f"c{i}")
        Xd, y = c.data(X, name="X"), c.data(np.sign(rng.normal(size=m)), name="y")
        c.minimize(fm.sum(fm.logistic(-fm.multiply(y, Xd @ w))) / m)
    return [p for p in compile_programs(prob).values() if p.role == "client"]


@pytest.mark.parametrize("dense", [True, False])
def test_batched_plan_picks_the_form_by_density_and_equals_each_client(dense):
    programs = _programs(dense)
    plan = BatchedPlan([p.value_grad_plan for p in programs])
    kinds = {type(m).__name__ for m, _ in plan._bd.values() if m is not None}   # (None: tried dense)
    assert kinds == ({"DenseBlocks"} if dense else {"csr_matrix"})
    W = np.random.default_rng(4).normal(size=(len(programs), 4))
    value, grad = plan(W.ravel())
    for i, p in enumerate(programs):
        v, g = p.value_grad_plan(W[i])
        assert value[i] == pytest.approx(float(v), rel=1e-13, abs=1e-13)
        np.testing.assert_allclose(grad[4 * i:4 * i + 4], np.ravel(g), rtol=1e-12, atol=1e-13)
