"""Check that a graph fits a problem: one node per client (by name), at most one server,
connected. Also the small queries backends need (`has_server`, `server_node`, `neighbors`).

networkx (~0.2 s CPU to import) is imported by the functions that touch a graph, in this package's
modules alike: a server backend's default star is never built (`backends.common.require_star`),
so `import fedmodel.backends` and a solve on it do not import networkx."""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fedmodel.errors import TopologyError

if TYPE_CHECKING:
    import networkx as nx

SERVER = "server"
ROLES = ("server", "client")


def client_names(problem: Any) -> list[str]:
    """Client names of `problem`: a `Problem` (anything with `.clients`, items with `.name`) or a
    plain list of names. Raises TopologyError on duplicates or a client named "server"."""
    if isinstance(problem, str):
        raise TopologyError(f"expected a Problem or a list of client names, got the string "
                            f"{problem!r}; wrap a single name in a list: [{problem!r}]")
    items = getattr(problem, "clients", problem)
    if isinstance(items, Mapping):
        items = list(items)
    try:
        items = list(items)
    except TypeError:
        raise TopologyError(f"expected a Problem (with .clients) or a list of client names, got "
                            f"{type(problem).__name__}") from None
    names: list[str] = []
    for item in items:
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if not isinstance(name, str) or not name:
            raise TopologyError(f"client {item!r} has no usable name; clients must be non-empty "
                                f"strings or objects with a .name string")
        names.append(name)
    if SERVER in names:
        raise TopologyError("a client is named 'server', which is reserved for the server node; "
                            "rename the client")
    duplicates = sorted(n for n, count in Counter(names).items() if count > 1)   # O(n), not O(n²)
    if duplicates:
        raise TopologyError(f"duplicate client names {duplicates}; client names must be unique")
    return names


def require_clients(problem: Any, kind: str, minimum: int = 1) -> list[str]:
    """`client_names(problem)`, raising TopologyError when there are fewer than `minimum` for a
    `kind` topology (the builders' check, also a server backend's for its default star)."""
    names = client_names(problem)
    if len(names) < minimum:
        raise TopologyError(f"{kind} topology needs at least {minimum} client(s), the problem "
                            f"has {len(names)}; add clients with problem.add_client(...)")
    return names


def _is_server(G: nx.Graph, node: Any) -> bool:
    default = "server" if node == SERVER else "client"
    return G.nodes[node].get("role", default) == "server"


def server_node(G: nx.Graph) -> str | None:
    """The node with role "server" (a node named "server" without a role counts), or None."""
    servers = [n for n in G.nodes if _is_server(G, n)]
    if len(servers) > 1:
        raise TopologyError(f"graph has {len(servers)} server nodes {sorted(map(str, servers))}; "
                            f"exactly one node may have role 'server'")
    return servers[0] if servers else None


def has_server(G: nx.Graph) -> bool:
    """True when the graph has a server node."""
    return server_node(G) is not None


def neighbors(G: nx.Graph, node: Any) -> list:
    """Neighbours of `node` (successors for a directed graph), in the graph's insertion order."""
    if node not in G:
        raise TopologyError(f"node {node!r} is not in the graph; its nodes are {list(G.nodes)}")
    return list(G.neighbors(node))


def _components(G: nx.Graph) -> list[list[str]]:
    import networkx as nx
    parts = nx.weakly_connected_components(G) if G.is_directed() else nx.connected_components(G)
    return sorted((sorted(map(str, c)) for c in parts), key=lambda c: (-len(c), c))


def validate(G: Any, problem: Any, need_server: bool = False) -> None:
    """Raise TopologyError unless `G` is a non-empty, connected networkx graph whose nodes are
    exactly the problem's clients, plus at most one server (exactly one when `need_server`)."""
    import networkx as nx
    if not isinstance(G, nx.Graph):
        raise TopologyError(f"topology must be a networkx graph, got {type(G).__name__}; build one "
                            f"with topologies.star(problem), topologies.ring(problem), ...")
    if G.number_of_nodes() == 0:
        raise TopologyError("topology graph is empty; it needs one node per client (and a "
                            "'server' node for server-based algorithms)")
    clients = client_names(problem)
    bad_roles = sorted(str(n) for n, r in G.nodes(data="role") if r is not None and r not in ROLES)
    if bad_roles:
        raise TopologyError(f"nodes {bad_roles} have a role other than 'server' or 'client'; set "
                            f"G.nodes[n]['role'] to one of those")
    known = set(clients)
    unknown = sorted(str(n) for n in G.nodes if n not in known and not _is_server(G, n))
    if unknown:
        raise TopologyError(f"nodes {unknown} match no client of the problem (clients: "
                            f"{clients}); rename them to client names or remove them")
    missing = [c for c in clients if c not in G]
    if missing:
        raise TopologyError(f"clients {missing} are not nodes of the topology; add them, e.g. "
                            f"rebuild it with a builder such as topologies.ring(problem)")
    server = server_node(G)  # raises when there are several
    if server is not None and server in known:
        raise TopologyError(f"node {server!r} is a client of the problem but has role 'server'; "
                            f"set its role to 'client' and add a separate 'server' node")
    if need_server and server is None:
        raise TopologyError("this algorithm needs a server, but no node has role 'server'; use "
                            "topologies.star(problem) or add a node 'server' with role='server'")
    parts = _components(G)
    if len(parts) > 1:
        listed = "; ".join("{" + ", ".join(p) + "}" for p in parts)
        raise TopologyError(f"topology is disconnected: {len(parts)} components {listed}; add "
                            f"edges joining them")
