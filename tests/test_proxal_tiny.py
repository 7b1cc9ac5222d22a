"""ProxAL's defaults on the tiny models a new user writes first (issue 25, items 1–2 of "fedmodel
as a new user"). A client's set or held constraint that cuts off the start (w = 0, where the
objective's gradient is 0) ran 100 outer × 1 inner steps at w = 0: the certificate (22) read the
set's normal cone at a w outside it and certified the first ADMM step. A ball not centred at 0
cycled (w inside, then 1e-4 outside after a one-step ADMM run) until "stalled" at β_max.
Answers: closed forms, and CVXPY through fm.verify."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm


def _bound():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    c = prob.add_client("c0")
    c.minimize(fm.sum_squares(w))
    c.subject_to(w >= 1)                    # a projected client set that excludes w = 0
    return prob, w


def _bound_with_data():
    rng = np.random.default_rng(0)
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    for i in range(3):
        c = prob.add_client(f"c{i}")
        X = rng.standard_normal((30, 2))
        c.minimize(fm.sum_squares(c.data(X, name="X") @ w) / 30)
        if i == 0:
            c.subject_to(w >= 1)
    return prob, w


def _shifted_ball():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    c = prob.add_client("c0")
    c.minimize(fm.sum_squares(w))
    c.subject_to(fm.norm2(w - 3) <= 1)      # held in the client's solves (not a projected set)
    return prob, w


@pytest.mark.parametrize("build, answer", [
    (_bound, np.ones(2)),
    (_bound_with_data, np.ones(2)),         # both bounds active (the reference is checked too)
    (_shifted_ball, (3 - 1 / np.sqrt(2)) * np.ones(2)),
], ids=["bound", "bound-with-data", "shifted-ball"])
def test_proxal_defaults_solve_tiny_client_constrained_models(build, answer):
    prob, w = build()
    res = prob.solve("proxal")
    ref_prob, ref_w = build()
    ref = ref_prob.solve("cvxpy")
    assert res.status == "converged"
    assert fm.verify(res, ref).ok
    np.testing.assert_allclose(ref.value(ref_w), answer, atol=1e-5)      # the reference itself
    np.testing.assert_allclose(res.value(w), answer, atol=1e-3)
    assert res.iterations["outer"] < 20
