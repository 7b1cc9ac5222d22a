"""Fed-DALD-DC (Algorithm 3, any connected graph other than a star): nodes solve (20) one after
another in the coordination sequence S (Gauss–Seidel; nodes with no edge between them run in one
parallel batch), each edge {i, j} with i before j in S carries C_ij = x_i − x_j and μ_ij,
updated by (21). Global (server-block) constraints and terms: the server block's program becomes
one more node, co-located with a designated client (`server_host`, default: the last client of
S), joined to it by one consensus edge and solved right after it in S.

Messages between peers are relayed by the coordinator (the executor has no peer-to-peer
channel), so the ledger books a peer message i → j as coordinator → j. The coordinator keeps the
models as one (N, d) array, rows in the order S; an inner iteration is one `GaussSeidelSweep`.
Node steps: `dc_nodes`.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from fedmodel import topologies

if TYPE_CHECKING:         # networkx is imported where a graph is built: a star run never needs it
    import networkx as nx
from fedmodel.errors import TopologyError
from fedmodel.runtime.executor import Executor, stack_replies
from fedmodel.runtime.messages import MESSAGES, check_payload
from ..common import progress
from . import kernels
from ..outcome import Outcome, Status


class GaussSeidelSweep:
    """One sweep of (20) in S: the batches one after another, each a `dald_dc_solve` request to
    its nodes (nodes of one batch share no edge), every reply's x relayed to the node's
    `neighbors` (`dald_dc_receive`, {"neighbor": node, "x": x}) before the next batch starts.
    An executor that serves the whole sweep as one block (the stacked form of `dald_dc_sweep`:
    the batched executor, for a sweep of one client group) does so, and the ledger books the
    messages the sweep stands for, as node by node."""

    def __init__(self, ex: Executor, neighbors: dict[str, Sequence[str]]):
        self.ex, self.neighbors = ex, neighbors
        self._relays: tuple = ((), ())     # (sweep nodes, their relay targets): the same every round
        self._flat: tuple = (None, ())     # (the batches last swept, their nodes as one tuple)
        self._trips: tuple = (None, 0, 0)  # (the batches last swept, their solve and relay trips)

    def __call__(self, batches: Sequence[Sequence[str]], opts: dict[str, Any]) -> dict[str, Any]:
        """The replies stacked (`Executor.map_stacked` layout) in sweep order: the nodes of
        `batches`, flattened."""
        if self._flat[0] is not batches:   # (a run passes the same batches every full sweep)
            self._flat = (batches, tuple(node for batch in batches for node in batch))
        nodes = self._flat[1]
        block = self.ex.map_stacked("dald_dc_sweep", nodes, common=opts, split=False)
        if block is not None:
            self._book(nodes, opts)
            self._book_round_trips(batches, nodes)
            return block
        replies = []
        for batch in batches:
            out = self.ex.map("dald_dc_solve", {node: dict(opts) for node in batch})
            for node in batch:
                replies.append(out[node])
                self.ex.map("dald_dc_receive", {j: {"neighbor": node, "x": out[node]["x"]}
                                                for j in self.neighbors[node]})
        return stack_replies(MESSAGES["dald_dc_solve"], replies)

    def _book(self, nodes: tuple[str, ...], opts: dict[str, Any]) -> None:
        """The ledger of a sweep served as one block: each node's solve request (the options)
        and reply (x and steps), and each relay of its new x to a neighbour (no reply data)."""
        ledger, d, solve = self.ex.ledger, self.ex.model_size, MESSAGES["dald_dc_solve"]
        ledger.record_group(nodes, "dald_dc_solve", check_payload(solve, solve.request, opts, d, "request"),
                            down=True)
        ledger.record_group(nodes, "dald_dc_solve", d + 1, down=False)
        if self._relays[0] != nodes:
            self._relays = (nodes, tuple(j for node in nodes for j in self.neighbors[node]))
        ledger.record_group(self._relays[1], "dald_dc_receive", d, down=True)
        ledger.record_group(self._relays[1], "dald_dc_receive", 0, down=False)

    def _book_round_trips(self, batches: Sequence[Sequence[str]], nodes: tuple[str, ...]) -> None:
        """The round trips of a sweep served as one block, as the node-by-node sweep books them
        (`Ledger.exchange`): one solve per parallel batch, one relay per node with neighbours."""
        if self._trips[0] is not batches:
            solves = sum(any(n != "server" for n in batch) for batch in batches)
            relays = sum(any(j != "server" for j in self.neighbors[n]) for n in nodes)
            self._trips = (batches, solves, relays)
        self.ex.ledger.exchange("dald_dc_solve", nodes, times=self._trips[1])
        self.ex.ledger.exchange("dald_dc_receive", nodes, times=self._trips[2])


def colour_order(H: nx.Graph, order: list[str]) -> list[str]:
    """A coordination sequence S whose parallel batches are the colour classes of a greedy
    colouring of H (networkx, largest degree first): nodes of one colour share no edge, so they
    solve (20) at once, and a sweep takes as many sequential steps as colours (2–3 on a ring)
    instead of up to one per node. Within a colour, nodes keep their order in `order`."""
    import networkx as nx
    colour = nx.coloring.greedy_color(H, strategy="largest_first")
    position = {n: i for i, n in enumerate(order)}
    return sorted(order, key=lambda n: (colour[n], position[n]))


# DALD-DC's default constraint penalty is 2ρ² (the paper's ‖ρ∘h‖² ⇔ (β/2)‖h‖²), but at least
# BETA_FLOOR: the equilibrated objective's curvature along the probe's direction is one and each
# constraint row unit-sized (fedmodel/compiler/scaling.py), so the dual function's curvature
# ∇c H⁻¹ ∇cᵀ is about one and the multiplier step β·c moves μ about β of the way to its value
# per outer step. 2ρ² at ρ = 0.1 (what a ring needs for x̂, builtin_models) is 0.02: the built-in
# model hit its 3,000-iteration cap on a ring and "stalled" on a complete graph; β = 1: 244 and
# 396 iterations, verified (docs/BENCHMARKS.md, branch pxrounds). Unchanged for ρ ≥ 1/√2.
BETA_FLOOR = 1.0

# Edge penalties from the nodes' curvatures (`adaptive_rho`; the paper's ρ_ij is any positive
# vector per edge, (18) and (21); its experiments use ρ = 1 everywhere): 2ρ_ij² = min(c_i, c_j),
# c_i the node's curvature at x⁰ (`dc_nodes.curvature`, one scalar sent with `dald_dc_init`),
# never above the given 2ρ² and never below CURVATURE_FLOOR × the largest c_i. Why: with a
# penalty far above every node's curvature the nodes agree early and their common point then
# creeps (the sweep's change, D (80), is the last residual to pass). Clients of 1–5,000 rows
# (c from 4e-5 to 1, the default 2ρ² = 2): ring 1,993 iterations → 39, Erdős–Rényi 2,279 → 29;
# five equal clients 902 → 60 (docs/BENCHMARKS.md, branch dcrows). A node that does not bend
# (a constraint-only server block, a pure ℓ1 term) leaves its edges to the other end: the
# centralized form's slack-only server at the floor went from max_iterations 2.9e-3 away to
# 0.22 (ring).
CURVATURE_FLOOR = 1e-2


def without_self_loops(G: nx.Graph, name: str) -> nx.Graph:
    """G without its self-loops, saying so: a node always agrees with itself, so a loop is no
    consensus edge. Kept, Fed-DALD-DC gave it a multiplier and a penalty toward the node's own
    last iterate (a ring of a9a clients of 1–5,000 rows ended 0.21 from CVXPY after 1,000 steps
    where the plain ring ended 0.013), and a star with a loop ran as DC, or was refused as "not a
    star" by FedProx / FedAvg (docs/BENCHMARKS.md, newuser8)."""
    loops = [(u, v) for u, v in G.edges() if u == v]
    if not loops:
        return G
    warnings.warn(f"{name}: the topology's self-loops at {sorted({str(u) for u, _ in loops})} are "
                  "ignored (a node is always in consensus with itself)", UserWarning, stacklevel=5)
    G = G.copy()
    G.remove_edges_from(loops)
    return G


def edge_rho(rho: np.ndarray, ends: tuple[float, float], largest: float) -> np.ndarray:
    """ρ_ij of an edge whose ends have curvatures `ends` (above; an end with none does not
    count), from the given ρ (a (d,) row); ρ itself where neither end has a curvature.

    >>> edge_rho(np.ones(2), (0.5, 0.02), 1.0)
    array([0.1, 0.1])
    """
    bending = [c for c in ends if c > 0.0]
    if not bending:
        return rho
    return np.minimum(rho, np.sqrt(max(CURVATURE_FLOOR * largest, min(bending)) / 2.0))


class FedDALDDC:
    """The Fed-DALD-DC loop of `DALD` (a mixin: options and shared steps live in `DALD`)."""

    def _dc_beta(self) -> float:
        """β of the constraints' augmented Lagrangian on a DC graph: `beta`, else
        max(2ρ², BETA_FLOOR) (above)."""
        if self.beta is not None or isinstance(self.rho, dict):
            return self._beta()
        return max(self._beta(), BETA_FLOOR)

    def _edge_rho(self, edge: tuple[str, str], d: int, bends: dict[str, float]) -> np.ndarray:
        """ρ of `edge`: the given one (a dict of edges; `adaptive_rho` off, as in the paper),
        else from its ends' curvatures `bends` (`edge_rho`)."""
        rho = self._rho(edge, d)
        if not self.adaptive_rho or isinstance(self.rho, dict):
            return rho
        return edge_rho(rho, (bends[edge[0]], bends[edge[1]]), max(bends.values()))

    def _dc_graph(self, problem, G, U, server_used):
        """Coordination sequence S, the undirected DC graph, and the batches of S that can run
        in parallel (consecutive nodes with no edge between them)."""
        import networkx as nx
        H = nx.Graph(U)
        clients = [c.name for c in problem.clients]
        if self.order is not None and self.order != "colour":
            order = list(self.order)
        elif G.is_directed() and all("level" in data for _, data in G.nodes(data=True)):
            order = topologies.solve_order(G)
        else:
            order = clients + (["server"] if "server" in H else [])
        if "server" not in H and server_used:                        # host the server block
            host = self.server_host or [n for n in order if n != "server"][-1]
            if host not in H:
                raise TopologyError(f"server_host {host!r} is not a node of the topology")
            H.add_edge(host, "server")
            order = order[:order.index(host) + 1] + ["server"] + order[order.index(host) + 1:]
        if self.order == "colour":
            order = colour_order(H, order)
        if sorted(order, key=str) != sorted(H.nodes, key=str):
            raise TopologyError(f"coordination order {order} must list every node of the DC graph "
                                f"{sorted(H.nodes, key=str)} exactly once")
        batches: list[list[str]] = []
        for node in order:
            if batches and not any(H.has_edge(node, other) for other in batches[-1]):
                batches[-1].append(node)
            else:
                batches.append([node])
        return H, order, batches

    def _dc(self, problem, G, U, ex, x0, d, server_used, callback, verbose, start, ckpt):
        """The coordinator's view of the iterates is one (N, d) array X, rows in the order S;
        each inner iteration is one Gauss–Seidel sweep (`GaussSeidelSweep`)."""
        H, order, batches = self._dc_graph(problem, G, U, server_used)
        beta = self._dc_beta()
        position = {n: i for i, n in enumerate(order)}
        neighbors = {n: list(H.neighbors(n)) for n in order}
        bends = ex.map("dald_dc_init", {n: {"x0": x0, "beta": beta} for n in order})
        bends = {n: float(bends[n]["curvature"]) for n in order}
        # every node's edge ends in one mapped request (one round trip; one per end was 2 per edge)
        edge = lambda n, j: (n, j) if position[n] < position[j] else (j, n)   # noqa: E731
        ex.map("dald_dc_links", {n: {"neighbors": list(neighbors[n]),
                                     "rho": [self._edge_rho(edge(n, j), d, bends) for j in neighbors[n]],
                                     "after": [float(position[j] > position[n]) for j in neighbors[n]],
                                     "x": x0} for n in order if neighbors[n]})
        gauss_seidel = GaussSeidelSweep(ex, neighbors)
        moving = np.array([any(position[j] < position[n] for j in neighbors[n]) for n in order], dtype=bool)
        X = np.tile(x0, (len(order), 1))          # not the bottom nodes: they enter D (80)
        history, total, status, k, info = [], 0, Status.MAX_ITERATIONS, 0, {}
        bar = progress(self.max_iterations, verbose, "DALD-DC")
        opts = self._opts()
        constrained = bool(problem.constraints)     # (a list over every block: once per run)
        full_sweep = [batch for batch in batches if batch]
        watch, saved = self._resume(ckpt, ex)   # docs/checkpoints.md
        if saved:
            k, total, X, history = saved["k"], saved["total"], saved["x"], saved["history"]
        while total < self.max_iterations:
            k += 1
            v = 0
            while True:                                                  # inner loop (Step 1)
                v += 1
                total += 1
                previous = X
                part = self._participants(order, total)
                if len(part) == len(order):     # everyone: the same sweep every time
                    sweep = full_sweep
                else:
                    part = set(part)
                    sweep = [[n for n in batch if n in part] for batch in batches]
                    sweep = [batch for batch in sweep if batch]
                reply = gauss_seidel(sweep, opts)                           # (20) in S
                solved = order if sweep is full_sweep else [n for batch in sweep for n in batch]
                if len(solved) == len(order):
                    X = reply["x"]                   # never written in place (may be read-only)
                else:
                    X = X.copy()
                    X[[position[n] for n in solved]] = reply["x"]
                dual, _ = kernels.largest_change(X, previous, moving)   # D (80)
                sound = not watch.check(total, **{"x_i (node models)": X})   # non-finite or growth
                if not sound or self._inner_done(k, v, dual) or total >= self.max_iterations:
                    break
            if not sound:          # keep the last sound sweep; the caller sees "diverged"
                status, X = watch.report(info), previous
                break
            replies = ex.map_stacked("dald_dc_dual", order, common={"consensus": float(self.dual_updates)})  # (21)
            primal = float(np.max(replies["primal"]))
            dmu = float(np.max(replies["dmu"]))
            last = self._converged(primal, dual, dmu, beta) or total >= self.max_iterations
            record = self._record_dc(ex, order, X, k, v, total, primal, dual, dmu / beta, start,
                                     last or k % self.report_every == 0)
            # a node's own multiplier still letting go (`local.unwinding`), for the stall rule
            record["unwinding"] = float(np.max(replies["unwind"], initial=0.0))
            stop = self._outer_step_done(record, history, callback, bar, order, X, constrained,
                                         primal, dual, dmu, beta)
            if stop:
                status = stop
                break
            self._save(ckpt, ex, k, watch, k=k, total=total, x=X, history=history)
        bar.close()
        clients = [n for n in order if n != "server"]
        rows = [position[c] for c in clients]
        shared = X[position["server"]].copy() if "server" in position and server_used else \
            X[rows].sum(axis=0) / len(clients)
        ex.ledger.rounds = total
        consensus = {}
        for n, m in ex.map("dald_state", {n: {} for n in order}).items():
            edges = m["mu"] if isinstance(m["mu"], dict) else {}   # (a node with no edges: none)
            for j, mu in edges.items():
                if position[n] < position[j]:
                    consensus[(n, j)] = mu
        info.update(consensus_multipliers=consensus, order=order, sweep_steps=len(batches), curvatures=bends,
                    client_values={n: X[i].copy() for i, n in enumerate(order)})
        return Outcome(status, shared=shared, history=history, iterations={"outer": k, "inner": total},
                       info=info)

    def _record_dc(self, ex, order, X, k, v, total, primal, dual, constraint, start, report=True) -> dict:
        """`_record_cc` at each node's own iterate (the rows of X)."""
        if not report:
            return self._record(k, v, total, primal, dual, constraint, start)
        reports = ex.map_stacked("report", order, rows={"x": X})
        objective, violation = float(np.sum(reports["objective"])), float(np.max(reports["violation"], initial=0.0))
        return self._record(k, v, total, primal, dual, constraint, start, objective, violation)
