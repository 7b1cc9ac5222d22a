"""Topologies as plain networkx graphs (docs/api.md §3): nodes are client names plus "server" where
there is one, node attribute `role` is "server" or "client". Builders, validation, DALD's
coordination hierarchy and a PNG drawer (matplotlib imported only when drawing)."""
from .builders import (complete, erdos_renyi, from_networkx, grid, path, random_regular, ring,
                       star)
from .draw import draw
from .hierarchy import coordination_order, hierarchy, hierarchy_matrix, solve_order
from .validate import client_names, has_server, neighbors, require_clients, server_node, validate

__all__ = [
    "client_names", "star", "path", "ring", "complete", "grid", "erdos_renyi", "random_regular",
    "from_networkx", "hierarchy", "coordination_order", "solve_order", "hierarchy_matrix",
    "validate", "has_server", "server_node", "neighbors", "draw", "require_clients",
]
