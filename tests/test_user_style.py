"""The refactoring's features as a user writes them: one objective per client with all its terms
(`c.minimize(loss + lam * fm.norm1(w))`), the same private-variable name in every client,
backends and executors by name with their default options. The tests next to each feature drive
models built the way the code was written (internals by hand, terms split for the backend); these
check that the user's spelling reaches the same behaviour. Independent answers: the serial run
of the same model, the accountant's own ε(T), the registry's documented case-insensitivity."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends.dp_admm.accounting import accountant_bounds


def user_logistic(n: int = 4, m: int = 12, d: int = 5, lam: float = 0.05, seed: int = 0,
                  regularizer=fm.norm1, private: bool = False):
    """Logistic regression as a user writes it: loss and regularizer in one client objective;
    with `private`, every client has its own slack named "s" coupled to w (a local constraint)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name="user-logistic")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        X, y = c.data(rng.normal(size=(m, d)), name="X"), c.data(np.sign(rng.normal(size=m)), name="y")
        loss = fm.sum(fm.logistic(-fm.multiply(y, X @ w))) / m
        if private:
            s = c.variable(name="s")
            c.minimize(loss + lam * regularizer(w) + fm.square(s - 1.0))
            c.subject_to(s + w[0] <= 0.5)
        else:
            c.minimize(loss + lam * regularizer(w))
    return prob, w


# ---- DP-ADMM's privacy budget, by name ---------------------------------------------------------
def test_a_private_run_by_name_stops_when_its_budget_is_spent():
    """`prob.solve("dp-admm", epsilon=…, epsilon_total=…)` with the default (clip) sensitivity:
    the run stops before the round that would exceed the budget, says "budget_exhausted", and
    the ε it reports is within the budget (and one more round's would not be)."""
    prob, w = user_logistic(m=30, regularizer=fm.sum_squares, lam=0.01)
    budget = 3.0
    res = prob.solve("dp-admm", epsilon=0.5, epsilon_total=budget, max_rounds=40)
    rounds = res.iterations["rounds"]
    assert res.status == "budget_exhausted" and 0 < rounds < 40
    privacy = res.info["privacy"]
    assert privacy["formal"] and privacy["rounds"] == rounds and privacy["pld"][0] <= budget
    assert accountant_bounds("laplace", 0.5, rounds + 1, 1e-6)["pld"][0] > budget
    assert np.all(np.isfinite(res.value(w)))


def test_a_users_client_l1_term_runs_in_the_private_step():
    """The user's one-objective lasso (λ‖w‖₁ in every client's objective) runs in DP-IADMM's ObjP
    step by the prox of the ℓ1 term: non-private it is CVXPY's answer, as is the rewrite with the
    ℓ1 term on the server; private, it is formal and stops within its budget."""
    prob, w = user_logistic(m=30)
    ref = prob.solve("cvxpy")
    res = prob.solve("dp-admm", max_rounds=5000, tol=1e-7)
    assert res.status == "converged" and res.objective == pytest.approx(ref.objective, rel=1e-6)
    np.testing.assert_allclose(res.value(w), ref.value(w), atol=1e-4)
    private = prob.solve("dp-admm", epsilon=0.5, epsilon_total=3.0, max_rounds=40)
    assert private.status == "budget_exhausted" and private.info["privacy"]["formal"]
    assert private.info["privacy"]["pld"][0] <= 3.0
    moved, v = user_logistic(m=30, lam=0.0, regularizer=fm.sum_squares)
    moved.server.minimize(4 * 0.05 * fm.norm1(v))              # the same model, ℓ1 on the server
    rewrite = moved.solve("dp-admm", max_rounds=5000, tol=1e-7)
    assert rewrite.objective == pytest.approx(ref.objective, rel=1e-6)
    np.testing.assert_allclose(rewrite.value(v), res.value(w), atol=1e-4)


# ---- executors by name, switched between solves ------------------------------------------------
@pytest.mark.integration   # (CI's integration run: the fast suite stays under 3 minutes)
def test_switching_executors_between_solves_gives_the_serial_answers():
    """A user solves once batched, then again with the default (serial) executor: each answer is
    the serial run's (the first within the batched tolerance, the second bit for bit), on a model
    whose clients each have a private variable named "s"."""
    prob, w = user_logistic(private=True)
    batched = prob.solve("dald", executor="batched")
    serial_after = prob.solve("dald")
    reference = prob.solve("dald")
    assert batched.status == serial_after.status == reference.status == "converged"
    np.testing.assert_allclose(batched.value(w), reference.value(w), rtol=0, atol=1e-12)
    assert np.array_equal(serial_after.value(w), reference.value(w))
    for i in range(4):
        s = prob.clients[i].private_variables[0]
        assert np.array_equal(serial_after.value(s), reference.value(s))


# ---- backends by name ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ProxAL", "PROXAL", "proxal"])
def test_backend_names_are_case_insensitive(name):
    prob, w = user_logistic(n=2, m=8, d=3)
    res = prob.solve(name, max_outer=2)
    assert res.backend == "proxal" and np.all(np.isfinite(res.value(w)))


def test_an_unknown_backend_name_is_a_clear_error():
    prob, _ = user_logistic(n=2, m=8, d=3)
    with pytest.raises(fm.FedModelError, match=r"unknown backend 'proxall'; did you mean 'proxal'\? choose one of \[.*'proxal'"):
        prob.solve("proxall")
    with pytest.raises(fm.FedModelError, match="unknown executor 'batch'"):
        prob.solve("proxal", executor="batch")


# ---- checkpoints of a by-name run, resumed on another executor -----------------------------------
@pytest.mark.integration   # (CI's integration run: the fast suite stays under 3 minutes)
def test_a_batched_run_by_name_resumes_serially_as_if_never_stopped(tmp_path):
    """The user's DALD run with its defaults, batched and checkpointed, stopped by a crash
    (an exception in the callback) and resumed by name on the default serial executor: the
    answer is the uninterrupted serial run's, bit for bit."""
    from conftest import StopRun as Stop, stop_after as _stop_after
    from test_checkpoint import _same
    prob, w = user_logistic(private=True)
    reference = prob.solve("dald")
    path = tmp_path / "run.ckpt"
    with pytest.raises(Stop):
        prob.solve("dald", executor="batched", checkpoint=path, checkpoint_every=2, callback=_stop_after(9))
    resumed = prob.solve("dald", checkpoint=path, resume=True)
    assert resumed.status == "converged"
    _same(resumed, reference)       # bitwise: iterates, multipliers, history, ledger
