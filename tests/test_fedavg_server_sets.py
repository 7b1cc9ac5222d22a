"""FedAvg / FedProx enforce the server's sets by projecting the average on them (step (53) as
a proximal step on h + ι_C): projected gradient descent on Σ f_i over C with one local step, so
the fixed point is the constrained minimizer. DP-FedAvg's projection is post-processing."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel import backends


def _least_squares(n: int = 4, d: int = 5, seed: int = 0):
    """Least squares whose unconstrained minimizer (‖·‖ ≈ 4) lies outside the server's sets."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name="server-sets")
    truth = np.array([2.0, -1.0, 1.0, 0.5, 3.0])[:d]
    for i in range(n):
        c = prob.add_client(f"c{i}")
        A = rng.normal(size=(30, d))
        c.minimize(fm.sum_squares(A @ w - (A @ truth + 0.1 * rng.normal(size=30))) / 30)
    return prob, w


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_a_server_ball_and_halfspace_are_projected_on_and_verified(name):
    prob, w = _least_squares()
    prob.server.subject_to((fm.norm2(w) <= 1.5).named("ball"))
    prob.server.subject_to((np.ones(5) @ w <= 1.0).named("halfspace"))
    exact = prob.solve("cvxpy")
    res = prob.solve(name)
    assert res.status == "converged"
    assert np.max(np.abs(res.value(w) - exact.value(w))) < 1e-6
    assert np.linalg.norm(res.value(w)) <= 1.5 + 1e-9
    # the halfspace's multiplier comes from the last projection's normal cone
    assert res.multipliers["halfspace"] == pytest.approx(exact.multipliers["halfspace"], rel=1e-4)
    assert fm.verify(res).ok


def test_client_level_dp_keeps_the_server_ball_exactly():
    """The noisy average is projected on the ball: every released model is in it."""
    prob, w = _least_squares(n=40, d=3)
    prob.server.subject_to(fm.norm2(w) <= 1.0)
    res = prob.solve(backends.FedAvg(step=0.5, epsilon_total=8, clip=1.0, seed=0))
    assert res.info["privacy"]["level"] == "client"
    assert np.linalg.norm(res.value(w)) <= 1.0 + 1e-9
