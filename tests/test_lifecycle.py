"""The run the framework owns (`Backend.run`): the executor is closed and every node program
handed back however the run ends (an error or Ctrl-C in the loop), unknown run options are
refused, the outcome is typed (`Status`, `Outcome`), and node procedures are registered
explicitly (no import side effect, no method found by a message's name)."""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import backends
from fedmodel.backends.outcome import Outcome, Status
from fedmodel.runtime.executor import SerialExecutor, open_executor, run_on_node
from fedmodel.runtime.messages import lookup
from fedmodel.runtime.program import compile_programs

D = 3


def _model(n: int = 3, seed: int = 0, server: bool = True):
    """Least squares on n clients, a client budget and (`server`) a global ball."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(D, name="w")
    prob = fm.Problem(name="lifecycle")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        A, b = c.data(rng.normal(size=(8, D)), name="A"), c.data(rng.normal(size=8), name="b")
        c.minimize(0.5 * fm.sum_squares(A @ w - b))
        c.subject_to(fm.sum(w) <= 0.3)
    if server:
        prob.server.subject_to(fm.norm2(w) <= 0.6)
    return prob, w


class Boom(RuntimeError):
    pass


def _raise_at(iteration: int, error: BaseException):
    """A callback that raises `error` at its `iteration`-th call (inside the algorithm loop)."""
    calls = []

    def callback(record):
        calls.append(record)
        if len(calls) == iteration:
            raise error
    return callback


# ProxAL and FedADMM closed their executor only on success before the framework owned the run
BACKENDS = {
    "proxal": lambda: backends.ProxAL(max_outer=5),
    "dald": lambda: backends.DALD(max_iterations=20),
    "fedadmm": lambda: backends.FedADMM(max_rounds=10),
    "dp-admm": lambda: backends.DPADMM(max_rounds=10, tol=0),
    "fedavg": lambda: backends.FedAvg(max_rounds=10),
    "cproxal": lambda: backends.CentralizedProxAL(max_outer=5),
}


@pytest.mark.parametrize("name", [name for name in BACKENDS if name != "cproxal"])   # (its own executor)
@pytest.mark.parametrize("error", [Boom("in the callback"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_a_run_that_raises_in_its_loop_hands_every_program_back(name, error):
    prob, _ = _model()
    ex = SerialExecutor()
    backend = BACKENDS[name]()
    with pytest.raises(type(error)):
        prob.solve(backend, executor=ex, callback=_raise_at(2, error))
    programs = ex.programs
    assert len(programs) == 4
    assert [n for n, p in programs.items() if p.holder is not None] == []
    assert ex.kinds is None          # closed: the run's procedure list is gone with it
    # the programs are free: another executor takes them over and serves them
    other = SerialExecutor().start(programs)
    for node in programs:
        assert np.isfinite(other.call(node, "report", x=np.zeros(D))["objective"])


def test_a_batched_run_that_raises_writes_the_stacked_state_back():
    """The batched executor keeps the clients' state as stacks while it holds them: closed by
    the framework on the error, it writes them back (`sync`) and frees every program."""
    from fedmodel.runtime.batched import BatchedExecutor
    prob, _ = _model(n=4)
    ex = BatchedExecutor()
    with pytest.raises(Boom):
        prob.solve(backends.FedADMM(max_rounds=10), executor=ex, callback=_raise_at(3, Boom("x")))
    assert ex.groups and all(p.holder is None for p in ex.programs.values())
    # the state written back is that of 3 rounds: each client's u_i is a finite model
    for name in ex.clients:
        assert np.all(np.isfinite(ex.programs[name].state["fedadmm"]["u"]))


def test_a_failed_check_before_the_loop_opens_nothing():
    """A model the backend refuses (FedAvg: a server constraint it cannot project on) fails in
    `prepare`, before an executor is opened: no program is compiled into it."""
    prob, w = _model(server=False)
    prob.server.subject_to(fm.sum_squares(np.diag([1.0, 2.0, 3.0]) @ w) <= 0.6)   # an ellipsoid
    ex = SerialExecutor()
    with pytest.raises(fm.FedModelError, match="not sets it can project on"):
        prob.solve(backends.FedAvg(max_rounds=3), executor=ex)
    assert ex.programs == {}


@pytest.mark.integration
def test_a_ray_run_that_raises_leaves_no_actor_alive():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'fedmodel[ray]')")
    from ray.exceptions import RayActorError
    from fedmodel.runtime.ray_executor import RayExecutor
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        prob, _ = _model()
        ex = RayExecutor()
        actors = {}

        def callback(record):       # the clients' actors as the run holds them, then a failure
            actors.update(ex.actors)
            raise Boom("in the callback")
        with pytest.raises(Boom):
            prob.solve(backends.ProxAL(max_outer=5), executor=ex, callback=callback)
        assert sorted(actors) == ["c0", "c1", "c2"] and ex.actors == {}
        assert all(p.holder is None for p in ex.programs.values())
        for name, actor in actors.items():      # each one was killed: a request to it fails
            with pytest.raises(RayActorError):
                ray.get(actor.serve.remote("report", {"x": np.zeros(D)}), timeout=60)
    finally:
        if ray.is_initialized():
            ray.shutdown()


@pytest.mark.integration
def test_a_flower_run_that_raises_ends_its_simulation_thread():
    pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedmodel[flower]')")
    pytest.importorskip("ray", reason="Flower's simulation engine needs Ray")
    from fedmodel.runtime.flower_executor import FlowerExecutor
    before = set(threading.enumerate())
    prob, _ = _model(server=False)
    ex = FlowerExecutor(timeout=60)
    with pytest.raises(Boom):
        prob.solve(backends.FedAvg(max_rounds=5), executor=ex, callback=_raise_at(1, Boom("x")))
    assert ex._simulation is None and all(p.holder is None for p in ex.programs.values())
    assert [t for t in set(threading.enumerate()) - before if t.is_alive() and not t.daemon] == []


# ---- options refused at the boundary ---------------------------------------------------------
def test_an_unknown_run_option_is_refused_naming_it():
    prob, _ = _model()
    with pytest.raises(fm.FedModelError, match=r"unknown option 'max_outr'.*run of backend 'proxal'"):
        backends.ProxAL().run(prob, max_outr=3)
    with pytest.raises(fm.FedModelError, match=r"'executer'.*did you mean 'executor'"):
        backends.DALD().solve(prob, executer="serial")
    with pytest.raises(fm.FedModelError, match=r"'tol'"):
        backends.CVXPY().run(prob, tol=1e-3)


# ---- typed outcome ---------------------------------------------------------------------------
def test_the_outcome_is_typed_and_the_status_a_str_enum():
    prob, w = _model()
    out = backends.ProxAL().run(prob)
    assert isinstance(out, Outcome) and out.status is Status.CONVERGED
    assert out["values"] is out.values and out.ledger is not None       # read as the dicts were
    res = prob.solve(backends.ProxAL())
    assert res.status == "converged" and res.status is Status.CONVERGED
    assert f"{res.status}" == str(res.status) == "converged"
    ref = prob.solve("cvxpy")
    assert ref.status is Status.CONVERGED
    np.testing.assert_allclose(res.value(w), ref.value(w), atol=1e-4)
    with pytest.raises(ValueError):
        Outcome("convergd")


# ---- explicit registration -------------------------------------------------------------------
def test_no_method_is_served_by_a_message_name():
    """Every served kind is a registered procedure: a NodeProgram method that is no procedure
    ("violations", "load_data") is refused instead of being called by its name."""
    prob, _ = _model()
    program = compile_programs(prob)["c0"]
    assert np.isfinite(run_on_node(program, "report", {"x": np.zeros(D)})["objective"])
    for name in ("violations", "save_state_now", "__init__"):
        with pytest.raises(fm.FedModelError, match="no node procedure is registered"):
            run_on_node(program, name, {})


def test_a_run_serves_only_its_backends_procedures():
    prob, _ = _model()
    with open_executor("serial", compile_programs(prob), backends.ProxAL.procedures) as ex:
        assert "proxal_admm_step" in ex.kinds and "report" in ex.kinds
        with pytest.raises(fm.FedModelError, match="'fedadmm_round' is not a procedure of this run"):
            ex.map("fedadmm_round", {"c0": {"z": np.zeros(D)}})
    assert all(p.holder is None for p in ex.programs.values())


@pytest.mark.integration   # (CI's integration run: the fast suite stays under 3 minutes)
def test_importing_a_node_module_registers_nothing_and_lookup_finds_installed_steps():
    """In a fresh interpreter: importing a backend's node module leaves the registry as it
    was; `lookup(kind)` (what a client calls) finds an installed backend's step by its
    stable name, through the backends' declared `procedures`, and refuses any other name."""
    script = (
        "import fedmodel.backends.proxal_nodes, fedmodel.backends.fedadmm.client\n"
        "from fedmodel.runtime import messages\n"
        "print(sorted(k for k in dict.keys(messages.PROCEDURES) if not k in messages.CORE_KINDS))\n"
        "found = messages.lookup('fedadmm_round')\n"
        "print(getattr(found, 'form', found).__module__)\n"   # (a client step: its form's module)
        "try:\n    messages.lookup('os.system')\nexcept messages.FedModelError as e:\n    print('refused')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["[]", "fedmodel.backends.fedadmm.client", "refused"]


def test_every_backend_lists_the_procedures_its_run_sends():
    """A run refuses kinds outside its backend's `procedures`, so a run of each backend on the
    serial and batched executors completing is the check that each list is whole."""
    from fedmodel.runtime.batched import BatchedExecutor
    for name, make in BACKENDS.items():
        prob, w = _model(n=4, server=name != "fedavg")
        for ex in (SerialExecutor(), BatchedExecutor()):
            res = prob.solve(make(), executor=ex)
            assert res.status in tuple(Status), name
            assert np.all(np.isfinite(res.value(w))), name
    assert lookup("report") is not None
