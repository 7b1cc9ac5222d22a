"""fedmodel as a new user, round 8 (issue 25; docs/BENCHMARKS.md "new user, round 8"): graphs as
networkx users build them (self-loops), and verify's flat-minimizer test on many records."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import fedmodel as fm


def _least_squares(n=5, m=40, d=6):
    """Σ_i ‖A_i w − b_i‖²/(n m) over n clients whose b_i are shifted by i (the clients disagree);
    returns the problem, w and the normal equations' answer."""
    rng = np.random.default_rng(0)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    blocks = []
    for i in range(n):
        A = rng.normal(size=(m, d))
        b = A @ rng.normal(size=d) + rng.normal(size=m) + i
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(A, name="A") @ w - c.data(b, name="b")) / (n * m))
        blocks.append((A, b))
    A = np.vstack([a for a, _ in blocks])
    b = np.concatenate([y for _, y in blocks])
    return prob, w, np.linalg.solve(A.T @ A, A.T @ b)


def _run(prob, backend, G):
    with pytest.warns(UserWarning, match="self-loops at .* are ignored"):
        return prob.solve(backend, topology=G)


def test_dald_dc_ignores_self_loops():
    """A ring with a self-loop at every node is the ring: the same steps to the same point (the
    loops were edges with a multiplier and a penalty toward the node's own last iterate)."""
    prob, w, exact = _least_squares()
    ring = nx.cycle_graph([c.name for c in prob.clients])
    plain = prob.solve("dald", topology=fm.topologies.from_networkx(ring, prob))
    looped = ring.copy()
    looped.add_edges_from((n, n) for n in ring.nodes)
    res = _run(prob, "dald", fm.topologies.from_networkx(looped, prob))
    assert res.status == "converged" and res.info["mode"] == "dc"
    assert res.iterations == plain.iterations
    assert np.max(np.abs(res.value(w) - exact)) <= 1e-5 * np.max(np.abs(exact))


@pytest.mark.parametrize("backend", ["dald", "fedprox"])
@pytest.mark.parametrize("where", ["c0", "server"])
def test_star_with_a_self_loop_is_a_star(backend, where):
    """A star with a loop at a client or the server runs Fed-DALD-CC (FedProx refused it as "not a
    star"; DALD ran it as DC)."""
    prob, w, exact = _least_squares()
    G = fm.topologies.star(prob)
    G.add_edge(where, where)
    res = _run(prob, backend, G)
    assert res.status == "converged" and res.info["mode"] == "cc"
    assert np.max(np.abs(res.value(w) - exact)) <= 1e-5 * np.max(np.abs(exact))


@pytest.mark.parametrize("rows", [3, 40, 2000])
def test_null_space_of_tall_and_wide_maps(rows, monkeypatch):
    """verify's flat-minimizer test (solution_set.null_space) on a Jacobian with one row per record:
    the same null space as scipy's, without the full U (rows × rows: 8.5 GB at a9a's 32,561
    rows, and 16.5 s of a verify at 6,000)."""
    from scipy.linalg import null_space as scipy_null_space
    from fedmodel import solution_set
    rng = np.random.default_rng(1)
    n = 12
    J = rng.normal(size=(rows, 5)) @ rng.normal(size=(5, n))     # rank 5 (≤ rows)
    full = []
    svd = np.linalg.svd
    monkeypatch.setattr(np.linalg, "svd", lambda A, full_matrices=True: full.append(full_matrices) or svd(A, full_matrices=full_matrices))
    N = solution_set.null_space(J, n)
    S = scipy_null_space(J, rcond=solution_set.RANK)
    assert N.shape == S.shape == (n, n - min(rows, 5))
    assert np.allclose(N @ N.T, S @ S.T, atol=1e-10)            # the same subspace
    assert full == [rows < n]
