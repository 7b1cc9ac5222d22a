"""`executor="auto"`: which executor it picks for a few model shapes (and why), and that a run
on it gives the serial executor's numbers."""
import numpy as np
import pytest

from fedmodel import backends
import fedmodel as fm
from fedmodel import registry
from fedmodel.runtime import auto_executor as auto
from fedmodel.runtime.auto_executor import AutoExecutor, choose
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.executor import SerialExecutor, make_executor
from fedmodel.runtime.program import compile_programs


def _logistic(n, d, zeros=0.0, two_kinds=False, seed=0):
    """n clients, d features, a fraction `zeros` of the data set to 0; `two_kinds`: every other
    client has a least-squares loss (two model structures)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    for i in range(n):
        m = 6 + i % 4
        X = rng.normal(size=(m, d)) * (rng.random((m, d)) >= zeros)
        c = prob.add_client(f"c{i}")
        Xd, y = c.data(X, name="X"), c.data(np.sign(rng.normal(size=m)), name="y")
        if two_kinds and i % 2:
            c.minimize(fm.sum_squares(Xd @ w - y) / m)
        else:
            c.minimize(fm.sum(fm.logistic(-fm.multiply(y, Xd @ w))) / m)
    return prob


def _clients(prob):
    return [p for p in compile_programs(prob).values() if p.role == "client"]


def test_choice_by_model_shape():
    few = _clients(_logistic(auto.MIN_GROUP - 1, 10))
    assert choose(few, jax_installed=True, gpu=True)[0] == "serial"      # nothing to vectorize
    dense_narrow = _clients(_logistic(12, 10))
    dense_wide = _clients(_logistic(12, 120))
    sparse_wide = _clients(_logistic(12, 120, zeros=0.8))
    assert choose(dense_narrow, jax_installed=True, gpu=False)[0] == "batched"
    assert choose(dense_wide, jax_installed=True, gpu=False, memory=1e12)[0] == "jax"
    name, reason = choose(dense_wide, jax_installed=True, gpu=False, memory=1e3)
    assert name == "batched" and "GiB available" in reason          # JAX's copy would not fit
    assert choose(dense_wide, jax_installed=False, gpu=False)[0] == "batched"
    name, reason = choose(sparse_wide, jax_installed=True, gpu=False)
    assert name == "batched" and "nonzero" in reason
    # a GPU: JAX from GPU_MIN_ENTRIES data entries (here 12 clients × ≤ 9 rows × 120), the CPU's rules below
    assert 12 * 9 * 120 < auto.GPU_MIN_ENTRIES
    name, reason = choose(sparse_wide, jax_installed=True, gpu=True)
    assert name == "batched" and "a GPU is present, but" in reason
    assert choose(dense_narrow, jax_installed=True, gpu=True)[0] == "batched"


def test_a_gpu_runs_large_data(monkeypatch):
    sparse_wide = _clients(_logistic(12, 120, zeros=0.8))
    entries = auto.data_bytes(sparse_wide) / 8
    monkeypatch.setattr(auto, "GPU_MIN_ENTRIES", entries)
    name, reason = choose(sparse_wide, jax_installed=True, gpu=True)
    assert name == "jax" and reason.startswith("a GPU is present and")    # the GPU before the sparsity rule
    monkeypatch.setattr(auto, "GPU_MIN_ENTRIES", entries * 1.01)
    assert choose(sparse_wide, jax_installed=True, gpu=True)[0] == "batched"


def test_data_density_counts_the_sampled_clients_data():
    prob = _logistic(30, 20, zeros=0.75, seed=3)
    # the same data drawn again: nonzeros of the first SAMPLE clients' X (y is 1-D: not counted)
    rng = np.random.default_rng(3)
    nonzero = total = 0
    for i in range(30):
        m = 6 + i % 4
        X = rng.normal(size=(m, 20)) * (rng.random((m, 20)) >= 0.75)
        rng.normal(size=m)
        if i < auto.SAMPLE:
            nonzero, total = nonzero + np.count_nonzero(X), total + X.size
    assert auto.data_density(_clients(prob)) == pytest.approx(nonzero / total, abs=1e-12)
    assert auto.data_density([]) == 1.0
    # bytes: the sampled clients' X (8 bytes an entry) scaled to all 30 clients
    assert auto.data_bytes(_clients(prob)) == pytest.approx(8.0 * total / auto.SAMPLE * 30)


def test_registered_and_returns_the_chosen_executor_started():
    assert "auto" in registry.names("executor")
    prob = _logistic(10, 10)
    chooser = make_executor("auto")
    assert isinstance(chooser, AutoExecutor)
    ex = chooser.start(compile_programs(prob))
    try:
        assert type(ex) is BatchedExecutor and chooser.chosen == "batched"
        assert ex.auto_choice == ("batched", chooser.reason)
        assert len(ex.groups) == 1 and ex.groups[0].n == 10
    finally:
        ex.close()


def test_no_large_group_falls_back_to_serial():
    # enough clients, but two structures with fewer than MIN_GROUP each
    n = 2 * (auto.MIN_GROUP - 1)
    assert n >= auto.MIN_GROUP
    chooser = AutoExecutor()
    ex = chooser.start(compile_programs(_logistic(n, 10, two_kinds=True)))
    try:
        assert type(ex) is SerialExecutor and chooser.chosen == "serial"
        assert "share one model structure" in chooser.reason
    finally:
        ex.close()


def test_auto_gives_the_serial_numbers():
    prob = _logistic(12, 6, seed=5)
    solver = backends.DALD(solver="gd", step=0.05, max_iterations=25, eps_primal=0.0, eps_dual=0.0)
    serial = prob.solve(solver, executor="serial")
    chooser = AutoExecutor()
    auto_run = prob.solve(solver, executor=chooser)
    assert chooser.chosen == "batched"
    for v in serial.values:
        np.testing.assert_allclose(auto_run.values[v], serial.values[v], rtol=1e-10, atol=1e-12)
    assert [r["objective"] for r in auto_run.history] == \
        pytest.approx([r["objective"] for r in serial.history], rel=1e-10)
    assert auto_run.ledger == serial.ledger


def test_no_gpu_plugin_means_no_gpu_and_no_jax_import(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in auto.GPU_PLUGINS else real(name, *a))
    monkeypatch.setattr(auto, "jax_available", lambda: True)
    assert auto.gpu_available() is False


def test_a_jax_pick_is_the_batched_executor_with_its_jax_engine(monkeypatch):
    """`auto` builds one executor for both vectorized picks: "jax" is `BatchedExecutor` with the
    JAX engine (JaxGroups, built once), "batched" the same class with numpy's."""
    pytest.importorskip("jax")
    from fedmodel.runtime.jax_engine import JaxGroup
    monkeypatch.setattr(auto, "choose", lambda programs, **_: ("jax", "picked by the test"))
    chooser = AutoExecutor()
    ex = chooser.start(compile_programs(_logistic(10, 10)))
    try:
        assert type(ex) is BatchedExecutor and ex.engine.name == "jax" and ex.min_group == auto.MIN_GROUP
        assert chooser.chosen == "jax" and ex.auto_choice == ("jax", "picked by the test")
        assert len(ex.groups) == 1 and type(ex.groups[0]) is JaxGroup and ex.groups[0].n == 10
    finally:
        ex.close()


def test_the_default_executor_is_auto_without_jax_on_the_cpu(monkeypatch):
    """A run that names no executor: serial below DEFAULT_MIN_CLIENTS clients, batched from
    there, never JAX's compile on a CPU (where `executor="auto"` picks JAX: dense, d ≥ JAX_MIN_WIDTH)."""
    from fedmodel.runtime.auto_executor import DefaultExecutor
    monkeypatch.setattr(auto, "jax_available", lambda: True)
    monkeypatch.setattr(auto, "gpu_available", lambda: False)
    monkeypatch.setattr(auto, "available_memory", lambda: 1e12)
    wide = compile_programs(_logistic(auto.DEFAULT_MIN_CLIENTS, auto.JAX_MIN_WIDTH))
    assert choose([p for p in wide.values() if p.role == "client"])[0] == "jax"
    default = backends.ProxAL().executor_for(None)
    assert type(default) is DefaultExecutor
    ex = default.start(wide)
    try:
        assert type(ex) is BatchedExecutor and ex.engine.name == "numpy" and default.chosen == "batched"
    finally:
        ex.close()
    few = DefaultExecutor()
    ex = few.start(compile_programs(_logistic(auto.DEFAULT_MIN_CLIENTS - 1, 10)))
    try:
        assert type(ex) is SerialExecutor and "serial's start" in few.reason
    finally:
        ex.close()


def test_a_solve_without_an_executor_gives_the_serial_numbers():
    prob = _logistic(auto.DEFAULT_MIN_CLIENTS, 6, seed=3)
    serial = prob.solve("proxal", executor="serial")
    default = prob.solve("proxal")
    assert default.status == serial.status == "converged"
    assert default.info["executor"]["name"] == "batched" and "executor" not in serial.info
    assert default.iterations == serial.iterations
    for v in serial.values:
        np.testing.assert_allclose(default.values[v], serial.values[v], rtol=1e-10, atol=1e-12)
