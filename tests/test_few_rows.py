"""Clients with few data rows and many features (issue 25 item 3, newuser2's item 4): Newton
systems by Sherman–Morrison–Woodbury through the r × r system of the data rows
(`runtime/low_rank.py`), never the N × N Hessian. Checked against dense solves, against the
dense Hessian of the same program, and end to end against closed forms and CVXPY.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm
from fedmodel.runtime import low_rank, solvers
from fedmodel.runtime.program import compile_programs


def _system(m, d, kind, seed):
    """(λ, X, s): diag(λ) + Xᵀ diag(s) X with λ > 0; s has zeros (saturated rows)."""
    rng = np.random.default_rng(seed)
    X = sp.random(m, d, density=0.05, random_state=seed, format="csr") if kind == "csr" \
        else rng.standard_normal((m, d))
    s = rng.uniform(0.0, 3.0, m)
    s[::3] = 0.0
    return rng.uniform(0.1, 2.0, d), X, s


@pytest.mark.parametrize("m, d, kind", [(20, 300, "dense"), (30, 400, "csr"), (58, 60, "dense"),
                                        (1, 50, "dense"), (40, 120, "csr")])
def test_woodbury_solve_matches_a_dense_solve(m, d, kind):
    lam, X, s = _system(m, d, kind, seed=m + d)
    Xd = X.toarray() if kind == "csr" else X
    low = Xd.T @ (s[:, None] * Xd)
    basis = low_rank.row_basis([X], d)
    Q = basis.dense()
    assert Q.shape[1] <= m and np.allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-12)
    packed = low_rank.pack(lam, Q.T @ low @ Q)
    assert np.allclose(low_rank.dense(packed, basis), np.diag(lam) + low, rtol=0,
                       atol=1e-12 * np.abs(low).max())
    rng = np.random.default_rng(1)
    for weight in (np.zeros(d), np.full(d, 0.7), rng.uniform(0, 5, d)):
        inverse = low_rank.inverse(packed, basis, weight)
        g = rng.standard_normal(d)
        exact = np.linalg.solve(np.diag(lam + weight) + low, g)
        assert np.max(np.abs(inverse.matrix @ g - exact)) <= 1e-10 * np.max(np.abs(exact))


def test_woodbury_refuses_a_nonpositive_diagonal():
    lam, X, s = _system(5, 40, "dense", seed=3)
    lam[7] = 0.0
    basis = low_rank.row_basis([X], 40)
    Q = basis.dense()
    packed = low_rank.pack(lam, Q.T @ (X.T @ (s[:, None] * X)) @ Q)
    assert low_rank.inverse(packed, basis, np.zeros(40)) is None   # the caller inverts dense(packed)
    assert low_rank.inverse(packed, basis, np.full(40, 1e-3)) is not None


def _sparse_problem(d, rows, clients, seed, server="ridge", logistic=False, density=0.02):
    rng = np.random.default_rng(seed)
    truth = np.zeros(d)
    truth[rng.choice(d, 10, replace=False)] = rng.normal(size=10)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    Xs, ys = [], []
    for i in range(clients):
        X = sp.random(rows, d, density=density, random_state=seed + i, format="csr")
        y = X @ truth + 0.01 * rng.normal(size=rows)
        c = prob.add_client(f"c{i}")
        if logistic:
            A = X.multiply(-np.sign(y + 1e-12)[:, None]).tocsr()
            c.minimize(fm.mean(fm.logistic(c.data(A) @ w)))
        else:
            c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)) / (rows * clients))
        Xs.append(X), ys.append(y)
    regularizer = fm.sum_squares(w) if server == "ridge" else fm.norm1(w)
    prob.server.minimize(1e-3 * regularizer)
    return prob, w, sp.vstack(Xs).toarray(), np.concatenate(ys)


@pytest.mark.parametrize("logistic", [False, True])
def test_packed_hessian_is_the_dense_one(logistic):
    prob, w, X, y = _sparse_problem(300, 15, 2, seed=5, logistic=logistic)
    programs = compile_programs(prob)
    client = programs["c0"]
    client.configure(10.0, 0.3, np.zeros(300))
    z = np.random.default_rng(0).standard_normal(300)
    packed = low_rank.hessian(client, z)
    assert packed is not None and packed.ndim == 1
    lam, C = low_rank.unpack(packed)
    assert low_rank.basis_of(client).shape == (300, 15) and C.shape == (15, 15)
    dense = client.hessian(z)
    assert np.max(np.abs(low_rank.dense(packed, low_rank.basis_of(client)) - dense)) <= \
        1e-12 * np.max(np.abs(dense))
    assert not low_rank.applies(programs["server"])      # 300 unknowns: its dense path as before


def test_a_hessian_of_another_form_keeps_the_dense_path():
    # sum(w)² couples every entry outside the data rows: not diagonal + rows, the check refuses
    d = 120
    X = np.random.default_rng(2).standard_normal((5, d))
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    c = prob.add_client("c0")
    c.minimize(fm.sum_squares(c.data(X) @ w) + fm.square(fm.sum(w)))
    client = compile_programs(prob)["c0"]
    client.configure(1.0, 0.1, np.zeros(d))
    assert low_rank.applies(client)            # the structure is found ...
    assert low_rank.hessian(client, np.ones(d)) is None
    assert not low_rank.applies(client)        # ... and refused by its check, for good


def _ridge_answer(X, y, d):
    m = len(y)
    return np.linalg.solve(X.T @ X / m + 1e-3 * np.eye(d), X.T @ y / m)


@pytest.mark.parametrize("backend", ["proxal", "dald"])
def test_sparse_ridge_few_rows(backend):
    # 3 clients × 15 CSR rows, d = 300: the clients' Newton systems go through 15 × 15 ones
    prob, w, X, y = _sparse_problem(300, 15, 3, seed=11)
    programs = compile_programs(prob)
    assert all(low_rank.applies(programs[f"c{i}"]) for i in range(3))
    res = prob.solve(backend)
    answer = _ridge_answer(X, y, 300)
    assert res.status == "converged"
    assert np.max(np.abs(res.value(w) - answer)) <= 1e-4 * np.max(np.abs(answer))
    assert fm.verify(res).ok            # (its KKT certificate; the closed form is the reference)


def _lasso_checked(backend, **options):
    prob, w, X, y = _sparse_problem(300, 15, 3, seed=11, server="l1")
    res = prob.solve(backend, **options)
    reference = prob.solve("cvxpy")
    assert res.status == "converged"
    assert fm.verify(res, reference).ok
    ref = reference.value(w)
    assert np.max(np.abs(res.value(w) - ref)) <= 1e-3 * np.max(np.abs(ref))


def test_sparse_lasso_few_rows():
    _lasso_checked("proxal")


@pytest.mark.integration
def test_sparse_lasso_few_rows_dald():
    # DALD's rate on the server's ℓ1 term (not its local solves) needs ~3,300 iterations here
    # (main too: max_iterations at its default 1,000): checked with room for them
    _lasso_checked("dald", max_iterations=6000)


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["proxal", "dald"])
def test_sparse_ridge_d2000_against_the_closed_form(backend):
    # the model: d = 2,000, 4 clients × 50 CSR rows (density 0.01), 1e-3‖w‖² on the
    # server: 76 s / 46 s on main (the dense N × N path), seconds now
    rng = np.random.default_rng(7)
    d = 2000
    truth = np.zeros(d)
    truth[rng.choice(d, 20, replace=False)] = rng.normal(size=20)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    Xs, ys = [], []
    for i in range(4):
        X = sp.random(50, d, density=0.01, random_state=10 + i, format="csr")
        y = X @ truth + 0.01 * rng.normal(size=50)
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)) / 200)
        Xs.append(X), ys.append(y)
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    X, y = sp.vstack(Xs).toarray(), np.concatenate(ys)
    answer = np.linalg.solve(X.T @ X / 200 + 1e-3 * np.eye(d), X.T @ y / 200)
    res = prob.solve(backend)
    assert res.status == "converged"
    assert np.max(np.abs(res.value(w) - answer)) <= 1e-4 * np.max(np.abs(answer))
    assert fm.verify(res, prob.solve("cvxpy")).ok
    assert solvers.DENSE_NEWTON_FLOATS >= d * d      # (the dense path was allowed: a choice, not a limit)


def test_a_packed_hessian_travels_in_the_node_state():
    # the chord Hessian is part of the node's state (a resumed Newton solve starts from the same
    # stale matrix): the packed one is a flat array there, and a node given the state continues
    # bitwise as the one that saved it
    prob = _sparse_problem(300, 15, 2, seed=5, logistic=True)[0]

    def client():
        program = compile_programs(prob)["c0"]
        program.configure(10.0, 0.3, np.zeros(300))
        return program
    first, second = client(), client()
    kw = dict(linear=np.full(300, 0.01), weight=0.5, anchor=np.zeros(300), tol=1e-3, method="newton")
    first.solve_local(x0=np.zeros(300), **kw)
    state = first.save_state()["state"]
    assert state["hessian"].ndim == 1                 # packed: [N, r, λ, C]
    second.load_state(state)
    x0 = np.full(300, 0.05)
    a = first.solve_local(x0=x0, **dict(kw, tol=1e-9))
    b = second.solve_local(x0=x0, **dict(kw, tol=1e-9))
    assert a["steps"] == b["steps"] and np.array_equal(a["x"], b["x"])
    assert a["grad_norm"] <= 1e-9
