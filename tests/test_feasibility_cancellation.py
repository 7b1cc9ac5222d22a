"""A binding constraint whose value is 0 by cancellation (a budget sum(w) >= 0 met with
sum(w) = -1.5e-12) reads its violation against the size of what it adds up, Σ|w_j|, not against
|sum(w)| itself (newuser4's house budget: verify said "feasibility 1.00e+00" on a right answer)."""
import dataclasses

import numpy as np
import pytest

import fedmodel as fm


def budget_model(seed: int = 0):
    rng = np.random.default_rng(seed)
    w = fm.Variable(6, name="w")
    prob = fm.Problem("budget")
    blocks = []
    for i in range(3):
        X = rng.standard_normal((15, 6)) * np.array([1, 10, 100, 1, 1, 1.0])
        y = X @ np.array([-3.0, 1.0, -2.0, 0.5, -1.0, 0.2]) + 0.1 * rng.standard_normal(15)
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)) / 45)
        blocks.append((X, y))
    prob.server.subject_to((fm.sum(w) >= 0).named("budget"))
    prob.server.subject_to((np.ones(6) @ w <= 1.0).named("row"))   # a matmul term: |1|·|w|
    X = np.vstack([b[0] for b in blocks]); y = np.concatenate([b[1] for b in blocks])
    K = np.block([[2 * X.T @ X / 45, -np.ones((6, 1))], [np.ones((1, 6)), np.zeros((1, 1))]])
    solution = np.linalg.solve(K, np.concatenate([2 * X.T @ y / 45, [0.0]]))
    return prob, w, solution[:6], solution[6]


def test_a_rounding_violation_of_a_cancelling_sum_is_not_infeasible():
    prob, w, w_star, mu = budget_model()
    assert mu > 0.1                                  # the budget binds
    x = w_star - (w_star.sum() + 1.5e-12) / 6        # sum(x) = -1.5e-12: rounding
    cert = prob.kkt_certificate({w.uid: x}, {"budget": np.array(mu), "row": np.array(0.0)})
    assert abs(x.sum() + 1.5e-12) < 1e-13
    assert cert.relative_feasibility < 1e-10         # 1.5e-12 / Σ|w_j| (~6), was 1.0
    assert cert.relative_stationarity < 1e-6


def test_a_real_violation_of_a_cancelling_sum_is_still_read():
    prob, w, w_star, mu = budget_model()
    x = w_star - (w_star.sum() + 0.05) / 6           # sum(x) = -0.05: 1 % of Σ|w_j|
    cert = prob.kkt_certificate({w.uid: x}, {"budget": np.array(mu), "row": np.array(0.0)})
    scale = np.sum(np.abs(x))
    assert np.isclose(cert.relative_feasibility, 0.05 / scale, rtol=1e-6)
    assert cert.relative_feasibility > 1e-3          # verify's tolerance: flagged


def user_budget(unit: float, seed: int = 1):
    """The budget model as a user writes it: one objective per client, the data in other units."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(6, name="w")
    prob = fm.Problem("budget-user")
    for i in range(3):
        X = rng.standard_normal((15, 6)) * np.array([1, 10, 100, 1, 1, 1.0])
        y = X @ np.array([-3.0, 1.0, -2.0, 0.5, -1.0, 0.2]) + 0.1 * rng.standard_normal(15)
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(unit * X) @ w - c.data(unit * y)) / 45)
    prob.server.subject_to(fm.sum(w) >= 0)
    return prob, w


@pytest.mark.parametrize("unit", [1e-3, 1.0, 1e3])
def test_the_binding_budget_verifies_in_any_units_and_a_wrong_point_does_not(unit):
    """ProxAL's defaults on the budget model with the data ×1e-3, ×1, ×1e3: CVXPY's answer, and
    fm.verify OK — the budget met to rounding is feasible; the same point moved by 1 % is flagged."""
    prob, w = user_budget(unit)
    reference = prob.solve("cvxpy")
    result = prob.solve("proxal")
    assert result.status == "converged"
    x, x_star = result.value(w), reference.value(w)
    assert np.max(np.abs(x - x_star)) <= 1e-3 * np.max(np.abs(x_star))     # (measured 1.1e-4)
    assert fm.verify(result, reference).ok
    moved = dataclasses.replace(result, values={w.uid: x_star * 1.01})
    assert not fm.verify(moved, reference).ok
