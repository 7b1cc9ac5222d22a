"""Issue 25, item 5: FedAvg / FedProx / DGD take a server term h (a regularizer) in their
server step, x̂ = argmin h(x) + (n/2α)‖x − mean_i x_i‖² (backends/special_cases.py,
`_DistributedPA._server_step`): with one local gradient step that is proximal gradient descent on
Σ f_i + h, so the answer is the model's. They refused such a term before. Independent answer:
CVXPY."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm


def _model(regularizer):
    rng = np.random.default_rng(0)
    w = fm.Variable(5, name="w")
    prob = fm.Problem()
    for i in range(10):
        client = prob.add_client(f"c{i}")
        A = rng.standard_normal((20, 5)) + 0.3 * i
        b = A @ np.ones(5) + rng.standard_normal(20)
        client.minimize(fm.sum_squares(client.data(A, name="A") @ w - client.data(b, name="b")) / 200)
    prob.server.minimize(regularizer(w))
    return prob, w


# FedProx (FedAvg with a proximal weight: the same code) and the batched executor in CI's integration run
@pytest.mark.parametrize("backend", ["fedavg", pytest.param("fedprox", marks=pytest.mark.integration)])
@pytest.mark.parametrize("executor", ["serial", pytest.param("batched", marks=pytest.mark.integration)])
@pytest.mark.parametrize("regularizer", [lambda w: 1e-3 * fm.sum_squares(w),
                                         lambda w: 0.5 * fm.sum_squares(w),
                                         lambda w: 0.05 * fm.norm1(w)],
                         ids=["ridge-1e-3", "ridge-0.5", "l1"])
def test_server_regularizer_is_solved_exactly(backend, executor, regularizer):
    """The defaults (one local step of 1/max L̂_i) reach CVXPY's answer to 1e-5 relative; the
    ridge 0.5 moves that answer by 0.064 (h dropped) or 0.056 (h divided by n = 10), 6000 times
    the tolerance."""
    prob, w = _model(regularizer)
    reference = prob.solve("cvxpy").value(w)
    result = prob.solve(backend, executor=executor)
    assert result.status == "converged"
    assert np.max(np.abs(result.value(w) - reference)) <= 1e-5 * np.max(np.abs(reference))


def test_a_server_ball_with_a_server_term_is_solved_and_other_sets_are_refused():
    """A ball is projected on in the server's step beside the ridge (tests/test_fedavg_server_sets.py
    has halfspaces); a set with no closed-form projection (an ellipsoid) is refused with the
    alternative."""
    prob, w = _model(lambda w: 1e-3 * fm.sum_squares(w))
    prob.server.subject_to(fm.norm2(w) <= 1.0)
    reference = prob.solve("cvxpy").value(w)
    result = prob.solve("fedavg")
    assert result.status == "converged"
    assert np.max(np.abs(result.value(w) - reference)) <= 1e-5 * np.max(np.abs(reference))
    prob.server.subject_to(fm.sum_squares(np.diag(np.arange(1.0, 6.0)) @ w) <= 4.0)
    with pytest.raises(fm.FedModelError, match="server block's constraints.*backends.DALD"):
        prob.solve("fedavg")
