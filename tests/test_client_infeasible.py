"""Infeasibility that lies in one client's data, decided by that client before the run (issue 25,
item 4; `fedmodel.runtime.own_constraints`, `backends.base.own_constraints_meet`).

The models are the Neyman-Pearson kind of bench_verdicts' infeasible even seeds, made small, with
a closed-form answer: a client whose class-1 rows come in pairs ±a has a mean class-1 logistic
loss ≥ log 2 at every w (convexity: ½(log(1+e^{−t}) + log(1+e^{t})) ≥ log(1+e⁰)), equal at
w = 0, so its constraint `loss ≤ r` with r < log 2 has no point and its least violation is
log 2 − r, relative to the size of its terms log 2 + r. CVXPY is the independent reference for
the whole model's status."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import registry
from fedmodel.backends import DPADMM, ProxAL
from fedmodel.runtime.own_constraints import CLEAR, least_violation, own_feasibility
from fedmodel.runtime.program import compile_programs

D = 4
LOG2 = float(np.log(2.0))


def neyman_pearson(r: float, paired: tuple[int, ...] = (1,), n: int = 3, seed: int = 0,
                   ridge: bool = True):
    """NP logistic over n clients (class-0 loss in the objective, class-1 loss ≤ r per client,
    a server ridge unless not `ridge`); the clients in `paired` have class-1 rows ±a (least
    loss log 2 at w = 0), the others rows shifted to one side (least loss 0, not attained)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(D, name="w")
    prob = fm.Problem(name="np")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        A = rng.standard_normal((5, D)) + 1.0
        X1 = np.vstack([A, -A]) if i in paired else A
        c.minimize(fm.mean(fm.logistic(c.data(rng.standard_normal((12, D)), name="X0") @ w)) / n)
        c.subject_to((fm.mean(fm.logistic(-(c.data(X1, name="X1") @ w))) <= r).named(f"np[c{i}]"))
    if ridge:
        prob.server.minimize(1e-3 * fm.sum_squares(w))
    return prob, w


def _quiet(prob, backend):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = prob.solve(backend)
    return result, [str(c.message) for c in caught if c.category is RuntimeWarning]


def _backends() -> list[str]:
    return [name for name in registry.names("backend") if name != "cvxpy"]


@pytest.mark.parametrize("name", _backends())
def test_a_client_alone_infeasible_is_infeasible_before_the_run_under_every_backend(name):
    # "pa" (the proximal algorithm) takes one client and no server term: the infeasible one alone
    prob, w = neyman_pearson(0.5, n=1, paired=(0,), ridge=False) if name == "pa" else neyman_pearson(0.5)
    client = "c0" if name == "pa" else "c1"
    assert prob.solve("cvxpy").status == "infeasible"
    result, warned = _quiet(prob, name)
    assert result.status == "infeasible"
    assert result.info["clients_infeasible"] == {client: f"np[{client}]"}
    assert not result.history and not result.iterations and not result.values
    # one round trip (the check), none where the run pools every block on its server (cProx-AL)
    assert result.ledger.round_trips == (0 if name == "cproxal" else 1)
    message = next(m for m in warned if "no common point" in m)
    assert f"'np[{client}]' of '{client}'" in message and "no iterations were run" in message


def test_the_reply_is_a_lower_bound_on_the_relative_least_violation():
    """(log 2 − r)/(log 2 + r) is the least violation relative to its terms' size: the reply is
    at most that and at least 90 % of it; the feasible clients reply 0 (a common point found)."""
    for r in (0.1, 0.5, 0.68):
        prob, _ = neyman_pearson(r)
        programs = compile_programs(prob)
        exact = (LOG2 - r) / (LOG2 + r)
        reply = own_feasibility(programs["c1"])
        assert reply["constraint"] == "np[c1]"
        assert 0.9 * exact <= reply["violation"] <= exact * (1 + 1e-9)
        assert own_feasibility(programs["c0"]) == {"violation": 0.0, "constraint": ""}
        assert own_feasibility(programs["server"])["violation"] == 0.0


def test_a_barely_feasible_or_barely_infeasible_client_is_not_called_infeasible():
    """r just above log 2 (w = 0 meets it: least violation 0) and r below it by less than CLEAR
    of the terms' size: no claim either way; a positive infimum not attained (loss ≤ 0 on rows
    shifted to one side: the loss only tends to 0 along a direction) is no claim either (its
    Newton decrement stays about F)."""
    for r in (LOG2 + 1e-3, LOG2 - 0.5 * CLEAR * 2 * LOG2):
        prob, _ = neyman_pearson(r)
        assert least_violation(compile_programs(prob)["c1"]) is None or \
            least_violation(compile_programs(prob)["c1"])[0] <= CLEAR
        assert own_feasibility(compile_programs(prob)["c1"])["violation"] == 0.0
    prob, _ = neyman_pearson(0.0, paired=())
    assert own_feasibility(compile_programs(prob)["c0"])["violation"] == 0.0


def test_a_barely_feasible_model_runs_and_converges():
    """r 0.002 above the worst client's least loss log 2: ProxAL converges (the check passes);
    its point is CVXPY's."""
    prob, w = neyman_pearson(LOG2 + 2e-3)
    reference = prob.solve("cvxpy")
    result, _ = _quiet(prob, ProxAL())
    assert result.status == "converged" and "clients_infeasible" not in result.info
    assert result.ledger.trips["own_feasibility"] == 1
    np.testing.assert_allclose(result.value(w), reference.value(w), atol=2e-3)


def test_no_client_constraint_on_data_no_check_and_a_private_run_never_asks():
    """A model whose clients have no constraint reading their data sends no check; a private
    DP-ADMM run (its accountant does not cover the reply) never asks either."""
    prob, _ = neyman_pearson(0.5)
    for client in prob.clients:
        client.constraints.clear()
    result, _ = _quiet(prob, ProxAL(max_outer=2))
    assert "own_feasibility" not in result.ledger.trips
    prob, _ = neyman_pearson(0.5)
    private, _ = _quiet(prob, DPADMM(epsilon=1.0, max_rounds=3))
    assert "own_feasibility" not in private.ledger.trips and "clients_infeasible" not in private.info
    public, _ = _quiet(prob, DPADMM(max_rounds=3))
    assert public.status == "infeasible" and public.info["clients_infeasible"] == {"c1": "np[c1]"}


def test_a_nonconvex_constraint_is_left_out_of_the_check():
    """A concave constraint's local least violation proves nothing: left out (no claim), while
    a convex infeasible one beside it still decides."""
    prob, w = neyman_pearson(0.9)            # every client alone feasible
    c0 = prob.clients[0]
    c0.subject_to((fm.sum_squares(w) >= c0.data(np.array(4.0), name="rad")).named("outside"))
    assert own_feasibility(compile_programs(prob)["c0"])["violation"] == 0.0
    c0.subject_to((fm.sum(w) >= c0.data(np.array(1.0), name="lo")).named("lo"),
                  (fm.sum(w) <= c0.data(np.array(-1.0), name="hi")).named("hi"))
    reply = own_feasibility(compile_programs(prob)["c0"])
    assert reply["violation"] > CLEAR and reply["constraint"] in ("lo", "hi")


@pytest.mark.integration     # adult (32,561 rows) and 20 CVXPY solves: CI runs it after the fast suite
def test_adult_at_twenty_clients_is_infeasible_in_five_clients_alone():
    """Table 1's adult cell at n = 20 (bound 0.2 on each client's class-1 loss) is infeasible
    (its least worst-client loss 0.2198): five clients cannot meet the bound alone. Their
    least losses by CVXPY name them, and each reply is the exact relative least violation
    (ℓ − 0.2)/(ℓ + 0.2) to 1e-6 (measured: 1e-10)."""
    import cvxpy as cp
    from conftest import load_data
    from fedmodel.reproductions import proxal_table1 as table1
    X, y = load_data(table1.load, "adult-a")
    prob, _, parts = table1.build(X, y, 20)
    programs = compile_programs(prob)
    expected = {}
    for block, rows in zip(prob.clients, parts):
        v = cp.Variable(X.shape[1])
        X1 = X[rows][y[rows] == 1]
        least = cp.Problem(cp.Minimize(cp.sum(cp.logistic(-(X1 @ v))) / len(X1))).solve(solver="CLARABEL")
        reply = own_feasibility(programs[block.name])
        if least > 0.2:
            expected[block.name] = f"np[{block.name}]"
            assert reply["violation"] == pytest.approx((least - 0.2) / (least + 0.2), abs=1e-6)
        else:
            assert reply["violation"] == 0.0
    assert len(expected) == 5
    result, _ = _quiet(prob, ProxAL())
    assert result.status == "infeasible" and result.info["clients_infeasible"] == expected
