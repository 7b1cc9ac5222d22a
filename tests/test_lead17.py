"""Lead, 2026-12-01 (nu17 probes): the server's model minimizer finishes on the face of an ℓ1
term as on a set's face. An elastic net on the server over raw power-plant data (column scales
1 … 1,000, an intercept) took 29 round trips and 10.6 s CPU — FISTA's 20,000 model iterations a
Newton step on an ill-conditioned model — where CVXPY takes 1.4 s; with the face solve: 9 round
trips, 0.1 s."""
import warnings

import cvxpy as cp
import numpy as np

import fedmodel as fm
from fedmodel.backends import proxal_newton_model
from fedmodel.backends.proxal import ProxAL
from fedmodel.backends.proxal_newton import NewtonInner
from conftest import load_data


def _ill_lasso_model(seed: int = 0, d: int = 6):
    """A lasso model Gᵀ(u − z) + ½(u − z)ᵀH(u − z) + λ‖u‖₁ of condition 1e8."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    H = Q @ np.diag(np.logspace(-4, 4, d)) @ Q.T
    return H, rng.normal(size=d), rng.normal(size=d) * 10


def _assert_lasso_optimal(u, z, G, H, lam, upper=np.inf):
    """The optimality conditions of the lasso QP (closed form, no solver): g + λ·sign(u) = 0 on
    the nonzero entries below `upper`, |g| ≤ λ on the zeros, g ≤ −λ where u is at `upper`."""
    g = G + H @ (u - z)
    scale = np.abs(H @ u).max() + np.abs(G).max()
    free = (u != 0) & (u < upper)
    np.testing.assert_allclose(g[free] + lam[free] * np.sign(u[free]), 0, atol=1e-8 * scale)
    assert np.all(np.abs(g[u == 0]) <= lam[u == 0] + 1e-8 * scale)
    assert np.all(g[u == upper] + lam[u == upper] <= 1e-8 * scale)


def test_the_model_minimizer_with_l1_is_the_lasso_qp_s_answer_in_few_iterations(monkeypatch):
    w, prob = fm.Variable(6, name="w"), fm.Problem()
    prob.add_client().minimize(fm.sum_squares(w))
    prob.server.minimize(0.7 * fm.norm1(w))
    server = ProxAL(inner=NewtonInner()).compile(prob)["server"]
    H, z, G = _ill_lasso_model()
    calls = _counted_prox(monkeypatch)
    found = proxal_newton_model.model_minimizer(server, z, G, H, np.zeros(6), 1e-10)
    assert 0 < np.count_nonzero(found == 0) < 6         # (a face with zeros and free entries)
    _assert_lasso_optimal(found, z, G, H, np.full(6, 0.7))
    assert calls["prox"] <= 200        # (FISTA alone: its 20,000 iterations)


def _counted_prox(monkeypatch) -> dict:
    calls = {"prox": 0}
    original = proxal_newton_model._prox

    def counted(*args):
        calls["prox"] += 1
        return original(*args)
    monkeypatch.setattr(proxal_newton_model, "_prox", counted)
    return calls


def test_the_clients_l1_weights_join_the_face(monkeypatch):
    """The clients' summed λ‖w‖₁ (`l1`) beside a server box: the same search, a bound and an
    ℓ1 zero held (FISTA alone: 5,464 model iterations)."""
    w, prob = fm.Variable(6, name="w"), fm.Problem()
    prob.add_client().minimize(fm.sum_squares(w))
    prob.server.subject_to(w <= 50)
    server = ProxAL(inner=NewtonInner()).compile(prob)["server"]
    H, z, G = _ill_lasso_model(seed=1)
    l1 = np.array([0.5, 0.5, 0.0, 2.0, 2.0, 0.1])
    calls = _counted_prox(monkeypatch)
    found = proxal_newton_model.model_minimizer(server, z, G, H, l1, 1e-10)
    _assert_lasso_optimal(found, z, G, H, l1, upper=50.0)
    assert found[5] == 50.0 and found[4] == 0.0 and calls["prox"] <= 200


def test_a_server_elastic_net_on_raw_power_plant_data_takes_few_round_trips():
    from fedmodel.datasets import load_regression
    data = load_data(load_regression, "power-plant")
    X = np.hstack([data.X, np.ones((len(data.y), 1))])
    y = np.asarray(data.y, float)
    w, prob = fm.Variable(X.shape[1], name="w"), fm.Problem()
    for rows in np.array_split(np.random.default_rng(0).permutation(len(y)), 6):
        c = prob.add_client()
        c.minimize(fm.sum_squares(c.data(X[rows]) @ w - c.data(y[rows])) / len(y))
    prob.server.minimize(1e-2 * fm.norm1(w) + 1e-2 * fm.sum_squares(w))
    v = cp.Variable(X.shape[1])
    cp.Problem(cp.Minimize(cp.sum_squares(X @ v - y) / len(y) + 1e-2 * cp.norm1(v) + 1e-2 * cp.sum_squares(v))).solve(
        solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve()
    assert res.status == "converged" and res.ledger.round_trips <= 15        # (29 before)
    assert np.linalg.norm(res.value(w) - v.value) <= 1e-3 * np.linalg.norm(v.value)
