"""`DenseBlocks`: diag(X_1, …, X_n) of dense same-width client data multiplies exactly as the
CSR block-diagonal matrix it replaces (same summation order: equal bit for bit), and the batched
plans use it for dense data only; on one thread or on numba's threads, the same numbers."""
import os

import numpy as np
import pytest
import scipy.linalg

import fedmodel as fm
from fedmodel.runtime.batched_plan import BatchedPlan
from fedmodel.runtime.segments import block_diag
from fedmodel.runtime import dense_blocks
from fedmodel.runtime.dense_blocks import ONE_THREAD, TASKS_PER_THREAD, THREADS, DenseBlocks
from fedmodel.runtime.program import compile_programs


@pytest.mark.parametrize("d", [1, 4, 10, 37])
def test_products_equal_the_csr_matrix_bitwise_and_the_dense_matrix(d):
    rng = np.random.default_rng(d)
    sizes = [3, 0, 7, 1, 5, 4, 2]                       # ragged, an empty client, odd row counts
    blocks = [rng.normal(size=(m, d)) for m in sizes]
    dense = DenseBlocks.of(blocks)
    csr = block_diag(blocks)
    full = scipy.linalg.block_diag(*blocks)
    assert dense.shape == csr.shape == full.shape and dense.T.shape == full.T.shape
    v, t = rng.normal(size=full.shape[1]), rng.normal(size=full.shape[0])
    np.testing.assert_array_equal(dense @ v, csr @ v)
    np.testing.assert_array_equal(dense.T @ t, csr.T @ t)
    np.testing.assert_allclose(dense @ v, full @ v, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(dense.T @ t, full.T @ t, rtol=1e-13, atol=1e-13)


class _Always:
    """A chooser that always picks `way` and counts the timed calls."""

    def __init__(self, way: int):
        self.way, self.timed = way, 0

    def choose(self) -> int:
        return self.way

    def record(self, seconds: float) -> None:
        self.timed += 1


def _threaded(blocks, way: int = THREADS, threads: int = 2) -> tuple[DenseBlocks, DenseBlocks]:
    """diag(blocks) and its transpose, split into tasks for `threads` threads (whatever numba's
    thread count; run on the threads this machine has) and always taking `way`."""
    dense = DenseBlocks.of(blocks)
    transposed = dense.T
    usable = dense_blocks._usable_threads(dense_blocks._numba()[0])
    for A in (dense, transposed):
        A._tasks = A.chunks(threads), min(threads, usable)
        A.faster = _Always(way)
    return dense, transposed


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_products_on_threads_equal_one_thread_and_csr_bitwise(threads):
    rng = np.random.default_rng(threads)
    blocks = [rng.normal(size=(m, 10)) for m in rng.integers(0, 60, 400)]    # ragged, > PARALLEL_ENTRIES
    csr = block_diag(blocks)
    chunks = DenseBlocks.of(blocks).chunks(threads)
    assert chunks[0] == 0 and chunks[-1] == len(blocks) and np.all(np.diff(chunks) > 0)
    assert len(chunks) == TASKS_PER_THREAD * threads + 1
    v, t = rng.normal(size=csr.shape[1]), rng.normal(size=csr.shape[0])
    for way in (ONE_THREAD, THREADS):
        dense, transposed = _threaded(blocks, way, threads)
        np.testing.assert_array_equal(dense @ v, csr @ v)
        np.testing.assert_array_equal(transposed @ t, csr.T @ t)
        assert dense.faster.timed == transposed.faster.timed == 1


def test_small_data_or_one_thread_is_one_task_and_not_timed():
    blocks = [np.ones((5, 4))] * 10
    np.testing.assert_array_equal(DenseBlocks.of(blocks).chunks(8), [0, 10])
    big = [np.ones((50, 10))] * 400
    np.testing.assert_array_equal(DenseBlocks.of(big).chunks(1), [0, 400])
    dense, _ = _threaded(big, THREADS, threads=1)
    dense @ np.ones(dense.shape[1])
    assert dense.faster.timed == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_process_forked_after_a_threaded_product_multiplies_on_one_thread():
    # numba's GNU OpenMP layer terminates a forked child that launches its threads: the child
    # must take the one-thread loop and still get the same numbers
    rng = np.random.default_rng(5)
    blocks = [rng.normal(size=(30, 10)) for _ in range(500)]
    dense, _ = _threaded(blocks)
    v = rng.normal(size=dense.shape[1])
    expected = dense @ v                                  # starts the threads in this process
    assert dense.faster.timed == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                          # the child: its product, then exit
        os.close(read)
        ok = np.array_equal(dense @ v, expected) and dense.faster.timed == 1
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1", "the forked child died, multiplied differently or timed its one-thread product"


def test_a_product_while_another_thread_is_in_one_runs_on_the_calling_thread():
    rng = np.random.default_rng(6)
    blocks = [rng.normal(size=(30, 10)) for _ in range(500)]
    dense, _ = _threaded(blocks)
    v = rng.normal(size=dense.shape[1])
    expected = dense @ v
    with dense_blocks._PARALLEL_LOCK:                     # as if another thread held numba's threads
        np.testing.assert_array_equal(dense @ v, expected)
    assert dense.faster.timed == 1                        # the one-thread fallback is not timed


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


def test_the_first_product_starts_the_threads_untimed(monkeypatch):
    """The thread pool starts (and the parallel loop loads) in a matrix's first product, not in
    the chooser's first timed probe of the threads in mid-run; the numbers are the same."""
    monkeypatch.setattr(dense_blocks, "_usable_threads", lambda numba: 2)
    rng = np.random.default_rng(5)
    rows = dense_blocks.PARALLEL_ENTRIES // 8 + 1
    blocks = [rng.normal(size=(m, 8)) for m in (rows // 3, rows // 3 + 1, rows // 3 + 2)]
    dense, csr = DenseBlocks.of(blocks), block_diag(blocks)
    v = rng.normal(size=dense.shape[1])
    np.testing.assert_array_equal(dense @ v, csr @ v)
    assert dense.faster._untimed == [True, False]     # the threads ran, untimed; way 0 not yet
    assert dense.faster.running == ONE_THREAD and dense.faster._calls == 0
    np.testing.assert_array_equal(dense @ v, csr @ v)  # then the chooser's turn: way 0 first
    assert dense.faster._untimed == [False, False]
