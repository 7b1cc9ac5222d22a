"""A result whose Parameters changed after the solve (issue 25 item 2; BENCHMARKS "new user,
round 7"): `fm.verify` checks it against the model at the values it was solved with, says which
Parameters changed, and never reads a stored certificate of one value beside a reference of
another. The answers are checked against the ridge's normal equations."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import verification

def _ridge(lam_value: float):
    """Σ_i ‖X_i w − y_i‖² + λ‖w‖² over two clients, λ a nonneg Parameter."""
    rng = np.random.default_rng(3)
    parts = [(rng.normal(size=(12, 3)), rng.normal(size=12)) for _ in range(2)]
    w, lam = fm.Variable(3, name="w"), fm.Parameter(nonneg=True, name="lam", value=lam_value)
    prob = fm.Problem()
    for X, y in parts:
        c = prob.add_client()
        c.minimize(fm.sum_squares(c.data(X, name="X") @ w - c.data(y, name="y")))
    prob.server.minimize(lam * fm.sum_squares(w))
    return prob, w, lam, parts


def _closed_form(parts, lam: float) -> np.ndarray:
    H = lam * np.eye(3) + sum(X.T @ X for X, _ in parts)
    return np.linalg.solve(H, sum(X.T @ y for X, y in parts))


def test_a_result_records_its_parameters():
    prob, w, lam, parts = _ridge(0.01)
    res = prob.solve("cvxpy")
    lam.value = 10.0
    assert res.parameters[lam.uid] == pytest.approx(0.01)


def test_stale_result_verified_at_its_own_values():
    """Solved at λ = 0.01, then λ = 10: the result is right for the model it solved — OK, with a
    note naming λ (old → new); the reference is the λ = 0.01 answer; λ is 10 again after."""
    prob, w, lam, parts = _ridge(0.01)
    res = prob.solve("cvxpy")
    lam.value = 10.0
    report = fm.verify(res)
    assert report.ok, str(report)
    assert any("lam" in n and "0.01 → 10" in n for n in report.notes), report.notes
    assert report.reference.value(w) == pytest.approx(_closed_form(parts, 0.01), rel=1e-5)
    assert float(lam.value) == 10.0 and float(prob.solve("cvxpy").objective) > res.objective


def test_stale_result_perturbed_is_not_ok():
    """The same stale result moved off its answer (its certificate recomputed at the moved point):
    NOT OK on the gap, the distance and the KKT rows, all measured at λ = 0.01."""
    prob, w, lam, parts = _ridge(0.01)
    res = prob.solve("cvxpy")
    lam.value = 10.0
    moved = dataclasses.replace(res, values={w.uid: res.values[w.uid] * 1.1}, certificate=None)
    report = fm.verify(moved)
    assert not report.ok
    assert {"objective gap", "solution distance", "KKT stationarity"} <= set(report.failed)
    assert float(lam.value) == 10.0


def test_fresh_answer_at_the_new_value_is_not_the_stale_one():
    """A reference solved at λ = 10 handed to verify for the λ = 0.01 result: not OK, and the
    note says the two were solved at different Parameter values."""
    prob, w, lam, parts = _ridge(0.01)
    res = prob.solve("cvxpy")
    lam.value = 10.0
    ref = prob.solve("cvxpy")
    assert ref.value(w) == pytest.approx(_closed_form(parts, 10.0), rel=1e-5)
    report = fm.verify(res, ref)
    assert not report.ok and "objective gap" in report.failed
    assert any("reference" in n and "lam" in n for n in report.notes), report.notes


def test_parameters_restored_when_verify_raises(monkeypatch):
    prob, w, lam, parts = _ridge(0.01)
    res = prob.solve("cvxpy")
    lam.value = 10.0

    def broken(problem, notes):
        assert float(lam.value) == pytest.approx(0.01)     # the reference solve sees the old λ
        raise RuntimeError("reference solve failed")
    monkeypatch.setattr(verification, "_reference", broken)
    with pytest.raises(RuntimeError):
        fm.verify(res)
    assert float(lam.value) == 10.0


def test_unchanged_parameters_say_nothing():
    prob, w, lam, parts = _ridge(0.01)
    report = fm.verify(prob.solve("cvxpy"))
    assert report.ok and not any("Parameter" in n for n in report.notes), report.notes


def test_fm_verify_stays_the_function_after_its_modules_are_imported():
    # importing a submodule sets it as the package's attribute; when the module was named
    # `fedmodel.verify`, `from fedmodel.verify import Report` made `fm.verify(res)` a module call
    code = ("import fedmodel as fm, fedmodel.verification, fedmodel.verify_report\n"
            "from fedmodel.verification import verify\n"
            "print(callable(fm.verify), fm.verify is verify, fm.Report.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "True", "fedmodel.verify_report"]
