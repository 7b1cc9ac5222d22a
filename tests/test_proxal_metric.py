"""ProxAL's ADMM in a diagonal metric, `ProxAL(rho_metric="curvature")` (issue 27 item 2, branch
pxcurv; docs/BENCHMARKS.md): the clients' Hessian diagonals against the closed form (dense and
packed low-rank Hessians), the metric D formed from them, the server's separable prox step with
a weight per entry, and the certificate (22) in the metric against the true ‖∇ℓ_k(w)‖∞."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm
from fedmodel.atoms.prox import soft_threshold
from fedmodel.backends import ProxAL, proxal as proxal_module, proxal_admm
from fedmodel.backends.proxal_nodes import curvature_diagonal
from fedmodel.runtime.program import compile_programs


def _least_squares(X, y):
    w = fm.Variable(X.shape[1], name="w")
    prob = fm.Problem("ls")
    client = prob.add_client("c0")
    client.minimize(fm.sum_squares(client.data(X, name="X") @ w - client.data(y, name="y")) / len(y))
    return prob


@pytest.mark.parametrize("rows, form", [(30, "dense"), (5, "dense"), (5, "sparse")])
def test_a_client_s_hessian_diagonal_is_the_closed_form(rows, form):
    """‖Xw − y‖²/m has ∇² = 2XᵀX/m: diagonal 2Σ_r X_rj²/m, from the dense Hessian (30 rows) and
    from the packed diag(λ) + Q C Qᵀ of a client with few rows (5 of 40 columns, dense or sparse)."""
    rng = np.random.default_rng(7)
    d = 4 if rows == 30 else 40
    X = rng.normal(size=(rows, d)) if form == "dense" else sp.random(rows, d, density=0.3, random_state=2,
                                                                      format="csc", data_rvs=rng.standard_normal)
    X = X if form == "dense" else X.tocsc()
    program = compile_programs(_least_squares(X, rng.normal(size=rows)))["c0"]
    dense = X if form == "dense" else X.toarray()
    expected = 2.0 * (dense ** 2).sum(axis=0) / rows
    got = curvature_diagonal(program, rng.normal(size=d))
    assert got is not None and got == pytest.approx(expected, rel=1e-8, abs=1e-12)


def test_the_metric_is_the_summed_curvature_relative_to_its_mean_clipped():
    spread = proxal_admm.METRIC_SPREAD
    assert proxal_admm.curvature_metric([np.ones(3), None]) is None          # a node that cannot say
    assert proxal_admm.curvature_metric([np.full(3, 2.0), np.full(3, 0.5)]) is None   # D = 1: Euclidean
    total = np.array([1.0, 3.0, 2.0, 0.5])
    assert proxal_admm.curvature_metric([total / 2, total / 2]) == pytest.approx(total / 1.625, rel=1e-12)
    D = proxal_admm.curvature_metric([np.r_[np.ones(9999), 1e8]])       # mean 10,001: both ends clipped
    assert D[-1] == spread and np.all(D[:-1] == 1 / spread)


def test_a_server_l1_step_with_a_weight_per_entry_is_the_entrywise_soft_threshold():
    """argmin λ‖w‖₁ + ½Σ_j c_j (w_j − a_j)² = soft_threshold(a, λ/c) in one step (the closed form
    `local_solvers._closed_form` takes for a separable prox term)."""
    w = fm.Variable(5, name="w")
    prob = fm.Problem("l1")
    prob.add_client("c0").minimize(fm.sum_squares(w))
    prob.server.minimize(0.3 * fm.norm1(w))
    server = compile_programs(prob)["server"]
    c, a = np.array([0.1, 1.0, 10.0, 100.0, 0.5]), np.array([1.0, -0.2, 0.05, -2.0, 0.1])
    out = server.solve_local(linear=None, weight=c, anchor=a, x0=np.zeros(5), tol=1e-12, method="prox")
    assert out["steps"] == 1
    assert out["x"] == pytest.approx(soft_threshold(a, 0.3 / c), abs=1e-12)


def _stiff_ridge(n=3, rows=20, d=6, seed=0):
    """Least squares over n clients whose last column is an intercept (curvature ~2 against ~0.02
    for the sparse columns), with a server ridge: the metric is far from one."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob, blocks = fm.Problem("stiff"), []
    for i in range(n):
        X = np.hstack([rng.normal(size=(rows, d - 1)) * (rng.random((rows, d - 1)) < 0.1), np.ones((rows, 1))])
        y = X @ np.arange(1.0, d + 1) + 0.1 * rng.normal(size=rows)
        blocks.append((X, y))
        client = prob.add_client(f"c{i}")
        client.minimize(fm.sum_squares(client.data(X, name="X") @ w - client.data(y, name="y")) / (n * rows))
    prob.server.minimize(1e-2 * fm.sum_squares(w))
    X, y = np.vstack([b[0] for b in blocks]), np.concatenate([b[1] for b in blocks])
    exact = np.linalg.solve(2 * X.T @ X / len(y) + 2e-2 * np.eye(d), 2 * X.T @ y / len(y))
    return prob, w, exact


def test_the_certificate_in_the_metric_bounds_the_true_gradient(monkeypatch):
    """(22) with ρ_i∘D bounds ‖∇ℓ_k(w)‖∞ at every outer iteration's last ADMM iterate (the
    true gradient by `check_certificate`), and the run lands on the closed-form ridge answer."""
    used = []
    metric = proxal_admm.curvature_metric
    monkeypatch.setattr(proxal_module, "curvature_metric", lambda d: used.append(metric(d)) or used[-1])
    prob, w, exact = _stiff_ridge()
    records = []
    # as written (`scaling=False`): the equilibration would even out the columns' curvature
    res = prob.solve(ProxAL(rho_metric="curvature", check_certificate=True), callback=records.append,
                     scaling=False)
    assert used and all(D is not None and D.max() / D.min() > 10 for D in used)
    for r in records:
        assert r["true_residual"] <= r["certificate"] * (1 + 1e-9) + 1e-15
    assert res.status == "converged"
    assert np.linalg.norm(res.value(w) - exact) <= 1e-3 * np.linalg.norm(exact)


@pytest.mark.integration
def test_a_sparse_lasso_with_an_intercept_takes_fewer_round_trips_in_the_metric():
    """Branch pxl1's model, smaller (6 clients × 100 rows, d = 1,000 sparse columns and an
    intercept, server 1e-3‖w‖₁; other draws than the probe's): the subproblem's curvature spans ~10³ (the intercept against
    the sparse columns), which no scalar ρ serves. Measured (docs/BENCHMARKS.md, pxcurv): 874
    round trips with the scalar ρ, 547 in the metric; both verified (the probe at d = 1,000: 874 / 495)."""
    rng = np.random.default_rng(5)
    d, rows = 1000, 100
    w = fm.Variable(d, name="w")
    prob = fm.Problem("sparse-l1")
    truth = np.zeros(d)
    truth[rng.choice(d - 1, 50, replace=False)] = rng.normal(size=50)
    truth[-1] = 0.5
    for i in range(6):
        B = sp.random(rows, d - 1, density=0.005, random_state=5 + i, format="csr", data_rvs=rng.standard_normal)
        X = sp.hstack([B, np.ones((rows, 1))]).tocsc()
        y = X @ truth + 0.05 * rng.normal(size=rows)
        client = prob.add_client(f"c{i}")
        client.minimize(fm.sum_squares(client.data(X, name="X") @ w - client.data(y, name="y")) / (6 * rows))
    prob.server.minimize(1e-3 * fm.norm1(w))
    res = prob.solve(ProxAL(rho_metric="curvature"))
    assert res.status == "converged"
    assert res.info["communication"]["round_trips"] <= 650
    assert fm.verify(res, prob.solve("cvxpy")).ok
