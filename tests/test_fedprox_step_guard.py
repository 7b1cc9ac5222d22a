"""FedProx / FedAvg's safeguard on the automatic step (`backends/step_guard.py`, issue 25 item
4): a round whose ‖Δx̂‖∞ is 10× the least of the last 50 halves the step (the one the clients
take and the one the server's step on its terms reads). Checked: the rule on a sequence of
residuals; no halving on a least-squares model, whose run is unchanged; a step the user gives is
kept; and (integration) bench_verdicts' np-barely seed 5, which "diverged" at round 9,633
(client models 1.2e6) where CVXPY solves it, now halves once and ends with an honest status."""
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import FedAvg, FedProx
from fedmodel.backends.step_guard import GROWTH, WINDOW, StepGuard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _Loop:
    """What StepGuard sits on: an options dict and a round hook."""

    def __init__(self):
        self.step = 0.8

    def _opts(self):
        return {"step": self.step, "solver": "gd"}

    def _outer_step_done(self, record, history, *args, **kwargs):
        history.append(record)
        return None


class _Guarded(StepGuard, _Loop):
    pass


def test_the_rule_halves_on_a_tenfold_growth_only():
    loop = _Guarded()
    loop.start_guard(True)
    sent = loop._opts()
    history = []
    duals = list(np.geomspace(1.0, 1e-3, 30))           # a converging run: never halved
    duals += [9.9e-3]                                    # 9.9× the least: still not
    for d in duals:
        loop._outer_step_done({"dual_residual": d}, history)
    assert loop.halvings == 0 and sent["step"] == loop.step == 0.8
    loop._outer_step_done({"dual_residual": GROWTH * 1e-3 * 1.01}, history)
    assert loop.halvings == 1 and sent["step"] == loop.step == 0.4
    # the window restarts: the next round is compared with rounds after the halving only
    loop._outer_step_done({"dual_residual": 0.5}, history)
    loop._outer_step_done({"dual_residual": 4.0}, history)      # 8×: kept
    assert loop.halvings == 1
    for _ in range(WINDOW):                                       # an old least leaves the window
        loop._outer_step_done({"dual_residual": 5.0}, history)
    loop._outer_step_done({"dual_residual": 49.0}, history)     # 9.8× the least of the last 50
    assert loop.halvings == 1 and len(history) == len(duals) + 3 + WINDOW + 1
    off = _Guarded()
    off.start_guard(False)
    off._opts()
    off._outer_step_done({"dual_residual": 1.0}, [])
    off._outer_step_done({"dual_residual": 1e3}, [])
    assert off.halvings == 0 and off.step == 0.8


def _least_squares(seed=0):
    rng = np.random.default_rng(seed)
    w = fm.Variable(4, name="w")
    prob = fm.Problem()
    truth = rng.normal(size=4)
    for i in range(3):
        A = rng.normal(size=(20, 4))
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(A, name="A") @ w - c.data(A @ truth, name="b")) / 60)
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    return prob, w


@pytest.mark.parametrize("backend", [FedProx, FedAvg])
def test_no_halving_on_a_well_posed_model(backend):
    prob, w = _least_squares()
    res = prob.solve(backend())
    ref = prob.solve("cvxpy")
    assert res.status == "converged" and res.info["step_halvings"] == 0
    np.testing.assert_allclose(res.value(w), ref.value(w), atol=1e-5)
    given = prob.solve(backend(step=res.info["step"], max_rounds=50))
    assert given.info["step_halvings"] == 0 and given.info["step"] == res.info["step"]


@pytest.mark.integration
def test_np_barely_seed_5_no_longer_diverges():
    """On main 2579f54: "diverged" at round 9,633, ‖x_i‖∞ 1.15e6, 1.9e4 from CVXPY (a WRONG
    verdict: CVXPY solves it). Now the step halves once (round 4,290, where ‖Δx̂‖∞ jumped ten-
    fold) and the run reaches its cap with an honest status and a finite point."""
    from benchmarks.bench_verdicts import random_model
    prob, w, _ = random_model("np-barely", 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve("fedprox")
    assert res.status in ("stalled", "max_iterations", "converged")
    assert res.info["step_halvings"] >= 1
    assert np.max(np.abs(res.value(w))) < 100.0


def test_a_resumed_run_keeps_the_halved_step(tmp_path, monkeypatch):
    """A checkpoint holds the guard's step, halvings and window: the resumed run is the
    uninterrupted one (it went back to the automatic step, halved again and ended elsewhere;
    found by the session's review). Halvings forced early (GROWTH 0.5)."""
    import fedmodel.backends.step_guard as guard
    monkeypatch.setattr(guard, "GROWTH", 0.5)
    rng = np.random.default_rng(0)
    w, prob, truth = fm.Variable(4, name="w"), fm.Problem(), rng.normal(size=4)
    for i in range(3):
        A = rng.normal(size=(20, 4))
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(A) @ w - c.data(A @ truth)) / 60)
        c.subject_to(fm.sum(w) <= 0.5)
    prob.server.minimize(1e-3 * fm.sum_squares(w))

    class Stop(Exception):
        pass

    def stop(record, seen=[]):
        seen.append(record)
        if len(seen) == 10:
            raise Stop
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = prob.solve(FedProx(max_rounds=30))
        path = tmp_path / "run.ckpt"
        with pytest.raises(Stop):
            prob.solve(FedProx(max_rounds=30), checkpoint=path, checkpoint_every=1, callback=stop)
        resumed = prob.solve(FedProx(max_rounds=30), checkpoint=path, resume=True)
    assert full.info["step_halvings"] >= 5
    assert (resumed.info["step"], resumed.info["step_halvings"]) == (full.info["step"], full.info["step_halvings"])
    np.testing.assert_array_equal(resumed.value(w), full.value(w))
