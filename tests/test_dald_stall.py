"""Issue 25, item 4: no stall verdict on a model CVXPY solves. On random box models DALD's
residuals can sit flat for hundreds of outer steps while the multipliers grow — the signature the
stall rule reads as "infeasible" — because a client's box multiplier, built up early, is still
falling towards 0: its constraint holds at x_i but still acts on the local solve, and the
residuals move again when it lets go. The clients report that (`local.unwinding`) and the rule
waits a window past it. Independent answers: CVXPY's solution; the histories are built by hand."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import topologies
from fedmodel.backends.dald import DALD
from fedmodel.backends.dald.local import unwinding
from fedmodel.runtime.program import compile_programs


def _records(n, primal=0.025, constraint=0.025, violation=0.05, dual=1e-9, unwind=0.0):
    """Flat history records as DALD-CC writes them (the fields the stall rule reads)."""
    return [{"primal_residual": primal, "constraint_residual": constraint, "violation": violation,
             "dual_residual": dual, "unwinding": unwind} for _ in range(n)]


def test_a_falling_multiplier_holds_the_verdict_for_a_window():
    """Residuals flat at 0.025 and iterates settled for 100 steps: "infeasible" — unless a
    client's multiplier fell in the last window; then only a full window after it counts."""
    assert DALD()._stall(_records(100)) == "infeasible"
    history = _records(100, unwind=0.025)
    assert DALD()._stall(history) is None
    history[-24:] = _records(24)          # it reached 0 at step 76; the window is 100 // 4 = 25
    assert DALD()._stall(history) is None
    assert DALD()._stall(history + _records(1)) == "infeasible"   # a window of 25 without it
    assert DALD()._stall(_records(100, unwind=1e-5)) == "infeasible"   # below the floor 1e-4


def test_unwinding_reads_inequality_multipliers_that_fall_and_stay_positive():
    """A box w ≤ 0.5 at x_i = 0.3 (holds by 0.2) with multiplier 1: the update takes it to
    1 − β·0.2 = 0.6 with β = 2 — a fall of 0.4, 0.2 in units of β; at x_i = 0.8 it grows: 0."""
    prob, w = fm.Problem(), fm.Variable(2, name="w")
    client = prob.add_client("c0")
    client.minimize(fm.sum_squares(w))
    client.subject_to(w <= 0.5)
    program = compile_programs(prob)["c0"]
    program.configure(2.0, 0.0, np.zeros(2))
    (name,) = program.node_state.mu
    program.set_multipliers({name: np.array([1.0, 0.0])})
    before = {name: program.node_state.mu[name].copy()}
    program.update_multipliers(np.array([0.3, 0.3]))
    np.testing.assert_allclose(program.node_state.mu[name], [0.6, 0.0], atol=1e-12)
    assert unwinding(program, before) == pytest.approx(0.2, abs=1e-12)
    before = {name: program.node_state.mu[name].copy()}
    program.update_multipliers(np.array([0.8, 0.8]))
    assert unwinding(program, before) == 0.0


def _random_model(rng):
    """The random check's model generator (ridge, logistic, logistic-ball, lasso, ls-box)."""
    kind = rng.choice(["ridge", "logistic", "logistic-ball", "lasso", "ls-box"])
    n, d, rows = int(rng.integers(2, 9)), int(rng.integers(3, 13)), int(rng.integers(5, 30))
    scale = 10.0 ** rng.uniform(-2, 2)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    truth = rng.normal(size=d) * 2
    for i in range(n):
        A = scale * (rng.normal(size=(rows, d)) + 0.5 * rng.normal(size=d))
        c = prob.add_client(f"c{i}")
        if kind in ("ridge", "lasso", "ls-box"):
            b = A @ truth / scale + 0.1 * rng.normal(size=rows)
            c.minimize(fm.sum_squares(c.data(A, name="A") @ w - b) / (n * rows))
            if kind == "lasso":
                c.minimize(0.05 / n * fm.norm1(w))
            if kind == "ridge":
                c.minimize(0.01 / n * fm.sum_squares(w))
            if kind == "ls-box":
                c.subject_to(w <= 0.5 + i * 0.1)
        else:
            y = np.where(rng.random(rows) < 1 / (1 + np.exp(-A @ truth / scale)), 1.0, -1.0)
            c.minimize(fm.mean(fm.logistic(c.data(-y[:, None] * A, name="Z") @ w)) / n)
            if kind == "logistic-ball":
                c.subject_to(fm.norm2(w) <= float(rng.uniform(0.5, 2.0)))
    if kind == "logistic":
        prob.server.minimize(0.01 * fm.sum_squares(w))
    return kind, n, d, prob, w


@pytest.mark.integration   # ~10 s (1000 DALD steps and CVXPY): CI's integration run
def test_a_box_model_cvxpy_solves_is_not_called_stalled():
    """The random check's model 3 (ls-box, 8 clients, d = 4): residuals flat at 0.025 from step
    250 to 650 while client 1's box multiplier fell 0.05 a step from 22 to 0; main said
    "stalled" at step 133, 2.2e-3 from CVXPY. With residual balancing it converged (836 outer
    steps); with the spectral penalty the box multipliers (β fixed) set a slower pace: the cap
    (1000) 4.0e-5 away (2779 steps to "converged", 3.5e-7 away) — no stall verdict either way."""
    rng = np.random.default_rng(0)
    for _ in range(4):
        kind, n, d, prob, w = _random_model(rng)
    assert (kind, n, d) == ("ls-box", 8, 4)
    ref = prob.solve("cvxpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # no stall warning
        res = prob.solve(DALD())
    assert res.status in ("converged", "max_iterations")
    x_star = ref.value(w)
    assert np.max(np.abs(res.value(w) - x_star)) <= 1e-4 * max(1.0, np.max(np.abs(x_star)))
    # the multipliers that let go (0.025 with the box's variable equilibrated, branch setscale)
    assert max(h["unwinding"] for h in res.history) > 0.01


@pytest.mark.integration     # 30 models, ~55 s in three tests of ten (the workers share them): CI's integration run
@pytest.mark.parametrize("tens", [0, 1, 2])
def test_no_stall_verdict_on_thirty_random_models_cvxpy_solves(tens):
    """The random check (seed 0): main said "stalled" on models 0, 3 and 10 (ls-box and
    logistic-ball), 2e-3 to 0.1 from CVXPY. Now no model CVXPY solves gets a stall verdict, and
    every run DALD calls converged is within 1e-3 (relative) of CVXPY's answer. (Model 0 ends
    at the 1000-step cap 4.7e-7 away; model 10's verify flags KKT stationarity: not stall verdicts.)"""
    rng = np.random.default_rng(0)
    for t in range(30):
        kind, n, d, prob, w = _random_model(rng)            # (every model drawn: the same sequence)
        if t // 10 != tens:
            continue
        ref = prob.solve("cvxpy")
        assert ref.status == "converged", (t, kind)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = prob.solve(DALD())
        assert res.status in ("converged", "max_iterations"), (t, kind, res.status)
        x_star = ref.value(w)
        if res.status == "converged":
            assert np.max(np.abs(res.value(w) - x_star)) <= 1e-3 * max(1.0, np.max(np.abs(x_star))), (t, kind)


def _ring_model():
    """The random check's model 18 (logistic-ball, 4 clients, d = 12), on a ring: Fed-DALD-DC."""
    rng = np.random.default_rng(0)
    for _ in range(19):
        kind, n, d, prob, w = _random_model(rng)
    assert (kind, n, d) == ("logistic-ball", 4, 12)
    return prob, w


def test_fed_dald_dc_reports_a_falling_multiplier_as_the_star_does():
    """Fed-DALD-DC's Step 2 (`dald_dc_dual`) reports `local.unwinding` like the star's; main's
    records had no "unwinding" (read as 0 by the stall rule). Serial and batched (the group's
    sweep) agree."""
    prob, w = _ring_model()
    runs = [prob.solve(DALD(max_iterations=60, stall_window=None), topology=topologies.ring(prob),
                       executor=executor) for executor in ("serial", "batched")]
    for res in runs:
        unwind = [h["unwinding"] for h in res.history]
        # (0.027 with the ball's variable equilibrated, branch setscale; 0.1 before)
        assert len(unwind) == 60 and max(unwind) > 0.01 and min(unwind) >= 0.0
    np.testing.assert_allclose([h["unwinding"] for h in runs[0].history],
                               [h["unwinding"] for h in runs[1].history], rtol=1e-6, atol=1e-9)


@pytest.mark.integration   # ~4 s (300 sweeps and CVXPY): CI's integration run
def test_a_ball_model_cvxpy_solves_is_not_called_stalled_on_a_ring():
    """Model 18 on a ring: main said "stalled" at outer step 54, 0.13 (relative, ∞-norm) from
    CVXPY, while client balls' multipliers were still falling (unwinding up to 0.41 β); with
    the nodes reporting it, the run converges (298 steps), 8.8e-7 away."""
    prob, w = _ring_model()
    ref = prob.solve("cvxpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)      # no stall warning
        res = prob.solve(DALD(), topology=topologies.ring(prob))
    assert res.status == "converged"
    x_star = ref.value(w)
    # (1.2e-5 with the ball's variable equilibrated, branch setscale; 8.8e-7 before): DALD's
    # distance rule promises dist_tol = 1e-4
    assert np.max(np.abs(res.value(w) - x_star)) <= 1e-4 * max(1.0, np.max(np.abs(x_star)))
    assert fm.verify(res, ref).ok
