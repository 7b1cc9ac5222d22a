"""FedADMM's and DP-ADMM's one-request-per-round forms (issue 16) on a model written as a user
writes it: one objective per client with every term in it, the same private name `b` in every
client, backends by name with their default options, `executor="batched"`. The batched run
reaches CVXPY's answer, equals the serial run, and a run that blows up says "diverged"."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime.batched import BatchedExecutor


def _model(private: bool = True, n: int = 8, d: int = 4):
    rng = np.random.default_rng(7)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name="users-logistic")
    for i in range(n):
        m = int(rng.integers(15, 40))
        c = prob.add_client(f"site{i}")
        X, y = c.data(rng.normal(size=(m, d)), name="X"), c.data(np.sign(rng.normal(size=m)), name="y")
        score = X @ w + c.variable(name="b") if private else X @ w
        extra = 0.1 * fm.sum_squares(c.private_variables[0]) if private else 0.0
        c.minimize(fm.sum(fm.logistic(-fm.multiply(y, score))) / m + 0.05 * fm.sum_squares(w) + extra)
    return prob, w


def test_fedadmm_defaults_on_batched_reach_cvxpy_and_equal_serial():
    prob, w = _model()
    exact = prob.solve("cvxpy")
    ex = BatchedExecutor()
    batched = prob.solve("fedadmm", executor=ex)
    serial = prob.solve("fedadmm")
    assert ex.stats[("fedadmm_round", "batched")] > 0 and ex.stats[("fedadmm_round", "serial")] == 0
    assert batched.status == serial.status == "converged"
    np.testing.assert_allclose(batched.value(w), serial.value(w), rtol=0, atol=1e-10)
    np.testing.assert_allclose(batched.value(w), exact.value(w), rtol=0, atol=1e-3)


def test_fedadmm_that_blows_up_on_batched_says_diverged():
    prob, _ = _model()
    with pytest.warns(RuntimeWarning, match="diverged"):
        result = prob.solve("fedadmm", executor="batched", lr=1e6, safeguard=False, adaptive=False,
                            max_rounds=5)
    assert result.status == "diverged"


# the first 200 rounds in the fast suite (ε̄ per round: the cap changes no noise scale), 2,000 in
# CI's integration run (~25 CPU s), the default max_rounds = 20,000 (~90 CPU s) in the slow run
@pytest.mark.parametrize("rounds", [pytest.param({"max_rounds": 200}, id="200-rounds"),
                                    pytest.param({"max_rounds": 2000}, id="2000-rounds",
                                                 marks=pytest.mark.integration),
                                    pytest.param({}, id="default-rounds", marks=pytest.mark.slow)])
def test_dp_admm_defaults_on_batched_equal_the_seeded_serial_run(rounds):
    prob, w = _model(private=False)
    ex = BatchedExecutor()
    batched = prob.solve("dp-admm", executor=ex, epsilon=1.0, seed=3, **rounds)
    serial = prob.solve("dp-admm", epsilon=1.0, seed=3, **rounds)
    assert ex.stats[("dp_admm_step", "batched")] > 0 and ex.stats[("dp_admm_step", "serial")] == 0
    assert batched.status == serial.status
    np.testing.assert_allclose(batched.value(w), serial.value(w), rtol=0, atol=1e-10)


@pytest.mark.integration     # JAX equivalence: CI runs it after the fast suite
def test_fedadmm_defaults_on_jax_equal_serial():
    from fedmodel.runtime.jax_executor import JaxExecutor
    prob, w = _model()
    ex = JaxExecutor()
    jax_run = prob.solve("fedadmm", executor=ex)
    serial = prob.solve("fedadmm")
    assert ex.stats[("fedadmm_round", "serial")] == 0
    assert jax_run.status == serial.status == "converged"
    np.testing.assert_allclose(jax_run.value(w), serial.value(w), rtol=0, atol=1e-10)


def test_fedadmm_with_half_the_clients_per_round_on_batched_equals_serial():
    prob, w = _model()           # private `b` in every client: the rows not taking part keep theirs
    ex = BatchedExecutor()
    batched = prob.solve("fedadmm", executor=ex, participation=0.5, seed=4, max_rounds=60)
    serial = prob.solve("fedadmm", participation=0.5, seed=4, max_rounds=60)
    assert ex.stats[("fedadmm_round", "batched")] > 0
    assert batched.status == serial.status
    np.testing.assert_allclose(batched.value(w), serial.value(w), rtol=0, atol=1e-10)


def test_dp_admm_defaults_without_noise_on_batched_reach_cvxpy():
    prob, w = _model(private=False)
    exact = prob.solve("cvxpy")
    ex = BatchedExecutor()
    result = prob.solve("dp-admm", executor=ex)          # ε = ∞: no noise, the automatic ρ floor
    assert ex.stats[("dp_admm_step", "batched")] > 0
    assert result.status == "converged"
    np.testing.assert_allclose(result.value(w), exact.value(w), rtol=0, atol=1e-3)
