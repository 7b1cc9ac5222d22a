"""Lead, 2026-12-01 (third session): the multipliers of a client's sets at large d."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import proxal_nodes
from fedmodel.compiler.codegen import Plan


def _central_differences(plan: Plan, x: np.ndarray) -> np.ndarray:
    step = 1e-6 * max(1.0, float(np.max(np.abs(x))))
    columns = []
    for j in range(x.size):
        up, down = x.copy(), x.copy()
        up[j] += step
        down[j] -= step
        columns.append((np.concatenate([np.ravel(v) for v in plan(up)])
                        - np.concatenate([np.ravel(v) for v in plan(down)])) / (2 * step))
    return np.column_stack(columns)


def test_the_sets_jacobian_by_rows_agrees_with_central_differences():
    w = fm.Variable(5, name="w")
    constraints = [fm.norm2(w) <= 2.0, w <= np.arange(5.0), fm.sum_squares(w) <= 3.0,
                   np.arange(15.0).reshape(3, 5) @ w >= -1]
    x = np.random.default_rng(0).normal(size=5)
    plan = Plan([c.expr for c in constraints], [w])
    jacobian = proxal_nodes._jacobian(constraints, w, x, plan, rows=10)
    assert np.allclose(jacobian, _central_differences(plan, x), rtol=1e-7, atol=1e-7)
    many_rows = [np.arange(60.0).reshape(12, 5) @ w <= 1]      # 12 rows on 5 unknowns: by columns
    plan = Plan([c.expr for c in many_rows], [w])
    assert np.allclose(proxal_nodes._jacobian(many_rows, w, x, plan, rows=12),
                       np.arange(60.0).reshape(12, 5), rtol=1e-7)


def test_a_ball_at_large_d_takes_a_few_plan_calls(monkeypatch):
    """The ball's multiplier at d = 20,000 from one transposed-Jacobian call and its check (central
    differences made 40,001 plan calls: 101 of the 174 s of the a9a d = 10⁵ solve, bigdense),
    and it is the KKT one: ∇(‖w‖² − r²) = 2w, so normal = 2νw gives ν back."""
    d = 20_000
    w = fm.Variable(d, name="w")
    ball = fm.sum_squares(w) <= 1.0
    x = np.random.default_rng(1).normal(size=d)
    x /= np.linalg.norm(x)                                  # on the sphere: active
    calls = []
    original = Plan.__call__
    monkeypatch.setattr(Plan, "__call__", lambda self, *a: calls.append(1) or original(self, *a))
    nu = proxal_nodes._normal_multipliers([ball], w, x, 2 * 0.75 * x)[ball.name]
    assert len(calls) <= 4        # the value, the row, the row's check along one direction (2)
    assert abs(float(nu) - 0.75) < 1e-9


def test_at_a_kink_the_rows_are_central_differences():
    """An ℓ∞ ball's tied corner (projection clips two coordinates to exactly r) and a
    Euclidean ball at its centre: a derivative rule picks one piece (ν = 1, the normal fitted
    with residual 1) or gives nan (with a RuntimeWarning); central differences average the
    pieces, and ν = 2 fits the normal exactly (review16)."""
    w = fm.Variable(4, name="w")
    corner = fm.norm_inf(w) <= 1
    nu = proxal_nodes._normal_multipliers([corner], w, np.array([1.0, 1.0, 0.5, 0.0]),
                                          np.array([1.0, 1.0, 0.0, 0.0]))[corner.name]
    assert abs(float(nu) - 2.0) < 1e-6
    ball = fm.norm2(w) <= 1
    plan = Plan([ball.expr], [w])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jacobian = proxal_nodes._jacobian([ball], w, np.zeros(4), plan, rows=1)
    assert np.all(np.isfinite(jacobian))


@pytest.mark.parametrize("units", [1e-3, 1.0, 1e3])
def test_a_users_infinity_ball_multipliers_match_cvxpy_in_any_units(units):
    """As a user writes it: three clients pulling w towards a corner of their ‖w‖∞ ≤ r, the data
    in other units (the radius with them). The projection clips two coordinates to exactly r —
    the tie where a derivative rule took one piece and halved ν (review16). ProxAL's answer and
    each client's multiplier against CVXPY's, and verify."""
    rng = np.random.default_rng(0)
    w = fm.Variable(4, name="w")
    prob = fm.Problem()
    for i in range(3):
        A = rng.normal(size=(20, 4)) * units
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(A, name="A") @ w - A @ np.array([3.0, -3.0, 0.1, 0.0])) / 20)
        c.subject_to(fm.norm_inf(w) <= 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res, ref = prob.solve("proxal"), prob.solve("cvxpy")
    assert res.status == "converged" and fm.verify(res, ref).ok
    for name, mu in ref.multipliers.items():
        assert abs(float(res.multipliers[name]) - float(mu)) <= 1e-3 * abs(float(mu))


def test_data_changed_in_place_between_solves_is_read_again():
    """A user's array passed to `c.data` stays theirs: changed in place, the next `prob.solve()`
    reads it. Here the change makes the client's Neyman-Pearson constraint impossible (its loss
    on ±A is at least log 2 > 0.5): "infeasible" before the run (one round trip), as CVXPY says.
    (The clients' own-constraint check is made each solve: adult50's cache of it, keyed by the
    data leaf's identity, missed an in-place change when called directly — reread16 — and is
    taken out.)"""
    rng = np.random.default_rng(0)
    w, prob = fm.Variable(4, name="w"), fm.Problem(name="np")
    A = rng.standard_normal((5, 4)) + 1.0
    X1 = np.vstack([A, A])
    c = prob.add_client("c1")
    c.minimize(fm.mean(fm.logistic(c.data(rng.standard_normal((12, 4)), name="X0") @ w)))
    c.subject_to((fm.mean(fm.logistic(-(c.data(X1, name="X1") @ w))) <= 0.5).named("np[c1]"))
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert prob.solve().status == "converged"
        X1[5:] = -A
        again = prob.solve()
        assert again.status == "infeasible" and again.info["communication"]["round_trips"] == 1
        assert prob.solve("cvxpy").status == "infeasible"
