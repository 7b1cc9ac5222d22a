"""New-user round 12 (the default path, `prob.solve()` → auto → Newton steps, on data as people
have it): what it found right, pinned while the Newton path is being reworked (docs/BENCHMARKS.md,
"fedmodel as a new user, round 12"). Each answer is checked against an independent one (the
closed form or the KKT system), not only through fm.verify. These pass on main ad3f97a: they pin
behaviour found right (the defects found are in backends/*, reproducers /work/briefs/repro/nu12_*)."""
import numpy as np
import pytest

import fedmodel as fm


def _dummy_trap(seed=0, rows=(30, 50, 80)):
    """Intercept + ALL levels of a 3-level categorical (exactly collinear) + 2 numeric columns."""
    rng = np.random.default_rng(seed)
    n = sum(rows)
    level = rng.integers(0, 3, n)
    X = np.column_stack([np.ones(n), np.eye(3)[level], rng.normal(size=(n, 2)) * [3.0, 0.5] + 10.0])
    y = X @ np.array([1.0, 0.5, -0.2, 0.3, 2.0, -1.0]) + 0.1 * rng.normal(size=n)
    return X, y, np.split(np.arange(n), np.cumsum(rows)[:-1])


def _least_squares(X, y, parts):
    w = fm.Variable(X.shape[1], name="w")
    prob = fm.Problem()
    for r in parts:
        c = prob.add_client()
        c.minimize(fm.sum_squares(c.data(X[r]) @ w - c.data(y[r])) / len(y))
    return prob, w


@pytest.mark.integration       # (fm.verify's fresh CVXPY solve and its face analysis: ~3 s)
def test_dummy_trap_without_a_ridge_is_a_face_not_a_failure():
    X, y, parts = _dummy_trap()
    prob, w = _least_squares(X, y, parts)
    res = prob.solve()
    f = lambda z: np.mean((X @ z - y) ** 2)
    best = f(np.linalg.lstsq(X, y, rcond=None)[0])
    assert res.status == "converged"
    assert abs(f(res.value(w)) - best) <= 1e-8 * best
    report = fm.verify(res)
    assert report.ok, str(report)
    assert "not a point" in str(report)        # the 1-dimensional face, said so


def test_dummy_trap_with_a_ridge_on_all_but_the_intercept_is_the_closed_form():
    X, y, parts = _dummy_trap(1)
    prob, w = _least_squares(X, y, parts)
    lam, mask = 1e-3, np.r_[0.0, np.ones(X.shape[1] - 1)]
    prob.server.minimize(lam * fm.sum_squares(fm.multiply(mask, w)))
    res = prob.solve()
    n = len(y)
    exact = np.linalg.lstsq(np.vstack([X / np.sqrt(n), np.sqrt(lam) * np.diag(mask)]),
                            np.r_[y / np.sqrt(n), np.zeros(X.shape[1])], rcond=None)[0]
    assert res.status == "converged"
    assert np.linalg.norm(res.value(w) - exact) <= 1e-4 * np.linalg.norm(exact)


def test_sum_to_zero_coding_is_the_kkt_answer():
    X, y, parts = _dummy_trap(2)
    prob, w = _least_squares(X, y, parts)
    prob.server.subject_to(fm.sum(w[1:4]) == 0)
    res = prob.solve()
    n, d = X.shape
    a = np.zeros(d)
    a[1:4] = 1
    K = np.block([[2 * X.T @ X / n, a[:, None]], [a[None, :], np.zeros((1, 1))]])
    exact = np.linalg.solve(K, np.r_[2 * X.T @ y / n, 0.0])[:d]
    assert res.status == "converged"
    assert np.linalg.norm(res.value(w) - exact) <= 1e-4 * np.linalg.norm(exact)


def test_simplex_and_a_client_bound_are_named_infeasible_before_the_run():
    X, y, parts = _dummy_trap(3)
    prob, w = _least_squares(X, y, parts)
    prob.server.subject_to(fm.sum(w) == 1, w >= 0)
    prob.clients[1].subject_to(w <= 0.1)           # six weights of at most 0.1 cannot sum to 1
    res = prob.solve()
    assert res.status == "infeasible"
    said = res.info["infeasible"]
    assert "sum(w) == 1" in said and "w <= 0.1" in said and "c1" in said


def test_a_parameter_radius_is_read_again_under_newton_steps():
    X, y, parts = _dummy_trap(4)
    X = X[:, [0, 4, 5]]                                   # intercept + the numeric columns
    prob, w = _least_squares(X, y, parts)
    r = fm.Parameter(nonneg=True, value=1.0, name="r")
    for c in prob.clients:
        c.subject_to(fm.norm2(w) <= r)
    for radius in (1.0, 0.3):
        r.value = radius
        res = prob.solve()
        assert res.info["auto"]["inner"] == res.info["inner"]["name"] == "newton"     # the Newton pick
        # the answer on the sphere ‖w‖ = r: w(μ) = (XᵀX/n + μ I)⁻¹ Xᵀy/n with ‖w(μ)‖ = r
        n = len(y)
        G, g = X.T @ X / n, X.T @ y / n
        lo, hi = 0.0, 1e6
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if np.linalg.norm(np.linalg.solve(G + mid * np.eye(3), g)) > radius else (lo, mid)
        exact = np.linalg.solve(G + hi * np.eye(3), g)
        assert res.status == "converged"
        assert np.linalg.norm(res.value(w) - exact) <= 1e-4 * radius
