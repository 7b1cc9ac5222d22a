"""DALD's hierarchical matrix (spec/dald.md §2.7, Definition 3) as a coordination DiGraph.

Encoding
--------
Matrix H = [a_ij], n × n. Row/column k is the k-th client of the problem; when n is one more
than the number of clients, the last row/column is "server" (the root in Fed-DALD-CC).
`a_ij = 1` (i ≠ j) means node i is a direct descendant of node j: a directed edge i → j,
information flows from i up to j, and j computes only after i. The diagonal `a_ii` must equal
the out-degree of node i (Def. 3). Entries are 0/1 off the diagonal; the graph must be acyclic
and weakly connected.

The returned `networkx.DiGraph` has node attributes
  `role`  "server" | "client",
  `index` the node's 0-based row in the matrix,
  `level` 1 for nodes without descendants (the bottom level, solved first), otherwise
          1 + the highest level among its direct descendants (so every edge goes to a higher level
          and nodes of one level never depend on each other),
and graph attributes `kind` = "hierarchy", `levels` (number of levels), `roots` (nodes with
out-degree 0, solved last), `matrix` (the matrix as a list of int lists).

Example (Exp. 1): [[1,1,0],[0,1,1],[0,0,0]] on clients a, b, c → a → b → c, levels 1, 2, 3,
coordination order [[a], [b], [c]]. Fed-DALD-CC: every client row has a 1 in the server column
(diagonal 1), server row zero → clients level 1 (parallel), server level 2.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedmodel.errors import TopologyError

from .validate import SERVER, client_names

if TYPE_CHECKING:      # networkx is imported by `hierarchy` when called (see validate.py)
    import networkx as nx


def _as_rows(matrix: Any) -> list[list[float]]:
    rows = matrix.tolist() if hasattr(matrix, "tolist") else matrix
    try:
        rows = [[float(x) for x in row] for row in rows]
    except (TypeError, ValueError):
        raise TopologyError("hierarchical matrix must be a square 2-D array of numbers") from None
    n = len(rows)
    if n == 0 or any(len(row) != n for row in rows):
        raise TopologyError(f"hierarchical matrix must be square and non-empty, got row lengths "
                            f"{[len(r) for r in rows]}")
    return rows


def hierarchy(matrix: Any, problem: Any) -> nx.DiGraph:
    """Coordination hierarchy of DALD from its hierarchical matrix (see the module docstring
    for the encoding). Raises TopologyError on a malformed matrix, a cycle or a disconnected
    hierarchy."""
    import networkx as nx
    rows = _as_rows(matrix)
    clients = client_names(problem)
    n = len(rows)
    if n == len(clients):
        names = clients
    elif n == len(clients) + 1:
        names = clients + [SERVER]
    else:
        raise TopologyError(f"hierarchical matrix is {n}x{n} but the problem has {len(clients)} "
                            f"clients; use {len(clients)}x{len(clients)} (clients only) or "
                            f"{len(clients) + 1}x{len(clients) + 1} (clients, then the server)")
    H = nx.DiGraph(kind="hierarchy")
    for k, name in enumerate(names):
        H.add_node(name, role="server" if name == SERVER else "client", index=k)
    for i, row in enumerate(rows):
        for j, a in enumerate(row):
            if i != j and a not in (0.0, 1.0):
                raise TopologyError(f"hierarchical matrix entry a[{i}][{j}] = {a:g} (node "
                                    f"{names[i]!r} → {names[j]!r}) must be 0 or 1")
            if i != j and a == 1.0:
                H.add_edge(names[i], names[j])
        if row[i] != H.out_degree(names[i]):
            raise TopologyError(f"diagonal a[{i}][{i}] = {row[i]:g} must equal the out-degree "
                                f"{H.out_degree(names[i])} of node {names[i]!r} (Definition 3)")
    if not nx.is_directed_acyclic_graph(H):
        cycle = [u for u, _ in nx.find_cycle(H)]
        raise TopologyError(f"hierarchy has a cycle {' → '.join(cycle + cycle[:1])}; a node "
                            f"cannot be its own descendant")
    if n > 1 and not nx.is_weakly_connected(H):
        parts = sorted(sorted(c) for c in nx.weakly_connected_components(H))
        raise TopologyError(f"hierarchy is disconnected: components {parts}; link each to a "
                            f"common root")
    for node in nx.topological_sort(H):
        below = [H.nodes[d]["level"] for d in H.predecessors(node)]
        H.nodes[node]["level"] = 1 + max(below, default=0)
    H.graph.update(levels=max(lvl for _, lvl in H.nodes(data="level")),
                   roots=[v for v in names if H.out_degree(v) == 0],
                   matrix=[[int(a) for a in row] for row in rows])
    return H


def coordination_order(H: nx.DiGraph) -> list[list[str]]:
    """Groups of nodes by level, bottom level first; nodes in a group run in parallel, groups
    run one after another (Gauss–Seidel across levels). Within a group: matrix order."""
    if H.number_of_nodes() == 0 or any("level" not in d for _, d in H.nodes(data=True)):
        raise TopologyError("coordination_order needs a graph built by topologies.hierarchy "
                            "(nodes carry a 'level' attribute)")
    key = lambda v: H.nodes[v].get("index", 0)  # noqa: E731
    groups: dict[int, list[str]] = {}
    for node in sorted(H.nodes, key=key):
        groups.setdefault(H.nodes[node]["level"], []).append(node)
    return [groups[level] for level in sorted(groups)]


def solve_order(H: nx.DiGraph) -> list[str]:
    """The flat Gauss–Seidel sequence S: `coordination_order(H)` concatenated."""
    return [node for group in coordination_order(H) for node in group]


def hierarchy_matrix(H: nx.DiGraph) -> list[list[int]]:
    """Inverse of `hierarchy`: Definition 3's matrix of H in its node order (`index`)."""
    names = sorted(H.nodes, key=lambda v: H.nodes[v].get("index", 0))
    pos = {v: k for k, v in enumerate(names)}
    out = [[0] * len(names) for _ in names]
    for u, v in H.edges:
        out[pos[u]][pos[v]] = 1
    for v in names:
        out[pos[v]][pos[v]] = H.out_degree(v)
    return out
