"""Group requests (`Executor.map_stacked`), batched Fed-DALD-DC sweeps (`dald_dc_sweep`), the
ledger's booking from a count, and the zero-parameter variant of `BatchedPlan`: the same
numbers, checks and ledger as the per-node messages."""
import pickle

import numpy as np
import pytest

from fedmodel import backends
import fedmodel as fm
from fedmodel import topologies
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.batched_group import Group
from fedmodel.runtime.executor import SerialExecutor
from fedmodel.runtime.ledger import Ledger
from fedmodel.runtime.program import compile_programs
from test_batched import (D, MODELS, TOL, _assert_same, _assert_value_grad_per_client, _client_programs,
                          _least_squares, _logistic)


def _started(executor, prob, rho=1.0):
    """An executor whose clients ran `dald_cc_init` (so the DALD procedures apply)."""
    ex = executor.start(compile_programs(prob))
    ex.map("dald_cc_init", {c: {"x0": np.zeros(D), "beta": 2.0, "rho": rho} for c in ex.clients})
    return ex


# ---- map_stacked ------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [SerialExecutor, BatchedExecutor])
def test_stacked_request_books_the_ledger_of_n_messages(make):
    prob, _ = _logistic(l1_on="clients")
    opts = {"tol": -1.0, "solver": "prox-grad", "step": 0.1, "local_steps": 1, "warm": 1.0}
    xhat = np.linspace(-1, 1, D)
    stacked, per_node = _started(make(), prob), _started(SerialExecutor(), prob)
    reply = stacked.map_stacked("dald_cc_solve", stacked.clients, common={"xhat": xhat, **opts})
    replies = per_node.map("dald_cc_solve", {c: {"xhat": xhat, **opts} for c in per_node.clients})
    assert reply["x"].shape == (len(stacked.clients), D) and reply["steps"].shape == (len(stacked.clients),)
    for i, c in enumerate(stacked.clients):
        np.testing.assert_allclose(reply["x"][i], replies[c]["x"], rtol=0, atol=TOL)
    assert stacked.ledger.messages == per_node.ledger.messages
    assert stacked.ledger.floats == per_node.ledger.floats
    assert stacked.ledger.floats[("server", "c0", "dald_cc_solve")] == D + 4      # x̂ + 4 options
    assert stacked.ledger.floats[("c0", "server", "dald_cc_solve")] == D + 1      # x_i + steps
    # per-node rows (a block) and a local kind (no ledger entry)
    X = np.arange(len(stacked.clients) * D, dtype=float).reshape(-1, D) / 100
    reports = stacked.map_stacked("report", stacked.clients, rows={"x": X})
    for i, c in enumerate(stacked.clients):
        assert reports["objective"][i] == pytest.approx(
            per_node.call(c, "report", x=X[i])["objective"], rel=TOL, abs=TOL)
    assert stacked.ledger.messages == per_node.ledger.messages


def test_batched_executor_serves_the_group_request_as_one_block():
    prob, _ = _logistic(l1_on="clients")
    ex = _started(BatchedExecutor(), prob)
    ex.map_stacked("dald_cc_solve", ex.clients, common={"xhat": np.zeros(D), "tol": -1.0,
                                                         "solver": "prox-grad", "step": 0.1,
                                                         "local_steps": 1, "warm": 1.0})
    assert ex.stats[("dald_cc_solve", "batched")] == len(ex.clients)
    assert ex.ledger._pending                       # booked from a count, spread on reading
    solves = [k for k in ex.ledger.messages if k[2] == "dald_cc_solve"]
    assert len(solves) == 2 * len(ex.clients) and all(ex.ledger.messages[k] == 1 for k in solves)


@pytest.mark.parametrize("make", [SerialExecutor, BatchedExecutor])
def test_oversized_or_undeclared_stacked_payload_is_refused(make):
    prob, _ = _logistic()
    ex = _started(make(), prob)
    n, before = len(ex.clients), dict(ex.ledger.messages)
    with pytest.raises(fm.FedModelError, match="refusing to send it"):
        ex.map_stacked("report", ex.clients, rows={"x": np.zeros((n, D + 1))})   # rows too wide
    with pytest.raises(fm.FedModelError, match="refusing to send it"):
        ex.map_stacked("report", ex.clients, rows={"x": np.zeros((n + 1, D))})   # a row too many
    with pytest.raises(fm.FedModelError, match="refusing to send it"):
        ex.map_stacked("dald_cc_dual", ex.clients, common={"xhat": np.zeros(2 * D)})
    with pytest.raises(fm.FedModelError, match="undeclared field"):
        ex.map_stacked("report", ex.clients, rows={"x": np.zeros((n, D)), "X": np.zeros((n, D))})
    with pytest.raises(fm.FedModelError, match="no node program"):
        ex.map_stacked("report", ["nobody"] + ex.clients, common={"x": np.zeros(D)})
    with pytest.raises(fm.FedModelError, match="not declared"):
        ex.map_stacked("no_such_kind", ex.clients)
    assert ex.ledger.messages == before             # nothing was sent


def test_ledger_group_booking_equals_single_bookings_and_survives_pickling():
    one, group = Ledger(), Ledger()
    for _ in range(3):
        for node in ("a", "b", "a"):
            one.record("server", node, "k", 7)
            one.record(node, "server", "k", 2)
        group.record_group(("a", "b", "a"), "k", 7, down=True)
        group.record_group(("a", "b", "a"), "k", 2, down=False)
    restored = pickle.loads(pickle.dumps(group))
    assert group.messages == one.messages and group.floats == one.floats
    assert restored == one and restored.total("down") == {"messages": 9, "floats": 63}


def test_stacked_replies_follow_the_request_order():
    """A group request listing every member in another order gets its rows in that order
    (the batched replies are the group's stack only when the order is the group's)."""
    prob, _ = _logistic(l1_on="clients")
    got = []
    for make in (BatchedExecutor, SerialExecutor):
        ex = _started(make(), prob)
        clients = ex.clients[::-1]
        x = ex.map_stacked("dald_cc_solve", clients, common={"xhat": np.full(D, 0.3), "tol": -1.0,
                                                             "solver": "prox-grad", "step": 0.1,
                                                             "local_steps": 1, "warm": 1.0})["x"]
        ex.map_stacked("dald_cc_dual", clients, common={"xhat": np.full(D, 0.3), "consensus": 1.0})
        got.append((x, ex.map_stacked("dald_state", clients)["mu"]))
    for a, b in zip(*got):
        np.testing.assert_allclose(a, b, rtol=0, atol=TOL)


def test_a_monitor_cannot_write_the_clients_models():
    """The DALD monitor's rows may be the nodes' own state on the batched executor: they are
    read-only on every executor."""
    prob, _ = _logistic(n=4, l1_on="clients")

    def monitor(t, models):
        with pytest.raises(ValueError, match="read-only"):
            models[next(iter(models))][0] = 1.0
        seen.append(models.array.copy())
    for executor in ("serial", "batched"):
        seen = []
        prob.solve(backends.DALD(solver="prox-grad", step=0.05, max_iterations=3, monitor=monitor),
                   executor=executor)
        assert len(seen) == 3


# ---- Fed-DALD-DC sweeps on the batched executor ----------------------------------------------
@pytest.mark.parametrize("topology", ["path", "ring", "erdos_renyi"])
@pytest.mark.parametrize("options", [dict(solver="prox-grad"), dict(solver="gd"),
                                     dict(solver="prox-grad", coordination="partial",
                                          participation=0.6, seed=3)])
def test_dc_sweep_is_batched_and_equals_the_node_by_node_sweep(topology, options):
    prob, _ = _logistic(n=7, l1_on="clients")
    G = topologies.erdos_renyi(prob, 0.5, seed=1) if topology == "erdos_renyi" else \
        getattr(topologies, topology)(prob)

    def algo():
        return backends.DALD(step=0.05, max_iterations=30, eps_primal=0.0, eps_dual=0.0, **options)
    serial = prob.solve(algo(), topology=G, executor="serial")
    ex = BatchedExecutor()
    batched = prob.solve(algo(), topology=G, executor=ex)
    _assert_same(serial, batched)
    assert ex.stats[("dald_dc_sweep", "batched")] > 0
    if "coordination" not in options:     # (a partial sweep of one node goes node by node)
        assert ex.stats[("dald_dc_solve", "serial")] == 0
    assert ex.stats[("dald_dc_dual", "batched")] == 30 * 7


def test_dc_sweep_with_per_coordinate_rho_and_a_box_equals_the_node_by_node_sweep():
    """The compiled sweep's other branches: a ρ vector per edge (weights per coordinate) and a
    prox term that is not λ‖w‖₁ (the box w ≤ 0.3: projection, node by node)."""
    prob, w = _logistic(n=6, l1_on="clients")
    for c in prob.clients:
        c.subject_to(w <= 0.3)
    G = topologies.ring(prob)
    rho = {e: np.linspace(0.5, 1.5, D) * (1 + 0.1 * k) for k, e in enumerate(G.edges)}

    def algo():
        return backends.DALD(rho=rho, step=0.05, solver="prox-grad", max_iterations=25,
                             eps_primal=0.0, eps_dual=0.0)
    serial = prob.solve(algo(), topology=G, executor="serial")
    ex = BatchedExecutor()
    batched = prob.solve(algo(), topology=G, executor=ex)
    _assert_same(serial, batched)
    assert ex.stats[("dald_dc_sweep", "batched")] == 25 * 6 and ex.stats[("dald_dc_solve", "serial")] == 0
    assert max(np.max(v) for v in batched.values.values()) <= 0.3 + 1e-12


def test_dc_sweep_with_several_local_steps_takes_the_node_by_node_path():
    prob, _ = _logistic(n=5, l1_on="clients")
    algo = backends.DALD(solver="prox-grad", step=0.05, local_steps=2, max_iterations=8,
                         eps_primal=0.0, eps_dual=0.0)
    serial = prob.solve(algo, topology=topologies.path(prob), executor="serial")
    ex = BatchedExecutor()
    batched = prob.solve(algo, topology=topologies.path(prob), executor=ex)
    _assert_same(serial, batched)
    assert ex.stats[("dald_dc_sweep", "batched")] == 0     # W = 2: ∇P depends on the neighbours


@pytest.mark.parametrize("case", ["exact", "prox-grad-W2", "gd-cold"])
def test_dc_parallel_batches_are_one_group_step_and_equal_the_serial_run(case, solve_counts):
    """A Fed-DALD-DC sweep the group cannot serve as one block (exact solves, W = 2, a cold
    start) sends `dald_dc_solve` per parallel batch of S (here the colour classes of a ring):
    each batch is one group step (`dald_dc_solve`'s form over its rows: one batched Newton solve,
    or W compiled steps), with the serial run's numbers; (21) goes per edge of the group."""
    if case == "exact":
        prob, _ = _least_squares(n=6)
        options = dict(solver="exact")
    else:
        prob, _ = _logistic(n=6, l1_on="clients")
        options = dict(solver="prox-grad", step=0.05, local_steps=2) if case == "prox-grad-W2" else \
            dict(solver="gd", step=0.05, warm_start=False)

    def algo():
        return backends.DALD(order="colour", max_iterations=12, eps_primal=0.0, eps_dual=0.0, **options)
    serial = prob.solve(algo(), topology=topologies.ring(prob), executor="serial")
    counts = solve_counts
    counts.update(batched=0, own=0)             # the batched run's solves only
    ex = BatchedExecutor()
    batched = prob.solve(algo(), topology=topologies.ring(prob), executor=ex)
    _assert_same(serial, batched)
    assert batched.info["sweep_steps"] == 2
    assert ex.stats[("dald_dc_sweep", "batched")] == 0 and ex.stats[("dald_dc_solve", "serial")] == 0
    assert ex.stats[("dald_dc_solve", "batched")] == 6 * 12 and ex.stats[("dald_dc_dual", "batched")] == 6 * 12
    if case == "exact":
        assert counts["batched"] == 2 * 12 and counts["own"] == 0     # one batched solve per batch


# ---- reporting every k-th iteration ------------------------------------------------------------
@pytest.mark.parametrize("topology", ["star", "path"])
def test_report_every_only_thins_the_history_objective(topology):
    prob, _ = _logistic(n=4, l1_on="clients")
    G = getattr(topologies, topology)(prob)

    def run(k):
        return prob.solve(backends.DALD(solver="prox-grad", step=0.05, max_iterations=10,
                                        eps_primal=0.0, eps_dual=0.0, report_every=k),
                          topology=G, executor="batched")
    every, thin = run(1), run(4)
    objectives = [r["objective"] for r in thin.history]
    assert [np.isnan(v) for v in objectives] == [k % 4 != 0 for k in range(1, 10)] + [False]
    if topology == "star":                               # the Σμ_i diagnostic on the same records
        assert [np.isnan(r["sum_mu"]) for r in thin.history] == [np.isnan(v) for v in objectives]
        assert max(r["sum_mu"] for r in every.history) <= 1e-12
    for a, b in zip(every.history, thin.history):
        if not np.isnan(b["objective"]):
            assert b["objective"] == a["objective"]
        assert b["primal_residual"] == a["primal_residual"]
    for uid in every.values:
        np.testing.assert_array_equal(thin.values[uid], every.values[uid])
    with pytest.raises(fm.FedModelError, match="report_every"):
        backends.DALD(report_every=0)


# ---- BatchedPlan: the variant for a parameter that is 0 -----------------------------------------
@pytest.mark.parametrize("name", ["least squares", "logistic mean", "w @ A, index, constraint"])
def test_plan_with_a_zero_proximal_weight_equals_the_per_client_plans(name):
    programs = _client_programs(MODELS[name])
    for p in programs:
        p.merit_ir.beta.value = 3.0
        p.merit_ir.prox_weight.value = 0.0              # DALD's configuration: ω = 0
        for center in p.merit_ir.centers.values():
            center.value = np.full(center.shape, 0.25)
        for mu in p.merit_ir.multipliers.values():
            mu.value = np.full(mu.shape, 0.7)
    group = Group([p.name for p in programs], programs)
    plan = group.plan("value_grad_plan")
    assert plan._zero_variants and len(plan._zero_variants[0][1]) < len(plan._ops)
    X = np.random.default_rng(5).normal(size=(len(programs), D))
    _assert_value_grad_per_client(group, programs, X)
    programs[1].merit_ir.prox_weight.value = 0.5         # not zero for every client: full plan
    X = X + 0.1                                          # (a point the programs did not cache)
    values, G = group.value_grad(X, np.zeros((len(programs), 0)))
    for i, p in enumerate(programs):
        np.testing.assert_allclose(G[i], p.value_grad(X[i], p.y)[1], rtol=TOL, atol=TOL)
