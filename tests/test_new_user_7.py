"""fedmodel as a new user, round 7 (issue 25; docs/BENCHMARKS.md "new user, round 7"): the CVXPY
reference on raw shipped data with a ball, and verify handed a reference it cannot trust."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import datasets

from conftest import load_data


def _airfoil():
    """NASA airfoil self-noise as shipped: frequency in Hz (to 20,000) beside a thickness of
    ~3e-3, sound level in dB; four clients by flow velocity."""
    table = load_data(lambda: np.loadtxt(datasets.data_file("regression/airfoil_self_noise.tsv")))
    X, y = table[:, :5], table[:, 5]
    return [(X[X[:, 3] == v], y[X[:, 3] == v]) for v in np.unique(X[:, 3])]


def _ridge_with_ball(parts, s, radius, weight, parameter=False):
    """Σ_i p_i‖[X_i 1] w − s·y_i‖²/N + 0.01‖w‖², ‖w‖ ≤ radius (inactive), p_0 = weight."""
    w = fm.Variable(6, name="w")
    prob = fm.Problem()
    N = sum(len(y) for _, y in parts)
    for i, (X, y) in enumerate(parts):
        c = prob.add_client()
        p = weight if i == 0 else 1.0
        p = fm.Parameter(nonneg=True, value=p) if parameter else p
        A = c.data(np.hstack([X, np.ones((len(X), 1))]), name="X")
        c.minimize(p * fm.sum_squares(A @ w - c.data(y * s, name="y")) / N)
    prob.server.minimize(1e-2 * fm.sum_squares(w))
    prob.server.subject_to(fm.norm2(w) <= radius)
    return prob, w


def _closed_form(parts, s, weight):
    """The ridge optimum (the ball is inactive): the normal equations."""
    H, g = 2e-2 * np.eye(6), np.zeros(6)
    N = sum(len(y) for _, y in parts)
    for i, (X, y) in enumerate(parts):
        A, p = np.hstack([X, np.ones((len(X), 1))]), (weight if i == 0 else 1.0)
        H += 2 * p / N * A.T @ A
        g += 2 * p / N * A.T @ (y * s)
    return np.linalg.solve(H, g)


@pytest.mark.parametrize("weight", [1.0, 1e3])
def test_cvxpy_reference_on_raw_airfoil_with_an_inactive_ball(weight):
    """The ball holds w whole (one scale): the equilibrated copy came back "optimal" 8 % (weight
    1) and 71 % (weight 1e3) from the answer; Clarabel as written is exact, and is now asked."""
    parts = _airfoil()
    prob, w = _ridge_with_ball(parts, 1.0, 1e6, weight)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)     # no "not a solution" warning either
        ref = prob.solve("cvxpy")
    exact = _closed_form(parts, 1.0, weight)
    assert ref.status == "converged"
    assert np.max(np.abs(ref.value(w) - exact)) <= 1e-7 * np.max(np.abs(exact))
    assert fm.verify(ref, ref).ok


@pytest.mark.integration
def test_cvxpy_is_not_infeasible_where_zero_is_feasible():
    """×1e3 units, a client weight Parameter 1e3 and a ball of radius 1e9: Clarabel as written said
    "infeasible" (w = 0 is feasible) and that verdict was kept over the equilibrated point."""
    parts = _airfoil()
    prob, w = _ridge_with_ball(parts, 1e3, 1e9, 1e3, parameter=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = prob.solve("cvxpy")
    exact = _closed_form(parts, 1e3, 1e3)
    assert ref.status == "converged"
    off = np.max(np.abs(ref.value(w) - exact)) / np.max(np.abs(exact))
    # both copies are inexact here: the point is either the answer or flagged as not one
    assert off <= 1e-6 or "not_stationary" in ref.info
    assert off <= 1e-6 or not fm.verify(ref, ref).ok


def _small_ridge(name="w"):
    rng = np.random.default_rng(7)
    w = fm.Variable(3, name=name)
    prob = fm.Problem()
    for _ in range(2):
        c = prob.add_client()
        X, y = rng.normal(size=(20, 3)), rng.normal(size=20)
        c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)) / 40)
    prob.server.subject_to(fm.norm2(w) <= 10.0)
    return prob, w


def test_verify_says_a_feasible_point_refutes_an_infeasible_reference():
    """A reference that says "infeasible" of a model whose result point meets every constraint:
    not OK (no answer to compare), and the report says the reference is the one that is wrong."""
    prob, w = _small_ridge()
    ref = prob.solve("cvxpy")
    wrong = dataclasses.replace(ref, status="infeasible", values={}, multipliers={})
    report = fm.verify(ref, wrong)
    assert not report.ok and report.failed == ["status"]
    assert any("model is feasible" in note for note in report.notes)
    # a reference of another model (one more constraint) says nothing about this one's feasibility
    other, v = _small_ridge()
    other.server.subject_to(fm.sum(v) >= 100.0)
    infeasible = other.solve("cvxpy")
    assert infeasible.status == "infeasible"
    report = fm.verify(ref, infeasible)
    assert not report.ok and not any("model is feasible" in note for note in report.notes)
    assert np.linalg.norm(ref.value(w)) <= 10.0 * (1 + 1e-6)
    capped = dataclasses.replace(ref, status="max_iterations", values={}, info={})   # a federated one
    assert "the reference ended 'max_iterations'" in fm.verify(ref, capped).notes   # no empty "()"


def test_verify_names_unnamed_variables_across_builds():
    """Two builds of one model with unnamed variables cannot be matched by label: say so."""
    first, _ = _small_ridge(name=None)
    second, _ = _small_ridge(name=None)
    with pytest.raises(fm.FedModelError, match="unnamed, its label is new in each build: name it"):
        fm.verify(first.solve("cvxpy"), second.solve("cvxpy"))
    named, _ = _small_ridge()
    again, _ = _small_ridge()
    report = fm.verify(named.solve("cvxpy"), again.solve("cvxpy"))
    assert report.ok and report.solution_distance <= 1e-9


def test_the_cvxpy_warnings_kept_are_said_once_where_the_caller_filters_them():
    """CVXPY records the warnings of its equilibrated solve while that answer is in doubt and
    says them again when it keeps it: re-issued by file path, a caller's `module=` filter no
    longer matched (a data-scale warning of `fedmodel.problem` came through), and the discarded
    as-written solve's warnings were said as well (each one twice)."""
    prob, _ = _small_ridge()
    prob.server.subject_to(fm.sum(prob.variables()[0]) <= 1e21)    # a constant that warns
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=".*entries as large as", module=r"fedmodel\.problem")
        assert prob.solve("cvxpy").status == "converged"
    assert not [m for m in seen if "entries as large as" in str(m.message)]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        prob.solve("cvxpy")
    said = [str(m.message) for m in seen if "entries as large as" in str(m.message)]
    assert len(said) == 1 and seen[0].filename.endswith("problem.py")


def test_an_infeasible_equilibrated_answer_yields_to_a_feasible_point_as_written(monkeypatch):
    """The equilibrated copy says "infeasible" (doubtful), the model as written has a feasible
    point 1 % off its optimum: the feasible point is kept, with its "not a solution" warning —
    not "infeasible" (it yielded only to a point that also passed the stationarity check)."""
    from fedmodel.backends import cvxpy_backend
    from fedmodel.backends.outcome import Outcome, Status
    prob, w = _small_ridge()
    exact = prob.solve("cvxpy").value(w)
    run = cvxpy_backend.CVXPY.run

    def equilibrated_infeasible(self, problem, *args, **kwargs):
        out = run(self, problem, *args, **kwargs)
        if problem is not prob:     # the equilibrated copy
            return Outcome(Status.INFEASIBLE, values={}, info={**out.info, "cvxpy_status": "infeasible"})
        out.values = {uid: value * 1.01 for uid, value in out.values.items()}
        return out

    monkeypatch.setattr(cvxpy_backend.CVXPY, "run", equilibrated_infeasible)
    with pytest.warns(RuntimeWarning, match="not a solution"):
        res = prob.solve("cvxpy")
    assert res.status != "infeasible"
    np.testing.assert_allclose(res.value(w), 1.01 * exact, rtol=1e-9)


def test_an_equilibrated_answer_that_violates_the_model_is_checked_as_written(monkeypatch):
    """Clarabel "optimal" on the equilibrated copy at a point that violates the user's ball
    (`finish_result`: "stalled") was returned as it was; the model as written is now solved too
    and its answer kept (reviewer of the session's diff)."""
    from fedmodel.backends import cvxpy_backend
    prob, w = _small_ridge()
    exact = prob.solve("cvxpy").value(w)
    run = cvxpy_backend.CVXPY.run

    def equilibrated_outside_the_ball(self, problem, *args, **kwargs):
        out = run(self, problem, *args, **kwargs)
        if problem is not prob:     # the equilibrated copy: a point far outside ‖w‖ ≤ 10
            out.values = {uid: value * 1e3 for uid, value in out.values.items()}
        return out

    monkeypatch.setattr(cvxpy_backend.CVXPY, "run", equilibrated_outside_the_ball)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve("cvxpy")
    assert res.status == "converged"
    np.testing.assert_allclose(res.value(w), exact, rtol=1e-7, atol=1e-9)
