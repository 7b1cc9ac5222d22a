"""RayExecutor: same iterates as the serial executor, worker-side loaders, faults, placement.

One local Ray cluster (loopback, 2 CPUs) for the module; tiny models and few rounds so the whole
file stays well under the CI budget. Tests that need no Ray (serial loaders) run without it.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import backends, topologies
from fedmodel.runtime.messages import install, procedure
from fedmodel.runtime.program import compile_programs

pytestmark = pytest.mark.integration     # Ray: a local cluster, worker processes: CI runs it after the fast suite

D = 3


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'fedmodel[ray]')")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             resources={"site_a": 100})
    # the slow test procedure below is defined in this (non-installed) module: ship it by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def shared_executor(ray_cluster):
    """One persistent executor: its actors (c0, c1, c2) serve every run that uses it."""
    ex = _ray_executor(persistent=True)
    yield ex
    ex.shutdown()


def _ray_executor(**options):
    from fedmodel.runtime.ray_executor import RayExecutor
    return RayExecutor(**options)


def _parts(n=3, m=6, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(m, D)), rng.normal(size=m)) for _ in range(n)]


def _model(parts, constrained=True, loader_dir=None):
    """Least squares over the clients' (A_i, b_i); with `loader_dir`, the data is read from
    .npy files there by loaders (on the worker), otherwise shipped as arrays."""
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i, (A, b) in enumerate(parts):
        c = prob.add_client(f"c{i}")
        if loader_dir is None:
            Ad, bd = c.data(A, name="A"), c.data(b, name="b")
        else:
            paths = [os.path.join(loader_dir, f"{c.name}_{k}.npy") for k in "Ab"]
            np.save(paths[0], A)
            np.save(paths[1], b)
            Ad = c.data(loader=_NpyLoader(paths[0]), shape=A.shape, name="A")
            bd = c.data(loader=_NpyLoader(paths[1]), shape=b.shape, name="b")
        c.minimize(0.5 * fm.sum_squares(Ad @ w - bd))
        if constrained:
            c.subject_to(fm.sum(w) <= 0.3)
    if constrained:
        prob.server.subject_to(fm.norm2(w) <= 0.6)
    return prob, w


class _NpyLoader:
    """A picklable loader reading an array where it runs (a stand-in for a client's disk)."""

    def __init__(self, path):
        self.path = path

    def __call__(self):
        return np.load(self.path)


def _run(backend, prob, executor, topology=None, callback=None):
    """The backend's raw outcome (values, history, ledger), as `Backend.run` returns it."""
    return backend.run(prob, topology=topology, executor=executor, callback=callback)


def _assert_same(a, b, w, tol=1e-10):
    np.testing.assert_allclose(a["values"][w.uid], b["values"][w.uid], rtol=0, atol=tol)
    assert len(a["history"]) == len(b["history"])
    for ra, rb in zip(a["history"], b["history"]):
        assert abs(ra["objective"] - rb["objective"]) <= tol * max(1.0, abs(ra["objective"]))
    for name, mu in a["multipliers"].items():
        np.testing.assert_allclose(mu, b["multipliers"][name], rtol=0, atol=tol)


CASES = {
    "proxal": (lambda: backends.ProxAL(beta=10.0, rho=1.0, max_outer=4, max_inner=30), True, None),
    "proxal-anderson": (lambda: backends.ProxAL(beta=10.0, rho=1.0, max_outer=4, max_inner=30, anderson=5),
                        True, None),
    "dald-cc": (lambda: backends.DALD(rho=1.0, max_iterations=15), True, None),
    "dald-dc": (lambda: backends.DALD(rho=1.0, max_iterations=10), True, "ring"),
    "fedprox": (lambda: backends.FedProx(mu=1.0, step=0.05, local_steps=3, max_rounds=15), False, None),
    "fedavg": (lambda: backends.FedAvg(step=0.05, local_steps=2, max_rounds=15), False, None),
    "dp-admm": (lambda: backends.DPADMM(epsilon=1.0, max_rounds=15, seed=3, tol=0), False, None),
    "fedadmm-insa": (lambda: backends.FedADMM(adaptive=True, inexact=True, participation=0.5,
                                              max_rounds=15, seed=2), False, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ray_iterates_equal_serial(shared_executor, case):
    make, constrained, topo = CASES[case]
    prob, w = _model(_parts(), constrained=constrained)
    topology = topologies.ring(prob) if topo == "ring" else None
    serial = _run(make(), prob, "serial", topology)
    ex = shared_executor
    remote = _run(make(), prob, ex, topology)
    _assert_same(serial, remote, w)
    # the ledger is recorded exactly as by the serial executor
    assert remote["ledger"].floats == serial["ledger"].floats
    assert remote["ledger"].messages == serial["ledger"].messages
    assert not ex.faults and sorted(ex.actors) == ["c0", "c1", "c2"]   # kept: persistent


def test_make_executor_ray_by_name(ray_cluster):
    prob, w = _model(_parts(n=2), constrained=False)
    res = prob.solve(backends.DALD(rho=1.0, max_iterations=20), executor="ray")
    ref = prob.solve(backends.DALD(rho=1.0, max_iterations=20))
    np.testing.assert_allclose(res.value(w), ref.value(w), rtol=0, atol=1e-10)
    assert res.ledger.floats == ref.ledger.floats
    assert ray_cluster.is_initialized()       # a Ray the user started is left running


# ---- data produced on the workers ---------------------------------------------------------------
def test_loader_data_stays_on_workers(shared_executor, tmp_path):
    parts = _parts()
    prob_arrays, w0 = _model(parts)
    prob, w = _model(parts, loader_dir=str(tmp_path))
    make = CASES["proxal"][0]
    serial = _run(make(), prob_arrays, "serial")
    remote = _run(make(), prob, shared_executor)
    np.testing.assert_allclose(remote["values"][w.uid], serial["values"][w0.uid], atol=1e-10)
    # the driver never loaded it: every loader Data is still remote here
    assert len(prob.remote_data()) == 2 * len(parts)
    with pytest.raises(fm.DataError, match="produced on the worker"):
        prob.to_cvxpy()


def test_loader_data_verify_after_load_data(tmp_path):
    """Serial executor: loaders run in-process; `prob.load_data()` allows verification."""
    parts = _parts()
    prob, w = _model(parts, loader_dir=str(tmp_path))
    with pytest.raises(fm.DataError, match="prob.load_data"):
        prob.solve("cvxpy")                         # verification's reference needs the data
    res = prob.solve(backends.DALD(rho=1.0, max_iterations=400))
    assert not prob.remote_data()                   # the serial executor loaded it here
    report = fm.verify(res, prob.solve("cvxpy"))
    assert res.status == "converged" and report.solution_distance < 1e-4, report
    prob2, w2 = _model(parts, loader_dir=str(tmp_path))
    ref = prob2.load_data().solve("cvxpy")          # the user allows loading on the driver
    np.testing.assert_allclose(ref.value(w2), res.value(w), atol=1e-4)


BAD_LOADERS = {
    "raises": (lambda: (_ for _ in ()).throw(OSError("disk not mounted")), "raised OSError: disk not mounted"),
    "shape": (lambda: np.ones((2, D)), r"returned shape \(2, 3\).*shape=\(6, 3\)"),
    "nan": (lambda: np.full((6, D), np.nan), "non-finite"),
}


def _bad_problem(kind):
    prob, w = _model(_parts(n=2), constrained=False)
    c = prob.add_client("bad")
    X = c.data(loader=BAD_LOADERS[kind][0], shape=(6, D), name="X")
    c.minimize(fm.sum_squares(X @ w))
    return prob


@pytest.mark.parametrize("kind", sorted(BAD_LOADERS))
def test_bad_loader_is_a_data_error_naming_the_client_serial(kind):
    with pytest.raises(fm.DataError, match=BAD_LOADERS[kind][1]) as info:
        _bad_problem(kind).solve(backends.DALD(max_iterations=2))
    assert "data 'X' of client 'bad'" in str(info.value)


@pytest.mark.parametrize("kind", sorted(BAD_LOADERS))
def test_bad_loader_is_a_data_error_naming_the_client_ray(ray_cluster, kind):
    ex = _ray_executor(start_timeout=60)
    with pytest.raises(fm.DataError, match=BAD_LOADERS[kind][1]) as info:
        _bad_problem(kind).solve(backends.DALD(max_iterations=2), executor=ex)
    assert "client 'bad'" in str(info.value)
    assert "ray::" not in str(info.value) and "Traceback" not in str(info.value)
    assert not ex.actors                      # the failed start released the other clients


# ---- faults ---------------------------------------------------------------------------------------
def _killer(ex, node, at):
    def callback(record):
        if record["iteration"] == at:
            ex_actor = ex.actors[node]
            import ray
            ray.kill(ex_actor)
    return callback


@pytest.mark.parametrize("snapshot_every", [0, 3])
def test_killed_actor_does_not_kill_the_run(shared_executor, snapshot_every):
    prob, w = _model(_parts())
    make = lambda: backends.DALD(rho=1.0, max_iterations=500, eps_primal=1e-6, eps_dual=1e-6)
    ex = shared_executor
    ex.snapshot_every, ex.timeout = snapshot_every, 60.0
    res = prob.solve(make(), executor=ex, callback=_killer(ex, "c1", at=5))
    assert [f["node"] for f in ex.faults] == ["c1"] and ex.faults[0]["recovered"]
    assert ex.recovery.total()["messages"] >= 1           # the replay is booked separately
    ref = prob.solve("cvxpy")
    report = fm.verify(res, ref)
    assert res.status == "converged" and report.solution_distance < 1e-3, report
    assert res.max_violation < 1e-3
    # restoring snapshot + replaying the requests gives the run it would have been
    clean = prob.solve(make())
    np.testing.assert_allclose(res.value(w), clean.value(w), atol=1e-9)
    assert res.iterations == clean.iterations
    # the replacement actor serves the next run
    again = _run(CASES["dald-cc"][0](), prob, ex)
    np.testing.assert_allclose(again["values"][w.uid], _run(CASES["dald-cc"][0](), prob, "serial")["values"][w.uid],
                               atol=1e-10)


def test_node_failure_after_max_restarts(ray_cluster):
    from fedmodel.runtime.ray_executor import NodeFailure
    prob, _ = _model(_parts(n=2), constrained=False)
    ex = _ray_executor(max_restarts=0)
    with pytest.raises(NodeFailure, match="client 'c0' failed 1 times"):
        prob.solve(backends.DALD(max_iterations=20), executor=ex, callback=_killer(ex, "c0", at=2))
    ex.close()


@procedure("test_ray_slow_echo", {"x": "x", "marker": "str"}, {"x": "x"})
def _slow_echo(program, x, marker):
    """Hangs the first time it runs anywhere: exactly one caller creates the marker file
    (O_EXCL is atomic, so two actors racing cannot both hang)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return {"x": 2.0 * x}
    import time
    time.sleep(60)
    return {"x": 2.0 * x}


install([_slow_echo])


def test_timeout_restarts_the_client(ray_cluster, tmp_path):
    prob, _ = _model(_parts(n=2), constrained=False)
    ex = _ray_executor(timeout=3.0).start(compile_programs(prob))
    try:
        x = np.arange(D, dtype=float)
        replies = ex.map("test_ray_slow_echo", {"c0": {"x": x, "marker": str(tmp_path / "m")},
                                                "c1": {"x": x, "marker": str(tmp_path / "m")}})
        np.testing.assert_array_equal(replies["c0"]["x"], 2 * x)
        np.testing.assert_array_equal(replies["c1"]["x"], 2 * x)
        assert len(ex.faults) == 1 and "no reply within 3 s" in ex.faults[0]["reason"]
    finally:
        ex.close()


# ---- placement ------------------------------------------------------------------------------------
def test_placement_by_custom_resources(ray_cluster):
    prob, w = _model(_parts(n=2), constrained=False)
    ex = _ray_executor(resources={"c0": {"site_a": 1}})
    ex.start(compile_programs(prob))
    node_id = ray_cluster.get_runtime_context().get_node_id()
    assert ex.placement == {"c0": node_id, "c1": node_id}
    assert ex.programs["c0"].n_shared == D and not hasattr(ex.programs["c0"], "merit_ir")
    ex.close()


def test_unplaceable_client_is_a_clear_error(ray_cluster):
    from fedmodel.runtime.ray_executor import NodeFailure
    prob, _ = _model(_parts(n=2), constrained=False)
    ex = _ray_executor(resources={"site_b": 1}, start_timeout=3)
    with pytest.raises(NodeFailure, match=r"client 'c0'.*did not start.*site_b"):
        ex.start(compile_programs(prob))
    assert not ex.actors
