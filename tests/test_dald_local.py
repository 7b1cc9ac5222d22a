"""DALD-CC's local solves on nodes too large for Newton (`local.lbfgs_kept`: L-BFGS whose
curvature pairs outlive the solve, stopped at a tolerance that follows the outer residual):
the pairs' weight correction against a closed form, a logistic model with an active client
ball (d = 210) against CVXPY on the serial and batched executors, and MNIST 3v7 (d = 784)
against CVXPY (integration)."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends.dald import DALD, local
from fedmodel.runtime import solvers
from conftest import load_data


def _quadratic(d=30, seed=0):
    """fun_grad of ½zᵀAz − bᵀz + ½w‖z − a‖² and its minimizer (A + wI)⁻¹(b + wa)."""
    rng = np.random.default_rng(seed)
    Q = rng.normal(size=(d, d))
    A, b = Q @ Q.T / d + 0.01 * np.eye(d), rng.normal(size=d)

    def problem(w, a):
        def fun_grad(z):
            diff = z - a
            return 0.5 * z @ A @ z - b @ z + 0.5 * w * diff @ diff, A @ z - b + w * diff
        return fun_grad, np.linalg.solve(A + w * np.eye(d), b + w * a)
    return problem


def test_kept_pairs_stay_exact_when_the_weight_changes():
    """The pairs store ∇P's changes without the weight's share: a second problem with another
    weight (adaptive ρ) and anchor is solved from them in fewer steps than from none, to the
    closed-form answer."""
    d = 30
    problem = _quadratic(d)
    fun_grad, answer = problem(0.5, np.zeros(d))
    state = {}
    z, _ = local.lbfgs_kept(fun_grad, np.zeros(d), np.full(d, 0.5), state, 1e-9)
    np.testing.assert_allclose(z, answer, atol=1e-7)
    assert 0 < len(state["pairs"][0]) <= local.MEMORY
    anchor = np.linspace(-1.0, 1.0, d)
    fun_grad, answer = problem(0.05, anchor)
    warm, warm_steps = local.lbfgs_kept(fun_grad, z, np.full(d, 0.05), state, 1e-9)
    cold, cold_steps = local.lbfgs_kept(fun_grad, z, np.full(d, 0.05), {}, 1e-9)
    np.testing.assert_allclose(warm, answer, atol=1e-7)
    np.testing.assert_allclose(cold, answer, atol=1e-7)
    assert warm_steps < cold_steps


def _logistic_ball(d=210, n=3, rows=25, radius=1.5, seed=0):
    """Mean logistic loss over n non-IID clients, a client ball ‖w‖₂ ≤ radius (active at the
    answer), a server ridge 0.01‖w‖²; d > 200 unknowns a node, so the clients' "auto" local
    solver is L-BFGS."""
    rng = np.random.default_rng(seed)
    truth = 3.0 * rng.normal(size=d) / np.sqrt(d)
    w = fm.Variable(d, name="w")
    prob = fm.Problem("kept-lbfgs")
    for i in range(n):
        A = rng.normal(size=(rows, d)) + 0.2 * i
        b = np.where(A @ truth + 0.5 * rng.normal(size=rows) > 0, 1.0, -1.0)
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(-b * (c.data(A, name="A") @ w))) / n)
        c.subject_to(fm.norm2(w) <= radius)
    prob.server.minimize(1e-2 * fm.sum_squares(w))
    return prob, w


@pytest.fixture(scope="module")
def ball_reference():
    prob, w = _logistic_ball()
    return prob.solve("cvxpy").value(w)


# the serial executor (~2 s at load: its first plans are compiled here) with the integration tests
@pytest.mark.parametrize("executor", [pytest.param("serial", marks=pytest.mark.integration), "batched"])
def test_logistic_ball_with_kept_lbfgs_reaches_cvxpy(executor, ball_reference, monkeypatch):
    scipy = []
    original = solvers.lbfgs
    monkeypatch.setattr(solvers, "lbfgs", lambda *args, **kwargs: scipy.append(1) or original(*args, **kwargs))
    prob, w = _logistic_ball()
    res = prob.solve(DALD(), executor=executor)
    assert res.status == "converged"
    assert not scipy            # kept L-BFGS from the first outer step (its residual: ε), no scipy L-BFGS-B
    assert np.linalg.norm(ball_reference) == pytest.approx(1.5, rel=1e-6)       # the ball acts
    distance = np.linalg.norm(res.value(w) - ball_reference) / np.linalg.norm(ball_reference)
    assert distance <= 1e-4
    assert res.max_violation <= 1e-6


@pytest.mark.integration
def test_mnist_ball_d784_reaches_cvxpy_with_kept_lbfgs():
    """bench_rounds' mnist-ball model (2,000 MNIST 3v7 rows over 5 clients, d = 784)."""
    from fedmodel.datasets import load_mnist37
    data = load_data(load_mnist37)
    X, y = data.X[:2000], np.where(data.y[:2000] > 0, 1.0, -1.0)
    w = fm.Variable(X.shape[1], name="w")
    prob = fm.Problem("mnist-ball")
    for i, part in enumerate(np.array_split(np.arange(len(y)), 5)):
        c = prob.add_client(f"c{i}")
        c.minimize(len(part) / len(y) * fm.mean(fm.logistic(-y[part] * (c.data(X[part], name="X") @ w))))
        c.subject_to(fm.norm2(w) <= 5.0)
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    res = prob.solve(DALD())
    ref = prob.solve("cvxpy")
    assert res.status == "converged"
    assert res.iterations["outer"] <= 250     # 211 with the balls' variable equilibrated (setscale)
    report = fm.verify(res, ref)
    assert report.ok, report.failed
