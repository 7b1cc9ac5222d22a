"""Topologies: builders, validation, DALD's hierarchy, drawing (docs/api.md §3)."""
import subprocess
import sys
from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest

from fedmodel import topologies as topo
from fedmodel.errors import TopologyError

NAMES = ["c0", "c1", "c2", "c3", "c4"]


def roles(G):
    return dict(G.nodes(data="role"))


# ---- client_names -------------------------------------------------------------------------
def test_client_names_from_list_and_problem_like_object():
    fake = SimpleNamespace(clients=[SimpleNamespace(name="a"), SimpleNamespace(name="b")])
    assert topo.client_names(fake) == ["a", "b"]
    assert topo.client_names(NAMES) == NAMES


@pytest.mark.parametrize("bad, word", [(["a", "a"], "duplicate"), (["server"], "server"),
                                       ("abc", "string"), ([3], "name")])
def test_client_names_rejects(bad, word):
    with pytest.raises(TopologyError, match=word):
        topo.client_names(bad)


# ---- builders -----------------------------------------------------------------------------
def test_star():
    G = topo.star(NAMES)
    assert set(G.nodes) == set(NAMES) | {"server"}
    assert G.number_of_edges() == 5
    assert roles(G)["server"] == "server"
    assert sum(r == "client" for r in roles(G).values()) == 5
    assert sorted(G.neighbors("server")) == NAMES
    assert topo.server_node(G) == "server" and topo.has_server(G)


def test_star_from_problem_like_object():
    fake = SimpleNamespace(clients=[SimpleNamespace(name=n) for n in "xyz"])
    G = topo.star(fake)
    assert set(G.nodes) == {"x", "y", "z", "server"}
    assert G.number_of_edges() == 3


def test_path_ring_complete():
    P, R, K = topo.path(NAMES), topo.ring(NAMES), topo.complete(NAMES)
    for G in (P, R, K):
        assert set(G.nodes) == set(NAMES)
        assert set(roles(G).values()) == {"client"}
        assert not topo.has_server(G)
    assert P.number_of_edges() == 4
    assert list(P.edges) == [("c0", "c1"), ("c1", "c2"), ("c2", "c3"), ("c3", "c4")]
    assert R.number_of_edges() == 5 and R.has_edge("c4", "c0")
    assert all(d == 2 for _, d in R.degree)
    assert K.number_of_edges() == 10
    assert topo.ring(["a", "b"]).number_of_edges() == 1
    assert topo.path(["a"]).number_of_edges() == 0


def test_grid():
    G = topo.grid(["a", "b", "c", "d", "e", "f"], 2, 3)
    assert G.number_of_edges() == 7
    assert sorted(G.neighbors("a")) == ["b", "d"]
    assert sorted(G.neighbors("e")) == ["b", "d", "f"]
    assert G.nodes["f"]["pos"] == (2.0, -1.0)
    with pytest.raises(TopologyError, match="2x2 has 4 cells.*6 clients"):
        topo.grid(["a", "b", "c", "d", "e", "f"], 2, 2)


def test_erdos_renyi_seeded_reproducible_and_connected():
    names = [f"c{i}" for i in range(12)]
    G1 = topo.erdos_renyi(names, 0.3, seed=7)
    G2 = topo.erdos_renyi(names, 0.3, seed=7)
    assert set(G1.nodes) == set(names) and nx.is_connected(G1)
    assert sorted(G1.edges) == sorted(G2.edges)
    assert G1.graph["p"] == 0.3 and G1.graph["attempts"] >= 1
    edge_sets = {frozenset(map(frozenset, topo.erdos_renyi(names, 0.3, seed=s).edges))
                 for s in range(5)}
    assert len(edge_sets) > 1  # the seed matters
    assert topo.erdos_renyi(names, 1.0, seed=0).number_of_edges() == 66


def test_erdos_renyi_gives_up_when_never_connected():
    with pytest.raises(TopologyError, match="disconnected in all 100 samples.*increase p"):
        topo.erdos_renyi(NAMES, 0.0, seed=1)
    with pytest.raises(TopologyError, match=r"p=1.5 must be in \[0, 1\]"):
        topo.erdos_renyi(NAMES, 1.5)


def test_random_regular():
    names = [f"c{i}" for i in range(10)]
    G = topo.random_regular(names, 3, seed=4)
    assert set(G.nodes) == set(names) and nx.is_connected(G)
    assert {d for _, d in G.degree} == {3}
    assert G.number_of_edges() == 15
    assert sorted(G.edges) == sorted(topo.random_regular(names, 3, seed=4).edges)
    with pytest.raises(TopologyError, match="degree\\*n even"):
        topo.random_regular(NAMES, 3)
    with pytest.raises(TopologyError, match="always disconnected"):
        topo.random_regular(names, 1)


def test_from_networkx_sets_roles_and_checks_nodes():
    G = nx.Graph([("server", "a"), ("a", "b")])
    out = topo.from_networkx(G, ["a", "b"])
    assert roles(out) == {"server": "server", "a": "client", "b": "client"}
    assert "role" not in G.nodes["a"]  # input untouched
    with pytest.raises(TopologyError, match=r"\['zz'\] match no client"):
        topo.from_networkx(nx.Graph([("a", "b"), ("b", "zz")]), ["a", "b"])
    with pytest.raises(TopologyError, match=r"\['b'\] are not nodes"):
        topo.from_networkx(nx.Graph([("a", "server")]), ["a", "b"])


# ---- validate -----------------------------------------------------------------------------
@pytest.mark.parametrize("build", [topo.star, topo.path, topo.ring, topo.complete,
                                   lambda names: topo.erdos_renyi(names, 0.9, seed=0)])
def test_validate_accepts_builders_and_refuses_them_damaged(build):
    """Every builder's graph passes; the same graph without one client or with a stray node
    does not (a validate that accepted everything would fail here)."""
    G = build(NAMES)
    topo.validate(G, NAMES)
    missing = G.copy()
    missing.remove_node(NAMES[-1])
    stray = G.copy()
    stray.add_edge(NAMES[0], "intruder")
    for damaged in (missing, stray):
        with pytest.raises(TopologyError):
            topo.validate(damaged, NAMES)


def test_validate_not_a_graph_and_empty():
    with pytest.raises(TopologyError, match="networkx graph, got dict"):
        topo.validate({"a": ["b"]}, NAMES)
    with pytest.raises(TopologyError, match="empty"):
        topo.validate(nx.Graph(), NAMES)


def test_validate_disconnected_names_components():
    G = topo.path(NAMES)
    G.remove_edge("c1", "c2")
    with pytest.raises(TopologyError, match=r"2 components \{c2, c3, c4\}; \{c0, c1\}"):
        topo.validate(G, NAMES)


def test_validate_server_missing_or_duplicated():
    with pytest.raises(TopologyError, match="needs a server"):
        topo.validate(topo.ring(NAMES), NAMES, need_server=True)
    G = topo.star(NAMES)
    G.add_node("hub", role="server")
    G.add_edge("hub", "c0")
    with pytest.raises(TopologyError, match=r"2 server nodes \['hub', 'server'\]"):
        topo.validate(G, NAMES)


def test_validate_missing_client_and_unknown_node():
    G = topo.star(NAMES)
    G.remove_node("c3")
    with pytest.raises(TopologyError, match=r"clients \['c3'\] are not nodes"):
        topo.validate(G, NAMES)
    G = topo.star(NAMES)
    G.add_edge("ghost", "server")
    G.nodes["ghost"]["role"] = "client"
    with pytest.raises(TopologyError, match=r"nodes \['ghost'\] match no client"):
        topo.validate(G, NAMES)


def test_validate_bad_role_and_client_as_server():
    G = topo.ring(NAMES)
    G.nodes["c2"]["role"] = "boss"
    with pytest.raises(TopologyError, match=r"\['c2'\] have a role"):
        topo.validate(G, NAMES)
    G.nodes["c2"]["role"] = "server"
    with pytest.raises(TopologyError, match="'c2' is a client of the problem but has role"):
        topo.validate(G, NAMES)


def test_neighbors_helper():
    assert topo.neighbors(topo.path(NAMES), "c2") == ["c1", "c3"]
    with pytest.raises(TopologyError, match="'nope' is not in the graph"):
        topo.neighbors(topo.path(NAMES), "nope")


# ---- hierarchy (spec/dald.md §2.7, Definition 3) ------------------------------------------
def test_hierarchy_chain_from_experiment_1():
    H = topo.hierarchy(np.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]]), ["a", "b", "c"])
    assert isinstance(H, nx.DiGraph)
    assert sorted(H.edges) == [("a", "b"), ("b", "c")]
    assert [H.nodes[v]["level"] for v in "abc"] == [1, 2, 3]
    assert H.graph["levels"] == 3 and H.graph["roots"] == ["c"]
    assert topo.coordination_order(H) == [["a"], ["b"], ["c"]]
    assert topo.solve_order(H) == ["a", "b", "c"]
    assert topo.hierarchy_matrix(H) == [[1, 1, 0], [0, 1, 1], [0, 0, 0]]


def test_hierarchy_cc_with_server_root():
    m = [[1, 0, 0, 1], [0, 1, 0, 1], [0, 0, 1, 1], [0, 0, 0, 0]]
    H = topo.hierarchy(m, ["a", "b", "c"])
    assert H.nodes["server"]["role"] == "server" and H.nodes["server"]["level"] == 2
    assert topo.coordination_order(H) == [["a", "b", "c"], ["server"]]
    assert H.number_of_edges() == 3


def test_hierarchy_tree_levels_parallel_groups():
    # a, b -> c ; c, d -> e  (e root): levels a=b=d=1, c=2, e=3
    m = [[1, 0, 1, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 0, 1], [0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]
    H = topo.hierarchy(m, list("abcde"))
    assert topo.coordination_order(H) == [["a", "b", "d"], ["c"], ["e"]]
    for group in topo.coordination_order(H):  # nodes in one group never depend on each other
        assert H.subgraph(group).number_of_edges() == 0


@pytest.mark.parametrize("matrix, message", [
    ([[1, 1], [0, 0], [0, 0]], "square"),
    ([[0, 1], [0, 0]], r"diagonal a\[0\]\[0\] = 0 must equal the out-degree 1 of node 'a'"),
    ([[1, 2], [0, 0]], r"a\[0\]\[1\] = 2 .* must be 0 or 1"),
    ([[1, 1], [1, 1]], "cycle a → b → a"),
    ([[0, 0], [0, 0]], r"disconnected: components \[\['a'\], \['b'\]\]"),
    ([[0] * 4] * 4, "4x4 but the problem has 2 clients"),
])
def test_hierarchy_rejects(matrix, message):
    with pytest.raises(TopologyError, match=message):
        topo.hierarchy(matrix, ["a", "b"])


# ---- draw & import hygiene ----------------------------------------------------------------
def test_draw_writes_png(tmp_path):
    out = topo.draw(topo.star(NAMES), tmp_path / "star.png")
    data = (tmp_path / "star.png").read_bytes()
    assert out == str(tmp_path / "star.png")
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    H = topo.hierarchy([[1, 1, 0], [0, 1, 1], [0, 0, 0]], ["a", "b", "c"])
    topo.draw(H, tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 5000


def test_import_does_not_load_matplotlib():
    code = "import sys, fedmodel.topologies; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
