"""Fed-DALD-DC's coloured sweep (`DALD(order="colour")`, backends/dald/dc.colour_order): the
coordination sequence S ordered by the colour classes of a greedy colouring, so each class solves
(20) as one parallel batch. Checked: the sweep takes as many steps as colours; run batch by batch
it gives the same iterates, bit for bit, as the node-by-node Gauss–Seidel sweep in the same S (no
node of a class reads another's update); the batched executor's compiled sweep agrees; the answer
is CVXPY's. Data are synthetic."""
import networkx as nx
import numpy as np
import pytest

from fedmodel import topologies
from fedmodel.backends import DALD
from fedmodel.backends.dald import dc
from test_dald import _least_squares, _rel_error

TIGHT = dict(eps_primal=1e-8, eps_dual=1e-8, max_iterations=3000)


def _rgg(prob, seed=3):
    G = nx.random_geometric_graph(len(prob.clients), 0.45, seed=seed)
    assert nx.is_connected(G)
    return topologies.from_networkx(nx.relabel_nodes(G, {i: f"c{i}" for i in G}), prob)


@pytest.mark.integration     # DALD-DC colour sweeps to the optimum: CI runs it after the fast suite
@pytest.mark.parametrize("build", [topologies.ring, _rgg])
def test_colour_sweep_reaches_the_optimum_in_few_steps(build):
    prob, w = _least_squares(n=8, lam=0.02)
    topology = build(prob)
    # the model as written: on the random geometric graph the equilibrated run (ρ = 1 on an
    # objective scaled by σ) needs more than 3000 iterations to 1e-8
    res = prob.solve(DALD(order="colour", **TIGHT), topology=topology, scaling=False)
    default = prob.solve(DALD(**TIGHT), topology=topology, scaling=False)
    assert res.status == "converged"
    assert _rel_error(res, prob.solve("cvxpy"), w) <= 1e-5
    colours = max(nx.coloring.greedy_color(nx.Graph(topology), "largest_first").values()) + 1
    assert res.info["sweep_steps"] <= colours + 1          # + the hosted server block's step
    assert res.info["sweep_steps"] < default.info["sweep_steps"]


def test_a_colour_batch_equals_its_nodes_one_by_one(monkeypatch):
    prob, w = _least_squares(n=8, lam=0.02)
    options = dict(order="colour", max_iterations=60, eps_primal=0.0, eps_dual=0.0)
    batched = prob.solve(DALD(**options), topology=topologies.ring(prob), executor="serial")
    parallel = prob.solve(DALD(**options), topology=topologies.ring(prob), executor="batched")
    one_by_one = dc.GaussSeidelSweep.__call__

    def sequential(self, batches, opts):                   # every node its own batch, same S
        return one_by_one(self, [[n] for batch in batches for n in batch], opts)
    monkeypatch.setattr(dc.GaussSeidelSweep, "__call__", sequential)
    serial = prob.solve(DALD(**options), topology=topologies.ring(prob), executor="serial")
    assert batched.info["order"] == serial.info["order"] and batched.info["sweep_steps"] <= 4
    for n, x in serial.info["client_values"].items():
        assert np.array_equal(batched.info["client_values"][n], x)
        assert np.allclose(parallel.info["client_values"][n], x, rtol=0, atol=1e-10)


def test_colour_order_keeps_the_given_order_within_a_class():
    H = nx.cycle_graph(["a", "b", "c", "d", "e", "f"])
    order = dc.colour_order(H, ["a", "b", "c", "d", "e", "f"])
    colour = nx.coloring.greedy_color(H, "largest_first")
    assert [colour[n] for n in order] == sorted(colour[n] for n in order)
    assert all(not H.has_edge(u, v) for u, v in zip(order, order[1:]) if colour[u] == colour[v])
