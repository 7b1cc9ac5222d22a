"""The reference solve of wine least squares with an active ball ‖w‖ ≤ r on every client at data
×1e-6 (newuser13): the cvxpy backend said "converged" 8.4e-3 off and `fm.verify` failed the
federated backends' right answers against it. Clarabel's tight attempt on the equilibrated copy
was 2e-6 from the answer but "inaccurate", and an "optimal" as written (5e-3 off) beat it; now the
better KKT score is kept. (Lowering the five equal balls once also fixed it, but made Clarabel
fail outright on a separable logistic with equal client balls at ×1e3: the whole chain through
SCS, 139 s instead of 2 s, test_verify_saturated — not kept.)"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from conftest import load_data


def ball_model(scale: float, balls: int = 5, wine: bool = False):
    """Least squares over 5 clients of 400 rows (12 columns: ones and 11 z-scored ones, random
    or wine quality's), ridge 1e-3, the ball ‖w‖ ≤ 0.5 (active) on the first `balls` clients;
    data ×scale, so w* = w*(1)/scale."""
    rng = np.random.default_rng(0)
    if wine:
        from fedmodel.datasets import load_regression
        data = load_data(load_regression, "winequality")
        rows = rng.permutation(len(data.y))[:2000]
        X, y = np.asarray(data.X, float)[rows], np.asarray(data.y, float)[rows]
        X = np.hstack([np.ones((2000, 1)), (X - X.mean(0)) / X.std(0)])
    else:
        X = np.hstack([np.ones((2000, 1)), rng.normal(size=(2000, 11))])
        y = X @ rng.normal(size=12) + 6.0 + rng.normal(size=2000)
    w = fm.Variable(12, name="w")
    prob = fm.Problem()
    for i, rows in enumerate(np.array_split(np.arange(2000), 5)):
        c = prob.add_client()
        c.minimize(0.5 * fm.sum_squares(c.data(X[rows] * scale) @ w - c.data(y[rows])) / 2000)
        if i < balls:
            c.subject_to(fm.norm2(w) <= 0.5 / scale)
    prob.server.minimize(1e-3 * scale ** 2 * fm.sum_squares(w))
    return prob, w


@pytest.mark.parametrize("scale", [1.0, 1e-6])
def test_the_reference_solve_of_a_ball_on_every_client(scale):
    """Wine's data (Clarabel's trouble was with them; random columns solve either way)."""
    warnings.simplefilter("ignore")
    one, w1 = ball_model(scale, balls=1, wine=True)
    single = one.solve("cvxpy")
    prob, w = ball_model(scale, wine=True)
    res = prob.solve("cvxpy")
    assert res.status == "converged"
    want = single.value(w1)
    assert np.max(np.abs(res.value(w) - want)) <= 1e-5 * np.max(np.abs(want))     # before: 8.4e-3
    assert res.certificate.relative_stationarity <= 1e-5
    mu = [float(res.multipliers[c.name]) for c in prob.constraints]
    assert np.allclose(mu, mu[0]) and sum(mu) == pytest.approx(float(single.multipliers[one.constraints[0].name]), rel=1e-4)
