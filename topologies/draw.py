"""Draw a topology (or a DALD hierarchy) to a PNG. matplotlib is imported lazily, through its
Agg canvas only, so importing `topologies` stays fast and pyplot's global state is untouched."""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from .validate import _is_server

if TYPE_CHECKING:      # networkx: see validate.py
    import networkx as nx

CLIENT_COLOR = "#9ecae1"
SERVER_COLOR = "#fd8d3c"


def _layout(G: nx.Graph) -> dict[Any, tuple[float, float]]:
    nodes = list(G.nodes)
    if nodes and all("pos" in G.nodes[v] for v in nodes):
        return {v: tuple(map(float, G.nodes[v]["pos"])) for v in nodes}
    if nodes and all("level" in G.nodes[v] for v in nodes):  # hierarchy: level 1 at the bottom
        by_level: dict[int, list] = {}
        for v in sorted(nodes, key=lambda v: G.nodes[v].get("index", 0)):
            by_level.setdefault(G.nodes[v]["level"], []).append(v)
        return {v: (k - (len(row) - 1) / 2, float(level))
                for level, row in by_level.items() for k, v in enumerate(row)}
    centre = [v for v in nodes if _is_server(G, v)]
    ring = [v for v in nodes if v not in centre]
    pos = {v: (0.0, 0.0) for v in centre}
    for k, v in enumerate(ring):  # clients on a circle in problem order, server in the middle
        angle = math.pi / 2 - 2 * math.pi * k / max(len(ring), 1)
        pos[v] = (math.cos(angle), math.sin(angle))
    return pos


def draw(G: nx.Graph, path: str | os.PathLike, title: str | None = None) -> str:
    """Write G as a PNG at `path`: clients as blue circles, the server as an orange square,
    every node labelled, arrows for directed edges. Returns the path written (as a str)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    pos = _layout(G)
    size = min(12.0, 4.0 + 0.25 * G.number_of_nodes())
    fig = Figure(figsize=(size, size))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for u, v in G.edges:
        (x0, y0), (x1, y1) = pos[u], pos[v]
        if G.is_directed():
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=1,
                        arrowprops=dict(arrowstyle="-|>", color="0.4", shrinkA=16, shrinkB=16))
        else:
            ax.plot([x0, x1], [y0, y1], color="0.6", lw=1.2, zorder=1)
    servers = [v for v in G.nodes if _is_server(G, v)]
    clients = [v for v in G.nodes if v not in servers]
    for group, marker, color, area in ((clients, "o", CLIENT_COLOR, 700),
                                       (servers, "s", SERVER_COLOR, 1000)):
        if group:
            ax.scatter([pos[v][0] for v in group], [pos[v][1] for v in group], s=area,
                       marker=marker, c=color, edgecolors="0.2", zorder=2)
    for v in G.nodes:
        ax.text(*pos[v], str(v), ha="center", va="center", fontsize=8, zorder=3)
    handles = [Line2D([], [], ls="", marker="o", ms=10, mfc=CLIENT_COLOR, mec="0.2",
                      label=f"client ({len(clients)})")]
    if servers:
        handles.append(Line2D([], [], ls="", marker="s", ms=10, mfc=SERVER_COLOR, mec="0.2",
                              label="server"))
    fig.legend(handles=handles, loc="lower center", ncol=2, frameon=False)
    ax.set_title(title if title is not None else
                 f"{G.graph.get('kind', 'topology')}: {G.number_of_nodes()} nodes, "
                 f"{G.number_of_edges()} edges")
    ax.margins(0.15)
    ax.set_axis_off()
    fig.savefig(os.fspath(path), dpi=100)
    return os.fspath(path)
