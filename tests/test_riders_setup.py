"""Issue 27 item 1, the set-up round trips: DP-ADMM's non-private run asks the clients' curvature
L̂_p at w¹ (its ρ floor) in its `dp_admm_init` request (`backends.dp_admm.setup`) instead of a
"local_curvature" request of its own; Fed-DALD-CC, FedAvg and FedProx send their `dald_cc_init`
inside the first `dald_cc_solve` request. The references send them apart, as before; histories,
answers and multipliers bit for bit those of the references."""
from __future__ import annotations

import numpy as np
import pytest

from fedmodel import backends
from fedmodel.runtime.executor import SerialExecutor
from fedmodel.runtime.messages import install
from fedmodel.runtime.program import compile_programs
from test_ledger_riders import _history, _model

ROUNDS = 7


class _CurvatureApart(backends.DPADMM):
    """DP-ADMM as before: `dp_admm_init`, then "local_curvature" as a request of its own."""

    def _init_clients(self, ex, w, local, curvature=None):
        records, shares, _ = super()._init_clients(ex, w, local)
        if not curvature:
            return records, shares, None
        L = ex.map_stacked("local_curvature", tuple(ex.clients), common={"z": w, "iterations": curvature})["L"]
        return records, shares, float(np.max(L))


@pytest.mark.parametrize("executor", ["serial", "batched"])
def test_dp_admm_asks_the_curvature_in_its_init_request(executor):
    prob, w, _ = _model(constrained=False)
    old = _CurvatureApart(max_rounds=ROUNDS, tol=0).run(prob, executor=executor)
    new = backends.DPADMM(max_rounds=ROUNDS, tol=0).run(prob, executor=executor)
    assert _history(new) == _history(old) and len(new["history"]) == ROUNDS
    np.testing.assert_array_equal(new["values"][w.uid], old["values"][w.uid])
    assert old["ledger"].trips["local_curvature"] == 1 and "local_curvature" not in new["ledger"].trips
    assert new["ledger"].round_trips == old["ledger"].round_trips - 1 == 1 + ROUNDS
    # a private run reads no curvature (a release its accountant does not cover): unchanged
    private = backends.DPADMM(epsilon=1.0, max_rounds=ROUNDS, seed=3, tol=0).run(prob, executor=executor)
    assert private["ledger"].round_trips == 1 + ROUNDS


@pytest.mark.parametrize("executor", ["serial", "batched"])
def test_the_init_reply_is_the_curvature_request_answer(executor):
    """L̂_p from `dp_admm_init` = the "local_curvature" request's at the same point, bitwise
    (batched: the same group estimate), and near λ_max(A_pᵀA_p) of the client's ½‖A_p w − b_p‖²
    (independent: numpy; 20 power steps from below)."""
    from fedmodel.runtime.batched import BatchedExecutor
    prob, w, parts = _model(constrained=False)
    install(backends.DPADMM.procedures)
    z = np.array([0.3, -0.2, 0.1])
    with (SerialExecutor() if executor == "serial" else BatchedExecutor()).start(compile_programs(prob)) as ex:
        clients = tuple(ex.clients)
        init = {"z0": z, "mechanism": "none", "epsilon": np.inf, "sensitivity": "clip", "seed": 1}
        replies = ex.map("dp_admm_init", {c: {**init, "index": i, "curvature": 20} for i, c in enumerate(clients)})
        asked = ex.map_stacked("local_curvature", clients, common={"z": z, "iterations": 20})["L"]
        if executor == "batched":            # (the group form served it: `setup._init_batched`)
            assert ex.stats[("dp_admm_init", "batched")] == len(clients)
    np.testing.assert_array_equal([replies[c]["L"] for c in clients], asked)
    exact = [np.linalg.eigvalsh(A.T @ A)[-1] for A, _ in parts]
    np.testing.assert_allclose(asked, exact, rtol=1e-3)


def _set_up_apart(base):
    """`base` (an executor class) with the protocol before: a first `dald_cc_solve` carrying
    the set-up (`init`, `rho`) is sent as `dald_cc_init` by itself (x⁰ = the solve's x̂), then
    the solve without it."""
    class Apart(base):
        def map_stacked(self, kind, nodes, rows=None, common=None, split=True, rider=None):
            if kind == "dald_cc_solve" and "init" in (common or {}):
                common, rows = dict(common), dict(rows)
                self.map_stacked("dald_cc_init", nodes, rows={"rho": rows.pop("rho")},
                                 common={"x0": common["xhat"], "beta": common.pop("init")})
            return super().map_stacked(kind, nodes, rows or None, common, split, rider)
    return Apart


@pytest.mark.parametrize("executor", ["serial", "batched"])
@pytest.mark.parametrize("make", [
    lambda: backends.DALD(max_iterations=ROUNDS, eps_primal=0, eps_dual=0),
    lambda: backends.FedAvg(max_rounds=ROUNDS, tol=0),
    lambda: backends.FedProx(max_rounds=ROUNDS, tol=0, local_steps=3)], ids=["dald", "fedavg", "fedprox"])
def test_the_set_up_travels_in_the_first_solve(make, executor):
    """Client and server sets (the clients' β and multipliers act): the history, answer, the
    clients' consensus and own multipliers bit for bit those of the set-up sent by itself, one
    round trip fewer (DALD: none left; FedAvg / FedProx: the curvature estimate)."""
    from fedmodel.runtime.batched import BatchedExecutor
    prob, w, _ = _model(constrained=True)
    base = SerialExecutor if executor == "serial" else BatchedExecutor
    ex = base()
    old, new = make().run(prob, executor=_set_up_apart(base)()), make().run(prob, executor=ex)
    if executor == "batched":            # (the group form served the set-up and every solve)
        assert ex.stats[("dald_cc_solve", "batched")] == 3 * ROUNDS
    assert _history(new) == _history(old) and len(new["history"]) == ROUNDS
    np.testing.assert_array_equal(new["values"][w.uid], old["values"][w.uid])
    assert set(new["multipliers"]) == set(old["multipliers"]) and new["multipliers"]
    for name, value in old["multipliers"].items():
        np.testing.assert_array_equal(np.asarray(new["multipliers"][name]), np.asarray(value))
    for name, mu in old["info"]["consensus_multipliers"].items():
        np.testing.assert_array_equal(new["info"]["consensus_multipliers"][name], mu)
    assert max(h["constraint_residual"] for h in new["history"]) > 0.0     # (the sets acted)
    assert old["ledger"].trips["dald_cc_init"] == 1 and "dald_cc_init" not in new["ledger"].trips
    assert new["ledger"].round_trips == old["ledger"].round_trips - 1
    assert new["ledger"].trips["dald_cc_solve"] == ROUNDS


def test_partial_participation_and_a_resumed_run_send_the_set_up_by_itself(tmp_path):
    """A first solve that reaches a sample of the clients cannot set up the others; a resumed
    run's set-up goes before the checkpoint's state replaces it. Both by themselves, as before."""
    from conftest import StopRun, stop_after
    prob, w, _ = _model(constrained=False)
    partial = prob.solve(backends.DALD(coordination="partial", participation=0.67,
                                           max_iterations=5, seed=1))
    assert partial.ledger.trips["dald_cc_init"] == 1
    make = lambda: backends.DALD(max_iterations=6, eps_primal=0, eps_dual=0)
    straight = prob.solve(make())
    path = tmp_path / "run.ckpt"
    with pytest.raises(StopRun):
        prob.solve(make(), checkpoint=path, checkpoint_every=1, callback=stop_after(3))
    resumed = prob.solve(make(), checkpoint=path, resume=True)
    assert _history({"history": resumed.history}) == _history({"history": straight.history})
    assert resumed.ledger.round_trips == straight.ledger.round_trips and "dald_cc_init" not in straight.ledger.trips


class _SumOnly(SerialExecutor):
    """A server that may see only sums (`map_sum`; here summed in this process)."""

    sum_only = True


class _SumOnlyApart(_set_up_apart(_SumOnly)):
    """... with the set-up by itself before the first sum, as before."""

    def map_sum(self, kind, nodes, common=None, fields=("x",)):
        if kind == "dald_cc_solve" and "init" in (common or {}):
            common = dict(common)
            rho = np.tile(common.pop("rho"), (len(nodes), 1))
            self.map_stacked("dald_cc_init", nodes, rows={"rho": rho},
                             common={"x0": common["xhat"], "beta": common.pop("init")})
        return super().map_sum(kind, nodes, common, fields)


@pytest.mark.parametrize("name", ["FedAvg", "FedProx"])
def test_under_secure_aggregation_the_set_up_travels_in_the_first_sum(name):
    """`_cc_summed` (the server sees only Σ_i x_i): one ρ for all, so the set-up's fields are
    the same for every client and ride in the first `map_sum` request; the clients' own
    multiplier step still goes as `dald_cc_dual` each round (its largest change is no sum)."""
    prob, w, _ = _model(constrained=True)
    make = lambda: getattr(backends, name)(max_rounds=ROUNDS, tol=0)
    old, new = make().run(prob, executor=_SumOnlyApart()), make().run(prob, executor=_SumOnly())
    assert new["info"]["secure_sum"]
    assert _history(new) == _history(old) and len(new["history"]) == ROUNDS
    np.testing.assert_array_equal(new["values"][w.uid], old["values"][w.uid])
    for key, value in old["multipliers"].items():
        np.testing.assert_array_equal(np.asarray(new["multipliers"][key]), np.asarray(value))
    assert old["ledger"].trips["dald_cc_init"] == 1 and "dald_cc_init" not in new["ledger"].trips
    assert new["ledger"].round_trips == old["ledger"].round_trips - 1 == 1 + 2 * ROUNDS
