"""Many sparse features, few rows, beyond the dense Newton budget (issue 25 item 3, helper
sparse3): the local Newton systems go through the data rows' m × m space (`low_rank.Basis`:
Q = Aᵀ T, never an N × r or N × N array), not Newton-CG on a diagonal or a d × d factor.
Checked against the ridge's dual closed form w = Xᵀ(XXᵀ/N + λI)⁻¹y/N and against dense solves.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm
from fedmodel.runtime import compiled_merit, local_solvers, low_rank, solvers
from fedmodel.runtime.program import compile_programs
from test_few_rows import _sparse_problem


def test_a_sparse_basis_is_implicit_orthonormal_and_spans_the_rows():
    rng = np.random.default_rng(0)
    X = sp.random(12, 400, density=0.05, random_state=1, format="csr")
    X = sp.vstack([X, X[:3] * 2.0]).tocsr()            # dependent rows: rank 12 of 15
    basis = low_rank.row_basis([X], 400)
    assert basis.mix is not None and basis.shape == (400, 12)
    Q = basis.dense()
    assert np.allclose(Q.T @ Q, np.eye(12), atol=1e-10)
    Xd = X.toarray()
    assert np.max(np.abs(Xd - (Xd @ Q) @ Q.T)) <= 1e-10 * np.max(np.abs(Xd))   # the row space
    weight = rng.uniform(0.1, 3.0, 400)
    assert np.allclose(basis.weighted_gram(weight), Q.T @ (weight[:, None] * Q), atol=1e-10)
    v = rng.standard_normal(12)
    assert np.allclose(basis.times(v), Q @ v) and np.allclose(basis.transpose_times(Q @ v), v)


def _ridge(d, rows, clients, seed, l1=False):
    """`test_few_rows._sparse_problem` (mean least squares, 1e-3‖w‖² or 1e-3‖w‖₁ on the
    server) at density 0.003, with the ridge's dual closed form."""
    prob, w, X, y = _sparse_problem(d, rows, clients, seed, server="l1" if l1 else "ridge", density=0.003)
    n_rows = len(y)
    dual = np.linalg.solve(X @ X.T / n_rows + 1e-3 * np.eye(n_rows), y / n_rows)
    return prob, w, X.T @ dual


def _no_cg_no_dense(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a d × d Hessian or CG was used beyond the dense budget")
    monkeypatch.setattr(solvers, "conjugate_gradients", refuse)
    monkeypatch.setattr(compiled_merit.CompiledMerit, "hessian", refuse)


def test_beyond_the_budget_the_row_space_solve_is_taken(monkeypatch):
    # d = 1,500 under a budget of 10⁶ floats (a 1,500² matrix is 2.25·10⁶): main took
    # Newton-CG (CG to 1e-12 on every client and on the server's diagonal) here
    monkeypatch.setattr(solvers, "DENSE_NEWTON_FLOATS", 1_000_000)
    prob, w, answer = _ridge(1500, 15, 3, seed=3)
    programs = compile_programs(prob)
    for name in ("c0", "server"):
        assert local_solvers.choose(programs[name], "exact") == "exact"
    assert low_rank.basis_of(programs["c0"]).mix is not None        # Q = Aᵀ T, implicit
    assert low_rank.basis_of(programs["server"]).shape == (1500, 0)  # a diagonal
    _no_cg_no_dense(monkeypatch)
    res = prob.solve("proxal")
    assert res.status == "converged"
    assert np.max(np.abs(res.value(w) - answer)) <= 1e-4 * np.max(np.abs(answer))


def test_beyond_the_budget_a_server_l1_step_is_its_closed_form(monkeypatch):
    # the server's merit is c·I (the ADMM's proximal terms) + λ‖w‖₁: one soft-threshold, as
    # within the budget, not FISTA (main: ~55 FISTA steps a round at d = 5,000, half its time)
    monkeypatch.setattr(solvers, "DENSE_NEWTON_FLOATS", 200_000)
    prob, w, _ = _ridge(600, 10, 2, seed=5, l1=True)
    reference = prob.solve("cvxpy")
    monkeypatch.setattr(solvers, "prox_gradient", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("FISTA on a c·I merit")))
    _no_cg_no_dense(monkeypatch)
    res = prob.solve("proxal")
    assert res.status == "converged"
    ref = reference.value(w)
    assert np.max(np.abs(res.value(w) - ref)) <= 1e-3 * np.max(np.abs(ref))


@pytest.mark.integration
def test_sparse_ridge_d20000_few_rows_against_the_dual_closed_form(monkeypatch):
    # d = 20,000, 3 clients × 40 CSR rows: beyond the default dense budget (4·10⁸ floats);
    # (ProxAL's default tolerance leaves 3e-4 relative here: the answer's entries are ~1e-3)
    # main's Newton-CG on the server's diagonal ran ~10³ CG products a solve (the d = 10⁵ probe
    # of round 5 gave no answer in 120 s)
    prob, w, answer = _ridge(20_000, 40, 3, seed=4)
    assert not solvers.dense_fits(20_000)
    _no_cg_no_dense(monkeypatch)
    res = prob.solve("proxal")
    assert res.status == "converged"
    assert np.max(np.abs(res.value(w) - answer)) <= 1e-3 * np.max(np.abs(answer))


def test_a_refused_packed_form_beyond_the_budget_falls_back_to_cg(monkeypatch):
    # sum(w)² couples every entry outside the data rows: the packed form's check refuses it;
    # beyond the budget the solve is then exact-CG (never a d × d matrix), to the dense answer
    d = 120
    X = np.random.default_rng(2).standard_normal((5, d))
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    c = prob.add_client("c0")
    c.minimize(fm.sum_squares(c.data(X) @ w - c.data(np.arange(5.0))) + fm.square(fm.sum(w)))

    def solve():
        client = compile_programs(prob)["c0"]
        client.configure(1.0, 0.1, np.zeros(d))
        return client.solve_local(linear=np.full(d, 0.01), weight=0.3, anchor=np.ones(d),
                                  x0=np.zeros(d), tol=1e-10, method="exact")["x"]
    dense = solve()                                       # within the budget: dense Newton
    monkeypatch.setattr(solvers, "DENSE_NEWTON_FLOATS", 1000)
    monkeypatch.setattr(compiled_merit.CompiledMerit, "hessian",
                        lambda *a: (_ for _ in ()).throw(AssertionError("dense Hessian")))
    fallback = solve()
    assert np.max(np.abs(fallback - dense)) <= 1e-8 * np.max(np.abs(dense))


@pytest.mark.parametrize("equality", [False, True])
def test_new_settings_keep_the_packed_core_only_where_it_holds(equality):
    # a new proximal weight changes λ only: C is kept (one product, not r); a new β on an
    # equality through the data changes C: the kept matrix is dropped (fresh on first use)
    prob, w, _ = _ridge(300, 10, 2, seed=6)
    X = sp.random(2, 300, density=0.05, random_state=9, format="csr")
    if equality:
        prob.clients[0].subject_to(prob.clients[0].data(X) @ w == 0.1)
    client = compile_programs(prob)["c0"]
    client.configure(10.0, 0.3, np.zeros(300))
    client.solve_local(linear=None, weight=0.5, anchor=None, x0=np.zeros(300), tol=1e-10, method="exact")
    kept = client._hessian_cache.copy()
    assert kept.ndim == 1
    client.configure(10.0 if not equality else 40.0, 2.0, np.zeros(300))
    now = client._hessian_cache
    if equality:
        assert now is None
        return
    assert np.array_equal(low_rank.unpack(now)[1], low_rank.unpack(kept)[1])
    dense = client.hessian(np.zeros(300))
    assert np.max(np.abs(low_rank.dense(now, low_rank.basis_of(client)) - dense)) <= 1e-12 * np.max(np.abs(dense))
    assert np.max(np.abs(low_rank.unpack(now)[0] - low_rank.unpack(kept)[0])) > 1.0   # λ is new
