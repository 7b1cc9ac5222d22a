"""ProxAL(inner=FedADMM(...)): FedADMM-InSa solves ProxAL's subproblems (Algorithm 1, step 3) on a
model with local and global constraints; verified against CVXPY, and the certificate it returns
bounds the true ‖∇ℓ_k‖∞ (so ProxAL's stop rule and Theorem 4.1 stay sound)."""
import pytest

import fedmodel as fm
from fedmodel.backends import ProxAL
from fedmodel.backends.fedadmm import FedADMM
from fedmodel.runtime.messages import PROCEDURES

from test_proxal import FAST, constrained_model

INNER = dict(beta=10.0, inexact=True, adaptive=True, local_solver="auto", max_rounds=2000)


@pytest.fixture
def count_proxal_steps(monkeypatch):
    """Sum of the local solver steps of ProxAL's own ADMM (Algorithm 2, step (19))."""
    total = [0]
    original = PROCEDURES["proxal_admm_step"]

    def counting(program, **payload):
        reply = original(program, **payload)
        total[0] += int(reply["steps"])
        return reply
    monkeypatch.setitem(PROCEDURES, "proxal_admm_step", counting)
    return total


@pytest.mark.integration     # ProxAL with FedADMM inner steps against CVXPY: CI runs it after the fast suite
def test_composition_verifies_against_cvxpy_and_counts_local_steps(count_proxal_steps):
    prob, w = constrained_model(0)            # local ineq./eq., private slack, global ineq./eq., λ‖w‖₁
    ref = prob.solve("cvxpy")
    own = prob.solve(ProxAL(**FAST))
    inner = FedADMM(**INNER)
    res = prob.solve(ProxAL(**FAST, inner=inner))
    report = fm.verify(res, reference=ref, rtol=1e-3)
    fedadmm_steps = sum(entry["local_steps"] for entry in inner.subproblem_log)
    message = (f"ProxAL's ADMM: {own.iterations} and {count_proxal_steps[0]} local steps; "
               f"FedADMM-InSa inner: {res.iterations} and {fedadmm_steps} local steps\n{report}")
    assert report.ok, message
    assert res.status == "converged", message
    assert report.solution_distance <= 1e-3, message
    assert all(entry["solved"] for entry in inner.subproblem_log), inner.subproblem_log
    assert len(inner.subproblem_log) == res.iterations["outer"]
    # every subproblem was solved to its τ_k in the certificate
    assert all(e["certificate"] <= e["tau"] for e in inner.subproblem_log)
    assert fedadmm_steps > 0 and count_proxal_steps[0] > 0, message
    print(message)


def test_certificate_bounds_the_true_subproblem_residual():
    """Without a server prox term ℓ_k is smooth: ProxAL's diagnostic computes ‖∇ℓ_k(w^{k+1})‖∞,
    which the FedADMM certificate must bound from above at every outer iteration."""
    prob, w = constrained_model(1, server_l1=False)
    ref = prob.solve("cvxpy")
    res = prob.solve(ProxAL(**dict(FAST, max_outer=6), inner=FedADMM(**INNER), check_certificate=True))
    for record in res.history:
        assert record["true_residual"] is not None
        assert record["true_residual"] <= record["certificate"] + 1e-12, record
        assert record["certificate"] <= record["tau"]
    assert fm.verify(res, reference=ref, rtol=1e-1).max_violation < 1e-1   # 6 outer steps only


def test_bad_inner_backend_is_refused():
    prob, w = constrained_model(0)
    with pytest.raises(fm.FedModelError, match="inner"):
        prob.solve(ProxAL(**dict(FAST, max_outer=1), inner="fedadmm"))
    with pytest.raises(fm.FedModelError, match="alpha"):
        prob.solve(ProxAL(**dict(FAST, max_outer=1), inner=FedADMM(alpha="weights")))
