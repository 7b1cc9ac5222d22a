"""FedProx and FedAvg as Fed-DALD-CC special cases (spec §2.9): iterate-by-iterate against a
direct numpy implementation of the textbook updates, and convergence to the CVXPY optimum."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel import topologies
from fedmodel.backends.special_cases import FedAvg, FedProx

D, M = 4, 15


def _parts(n=3, seed=0, common_design=False):
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=D)
    A0 = rng.normal(size=(M, D))
    parts = []
    for i in range(n):
        A = A0 if common_design else rng.normal(size=(M, D)) + 0.5 * i
        parts.append((A, A @ truth + rng.normal(size=M)))
    return parts


def _problem(parts):
    """f_i(w) = (1/M)‖A_i w − b_i‖², gradient (2/M) A_iᵀ(A_i w − b_i)."""
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i, (A, b) in enumerate(parts):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(A, name="A") @ w - c.data(b, name="b")) / M)
    return prob, w


def _grad(A, b, x):
    return 2 * A.T @ (A @ x - b) / M


def _textbook(parts, rounds, step, local_steps, mu):
    """FedProx (FedAvg: mu = 0): each client runs `local_steps` GD steps on
    f_i(x) + (mu/2)‖x − x̂‖² from x̂; the server averages (uniform weights)."""
    xhat, iterates = np.zeros(D), []
    for _ in range(rounds):
        local = []
        for A, b in parts:
            x = xhat.copy()
            for _ in range(local_steps):
                x = x - step * (_grad(A, b, x) + mu * (x - xhat))
            local.append(x)
        xhat = sum(local) / len(local)
        iterates.append(xhat)
    return iterates


@pytest.mark.parametrize("backend, mu", [("fedprox", 0.5), ("fedavg", 0.0)])
def test_iterates_match_textbook_updates(backend, mu):
    parts = _parts()
    prob, w = _problem(parts)
    step, local_steps = 0.05, 3
    expected = _textbook(parts, 5, step, local_steps, mu)
    for k in range(1, 6):
        algo = FedProx(mu=mu, step=step, local_steps=local_steps, max_rounds=k, tol=0) \
            if backend == "fedprox" else FedAvg(step=step, local_steps=local_steps, max_rounds=k, tol=0)
        res = prob.solve(algo, topology=topologies.star(prob), scaling=False)   # textbook units
        assert res.iterations == {"rounds": k}
        assert np.allclose(res.value(w), expected[k - 1], rtol=0, atol=1e-13), (backend, k)


def test_fedprox_exact_local_solve_matches_closed_form():
    """(52) solved exactly: x_i = (2A_iᵀA_i/M + μI)⁻¹(2A_iᵀb_i/M + μ x̂); (53) x̂ = mean x_i."""
    parts = _parts()
    prob, w = _problem(parts)
    mu, xhat = 2.0, np.zeros(D)
    for k in range(1, 5):
        xhat = sum(np.linalg.solve(2 * A.T @ A / M + mu * np.eye(D), 2 * A.T @ b / M + mu * xhat)
                   for A, b in parts) / len(parts)
        res = prob.solve(FedProx(mu=mu, local_steps=None, max_rounds=k, tol=0), scaling=False)
        assert np.allclose(res.value(w), xhat, rtol=0, atol=1e-12)


def test_fedprox_reaches_cvxpy_optimum_on_strongly_convex_model():
    """Common Hessian across clients (same design, different targets): FedProx's fixed point is
    the minimizer of Σ f_i, reached to 1e-5 relative."""
    prob, w = _problem(_parts(common_design=True))
    ref = prob.solve("cvxpy")
    res = prob.solve("fedprox", mu=1.0, local_steps=None, max_rounds=500, tol=1e-11)
    assert res.status == "converged"
    x_star = ref.value(w)
    assert np.max(np.abs(res.value(w) - x_star)) / max(1.0, np.max(np.abs(x_star))) <= 1e-5
    assert abs(res.objective - ref.objective) <= 1e-8 * abs(ref.objective)


def test_one_local_step_is_gradient_descent_and_reaches_optimum():
    """Heterogeneous clients, one local step: FedProx = FedAvg = GD on (1/n)Σ f_i."""
    prob, w = _problem(_parts(seed=1))
    x_star = prob.solve("cvxpy").value(w)
    for algo in (FedProx(mu=1.0, step=0.1, local_steps=1, max_rounds=5000, tol=1e-12),
                 FedAvg(step=0.1, local_steps=1, max_rounds=5000, tol=1e-12)):
        res = prob.solve(algo)
        assert res.status == "converged"
        assert np.max(np.abs(res.value(w) - x_star)) / max(1.0, np.max(np.abs(x_star))) <= 1e-5


def test_client_drift_with_many_local_steps_is_reported_not_hidden():
    """Heterogeneous clients, 10 local steps: FedAvg converges to a point that is NOT the
    optimum of Σ f_i (client drift); its KKT certificate shows it, and the run says it: "stalled",
    not "converged"."""
    prob, w = _problem(_parts(seed=1))
    x_star = prob.solve("cvxpy").value(w)
    with pytest.warns(RuntimeWarning, match="not a solution of the model"):
        res = prob.solve(FedAvg(step=0.05, local_steps=10, max_rounds=3000, tol=1e-12))
    assert res.status == "stalled" and "client drift" in res.info["not_stationary"]
    assert np.max(np.abs(res.value(w) - x_star)) > 1e-4
    assert res.certificate.stationarity > 1e-4


def test_bad_options_and_unprojectable_server_sets_are_refused():
    """Server terms and projectable sets enter the server step (tests/test_server_terms_fedprox.py,
    tests/test_fedavg_server_sets.py); other server constraints are refused."""
    prob, w = _problem(_parts())
    prob.server.subject_to(fm.sum_squares(w) + fm.sum(w) <= 1.0)
    with pytest.raises(fm.FedModelError, match="server"):
        prob.solve(FedProx())
    with pytest.raises(fm.FedModelError):
        FedProx(mu=-1.0)
    with pytest.raises(fm.FedModelError):
        FedAvg(local_steps=0)
