"""DALD's stall rule on a feasible model whose client multipliers must grow large (newuser13):
wine least squares with two clients' mean-prediction bands mean(X_0 w) ≥ 10 and mean(X_1 w) ≤ 0
(both active, ‖w*‖ = 75). The multipliers climb at β·violation a step, the signature of an
infeasible run, while the violation wobbles down ~1 % a window and the iterates still move:
DALD said "stalled", "may be infeasible", at step 41, 0.99 from CVXPY's answer."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import DALD

from conftest import load_data
from test_stall_rules import _records


def test_a_violation_still_falling_while_the_iterates_move_is_progress():
    k = np.arange(60.0)
    steps = 0.95 + 0.004 * np.sin(k / 3)                   # the multipliers' step: steady growth
    falling = 0.97 * (1 - 0.0015 * k) + 0.003 * np.sin(k / 2)
    assert DALD()._stall(_records([0.02] * 60, steps, falling, dual=0.1)) is None
    assert DALD()._stall(_records([0.02] * 60, steps, [0.95] * 60, dual=0.1)) == "stalled"
    settled = _records([0.02] * 60, steps, falling, dual=1e-6)     # iterates settled: the verdict
    assert DALD()._stall(settled) == "infeasible"


@pytest.mark.integration          # ~5 s
def test_feasible_client_bands_are_not_stalled():
    from fedmodel.datasets import load_regression
    data = load_data(load_regression, "winequality")
    rng = np.random.default_rng(0)
    rows = rng.permutation(len(data.y))[:2000]
    X, y = np.asarray(data.X, float)[rows], np.asarray(data.y, float)[rows]
    X = np.hstack([np.ones((2000, 1)), (X - X.mean(0)) / X.std(0)])
    w = fm.Variable(12, name="w")
    prob = fm.Problem()
    for i, part in enumerate(np.array_split(np.arange(2000), 5)):
        c = prob.add_client()
        A = c.data(X[part], name="X")
        c.minimize(0.5 * fm.sum_squares(A @ w - c.data(y[part])) / 2000)
        if i == 0:
            c.subject_to((fm.mean(A @ w) >= 10).named("mean_pred_hi"))
        if i == 1:
            c.subject_to((fm.mean(A @ w) <= 0).named("mean_pred_lo"))
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    warnings.simplefilter("ignore")
    assert prob.solve("cvxpy").status == "converged"
    res = prob.solve(DALD(max_iterations=300))
    assert res.status == "max_iterations"            # slow, honest: not "stalled" at step 41
