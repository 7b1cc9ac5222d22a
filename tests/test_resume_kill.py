"""Exact resume after SIGKILL (issue 13 point 6, docs/checkpoints.md): a solving process kills
itself with SIGKILL at callback k, at the k-th request to the nodes (mid-iteration) or inside the
k-th checkpoint write; resuming from its last checkpoint in another process gives bitwise the
iterates, multipliers, history and ledger of the uninterrupted run (the independent answer: that
run itself, computed in this process).

Every backend with `checkpointing = True` is covered, with a small explicit option set and
with its constructor defaults (which other changes may retune: the test takes whatever they are)."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import topologies
from fedmodel import backends
from fedmodel.runtime import checkpoint as ck
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.executor import Executor

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_checkpoint import constrained_model, least_squares  # noqa: E402

pytestmark = pytest.mark.integration     # kill-and-resume in subprocesses: CI runs it after the fast suite


def logistic_model(seed: int = 0, n_clients: int = 3, d: int = 4):
    """Logistic regression with a disk on each client and a server constraint: non-quadratic merits,
    so Newton's chord Hessians carry over between subproblems (state a resume must restore)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=f"logistic-{seed}")
    for i in range(n_clients):
        c = prob.add_client(f"c{i}")
        X = c.data(rng.normal(size=(20, d)), name=f"X{i}")
        y = c.data(np.sign(rng.normal(size=20) + 0.3), name=f"y{i}")
        c.minimize(fm.sum(fm.logistic(-fm.multiply(y, X @ w))) / 20)
        c.subject_to((fm.sum_squares(w) <= 0.5).named(f"disk{i}"))
    prob.server.subject_to((fm.sum(w) >= 0.3).named("floor"))
    return prob, w


# name -> (model, backend factory, solve options). Small runs: each must finish in well under 1 s.
CASES = {
    # the run: ProxAL(beta=10, rho=1), everything else its defaults
    "proxal": (constrained_model, lambda: backends.ProxAL(beta=10.0, rho=1.0, max_outer=8), {}),
    "proxal-logistic": (logistic_model, lambda: backends.ProxAL(beta=10.0, rho=1.0, max_outer=8), {}),
    "proxal-anderson": (logistic_model, lambda: backends.ProxAL(
        beta=10.0, rho=1.0, s_bar=0.01, q=0.7, adaptive_rho=True, anderson=3, beta_growth=2.0,
        tol=(1e-4, 1e-4), max_outer=8), {}),
    "proxal-fedadmm": (constrained_model, lambda: backends.ProxAL(beta=10.0, max_outer=6, inner=backends.FedADMM(
        adaptive=True, inexact=True, lr=0.05, max_rounds=30)), {}),
    "cproxal": (logistic_model, lambda: backends.CentralizedProxAL(beta=10.0, max_outer=8), {}),
    # the batched executor holds client state in stacks between requests
    "proxal-batched": (logistic_model, lambda: backends.ProxAL(beta=10.0, rho=1.0, max_outer=8),
                       {"executor": "batched"}),
    "dald-batched": (logistic_model, lambda: backends.DALD(max_iterations=8), {"executor": "batched"}),
    "dald-dc-batched": (logistic_model, lambda: backends.DALD(max_iterations=8),
                        {"executor": "batched", "topology": "path"}),
    "dald-cc": (lambda: constrained_model(1, server_l1=False), lambda: backends.DALD(
        rho=2.0, coordination="partial", participation=0.6, seed=3, max_iterations=12), {}),
    "dald-dc": (lambda: constrained_model(2, server_l1=False), lambda: backends.DALD(
        rho=2.0, coordination="partial", participation=0.7, seed=5, max_iterations=12),
        {"topology": "path"}),
    "fedprox": (least_squares, lambda: backends.FedProx(mu=1.0, step=0.05, local_steps=3,
                                                        max_rounds=10, tol=0.0), {}),
    "fedavg": (least_squares, lambda: backends.FedAvg(step=0.05, local_steps=3, max_rounds=10), {}),
    # too large a step: "diverged" at round 9, by growth against the smallest norm seen so far —
    # a memory (DivergenceWatch.smallest) the checkpoint must carry
    "fedavg-diverging": (least_squares, lambda: backends.FedAvg(step=0.8, local_steps=3, max_rounds=30), {}),
    "dgd": (least_squares, lambda: backends.DistributedGD(step=0.05, max_rounds=10), {}),
    "pa": (lambda: least_squares(n_clients=1), lambda: backends.ProximalAlgorithm(alpha=1.0, max_iterations=10),
           {}),
    "fedadmm-insa": (lambda: least_squares(2, n_clients=5), lambda: backends.FedADMM(
        beta=2.0, adaptive=True, inexact=True, lr=0.05, participation=0.4, max_rounds=10, seed=5,
        tol=None), {}),
    "dp-admm": (lambda: least_squares(1), lambda: backends.DPADMM(
        epsilon=0.5, variant="objT", max_rounds=10, seed=11, sensitivity=1.0), {}),
}
# constructor defaults, capped at a few iterations
DEFAULTS = {
    # (default ProxAL converges in 2 outer iterations here: a tighter tol keeps it going)
    "proxal-default": (logistic_model, lambda: backends.ProxAL(tol=(1e-6, 1e-6), max_outer=6), {}),
    "cproxal-default": (logistic_model, lambda: backends.CentralizedProxAL(tol=(1e-6, 1e-6), max_outer=6), {}),
    "dald-default": (lambda: constrained_model(1, server_l1=False),
                     lambda: backends.DALD(max_iterations=8), {}),
    "fedprox-default": (least_squares, lambda: backends.FedProx(max_rounds=8), {}),
    "fedadmm-default": (least_squares, lambda: backends.FedADMM(max_rounds=8), {}),
    "dp-admm-default": (lambda: least_squares(1), lambda: backends.DPADMM(max_rounds=8, seed=2), {}),
}
ALL = {**CASES, **DEFAULTS}


def solve(name: str, **options):
    """Run case `name` (a fresh model and backend: what a new process would build)."""
    model, make, extra = ALL[name]
    prob, _ = model()
    extra = dict(extra)
    if extra.get("topology") == "path":
        extra["topology"] = topologies.path(prob)
    return prob.solve(make(), **extra, **options)


def _wrap_requests(before) -> Callable[[], None]:
    """Call `before()` ahead of every request the driver sends (per-node `map` and group
    `map_stacked`, on the serial and the batched executor); returns the undo."""
    originals = [(cls, method, getattr(cls, method)) for cls in (Executor, BatchedExecutor)
                 for method in ("map", "map_stacked") if method in vars(cls)]

    def wrapped(send):
        def request(self, *args, **kwargs):
            before()
            return send(self, *args, **kwargs)
        return request
    for cls, method, send in originals:
        setattr(cls, method, wrapped(send))
    return lambda: [setattr(cls, method, send) for cls, method, send in originals]


def _die_at(name: str, k: int, where: str, path: str) -> None:
    """Run case `name` with checkpoints and SIGKILL this process at callback k ("callback"), in
    the os.replace of the k-th checkpoint write ("write": the new file is complete but not yet
    renamed over the old one), or at the k-th request the driver sends to the nodes ("request":
    mid-iteration, between two checkpoints). Runs in a forked process (see `forker`)."""
    count = [0]

    def die(*_):
        count[0] += 1
        if count[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)

    if where == "write":
        replace = os.replace

        def killing_replace(src, dst):
            die()
            replace(src, dst)
        ck.os = type(os)("os_with_kill")
        ck.os.__dict__.update(os.__dict__, replace=killing_replace)
    if where == "request":
        _wrap_requests(die)
    solve(name, checkpoint=path, checkpoint_every=1, callback=die if where == "callback" else None)


# A process that has imported everything once and forks one child per kill: a real process killed
# by a real SIGKILL, without paying the import time for every case. Replies the raw wait status.
SERVER = textwrap.dedent("""
    import os, sys, traceback
    sys.path.insert(0, {here!r})
    import test_resume_kill as t
    import fedmodel.backends.proxal, fedmodel.backends.dald, fedmodel.backends.fedadmm, fedmodel.backends.dp_admm, fedmodel.backends.special_cases  # noqa: F401,E401
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            try:
                name, k, where, path = line.split()
                t._die_at(name, int(k), where, path)
            except BaseException:
                traceback.print_exc()
            os._exit(3)       # not killed: the run had fewer than k callbacks / writes / requests
        print(os.waitpid(pid, 0)[1], flush=True)
""")


@pytest.fixture(scope="module")
def forker():
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", SERVER.format(here=str(HERE))], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def killed_run(name: str, k: int, where: str, path: Path) -> None:
        proc.stdin.write(f"{name} {k} {where} {path}\n")
        proc.stdin.flush()
        status = int(proc.stdout.readline())
        assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL, \
            f"the run was not killed (exit code {os.waitstatus_to_exitcode(status)})"
    yield killed_run
    proc.stdin.close()
    proc.wait(timeout=30)


def _same(a, b) -> None:
    """Bitwise equal status, iteration counts, values, multipliers, history (less wall times)."""
    assert (a.status, a.iterations) == (b.status, b.iterations)
    # the two runs built their own models: variables match by creation order (uids increase)
    assert len(a.values) == len(b.values)
    for u, v in zip(sorted(a.values), sorted(b.values)):
        assert np.array_equal(a.values[u], b.values[v]), \
            f"values differ by {np.max(np.abs(a.values[u] - b.values[v])):.3g}"
    for name in a.multipliers:
        assert np.array_equal(np.asarray(a.multipliers[name]), np.asarray(b.multipliers[name]))
    strip = lambda h: [{k: v for k, v in r.items() if k != "time"} for r in h]  # noqa: E731
    assert repr(strip(a.history)) == repr(strip(b.history))
    if a.ledger is not None or b.ledger is not None:      # cProx-AL has no communication
        assert a.ledger.messages == b.ledger.messages and a.ledger.floats == b.ledger.floats


_REFERENCES: dict[str, object] = {}


def _reference(name: str):
    if name not in _REFERENCES:
        _REFERENCES[name] = solve(name)
    return _REFERENCES[name]


def _check(killed_run, tmp_path, name: str, k: int, where: str = "callback"):
    reference = _reference(name)
    n = len(reference.history)
    k = {-1: n - 1, -2: n - 2}.get(k, k)          # negative k: counted from the end
    assert 1 <= k and (k < n or where == "request"), f"case {name!r} has only {n} iterations"
    path = tmp_path / "run.ckpt"
    killed_run(name, k, where, path)
    # callback k runs before checkpoint k is written; a kill in write k keeps checkpoint k − 1
    done = ck.read(path)["iteration"] if path.exists() else 0
    assert done == k - 1 if where != "request" else done < n
    _same(solve(name, checkpoint=path, resume=True), reference)
    return reference, done


@pytest.mark.parametrize("name, k", [(name, k) for name in ("proxal", "proxal-logistic", "cproxal")
                                     for k in (1, 2, -1)]
                         + [(name, k) for name in ("dald-cc", "fedadmm-insa", "dp-admm") for k in (2, -1)]
                         + [("dald-batched", -1)])     # resumed after adaptive ρ changed ρ
def test_sigkill_in_a_callback_then_resume_is_bitwise(forker, tmp_path, name, k):
    _check(forker, tmp_path, name, k)


@pytest.mark.parametrize("name", ["proxal-anderson", "proxal-batched", "proxal-fedadmm", "dald-dc",
                                  "dald-dc-batched", "fedprox", "fedavg", "dgd", "pa"])
def test_sigkill_in_a_callback_other_backends(forker, tmp_path, name):
    _check(forker, tmp_path, name, 3)


@pytest.mark.filterwarnings("ignore:.* diverged at iteration:RuntimeWarning")
def test_sigkill_before_a_divergence_reports_it_at_the_same_round(forker, tmp_path):
    reference, _ = _check(forker, tmp_path, "fedavg-diverging", 5)
    assert reference.status == "diverged" and len(reference.history) > 6


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_sigkill_with_default_options(forker, tmp_path, name):
    _check(forker, tmp_path, name, 2)


@pytest.mark.parametrize("name", ["proxal", "dald-cc"])
def test_sigkill_inside_a_checkpoint_write_keeps_the_previous_one(forker, tmp_path, name):
    _check(forker, tmp_path, name, 3, where="write")


@pytest.mark.parametrize("name, k", [("proxal-logistic", 70), ("proxal-batched", 30), ("dald-cc", 50),
                                     ("fedadmm-insa", 20), ("dp-admm", 20)])
def test_sigkill_between_two_requests_mid_iteration(forker, tmp_path, name, k):
    _, done = _check(forker, tmp_path, name, k, where="request")
    assert done > 0           # killed after a checkpoint: the resume really continued a run


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.* diverged at iteration:RuntimeWarning")
@pytest.mark.parametrize("k", [1, 2, 3, 5, -2, -1])
@pytest.mark.parametrize("name", sorted(ALL))
def test_sigkill_sweep(forker, tmp_path, name, k):
    if k > len(_reference(name).history) - 1:
        pytest.skip(f"{name} has fewer than {k + 1} iterations")
    _check(forker, tmp_path, name, k)


def _requests(name: str) -> int:
    """How many requests the driver sends in an uninterrupted run of case `name` before its last
    iteration's callback (so the last checkpoint is not yet written): a kill at any of them
    lands mid-run, whatever the backend sends after its loop (reports, multipliers)."""
    count, before_last_callback = [0], [0]

    def counting():
        count[0] += 1

    def callback(*_):
        before_last_callback[0] = count[0]
    restore = _wrap_requests(counting)
    try:
        solve(name, callback=callback)
    finally:
        restore()
    return before_last_callback[0]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.* diverged at iteration:RuntimeWarning")
@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.6, 0.9])
@pytest.mark.parametrize("name", sorted(ALL))
def test_sigkill_sweep_mid_iteration(forker, tmp_path, name, fraction):
    _check(forker, tmp_path, name, max(1, round(fraction * _requests(name))), where="request")
