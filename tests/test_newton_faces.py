"""NewtonInner's model minimizer finishes on the face of the server's linear sets
(`proxal_newton_model.face_minimizer`): the exact QP minimizer from a point on the right face, and newuser12's
stacking model with simplex weights (no answer in 120 s before: FISTA crept on a model of
condition 2e9) in a few round trips."""
import warnings

import cvxpy as cp
import numpy as np

import fedmodel as fm
from fedmodel.backends.proxal_newton_model import face_minimizer
from fedmodel.backends.proxal import ProxAL
from fedmodel.backends.proxal_newton import NewtonInner
from conftest import load_data


def _server(prob):
    """The server's program as ProxAL compiles it (its sets as prox terms)."""
    return ProxAL(inner=NewtonInner()).compile(prob)["server"]


def test_the_face_s_minimizer_is_the_qp_s_from_a_point_on_its_face():
    """Bounds 0 ≤ w ≤ 0.4 (the server's prox sets; an equality would be in the AL: here its
    penalty β·a aᵀ, β = 1e6, in the model's Hessian, as in the stacking model)."""
    rng = np.random.default_rng(0)
    w, prob = fm.Variable(6, name="w"), fm.Problem()
    prob.add_client().minimize(fm.sum_squares(w))
    prob.server.subject_to(w >= 0, w <= 0.4)
    A = rng.normal(size=(6, 6))
    H, z = A.T @ A + 1e6 * np.ones((6, 6)), np.full(6, 1 / 6)
    G = rng.normal(size=6)
    v = cp.Variable(6)
    cp.Problem(cp.Minimize(G @ (v - z) + 0.5 * cp.quad_form(v - z, cp.psd_wrap(H))), [v >= 0, v <= 0.4]).solve(
        solver="CLARABEL", tol_gap_abs=1e-14, tol_gap_rel=1e-14, tol_feas=1e-14)
    exact = np.clip(np.where(np.abs(v.value) < 1e-9, 0.0, v.value), 0, 0.4)
    on_face = np.where(exact == 0, 0.0, np.where(exact > 0.4 - 1e-9, 0.4, 0.2))   # the same bounds
    found, _ = face_minimizer(_server(prob), z, G, H, on_face)
    np.testing.assert_allclose(found, exact, atol=1e-6)
    assert np.all(found[exact == 0] == 0.0)


def test_a_ball_is_no_face():
    w, prob = fm.Variable(3, name="w"), fm.Problem()
    prob.add_client().minimize(fm.sum_squares(w))
    prob.server.subject_to(fm.norm2(w) <= 1)
    assert face_minimizer(_server(prob), np.zeros(3), np.ones(3), np.eye(3), np.zeros(3))[0] is None


def test_stacking_weights_on_the_simplex_converge_in_a_few_round_trips():
    """newuser12's nu12_simplex_hang: five crude predictors of wine quality stacked with weights
    on the simplex, 5 clients: no answer in 120 s before (CVXPY 0.07 s); now 16 round trips."""
    from fedmodel.datasets import load_regression
    data = load_data(load_regression, "winequality")
    cols = data.X[:, [0, 1, 2, 8, 10]]
    P, y = cols / cols.mean(0) * data.y.mean(), np.asarray(data.y, float)
    w, prob = fm.Variable(5, name="w"), fm.Problem()
    for rows in np.array_split(np.random.default_rng(0).permutation(len(y)), 5):
        c = prob.add_client()
        c.minimize(fm.sum_squares(c.data(P[rows]) @ w - c.data(y[rows])) / len(y))
    prob.server.subject_to(fm.sum(w) == 1, w >= 0)
    v = cp.Variable(5)
    cp.Problem(cp.Minimize(cp.sum_squares(P @ v - y) / len(y)), [cp.sum(v) == 1, v >= 0]).solve()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve()
    assert res.status == "converged" and res.ledger.round_trips <= 30
    assert np.linalg.norm(res.value(w) - v.value) <= 1e-4 * np.linalg.norm(v.value)
