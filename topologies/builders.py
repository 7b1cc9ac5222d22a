"""Graph builders: each returns a `networkx.Graph` whose nodes are the problem's client names
(in the problem's order), plus "server" for the star; node attribute `role` is "server" or
"client"; graph attribute `kind` names the builder."""
from __future__ import annotations

import itertools
import math
import random
from typing import Any

from typing import TYPE_CHECKING

from fedmodel.errors import TopologyError

from .validate import SERVER, client_names, require_clients, validate

if TYPE_CHECKING:      # networkx is imported by the builders when called (see validate.py)
    import networkx as nx

MAX_TRIES = 100


def _clients_graph(problem: Any, kind: str, minimum: int = 1) -> tuple[nx.Graph, list[str]]:
    import networkx as nx
    names = require_clients(problem, kind, minimum)
    G = nx.Graph(kind=kind)
    G.add_nodes_from(names, role="client")
    return G, names


def _relabeled(H: nx.Graph, names: list[str], G: nx.Graph) -> nx.Graph:
    """Copy the integer-labelled edges of H onto G, whose nodes are `names` (0..n-1 in order)."""
    G.add_edges_from((names[a], names[b]) for a, b in H.edges)
    return G


def star(problem: Any) -> nx.Graph:
    """Server + clients, one edge server–client each (n edges)."""
    G, names = _clients_graph(problem, "star")
    G.add_node(SERVER, role="server")
    G.add_edges_from((SERVER, name) for name in names)
    return G


def path(problem: Any) -> nx.Graph:
    """Chain of the clients in the problem's order (n − 1 edges); DALD's linear routing."""
    G, names = _clients_graph(problem, "path")
    G.add_edges_from(zip(names, names[1:]))
    return G


def ring(problem: Any) -> nx.Graph:
    """Cycle through the clients in order (n edges for n ≥ 3; 2 clients give one edge)."""
    import networkx as nx
    G, names = _clients_graph(problem, "ring")
    G.add_edges_from(zip(names, names[1:] + names[:1]))
    G.remove_edges_from(list(nx.selfloop_edges(G)))
    return G


def complete(problem: Any) -> nx.Graph:
    """Every pair of clients joined (n(n − 1)/2 edges)."""
    G, names = _clients_graph(problem, "complete")
    G.add_edges_from(itertools.combinations(names, 2))
    return G


def grid(problem: Any, rows: int, cols: int) -> nx.Graph:
    """rows × cols lattice, clients placed row by row; node attribute `pos` = (col, −row)."""
    G, names = _clients_graph(problem, "grid")
    if rows < 1 or cols < 1 or rows * cols != len(names):
        raise TopologyError(f"grid {rows}x{cols} has {rows * cols} cells but the problem has "
                            f"{len(names)} clients; choose rows*cols == {len(names)}")
    at = {(r, c): names[r * cols + c] for r in range(rows) for c in range(cols)}
    for (r, c), name in at.items():
        G.nodes[name]["pos"] = (float(c), float(-r))
        if c + 1 < cols:
            G.add_edge(name, at[r, c + 1])
        if r + 1 < rows:
            G.add_edge(name, at[r + 1, c])
    G.graph.update(rows=rows, cols=cols)
    return G


def _sample_connected(kind: str, n: int, sample, seed: int | None,
                      hint: str) -> tuple[nx.Graph, int]:
    import networkx as nx
    rng = random.Random(seed)
    for attempt in range(1, MAX_TRIES + 1):
        H = sample(rng)
        if nx.is_connected(H):
            return H, attempt
    raise TopologyError(f"{kind} graph on {n} clients was disconnected in all {MAX_TRIES} "
                        f"samples (seed={seed!r}); {hint}")


def erdos_renyi(problem: Any, p: float, seed: int | None = None) -> nx.Graph:
    """G(n, p) random graph, resampled (reproducibly from `seed`) until connected, ≤ 100 tries.
    Graph attributes `p`, `seed`, `attempts` record how it was drawn."""
    import networkx as nx
    G, names = _clients_graph(problem, "erdos_renyi")
    if not 0.0 <= p <= 1.0:
        raise TopologyError(f"edge probability p={p} must be in [0, 1]")
    n = len(names)
    H, attempts = _sample_connected(
        "Erdős–Rényi", n, lambda rng: nx.gnp_random_graph(n, p, seed=rng), seed,
        f"increase p (connectivity needs p well above ln(n)/n = {math.log(n) / n:.3g})")
    G.graph.update(p=p, seed=seed, attempts=attempts)
    return _relabeled(H, names, G)


def random_regular(problem: Any, degree: int, seed: int | None = None) -> nx.Graph:
    """Random `degree`-regular graph, resampled (reproducibly from `seed`) until connected."""
    import networkx as nx
    G, names = _clients_graph(problem, "random_regular")
    n = len(names)
    if degree < 0 or degree >= n or (n * degree) % 2:
        raise TopologyError(f"no {degree}-regular graph on {n} clients: need 0 <= degree < {n} "
                            f"and degree*n even")
    if n > 1 and (degree == 0 or (degree == 1 and n > 2)):
        raise TopologyError(f"a {degree}-regular graph on {n} clients is always disconnected; "
                            f"use degree >= 2")
    H, attempts = _sample_connected(
        "random regular", n, lambda rng: nx.random_regular_graph(degree, n, seed=rng), seed,
        "use a larger degree")
    G.graph.update(degree=degree, seed=seed, attempts=attempts)
    return _relabeled(H, names, G)


def from_networkx(G: nx.Graph, problem: Any) -> nx.Graph:
    """Adopt a user graph without relabelling: its nodes must be exactly the client names,
    optionally plus "server". Returns a copy with `role` set and validated (connected)."""
    import networkx as nx
    if not isinstance(G, nx.Graph):
        raise TopologyError(f"from_networkx needs a networkx graph, got {type(G).__name__}")
    names = client_names(problem)
    extra = sorted(str(n) for n in G.nodes if n not in set(names) and n != SERVER)
    if extra:
        raise TopologyError(f"nodes {extra} match no client of the problem (clients: {names}); "
                            f"relabel them with networkx.relabel_nodes(G, mapping) first")
    out = G.copy()
    for node in out.nodes:
        out.nodes[node]["role"] = "server" if node == SERVER else "client"
    out.graph.setdefault("kind", "custom")
    validate(out, names)
    return out
