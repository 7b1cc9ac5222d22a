"""Fed-DALD-DC's edge penalties from the nodes' curvatures (`dc.edge_rho`, `adaptive_rho`):
clients of very different sizes (1 to 300 rows: curvatures four orders apart, all below the
default penalty 2ρ² = 2) reach CVXPY's answer on a ring and a random graph (issue 25 item 4)."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel import topologies
from fedmodel.backends.dald import DALD
from fedmodel.backends.dald.dc import CURVATURE_FLOOR, edge_rho


def test_edge_rho_is_the_smaller_curvature_under_the_given_rho_above_the_floor():
    rho = np.array([1.0, 0.05])
    # 2ρ² = min(0.5, 0.08) = 0.08 → ρ = 0.2 (the second coordinate keeps its smaller given ρ)
    assert np.allclose(edge_rho(rho, (0.5, 0.08), 1.0), [0.2, 0.05])
    # a node that bends far less than the largest: the floor, a fraction of the largest's
    assert np.allclose(edge_rho(rho, (1e-6, 0.3), 2.0), [np.sqrt(CURVATURE_FLOOR * 2.0 / 2.0), 0.05])
    # a node that does not bend (a constraint-only server block): the other end's curvature
    assert np.allclose(edge_rho(rho, (0.0, 0.3), 2.0), [np.sqrt(0.3 / 2.0), 0.05])
    # both ends above 2ρ²: the given ρ
    assert np.allclose(edge_rho(rho, (7.0, 9.0), 9.0), rho)
    # no node bends at all (a linear model): the given ρ, never 0
    assert np.allclose(edge_rho(rho, (0.0, 0.0), 0.0), rho)


def _rows_apart(rows=(1, 7, 40, 300), d=5, seed=12):
    """The newuser6 reproducer, smaller: least squares / N per client, a server ridge 1e-3."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=d)
    w, prob = fm.Variable(d, name="w"), fm.Problem()
    for i, m in enumerate(rows):
        X = rng.normal(size=(m, d)) + 0.5 * i
        y = X @ truth + 0.3 * rng.normal(size=m) + i
        c = prob.add_client()
        c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)) / sum(rows))
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    return prob, w


@pytest.mark.parametrize("graph", ["ring", "erdos_renyi"])
def test_dc_clients_of_very_different_sizes_reach_cvxpy(graph):
    prob, w = _rows_apart()
    reference = prob.solve("cvxpy")
    topology = topologies.ring(prob) if graph == "ring" else topologies.erdos_renyi(prob, 0.6, seed=1)
    # (one uniform ρ = 1, `adaptive_rho=False`: both 3.1e-2 away after these 300 iterations;
    # with the curvatures: converged in 22 / 25)
    res = prob.solve(DALD(max_iterations=300), topology=topology)
    assert res.status == "converged"
    x, x_star = res.value(w), reference.value(w)
    assert np.max(np.abs(x - x_star)) <= 1e-4 * np.max(np.abs(x_star))
    assert fm.verify(res, reference).ok
