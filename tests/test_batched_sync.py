"""One holder per node program (`program.holder`, `Executor.take_over` / `hand_back`): while
a batched executor holds the programs its groups keep the clients' state as stacks
(`Group.publish` / `on_sync` / `sync`) and the `program.state` dicts are stale; an explicit
transfer — another executor taking the programs over, `close`, a pickled copy — writes the
newest numbers back, equal to an all-serial run of the same requests. An executor refuses
programs another one holds, and a group's cached validation of the states (`Group.checked`)
is dropped when its executor serves a member node by node or hands the programs over."""
import pickle

import networkx as nx
import numpy as np
import pytest

from fedmodel import backends
import fedmodel as fm
from fedmodel.backends.dald.dc import GaussSeidelSweep   # (importing backends.dald registers its node steps)
from fedmodel import topologies
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.executor import SerialExecutor
from fedmodel.runtime.program import compile_programs
from test_batched import D, TOL, _logistic

SOLVE = {"tol": -1.0, "solver": "prox-grad", "step": 0.2, "local_steps": 2, "warm": 1.0}


def _cc_init(ex, clients, x0=0.0, beta=2.0, rho=None):
    """`dald_cc_init` per node (ρ_i: one number per client, default 1)."""
    rho = np.ones(len(clients)) if rho is None else rho
    ex.map("dald_cc_init", {c: {"x0": np.full(D, x0), "beta": beta, "rho": float(r)}
                            for c, r in zip(clients, rho)})


def _cc_rounds(ex, clients, xhat, rounds):
    """Fed-DALD-CC rounds as group requests: solve (13) at x̂, x̂ ← mean x_i, dual (15).
    Returns the x̂ of each round."""
    trace = []
    for _ in range(rounds):
        X = ex.map_stacked("dald_cc_solve", clients, common={"xhat": xhat, **SOLVE})["x"]
        xhat = X.mean(axis=0)
        ex.map_stacked("dald_cc_dual", clients, common={"xhat": xhat, "consensus": 1.0})
        trace.append(xhat)
    return np.array(trace)


def _cc_dicts(programs, clients):
    """(x_i, μ_i) stacks as the clients' dicts hold them."""
    return tuple(np.array([programs[c].state["dald"][k] for c in clients]) for k in ("x", "mu"))


def _shared_programs(prob):
    """One set of programs for a serial and a batched executor; the batched one holds them."""
    programs = compile_programs(prob)
    serial = SerialExecutor().start(programs)
    return programs, BatchedExecutor().start(programs), serial


# ---- Fed-DALD-CC: stale dicts until the holder writes them back -------------------------------
@pytest.mark.parametrize("reader", ["serial takes over", "close", "pickle"])
def test_cc_state_is_written_back_when_handed_over(reader):
    """After batched group requests the dicts still hold the initial zeros and the programs are
    held by the batched executor; a serial executor taking them over, `close`, or a pickled
    copy sees the newest x_i and μ_i (those of an all-serial run).
    (λ‖w‖₁ on the server: a client prox term's closure is not picklable by `pickle`.)"""
    prob, _ = _logistic(l1_on="server")
    programs, batched, serial = _shared_programs(prob)
    clients = batched.clients
    _cc_init(batched, clients)
    reference = SerialExecutor().start(compile_programs(prob))
    _cc_init(reference, clients)
    xhat0 = np.linspace(-0.5, 0.5, D)
    trace = _cc_rounds(batched, clients, xhat0, 3)
    np.testing.assert_allclose(trace, _cc_rounds(reference, clients, xhat0, 3), rtol=0, atol=TOL)
    assert batched.stats[("dald_cc_solve", "batched")] == 3 * len(clients)

    want_x, want_mu = _cc_dicts(reference.programs, clients)
    assert np.abs(want_x).max() > 0.01 and np.abs(want_mu).max() > 0.001     # the run moved
    assert all(programs[c].holder is batched for c in clients)
    stale_x, stale_mu = _cc_dicts(programs, clients)
    np.testing.assert_array_equal(stale_x, 0.0)
    np.testing.assert_array_equal(stale_mu, 0.0)

    if reader == "serial takes over":
        xhat = trace[-1]
        got = serial.take_over().call(clients[0], "dald_cc_solve", xhat=xhat, **SOLVE)["x"]
        want = reference.call(clients[0], "dald_cc_solve", xhat=xhat, **SOLVE)["x"]
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
        mus = serial.map("dald_state", {c: {} for c in clients})
        np.testing.assert_allclose([mus[c]["mu"] for c in clients], want_mu, rtol=0, atol=TOL)
        want_x, want_mu = _cc_dicts(reference.programs, clients)
        got_x, got_mu = _cc_dicts(programs, clients)
        holder = serial
    elif reader == "close":
        batched.close()
        got_x, got_mu = _cc_dicts(programs, clients)
        holder = None
    else:                                   # (the batched executor keeps holding the original)
        copy = pickle.loads(pickle.dumps(programs[clients[1]]))
        assert copy.holder is None
        got_x, got_mu = copy.state["dald"]["x"][None], copy.state["dald"]["mu"][None]
        want_x, want_mu = want_x[1:2], want_mu[1:2]
        holder = batched
    np.testing.assert_allclose(got_x, want_x, rtol=0, atol=TOL)
    np.testing.assert_allclose(got_mu, want_mu, rtol=0, atol=TOL)
    assert all(programs[c].holder is holder for c in clients)


def test_an_executor_refuses_programs_another_one_holds():
    """Serving a program another executor holds is refused (no silent hand-over); after
    `take_over` it is served, and a closed executor's programs are free for anyone."""
    prob, _ = _logistic(l1_on="clients")
    programs, batched, serial = _shared_programs(prob)
    clients = batched.clients
    _cc_init(batched, clients)
    for request in (lambda: serial.call(clients[0], "dald_state"),
                    lambda: serial.map_stacked("dald_state", clients)):
        with pytest.raises(fm.FedModelError, match="held by another executor"):
            request()
    serial.take_over().call(clients[0], "dald_state")
    with pytest.raises(fm.FedModelError, match="held by another executor"):
        _cc_rounds(batched, clients, np.zeros(D), 1)
    serial.close()
    _cc_rounds(batched, clients, np.zeros(D), 1)            # free: held by whoever serves it
    assert all(programs[c].holder is batched for c in clients)


@pytest.mark.parametrize("reinit", ["all clients", "some clients"])
def test_reinit_through_another_executor_invalidates_the_checked_states(reinit):
    """Batched rounds, then `dald_cc_init` (new state dicts, other x0, β and ρ_i) through a
    serial executor that took the programs over, then batched rounds again after taking them
    back: the batched executor must drop the states it validated and stacked before, and match
    the all-serial sequence."""
    prob, _ = _logistic(l1_on="clients")
    programs, batched, serial = _shared_programs(prob)
    reference = SerialExecutor().start(compile_programs(prob))
    clients = batched.clients
    again = clients if reinit == "all clients" else clients[::2]
    rho = np.linspace(0.5, 1.5, len(again))
    traces = []
    for first, second in ((batched, serial), (reference, reference)):
        _cc_init(first, clients)
        before = _cc_rounds(first, clients, np.full(D, 0.1), 3)
        _cc_init(second.take_over(), again, x0=0.3, beta=3.0, rho=rho)   # new dicts for `again`
        after = _cc_rounds(first.take_over(), clients, before[-1], 3)
        first.close()
        traces.append((np.vstack([before, after]), *_cc_dicts(first.programs, clients)))
    assert batched.stats[("dald_cc_solve", "batched")] == 6 * len(clients)
    (got, got_x, got_mu), (want, want_x, want_mu) = traces
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    np.testing.assert_allclose(got_x, want_x, rtol=0, atol=TOL)
    np.testing.assert_allclose(got_mu, want_mu, rtol=0, atol=TOL)
    rho2 = np.array([np.broadcast_to(programs[c].state["dald"]["rho2"], (D,)) for c in again])
    np.testing.assert_array_equal(rho2, np.repeat(rho[:, None] ** 2, D, axis=1))


def test_a_second_batched_executor_continues_from_the_newest_state():
    """Batched rounds on one executor, then on another batched executor that takes the same
    programs over: the second must start from the first one's newest x_i and μ_i."""
    prob, _ = _logistic(l1_on="clients")
    programs = compile_programs(prob)
    first, second = BatchedExecutor().start(programs), BatchedExecutor().start(programs)
    reference = SerialExecutor().start(compile_programs(prob))
    clients = first.clients
    traces = []
    for a, b in ((first, second), (reference, reference)):
        _cc_init(a.take_over(), clients)
        before = _cc_rounds(a, clients, np.full(D, 0.1), 2)
        traces.append(np.vstack([before, _cc_rounds(b.take_over(), clients, before[-1], 2)]))
    assert second.stats[("dald_cc_solve", "batched")] == 2 * len(clients)
    np.testing.assert_allclose(traces[0], traces[1], rtol=0, atol=TOL)

def test_closing_a_superseded_executor_leaves_the_newer_hold():
    """After a second batched executor took the programs over, closing the first one must not
    release the second one's hold nor write its older state back: a serial executor taking
    the programs over then sees the second one's state."""
    prob, _ = _logistic(l1_on="clients")
    programs = compile_programs(prob)
    first, second = BatchedExecutor().start(programs), BatchedExecutor().start(programs)
    reference = SerialExecutor().start(compile_programs(prob))
    clients = first.clients
    for a, b in ((first, second), (reference, reference)):
        _cc_init(a.take_over(), clients)
        xhat = _cc_rounds(a, clients, np.full(D, 0.1), 2)[-1]
        _cc_rounds(b.take_over(), clients, xhat, 2)
    first.close()
    assert all(programs[c].holder is second for c in clients)
    mus = SerialExecutor().start(programs).map("dald_state", {c: {} for c in clients})
    want = reference.map("dald_state", {c: {} for c in clients})
    np.testing.assert_allclose([mus[c]["mu"] for c in clients], [want[c]["mu"] for c in clients],
                               rtol=0, atol=TOL)


def test_a_server_step_keeps_the_clients_checks_and_stacks():
    """Only a member served node by node voids a group's checks and writes its stacks back: a
    server request between batched rounds leaves the validated client states cached and the
    dicts stale; the programs stay held by the batched executor throughout."""
    prob, _ = _logistic(l1_on="server")
    programs, batched, _ = _shared_programs(prob)
    clients = batched.clients
    _cc_init(batched, clients)
    xhat = _cc_rounds(batched, clients, np.full(D, 0.1), 2)[-1]
    group, = batched.groups
    assert "cc" in group._checked and group._pending
    batched.call("server", "report", x=xhat)
    assert "cc" in group._checked and group._pending
    batched.call(clients[0], "report", x=xhat)              # a member: written back, checks void
    assert "cc" not in group._checked and not group._pending
    assert all(programs[c].holder is batched for c in clients)


# ---- Fed-DALD-DC: relayed copies, edge multipliers and flags written back ---------------------
def _dc_start(ex, clients, graph):
    """`dald_dc_init` and `dald_dc_links` (one edge end a request) on a graph of the clients,
    order S = clients."""
    position = {c: i for i, c in enumerate(clients)}
    neighbors = {c: sorted(graph.neighbors(c), key=position.get) for c in clients}
    ex.map("dald_dc_init", {c: {"x0": np.zeros(D), "beta": 2.0} for c in clients})
    for c in clients:
        for j in neighbors[c]:
            ex.call(c, "dald_dc_links", neighbors=[j], rho=[1.0], after=[float(position[j] > position[c])],
                    x=np.zeros(D))
    return neighbors


def _dc_view(programs, clients):
    """Every node's x, and per end (node, neighbour): its copy of x_nbr, μ, fresh; solved per node."""
    x = {c: np.array(programs[c].state["dald"]["x"]) for c in clients}
    ends = {(c, j): (np.array(e["x"]), np.array(e["mu"]), e.get("fresh"))
            for c in clients for j, e in programs[c].state["dald"]["edges"].items()}
    return x, ends, {c: programs[c].state["dald"].get("solved") for c in clients}


def test_dc_sweeps_are_written_back_at_close():
    """A full sweep and multiplier step, then a sweep of some nodes only, by hand: the dicts
    stay stale while the group holds them; `close` writes back the models, the relayed copies,
    μ_e and the solved / fresh flags exactly as a serial executor leaves them."""
    prob, _ = _logistic(n=6, l1_on="clients")
    views = []
    for ex in (BatchedExecutor(), SerialExecutor()):
        ex.start(compile_programs(prob))
        clients = ex.clients
        graph = nx.relabel_nodes(nx.cycle_graph(len(clients)), dict(enumerate(clients)))
        neighbors = _dc_start(ex, clients, graph)
        opts = {**SOLVE, "step": 0.05, "local_steps": 1}
        for sweep in (clients, clients[1:4]):
            GaussSeidelSweep(ex, neighbors)([[c] for c in sweep], opts)
            if sweep is clients:
                ex.map_stacked("dald_dc_dual", clients, common={"consensus": 1.0})
        if isinstance(ex, BatchedExecutor):
            assert ex.stats[("dald_dc_sweep", "batched")] == len(clients) + 3
            assert all(ex.programs[c].holder is ex for c in clients)
            x, ends, solved = _dc_view(ex.programs, clients)
            assert all(not np.any(v) for v in x.values())          # still x0: not handed over
            assert all(s is None for s in solved.values())
        ex.close()
        assert all(ex.programs[c].holder is None for c in clients)
        views.append(_dc_view(ex.programs, clients))
    (x, ends, solved), (want_x, want_ends, want_solved) = views
    assert solved == want_solved == {c: c in clients[1:4] for c in clients}
    assert ends.keys() == want_ends.keys()
    for c in clients:
        np.testing.assert_allclose(x[c], want_x[c], rtol=0, atol=TOL)
    assert np.abs(np.array(list(x.values()))).max() > 0.001
    for end, (copy, mu, fresh) in ends.items():
        np.testing.assert_allclose(copy, want_ends[end][0], rtol=0, atol=TOL)
        np.testing.assert_array_equal(copy, x[end[1]])              # the neighbour's newest model
        np.testing.assert_allclose(mu, want_ends[end][1], rtol=0, atol=TOL)
        assert bool(fresh) is bool(want_ends[end][2]) is (end[1] in clients[1:4])


def test_dc_solve_leaves_consistent_node_state():
    """A whole Fed-DALD-DC solve on a path: while it runs the batched executor holds the nodes'
    state (the callback sees its stacks not yet written back); afterwards every end holds its
    neighbour's model and the same μ_e as the other end (equal to the serial run's), and no
    solved / fresh flag is left after the final multiplier step."""
    prob, _ = _logistic(n=6, l1_on="clients")

    def algo():   # the model as written: its node states are then in the result's units
        backend = backends.DALD(solver="prox-grad", step=0.05, max_iterations=12, eps_primal=0.0,
                                eps_dual=0.0)
        backend.scaling = False
        return backend
    serial = prob.solve(algo(), topology=topologies.path(prob), executor="serial")
    ex = BatchedExecutor()
    held = []
    result = prob.solve(algo(), topology=topologies.path(prob), executor=ex,
                        callback=lambda record: held.append(bool(ex.groups[0]._pending) and all(
                            p.holder is ex for p in ex.programs.values() if p.role == "client")))
    assert held == [True] * 12
    assert ex.stats[("dald_dc_sweep", "batched")] == ex.stats[("dald_dc_dual", "batched")] == 12 * 6
    multipliers = serial.info["consensus_multipliers"]
    assert max(np.abs(m).max() for m in multipliers.values()) > 0.001
    for name in ex.clients:
        program = ex.programs[name]
        assert program.holder is None
        state = program.state["dald"]
        np.testing.assert_array_equal(state["x"], result.info["client_values"][name])
        np.testing.assert_allclose(state["x"], serial.info["client_values"][name], rtol=0, atol=TOL)
        assert bool(state["solved"]) is False
        for nbr, end in state["edges"].items():
            other = ex.programs[nbr].state["dald"]
            np.testing.assert_array_equal(end["x"], other["x"])
            np.testing.assert_array_equal(end["mu"], other["edges"][name]["mu"])
            edge = (name, nbr) if (name, nbr) in multipliers else (nbr, name)
            np.testing.assert_allclose(end["mu"], multipliers[edge], rtol=0, atol=TOL)
            assert bool(end["fresh"]) is False


def _path(clients):
    return nx.relabel_nodes(nx.path_graph(len(clients)), dict(enumerate(clients)))


DC_STEP = {**SOLVE, "step": 0.05, "local_steps": 1}


def test_dc_two_batched_executors_on_the_same_programs():
    """A second executor's batched sweep in between: the first executor's cached sweep state
    (solved / fresh flags) is written back and void once the other one takes the programs
    over, so its multiplier step (after taking them back) still moves μ_e as the serial run's
    does."""
    prob, _ = _logistic(n=6, l1_on="clients")

    def run(first, second, clients):
        neighbors = _dc_start(first.take_over(), clients, _path(clients))
        GaussSeidelSweep(first, neighbors)([[c] for c in clients], DC_STEP)
        first.map_stacked("dald_dc_dual", clients, common={"consensus": 1.0})
        GaussSeidelSweep(second.take_over(), neighbors)([[c] for c in clients], DC_STEP)
        first.take_over().map_stacked("dald_dc_dual", clients, common={"consensus": 1.0})
        first.close()
        second.close()
    programs = compile_programs(prob)
    first, second = BatchedExecutor().start(programs), BatchedExecutor().start(programs)
    run(first, second, first.clients)
    assert first.stats[("dald_dc_dual", "batched")] == 12 and second.stats[("dald_dc_sweep", "batched")] == 6
    reference = SerialExecutor().start(compile_programs(prob))
    run(reference, reference, reference.clients)
    _, got, _ = _dc_view(programs, first.clients)
    _, want, _ = _dc_view(reference.programs, first.clients)
    assert max(float(np.abs(got[e][1] - want[e][1]).max()) for e in want) <= TOL
    assert max(float(np.abs(want[e][1]).max()) for e in want) > 1e-3        # μ moved


def test_dc_relinking_an_edge_rebuilds_the_batched_layout():
    """`dald_dc_links` again for existing neighbours (a new ρ) replaces the end dicts: the
    batched sweep must use the new ends and their 2ρ², as the serial sweep does."""
    prob, _ = _logistic(n=6, l1_on="clients")
    sweeps = []
    for ex in (BatchedExecutor(), SerialExecutor()):
        ex.start(compile_programs(prob))
        clients = ex.clients
        neighbors = _dc_start(ex, clients, _path(clients))
        GaussSeidelSweep(ex, neighbors)([[c] for c in clients], DC_STEP)
        ex.close()
        x = {c: np.array(ex.programs[c].state["dald"]["x"]) for c in clients}
        for i, c in enumerate(clients):
            for j in neighbors[c]:
                ex.call(c, "dald_dc_links", neighbors=[j], rho=[3.0], after=[float(clients.index(j) > i)],
                        x=x[j])
        sweeps.append(np.array(GaussSeidelSweep(ex, neighbors)([[c] for c in clients], DC_STEP)["x"]))
    np.testing.assert_allclose(sweeps[0], sweeps[1], rtol=0, atol=TOL)
    assert np.abs(sweeps[1]).max() > 1e-3
