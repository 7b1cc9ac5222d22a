"""Infeasible and unbounded models are reported quickly (issue 13, point 5): ProxAL and cProx-AL
stop with "infeasible" / "unbounded", the least-violation point and the violated constraints by
name; CVXPY's statuses map to ours; fm.verify agrees when both say the same. The independent
answers are CVXPY's status and closed forms (the least violation of sum(w) ≥ 1, sum(w) ≤ −1
is 1, at sum(w) = 0)."""
from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

import fedmodel as fm
from backends import CVXPY, CentralizedProxAL, ProxAL
from backends.cvxpy_backend import STATUS
from fedmodel.datasets import load_monks
from fedmodel.reproductions import table1

BACKENDS = [ProxAL, CentralizedProxAL]


def least_squares(n: int = 3, d: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name="lsq")
    for i in range(n):
        client = prob.add_client(f"c{i}")
        A, b = client.data(rng.standard_normal((20, d)), name="A"), client.data(rng.standard_normal(20), name="b")
        client.minimize(fm.sum_squares(A @ w - b) / 20)
    return prob, w


def quiet_solve(prob, backend):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        result = prob.solve(backend)
    return result, time.perf_counter() - start, [str(c.message) for c in caught if c.category is RuntimeWarning]


@pytest.mark.parametrize("backend", BACKENDS)
def test_contradictory_server_constraints(backend):
    prob, w = least_squares()
    prob.server.subject_to((fm.sum(w) >= 1).named("lo"), (fm.sum(w) <= -1).named("hi"))
    assert prob.solve("cvxpy").status == "infeasible"
    result, seconds, warned = quiet_solve(prob, backend())
    assert result.status == "infeasible" and seconds < 10.0
    assert result.iterations["outer"] <= 8
    assert any("infeasible" in message for message in warned)
    # the least violating points have sum(w) = 0 and violate both constraints by exactly 1
    assert abs(float(np.sum(result.value(w)))) <= 1e-3
    assert result.max_violation == pytest.approx(1.0, abs=1e-3)
    violated = result.info["violated"]
    assert {name.split(":")[0] for name in violated} == {"lo", "hi"}
    assert all(v == pytest.approx(1.0, abs=1e-3) for v in violated.values())
    report = fm.verify(result)
    assert report.ok and "both say the model is infeasible" in str(report)


@pytest.mark.parametrize("backend", BACKENDS)
def test_feasible_neighbour_is_not_flagged(backend):
    """The same model with one constraint sum(w) ≤ 1 converges and agrees with CVXPY."""
    prob, w = least_squares()
    prob.server.subject_to((fm.sum(w) <= -1).named("hi"))
    result, _, warned = quiet_solve(prob, backend())
    assert result.status == "converged" and not warned
    reference = prob.solve("cvxpy")
    assert fm.verify(result, reference=reference).ok
    np.testing.assert_allclose(result.value(w), reference.value(w), atol=1e-3)


@pytest.fixture(scope="module")
def monks_ordinal():
    """monks-1's six ordinal 121-UCI columns: without an intercept no w gets every client's
    class-1 loss to 0.2 (infeasible); with an intercept column the model is feasible."""
    train, test = load_monks(1, "train"), load_monks(1, "test")
    X, y = np.vstack([train.X, test.X]), np.concatenate([train.y, test.y])
    return X, y


def least_squares_violation(X, y, parts, threshold: float = 0.2) -> float:
    """The largest violation at the minimizer of Σ_i [loss_i − threshold]₊² (CVXPY): the point an
    augmented Lagrangian method tends to on an infeasible model as its multipliers grow."""
    import cvxpy as cp
    v = cp.Variable(X.shape[1])
    losses = [cp.sum(cp.logistic(-(X[r][y[r] == 1] @ v))) / int((y[r] == 1).sum()) for r in parts]
    cp.Problem(cp.Minimize(cp.sum_squares(cp.hstack([cp.pos(loss - threshold) for loss in losses])))).solve(
        solver="CLARABEL")
    return max(float(loss.value) for loss in losses) - threshold


def test_neyman_pearson_without_intercept_is_infeasible_quickly(monks_ordinal):
    X, y = monks_ordinal
    infeasible, _, parts = table1.build(X, y, 5)
    assert table1.smallest_worst_client_loss(X, y, parts) > 0.4      # far above the 0.2 bound
    assert infeasible.solve("cvxpy").status == "infeasible"
    feasible, _, _ = table1.build(np.hstack([X, np.ones((len(X), 1))]), y, 5)
    ok, ok_seconds, _ = quiet_solve(feasible, ProxAL())
    assert ok.status == "converged"
    result, seconds, warned = quiet_solve(infeasible, ProxAL())
    assert result.status == "infeasible" and seconds < 10.0
    # measured: 249 vs 117 ADMM iterations, 5 vs 4 outer iterations
    assert result.iterations["inner"] <= 5 * ok.iterations["inner"]
    assert set(result.info["violated"]) == {repr(c) for c in infeasible.constraints}
    assert result.max_violation == pytest.approx(least_squares_violation(X, y, parts), abs=1e-4)   # 0.4280
    assert fm.verify(result).ok
    central, _, _ = quiet_solve(infeasible, CentralizedProxAL())
    assert central.status == "infeasible" and central.max_violation == pytest.approx(result.max_violation, abs=1e-4)


def unbounded_model():
    rng = np.random.default_rng(1)
    w = fm.Variable(4, name="w")
    prob = fm.Problem(name="linear")
    for i in range(3):
        client = prob.add_client(f"c{i}")
        client.minimize(fm.sum(client.data(rng.standard_normal((5, 4)), name="A") @ w))
    return prob


@pytest.mark.parametrize("backend", BACKENDS)
def test_unbounded_model_stops_with_unbounded(backend):
    prob = unbounded_model()
    assert prob.solve("cvxpy").status == "unbounded"
    result, seconds, warned = quiet_solve(prob, backend())
    assert result.status == "unbounded" and seconds < 10.0
    assert result.iterations["outer"] <= 10 and any("unbounded" in m for m in warned)
    objectives = [record["objective"] for record in result.history]
    assert objectives[-1] < objectives[0] < 0
    assert fm.verify(result).ok


def test_cvxpy_statuses_map_to_ours():
    allowed = {"converged", "max_iterations", "diverged", "infeasible", "unbounded", "stalled"}
    assert set(STATUS.values()) <= allowed
    assert STATUS["infeasible_inaccurate"] == "infeasible" and STATUS["unbounded_inaccurate"] == "unbounded"
    prob, w = least_squares()
    prob.server.subject_to(fm.sum(w) >= 1, fm.sum(w) <= -1)
    assert prob.solve(CVXPY()).status == "infeasible"


def test_verify_does_not_accept_a_different_verdict():
    prob, w = least_squares()
    prob.server.subject_to((fm.sum(w) >= 1).named("lo"), (fm.sum(w) <= -1).named("hi"))
    result, _, _ = quiet_solve(prob, ProxAL.paper(max_outer=3, max_inner=100))   # fixed β: no verdict
    assert result.status == "max_iterations"
    report = fm.verify(result)
    assert not report.ok and "infeasible" in str(report)


def _records(violations, betas, objectives=None, steps=None):
    objectives = objectives or [0.0] * len(violations)
    steps = steps or [1.0] * len(violations)
    return [{"violation": v, "beta": b, "objective": o, "primal_change": s}
            for v, b, o, s in zip(violations, betas, objectives, steps)]


def test_verdict_rules_on_synthetic_histories():
    """The stopping rules alone: a flat violation while β reaches β_max is infeasible; a slow
    (< 2× over 9 iterations) fall at β_max is stalled; equal objective drops with equal steps
    are unbounded; a falling violation or shrinking steps are none of these."""
    from backends.proxal import _verdict
    args = dict(growth=4.0, beta_max=1e4, eps1=1e-3, eps2=1e-4)
    assert _verdict(_records([0.43] * 5, [300, 300, 1200, 4800, 1e4]), **args) == "infeasible"
    assert _verdict(_records([0.43] * 4, [300, 1200, 4800, 4800]), **args) is None      # β not at max
    assert _verdict(_records([0.43] * 5, [300] * 5), **dict(args, growth=1.0)) is None  # paper: no verdict
    slow = [0.1 * 0.95 ** k for k in range(10)]
    assert _verdict(_records(slow, [1e4] * 10), **args) == "stalled"
    assert _verdict(_records([0.1 * 0.5 ** k for k in range(10)], [1e4] * 10), **args) is None
    drops = _records([0.0] * 6, [300] * 6, objectives=[-10.0 * k for k in range(6)], steps=[5.0] * 6)
    assert _verdict(drops, **args) == "unbounded"
    shrinking = _records([0.0] * 6, [300] * 6, objectives=[-10.0 * (1 - 0.5 ** k) for k in range(6)],
                         steps=[5.0 * 0.5 ** k for k in range(6)])
    assert _verdict(shrinking, **args) is None
