"""Checkpoint and resume (fedmodel/runtime/checkpoint.py): a run stopped after a checkpoint and
resumed gives bitwise the same iterates, history and ledger as the uninterrupted run (the
independent answer: the uninterrupted run itself); writes are atomic under SIGKILL."""
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import topologies
from fedmodel import backends
from fedmodel.runtime import checkpoint as ck
from conftest import StopRun, stop_after

HERE = Path(__file__).resolve().parent


def constrained_model(seed=0, n_clients=3, d=5, server_l1=True):
    """Least squares per client, local disk constraints, a private variable, global
    constraints and an optional λ‖w‖₁ on the server (ProxAL's general case)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=f"ckpt-{seed}")
    for i in range(n_clients):
        c = prob.add_client(f"c{i}")
        A = c.data(rng.normal(size=(15, d)), name=f"A{i}")
        b = c.data(rng.normal(size=15) + 1.0, name=f"b{i}")
        c.minimize(fm.sum_squares(A @ w - b) / 15)
        c.subject_to((fm.sum_squares(w) <= 1.0 + i).named(f"disk{i}"))
        if i == 1:
            s = c.variable(name="s1")
            c.minimize(fm.square(s - 1.0))
            c.subject_to((s + w[2] <= 0.5).named("slack"))
    prob.server.subject_to((w[3] + w[4] <= 0.2).named("g_ineq"))
    if server_l1:
        prob.server.minimize(0.05 * fm.norm1(w))
    return prob, w


def least_squares(seed=0, n_clients=4, d=4):
    """Unconstrained federated least squares (FedProx, DP-ADMM)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=f"ls-{seed}")
    for i in range(n_clients):
        c = prob.add_client(f"c{i}")
        A = c.data(rng.normal(size=(12, d)), name=f"A{i}")
        b = c.data(rng.normal(size=12), name=f"b{i}")
        c.minimize(fm.sum_squares(A @ w - b) / 12)
    return prob, w


PROXAL = dict(beta=10.0, rho=1.0, s_bar=0.01, q=0.7, adaptive_rho=True, tol=(1e-4, 1e-4), max_outer=12)


def _same(a, b):
    """Bitwise equal iterates, multipliers, history (without wall times) and ledgers."""
    assert a.status == b.status and a.iterations == b.iterations
    assert set(a.values) == set(b.values)
    for uid in a.values:
        assert np.array_equal(a.values[uid], b.values[uid])
    for name in a.multipliers:
        assert np.array_equal(np.asarray(a.multipliers[name]), np.asarray(b.multipliers[name]))
    strip = lambda h: [{k: v for k, v in r.items() if k != "time"} for r in h]  # noqa: E731
    assert repr(strip(a.history)) == repr(strip(b.history))
    assert a.objective == b.objective
    assert a.ledger.messages == b.ledger.messages and a.ledger.floats == b.ledger.floats


def _check_resume(tmp_path, prob, make, stop_at, every=1, topology=None, executor="serial"):
    reference = prob.solve(make(), topology=topology, executor=executor)
    path = tmp_path / "run.ckpt"
    with pytest.raises(StopRun):
        prob.solve(make(), topology=topology, executor=executor, checkpoint=path, checkpoint_every=every,
                   callback=stop_after(stop_at))
    saved = ck.read(path)
    done = (stop_at - 1) // every * every          # the last multiple of `every` before the stop
    assert saved["iteration"] == done and saved["outcome"] is None
    seen = []
    resumed = prob.solve(make(), topology=topology, executor=executor, checkpoint=path, resume=True,
                         callback=seen.append)
    assert len(seen) == len(reference.history) - len(saved["loop"]["history"]) > 0
    _same(resumed, reference)
    # the finished run is recorded: resuming again returns it without iterating
    again = prob.solve(make(), topology=topology, checkpoint=path, resume=True, callback=stop_after(1))
    _same(again, reference)
    return reference


@pytest.mark.parametrize("anderson", [0, pytest.param(5, marks=pytest.mark.integration)])
def test_proxal_resume_equals_uninterrupted(tmp_path, anderson):
    prob, w = constrained_model()
    # the paper's τ_k schedule: a long run (11 outer; the default progress rule stops after 5,
    # whose resume tests/test_proxal_rounds.py checks)
    ref = _check_resume(tmp_path, prob, lambda: backends.ProxAL(**PROXAL, anderson=anderson, tau_rule="paper"),
                        stop_at=6, every=2)
    assert len(ref.history) >= 8 and ref.max_violation < 1e-2      # a real, nontrivial run


def _places_of(value: float, obj, where: str = "") -> list[str]:
    """Where `value` is stored in a checkpoint's payload (numbers, 0-d arrays, inside
    containers), leaving out the run's records (`history`, `certificate_log`: what the result
    reports per iteration, not state)."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() if k not in ("history", "certificate_log")
                for p in _places_of(value, v, f"{where}/{k}")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in _places_of(value, v, f"{where}[{i}]")]
    if isinstance(obj, (float, np.floating)) or (isinstance(obj, np.ndarray) and obj.shape == ()):
        return [where] if float(obj) == value else []
    return []


@pytest.mark.parametrize("executor", ["serial", pytest.param("batched", marks=pytest.mark.integration)])
def test_a_proxal_checkpoint_holds_beta_once_and_resumes_bitwise(tmp_path, executor):
    """β is stored once in a checkpoint — in ProxAL's loop state; the node states leave out the
    settings "configure" sends again (docs/architecture.md follows β) — and the run resumed from
    it equals the uninterrupted one bitwise (a client with a private variable, whose proximal
    weight 1/β the node derives)."""
    beta = 7.25                     # a value nothing else in the run takes
    prob, w = constrained_model(seed=3)

    def make():
        return backends.ProxAL(**{**PROXAL, "beta": beta}, beta_growth=1.0, tau_rule="paper")
    _check_resume(tmp_path, prob, make, stop_at=4, executor=executor)
    path = tmp_path / "beta.ckpt"
    with pytest.raises(StopRun):
        prob.solve(make(), executor=executor, checkpoint=path, callback=stop_after(3))
    saved = ck.read(path)
    assert len(saved["nodes"]) == 4 and saved["loop"]["beta"] == beta
    assert _places_of(beta, saved) == ["/loop/beta"]
    assert [r["beta"] for r in saved["loop"]["history"]] == [beta, beta]   # the records keep theirs


def test_dald_cc_resume_with_seeded_participation(tmp_path):
    prob, w = constrained_model(1, server_l1=False)
    make = lambda: backends.DALD(rho=2.0, coordination="partial", participation=0.6,  # noqa: E731
                                 seed=3, max_iterations=25)
    ref = _check_resume(tmp_path, prob, make, stop_at=9)
    assert len(ref.history) == 25


def test_dald_dc_resume_on_a_path(tmp_path):
    prob, w = constrained_model(2, server_l1=False)
    make = lambda: backends.DALD(rho=2.0, coordination="partial", participation=0.7,  # noqa: E731
                                 seed=5, max_iterations=20)
    _check_resume(tmp_path, prob, make, stop_at=7, every=3, topology=topologies.path(prob))


@pytest.mark.parametrize("topology", ["star", "path"])
def test_dald_resume_on_the_batched_executor(tmp_path, topology):
    """Checkpoints taken while the batched executor holds the clients' state (stacks not yet
    handed to the dicts, DC sweep flags as arrays) resume bitwise like the uninterrupted run."""
    from test_batched import _logistic
    prob, _ = _logistic(n=6, l1_on="clients")
    make = lambda: backends.DALD(solver="prox-grad", step=0.05, max_iterations=14,  # noqa: E731
                                 eps_primal=0.0, eps_dual=0.0)
    _check_resume(tmp_path, prob, make, stop_at=8, every=3, topology=getattr(topologies, topology)(prob),
                  executor="batched")


def test_fedprox_resume(tmp_path):
    prob, w = least_squares()
    make = lambda: backends.FedProx(mu=1.0, step=0.05, local_steps=3, max_rounds=15, tol=0.0)  # noqa: E731
    _check_resume(tmp_path, prob, make, stop_at=5)


def test_dp_admm_resume_restores_client_noise_generators(tmp_path):
    prob, w = least_squares(1)
    make = lambda: backends.DPADMM(epsilon=0.5, variant="objT", max_rounds=14, seed=11,  # noqa: E731
                                   sensitivity=1.0)
    ref = _check_resume(tmp_path, prob, make, stop_at=8)
    assert np.ptp([r["noise_magnitude"] for r in ref.history]) > 0     # noise was really drawn


def test_dp_admm_resume_with_local_constraints_restores_multipliers_and_value_noise(tmp_path):
    """Private ObjP with a data-dependent local constraint (backends/dp_admm/constrained.py):
    the multipliers, the clipping settings and the released values' generator come back."""
    rng = np.random.default_rng(4)
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    for i in range(2):
        c = prob.add_client(f"c{i}")
        A0, A1 = c.data(rng.normal(size=(20, 3)) + 0.5), c.data(rng.normal(size=(15, 3)) + 0.5)
        c.minimize(fm.mean(fm.logistic(A0 @ w)) / 2)
        c.subject_to(fm.mean(fm.logistic(-(A1 @ w))) <= 0.6)
    make = lambda: backends.DPADMM(epsilon=2.0, max_rounds=14, seed=3, tol=0.0)  # noqa: E731
    ref = _check_resume(tmp_path, prob, make, stop_at=8)
    assert any(np.any(v > 0) for v in ref.multipliers.values())      # the constraint was active


def test_fedadmm_insa_resume_with_seeded_participation(tmp_path):
    prob, w = least_squares(2, n_clients=5)
    make = lambda: backends.FedADMM(beta=2.0, adaptive=True, inexact=True, lr=0.05,  # noqa: E731
                                    participation=0.4, max_rounds=12, seed=5, tol=None)
    _check_resume(tmp_path, prob, make, stop_at=6, every=2)


def test_resume_without_a_file_starts_fresh_and_no_checkpoint_costs_nothing(tmp_path):
    prob, w = least_squares()
    make = lambda: backends.FedProx(mu=1.0, step=0.05, local_steps=2, max_rounds=6, tol=0.0)  # noqa: E731
    path = tmp_path / "new.ckpt"
    fresh = prob.solve(make(), checkpoint=path, resume=True)
    _same(fresh, prob.solve(make()))
    assert ck.read(path)["outcome"] is not None


# ---- atomicity ----------------------------------------------------------------------------------
class _Explodes:
    def __reduce__(self):
        raise RuntimeError("disk full (simulated)")


def test_exception_during_a_write_leaves_the_old_checkpoint(tmp_path):
    path = tmp_path / "state.ckpt"
    ck.atomic_write(path, {"i": 1, "blob": np.ones(1000)})
    with pytest.raises(RuntimeError, match="disk full"):
        ck.atomic_write(path, {"i": 2, "blob": np.zeros(10**6), "bad": _Explodes()})
    old = ck.read(path)
    assert old["i"] == 1 and np.all(old["blob"] == 1)
    assert os.listdir(tmp_path) == ["state.ckpt"]          # no temporary file left behind


def test_exception_while_saving_node_states_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    prob, w = least_squares()
    path = tmp_path / "run.ckpt"
    make = lambda: backends.FedProx(mu=1.0, step=0.05, local_steps=2, max_rounds=8, tol=0.0)  # noqa: E731
    calls = [0]
    real = ck.Checkpointer._write

    def flaky(self, payload):
        calls[0] += 1
        if calls[0] == 4:
            raise OSError("I/O error (simulated)")
        real(self, payload)
    monkeypatch.setattr(ck.Checkpointer, "_write", flaky)
    with pytest.raises(OSError):
        prob.solve(make(), checkpoint=path)
    monkeypatch.undo()
    assert ck.read(path)["iteration"] == 3
    _same(prob.solve(make(), checkpoint=path, resume=True), prob.solve(make()))


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from fedmodel.runtime.checkpoint import atomic_write
    i = 0
    while True:
        i += 1
        atomic_write(sys.argv[1], {"i": i, "blob": np.full(1_500_000, float(i))})
""")


def test_sigkill_during_writes_never_leaves_a_torn_checkpoint(tmp_path):
    path = tmp_path / "state.ckpt"
    rng = np.random.default_rng(0)
    for trial in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
        try:
            _wait_for(lambda: path.exists() and ck.read(path)["i"] >= 2, proc)
            time.sleep(float(rng.uniform(0.0, 0.2)))      # kill at an arbitrary point of a write
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        data = ck.read(path)
        assert data["blob"].shape == (1_500_000,) and np.all(data["blob"] == data["i"])


# ---- SIGKILL a solving process, resume in-process ----------------------------------------------
SOLVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {here!r})
    from test_checkpoint import constrained_model, PROXAL
    from fedmodel import backends
    prob, w = constrained_model()
    prob.solve(backends.ProxAL(**PROXAL), checkpoint=sys.argv[1], checkpoint_every=1,
               callback=lambda record: time.sleep(0.3))   # slow enough to be killed mid-run
""")


def _wait_for(condition, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (EOFError, pickle.UnpicklingError, FileNotFoundError):
            pass     # never expected (writes are atomic); tolerated only while polling
        assert proc.poll() is None, f"the subprocess ended early with code {proc.returncode}"
        time.sleep(0.02)
    raise AssertionError("timed out waiting for the subprocess")


@pytest.mark.integration     # kill-and-resume in a subprocess: CI runs it after the fast suite
def test_sigkill_a_solving_subprocess_then_resume(tmp_path):
    path = tmp_path / "proxal.ckpt"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", SOLVER.format(here=str(HERE)), str(path)], env=env)
    try:
        _wait_for(lambda: path.exists() and ck.read(path)["iteration"] >= 3, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    stopped_at = ck.read(path)["iteration"]
    prob, w = constrained_model()                 # a new process-independent copy of the model
    reference = prob.solve(backends.ProxAL(**PROXAL))
    assert stopped_at < len(reference.history)    # it was killed before the end
    resumed = prob.solve(backends.ProxAL(**PROXAL), checkpoint=path, resume=True)
    _same(resumed, reference)


# ---- refusing what cannot be resumed -----------------------------------------------------------
def test_other_problem_or_options_are_refused(tmp_path):
    prob, w = least_squares(0)
    path = tmp_path / "run.ckpt"
    make = lambda **o: backends.FedProx(**{"mu": 1.0, "step": 0.05, "max_rounds": 4, "tol": 0.0, **o})  # noqa: E731
    first = prob.solve(make(), checkpoint=path)
    other_data, _ = least_squares(1)               # same structure, different data
    with pytest.raises(ck.CheckpointError, match="problem .* or the options"):
        other_data.solve(make(), checkpoint=path, resume=True)
    with pytest.raises(ck.CheckpointError, match="options of backend 'fedprox'"):
        prob.solve(make(mu=2.0), checkpoint=path, resume=True)
    with pytest.raises(fm.FedModelError):
        prob.solve(backends.DALD(max_iterations=4), checkpoint=path, resume=True)
    same_again, w_again = least_squares(0)         # rebuilt identically (new uids): accepted
    assert w_again.uid != w.uid
    again = same_again.solve(make(), checkpoint=path, resume=True)
    assert np.array_equal(again.value(w_again), first.value(w))   # values re-keyed to new uids


def test_bad_checkpoint_arguments_raise_clear_errors(tmp_path):
    prob, w = least_squares()
    fedprox = backends.FedProx(max_rounds=2)
    with pytest.raises(fm.FedModelError, match="does not support checkpoints"):
        prob.solve("cvxpy", checkpoint=tmp_path / "x.ckpt")
    with pytest.raises(fm.FedModelError, match="need checkpoint=PATH"):
        prob.solve(fedprox, resume=True)
    with pytest.raises(fm.FedModelError, match="checkpoint_every"):
        prob.solve(fedprox, checkpoint=tmp_path / "x.ckpt", checkpoint_every=0)
    with pytest.raises(fm.FedModelError, match="does not exist"):
        prob.solve(fedprox, checkpoint=tmp_path / "missing" / "x.ckpt")
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a pickle")
    with pytest.raises(ck.CheckpointError, match="cannot read"):
        prob.solve(fedprox, checkpoint=garbage, resume=True)
    assert issubclass(ck.CheckpointError, fm.FedModelError)


def test_a_checkpoint_of_an_older_format_is_refused_with_a_clear_message(tmp_path, monkeypatch):
    """Format-1 files (before the runtime/backends refactoring) pickle node state of modules that
    have moved (e.g. backends.dald_nodes): they are refused by their format, not by a Python
    error from unpickling."""
    import types
    moved = types.ModuleType("backends.dald_nodes")

    class CCState:                                  # a class of a module that no longer exists
        pass
    CCState.__module__, CCState.__qualname__ = moved.__name__, "CCState"
    moved.CCState = CCState
    prob, _ = least_squares(0)
    fedprox = backends.FedProx(max_rounds=2)
    for name, state in (("moved.ckpt", CCState()), ("plain.ckpt", {"y": np.zeros(3)})):
        path = tmp_path / name
        with monkeypatch.context() as m:
            m.setitem(sys.modules, moved.__name__, moved)
            ck.atomic_write(path, {"format": 1, "fingerprint": "", "backend": "fedprox", "iteration": 1,
                                   "loop": {}, "nodes": {"c0": state}, "ledger": None, "outcome": None})
        with pytest.raises(ck.CheckpointError, match=r"older fedmodel version \(checkpoint format 1"):
            prob.solve(fedprox, checkpoint=path, resume=True)
