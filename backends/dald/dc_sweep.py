"""Fed-DALD-DC's Gauss–Seidel sweep inside one client group (`dald_dc_sweep`, the stacked form
the batched executor serves; see `dc_nodes`): the group's edge layout and stacks (`EdgeLayout`,
`SweepState`), the sweep (`kernels.gauss_seidel_sweep`) and (21) over the group's edges
(`_group_dual`). Split from `dc_nodes` (its node steps) at the 400-line limit.
"""
from __future__ import annotations

from functools import partial
from operator import is_, itemgetter

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime.batched_group import Group, in_group_order, read_only
from fedmodel.runtime.messages import MessageKind, Procedure
from . import kernels
from .local import SOLVE_OPTIONS


# ---- a whole sweep inside one group ----------------------------------------------------------------
class EdgeLayout:
    """The group's edges. Ends: node i's edges in its dict order, nodes in group order (owner
    row, neighbour row, the end's dict). Edges: one row per undirected edge {i, j}, i before j in
    S (its "+" end at i, "−" end at j), with 2ρ² ((E, 1) when one number per edge, else (E, d)).
    `adjacency`: every node's ends as (ptr, edge, neighbour, sign), CSR over the nodes."""

    def __init__(self, group: Group, states: list[dict]):
        self.ends, owner, nbr, signs = [], [], [], []
        for i, state in enumerate(states):
            for name, end in state["edges"].items():
                self.ends.append(end)
                owner.append(i)
                nbr.append(group.index[name])
                signs.append(float(end["sign"]))
        self.owner, self.nbr = np.array(owner, dtype=np.intp), np.array(nbr, dtype=np.intp)
        n, m, d = group.n, len(self.ends), group.n_x
        where = {(o, j): k for k, (o, j) in enumerate(zip(owner, nbr))}
        plus = [k for k in range(m) if signs[k] > 0]
        self.complete = all((nbr[k], owner[k]) in where and signs[where[(nbr[k], owner[k])]] < 0 for k in plus) \
            and 2 * len(plus) == m
        self.a = np.array(plus, dtype=np.intp)                              # "+" ends
        self.b = np.array([where.get((nbr[k], owner[k]), 0) for k in plus], dtype=np.intp)
        self.i, self.j = self.owner[self.a], self.nbr[self.a]               # edge i → j
        E = len(plus)
        twice_rho2 = np.array([2.0 * np.broadcast_to(self.ends[k]["rho2"], (d,)) for k in plus]).reshape(E, d)
        scalar = bool(np.all(twice_rho2 == twice_rho2[:, :1])) if d else True
        self.twice_rho2 = np.ascontiguousarray(twice_rho2[:, :1]) if scalar and d else twice_rho2
        edge = np.zeros(m, dtype=np.intp)
        edge[self.a] = np.arange(E)
        edge[self.b] = np.arange(E)
        ptr = np.zeros(n + 1, dtype=np.intp)
        np.add.at(ptr, self.owner + 1, 1)
        self.adjacency = (np.cumsum(ptr), edge, self.nbr, np.array(signs))
        self.tables = [state["edges"] for state in states]
        self.counts = [len(t) for t in self.tables]
        self.ends_a = [self.ends[k] for k in self.a]
        self.ends_b = [self.ends[k] for k in self.b]

    def valid(self, states: list[dict]) -> bool:
        """Still the same edge tables holding the same end dicts: `dald_dc_init` makes a new
        table, `dald_dc_links` adds ends (or replaces them, e.g. with a new ρ)."""
        return len(states) == len(self.tables) and all(map(_same_table, states, self.tables, self.counts)) \
            and all(map(is_, (end for table in self.tables for end in table.values()), self.ends))


def _same_table(state: dict, table: dict, count: int) -> bool:
    edges = state["edges"]
    return edges is table and len(edges) == count


def _dc_states(group: Group) -> list[dict] | None:
    states = [p.state.get("dald") for p in group.programs]
    if any(s is None or s.get("rho2") is not None or not isinstance(s.get("edges"), dict) for s in states):
        return None
    return states


def _layout(group: Group, states: list[dict]) -> EdgeLayout | None:
    layout = group.memo.get("dald_dc_layout")
    if layout is None or not layout.valid(states):
        if any(name not in group.index for s in states for name in s["edges"]):
            return None                          # an edge leaves the group: per-node path
        layout = group.memo["dald_dc_layout"] = EdgeLayout(group, states)
    return layout if layout.complete else None


def _edge_state(group: Group, layout: EdgeLayout, states: list[dict]):
    """(X, μ per edge) with the invariants a Fed-DALD-DC run keeps: every node holds its
    neighbours' current models (relayed after each solve) and both ends of an edge the same μ.
    After a per-node step the copies are separate arrays: checked equal once and replaced by
    shared row views. None when they differ (then: per-node path)."""
    n_x = group.n_x
    X = group.gather("x", states, n_x)
    group.sync()                                 # (a fresh stack's row views are handed over)
    views = group.row_views("x")
    nbr_views = [views[j] for j in layout.nbr]
    if not all(map(is_, map(itemgetter("x"), layout.ends), nbr_views)):
        copies = np.array([np.broadcast_to(e["x"], (n_x,)) for e in layout.ends]).reshape(len(layout.ends), n_x)
        if not np.array_equal(copies, X[layout.nbr]):
            return None
        for e, j in zip(layout.ends, layout.nbr):
            e["x"] = views[j]
    MU = group.gather("mu", layout.ends_a, n_x, slot="edge:mu+")
    if group.gather("mu", layout.ends_b, n_x, slot="edge:mu-") is not MU:
        if not np.array_equal(group.stack("edge:mu-"), MU):
            return None
        group.publish("mu", MU, layout.ends_b, slot="edge:mu-")
    return X, MU


class SweepState:
    """What a batched Fed-DALD-DC run keeps as arrays instead of per-node dict entries: which
    nodes solved since the last multiplier step (`state["solved"]`) and which ends received
    their neighbour's new model (`end["fresh"]`). Read from the dicts when the states are
    validated; written back (with the relayed copies `end["x"]`) on the group's next sync."""

    def __init__(self, group: Group, states: list[dict], layout: EdgeLayout):
        self.group, self.states, self.layout = group, states, layout
        self.solved = np.array([bool(s.get("solved")) for s in states])
        self.fresh = np.array([bool(e.get("fresh")) for e in layout.ends])

    def write_back(self) -> None:
        """The relayed copies, `fresh` and `solved` flags into the nodes' dicts (`Group.on_sync`)."""
        views = self.group.row_views("x")
        for end, j, fresh in zip(self.layout.ends, self.layout.nbr.tolist(), self.fresh.tolist()):
            end["x"] = views[j]                  # the relays (a node that sat out: the same numbers)
            end["fresh"] = fresh
        for state, solved in zip(self.states, self.solved.tolist()):
            state["solved"] = solved


def _dc_stacks(group: Group):
    """(sweep state, edge layout, x_i stack, edge μ stack) of the group's DALD-DC nodes, or None
    (not covered). The states are validated once until a node is next served node by node (or
    handed to another executor); the batched forms keep the invariants (they publish the stacks
    and the sweep state)."""
    def validate():
        states = _dc_states(group)
        layout = None if states is None else _layout(group, states)
        known = None if layout is None else _edge_state(group, layout, states)
        return None if known is None else SweepState(group, states, layout)
    sweep = group.checked("dc", validate)
    if sweep is None:
        return None
    return sweep, sweep.layout, group.gather("x", sweep.states, group.n_x), \
        group.gather("mu", sweep.layout.ends_a, group.n_x, slot="edge:mu+")


def _sweep_stacked(group: Group, order: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`dald_dc_solve` (20) for the group rows `order`, one after another (Gauss–Seidel), with
    the neighbour relays in between: the stacked replies ({"x", "steps"}, rows in sweep order),
    or None (not covered)."""
    new = None if blocks else _sweep_block(group, order, common)
    if new is None:
        return None
    return {"x": read_only(new) if in_group_order(order, group.n) else new[order], "steps": np.ones(len(order))}


def _sweep_block(group: Group, order: np.ndarray, common: dict) -> np.ndarray | None:
    """The sweep of `sweep_stacked`: the new (n, d) model stack, or None (not covered)."""
    solver, prox = common.get("solver"), bool(group.prox)
    covered = (solver == "prox-grad" or (solver == "gd" and prox)) and int(common.get("local_steps", 0)) == 1 \
        and common.get("warm", 1.0) and not group.n_y and group.n >= 2
    known = _dc_stacks(group) if covered else None
    if known is None:
        return None
    sweep, layout, X, MU = known
    step = float(common["step"])
    G = group.grad(X, np.zeros((group.n, 0)))     # ∇P_s at every warm start
    threshold, cols, prox_after = group.kernel_prox(step, prox)
    B = kernels.gauss_seidel_sweep(X, G, MU, order, layout.adjacency, layout.twice_rho2, step, threshold,
                                   cols, partial(_prox_row, group, t=step) if prox_after else None)
    group.publish("x", B, sweep.states)
    solved = np.zeros(group.n, dtype=bool)
    solved[order] = True
    sweep.solved |= solved
    sweep.fresh |= solved[layout.nbr]                   # every solve is relayed to the neighbours
    group.on_sync("dc", sweep.write_back)
    return B


def _prox_row(group: Group, z: np.ndarray, i: int, t: float) -> None:
    """Client i's prox step on its row z (in place), as `Group.apply_prox` does for all rows."""
    for cols, weights, k in group.prox:
        v = z[cols]
        if weights is not None:
            v -= np.clip(v, -t * weights[i], t * weights[i])
        else:
            term = group.programs[i].merit_ir.prox_terms[k]
            z[cols] = np.ravel(term.prox(v.reshape(term.variable.shape), t))


def _group_dual(group: Group, known, consensus: float) -> np.ndarray:
    """(21) for every node of the group, one row per edge of its stacks: C_ij = x_i − x_j,
    μ_ij += 2ρ²∘C_ij when both ends took part (a dropout keeps μ); ‖C‖∞ per node."""
    sweep, layout, X, MU = known
    if consensus:
        move = sweep.solved[layout.i] & sweep.solved[layout.j] & sweep.fresh[layout.a] & sweep.fresh[layout.b]
    else:
        move = np.zeros(len(layout.a), dtype=bool)
    new, size = kernels.edge_dual(X, MU, layout.i, layout.j, layout.twice_rho2, move)
    primal = np.zeros(group.n)
    np.maximum.at(primal, layout.i, size)
    np.maximum.at(primal, layout.j, size)
    if consensus:
        group.publish("mu", new, layout.ends_a, slot="edge:mu+")
        group.publish("mu", new, layout.ends_b, slot="edge:mu-")
    sweep.solved[:] = False
    sweep.fresh[:] = False
    group.on_sync("dc", sweep.write_back)
    return primal


def _dc_sweep(program, **payload):
    """Only a group serves a sweep (its stacked form); elsewhere `dc.GaussSeidelSweep` sends the
    solves and relays node by node. It books their traffic, so the kind itself is local."""
    raise FedModelError("dald_dc_sweep is served by a group's stacked form only; send "
                        "dald_dc_solve and dald_dc_receive to a single node")


SWEEP = Procedure(MessageKind("dald_dc_sweep", dict(SOLVE_OPTIONS), {"x": "x", "steps": "1"}, local=True),
                  _dc_sweep, stacked=_sweep_stacked)
