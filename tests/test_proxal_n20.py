"""`fedmodel run --clients 20` (issue 25 item 4 / issue 27 item 2): the built-in WDBC
Neyman-Pearson model at n = 20 with the options `fedmodel run` passes. Its first ADMM run, the
constraints held in the clients' solves, ends by the stall rule (certificate 1.4e-2 against
τ_0 = 1e-3) on a feasible model; an unsolved run alone no longer sends the constraints back to
the augmented Lagrangian (only a client that cannot meet its own, or a consensus residual that
shows ∩ X_i empty, `proxal_outer.no_consensus`, does). Measured (docs/BENCHMARKS.md, "n = 20"):
main 44 outer / 9,275 ADMM iterations, 42 of 44 ADMM runs unsolved in the AL; now 7 / 1,167."""
from __future__ import annotations

import warnings

import pytest

import fedmodel as fm
from fedmodel.backends import ProxAL
from fedmodel.builtin_models import backend_options, neyman_pearson


def _solve(**overrides):
    prob, _ = neyman_pearson(n_clients=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prob, prob.solve(ProxAL(**{**backend_options("proxal"), **overrides}))


@pytest.mark.integration    # (~5 s: one ADMM run of 161 iterations over 20 clients)
def test_an_unsolved_first_run_keeps_the_constraints_held():
    """The first run stalls unsolved, no client fails and the consensus residual falls: the
    constraints stay in the clients' solves (main: back to the AL after outer iteration 1)."""
    _, res = _solve(max_outer=1)
    first = res.history[0]
    assert first["certificate"] > first["tau"]          # the case: unsolved, by the stall rule
    assert "client_constraints" not in res.info
    # held, the multipliers of the AL do not move: Δμ = 0 (the NP rows are not in the AL)
    assert first["multiplier_change"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.integration    # (~40 s; main: 160 s, 9,363 round trips)
def test_the_built_in_model_at_20_clients_verifies_in_few_outer_iterations():
    prob, res = _solve()
    assert res.status == "converged"
    assert fm.verify(res, prob.solve("cvxpy")).ok
    assert res.iterations["outer"] <= 10                 # measured 7 (main 44)
    assert res.info["communication"]["round_trips"] <= 1500    # measured 1,174 (main 9,363)
