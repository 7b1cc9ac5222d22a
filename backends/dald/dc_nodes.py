"""Fed-DALD-DC node steps (Algorithm 3): `dald_dc_init`, `dald_dc_links` (a node's edge ends),
`dald_dc_receive`, `dald_dc_solve` (20), `dald_dc_dual` (21) and `dald_dc_sweep` (a Gauss–Seidel
sweep of (20) with its relays inside one client group). State: `program.state["dald"]` (x; per
edge end μ_e, ρ_e², the sign of C_e at this end, the newest copy of the neighbour's model).

`dald_dc_solve` and `dald_dc_dual` are written once, over rows of nodes (`client_step`): one
node on the serial, Ray and Flower executors, a group (e.g. a parallel batch of S) on the
batched and JAX ones. (20) is each row's consensus terms from the copies it holds
(`kernels.edge_terms`: Σ sign_e μ_e, Σ 2ρ_e², the weighted mean of the copies), then the rows'
local solve (`local.local_argmin`); (21) is `kernels.edge_dual` over the rows' edge ends.

`dald_dc_sweep` stays a group's stacked form: it stands for the solves of S one after another
*and* the relays between them, so only an engine holding every node of S can serve it (else
`dc.GaussSeidelSweep` sends `dald_dc_solve` per parallel batch and `dald_dc_receive` per
relay). With W = 1 and a warm start, ∇P_s(x_s) depends only on the node's own state, so one
batched ∇P serves the group and one compiled loop over S (`kernels.gauss_seidel_sweep`) takes
for each node the same consensus terms (`edge_terms_row`) and the same proximal-gradient step
as `dald_dc_solve`: the arithmetic is written once, in the compiled row functions. W > 1, a
cold start, private variables or an edge leaving the group: `dald_dc_solve` per batch.
While the batched executor holds the nodes, its stacks and `SweepState` are authoritative;
`Group.sync` writes them back into the dicts before anything reads them.
"""
from __future__ import annotations

from functools import partial
from operator import is_, itemgetter

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime.batched_group import Group, in_group_order, read_only
from fedmodel.runtime.batched_procedures import same_options
from fedmodel.runtime.client_step import client_step
from fedmodel.runtime.ledger import MessageKind, Procedure, procedure
from . import kernels
from .local import SOLVE_OPTIONS, init_state, local_argmin

_SOLVE_OPTS = tuple(SOLVE_OPTIONS)


@procedure("dald_dc_init", {"x0": "x", "beta": "1"}, {})
def _dc_init(program, x0, beta):
    init_state(program, np.asarray(x0, float), beta, None)
    return {}


@procedure("dald_dc_links", {"neighbors": "str", "rho": "opaque", "after": "opaque", "x": "x"}, {})
def _dc_links(program, neighbors, rho, after, x):
    """The node's edge ends, one per neighbour (an existing end is replaced, e.g. with a new ρ);
    `after` = 1 when the neighbour comes later in S (C = x_self − x_nbr). One mapped request sets
    up the whole graph. (`rho`, `after` opaque: the ledger skips these few floats, once a run.)"""
    edges = program.state["dald"]["edges"]
    for neighbor, rho_e, after_e in zip(neighbors, rho, after):
        edges[neighbor] = {"rho2": np.asarray(rho_e, float) ** 2, "sign": 1.0 if after_e else -1.0,
                           "mu": np.zeros_like(x, dtype=float), "x": np.array(x, float)}
    return {}


@procedure("dald_dc_receive", {"neighbor": "str", "x": "x"}, {})
def _dc_receive(program, neighbor, x):
    """The newest model of `neighbor` (relayed after its solve in S)."""
    edge = program.state["dald"]["edges"][neighbor]
    edge["x"], edge["fresh"] = np.array(x, float), True
    return {}


# ---- the rows' own edge ends -------------------------------------------------------------------
class OwnEnds:
    """The edge ends of the nodes `rows` (their dict order, rows in order), each with the
    neighbour copy its node holds: X = the rows' models, then one row per end (its copy);
    `adjacency` over X's rows (CSR: row k's ends point at their copies' rows), μ_e and
    2ρ_e² ((m, d)) per end, and per end its row k, whether C_e = x_row − x_e (sign > 0)."""

    def __init__(self, group: Group, rows: np.ndarray, states: list[dict]):
        n_x, k, tables = group.n_x, len(rows), [s["edges"] for s in states]
        self.ends = [end for table in tables for end in table.values()]
        m, counts = len(self.ends), [len(t) for t in tables]
        self.row = np.repeat(np.arange(k), counts) if k > 1 else np.zeros(m, dtype=np.intp)
        ptr = np.full(k + m + 1, m, dtype=np.intp)          # (the copies' rows have no ends)
        ptr[0], ptr[1:k + 1] = 0, np.cumsum(counts)
        self.sign = np.array([e["sign"] for e in self.ends], dtype=float)
        ends = np.arange(m)
        self.adjacency = (ptr, ends, k + ends, self.sign)
        self.X = np.array([s["x"] for s in states] + [e["x"] for e in self.ends], dtype=float).reshape(k + m, n_x)
        self.MU = np.array([e["mu"] for e in self.ends], dtype=float).reshape(m, n_x)
        rho2 = [e["rho2"] for e in self.ends]       # one number per edge: (m, 1)
        self.twice_rho2 = 2.0 * (np.array(rho2, dtype=float).reshape(m, 1) if all(np.ndim(r) == 0 for r in rho2)
                                 else np.array([np.broadcast_to(r, (n_x,)) for r in rho2], dtype=float).reshape(m, n_x))


# ---- (20): a node's solve, for rows of nodes -----------------------------------------------------
@client_step("dald_dc_solve", dict(SOLVE_OPTIONS), {"x": "x", "steps": "1"})
def _dc_solve(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """(20): argmin f_s + Σ_{j>s}[μ_sjᵀ(x_s − x_j) + ‖ρ_sj∘(x_s − x_j)‖²]
                       + Σ_{e<s}[μ_esᵀ(x_e − x_s) + ‖ρ_es∘(x_e − x_s)‖²]
    for the rows `members`, each with the newest neighbour copies it holds (the members of one
    request solve side by side: a parallel batch of S), warm-started at x_s (or the anchor);
    None when they were sent different options."""
    opts = same_options(payloads, members, _SOLVE_OPTS)
    if opts is None:
        return None
    group.sync()                # (the group's stacks, e.g. after a sweep, into the nodes' dicts)
    rows = np.array([group.index[m] for m in members], dtype=np.intp)
    states = [group.programs[i].state["dald"] for i in rows]
    ends = OwnEnds(group, rows, states)
    k = len(rows)
    linear, total, anchor = kernels.edge_terms(ends.X, ends.MU, np.arange(k), ends.adjacency, ends.twice_rho2)
    n, n_x = group.n, group.n_x
    if k == n and np.array_equal(rows, np.arange(n)):
        X0, L, W, A = ends.X[:k], linear, total, anchor
    else:                       # one row per client of the group (the others: no work kept)
        X0 = np.array([np.broadcast_to(p.state.get("dald", {}).get("x", 0.0), (n_x,)) for p in group.programs],
                      dtype=float).reshape(n, n_x)
        L, W, A = np.zeros((n, n_x)), np.zeros((n, n_x)), X0.copy()
        L[rows], W[rows], A[rows] = linear, total, anchor
    if not opts.get("warm", 1.0):
        X0 = X0.copy()
        X0[rows] = anchor
    new_x, steps = local_argmin(group, rows, X0, L, W, A, opts.get("tol"), opts["solver"], opts["step"],
                                opts["local_steps"])
    replies = {}
    for j, (m, i, s) in enumerate(zip(members, rows, states)):
        s["x"], s["solved"] = new_x[i], True
        replies[m] = {"x": new_x[i], "steps": int(steps[j])}
    group.forget()              # the members' dicts were written (a group's sweep state is void)
    return replies


# ---- (21): the edge multipliers, for rows of nodes -----------------------------------------------
def _dual_ends(group: Group, rows: np.ndarray, states: list[dict], consensus: float) -> np.ndarray:
    """(21) on every edge end of the nodes `rows`, each with the neighbour copy it holds:
    C = sign·(x_row − x_e), μ_e += 2ρ_e²∘C when both ends took part (this node solved and the
    neighbour's model was relayed since the last step: a dropout keeps μ). Returns ‖C‖∞ per row.
    (Both ends hold the same x_i, x_j after a full sweep, so the mirrored copies stay equal.)"""
    ends = OwnEnds(group, rows, states)
    own, copy = ends.row, len(rows) + np.arange(len(ends.ends))
    after = ends.sign > 0
    tail, head = np.where(after, own, copy), np.where(after, copy, own)
    move = np.array([bool(consensus) and bool(states[r].get("solved")) and bool(e.get("fresh"))
                     for r, e in zip(own, ends.ends)], dtype=bool)
    new, size = kernels.edge_dual(ends.X, ends.MU, tail, head, ends.twice_rho2, move)
    primal = np.zeros(len(rows))
    np.maximum.at(primal, own, size)
    for e, mu, moved in zip(ends.ends, new, move):
        if moved:
            e["mu"] = mu
        e["fresh"] = False
    for s in states:
        s["solved"] = False
    return primal


def _dual_rows(group: Group, rows: np.ndarray, consensus: float) -> tuple[np.ndarray, np.ndarray]:
    """(21) and the nodes' own constraint multipliers (Step 2) for the group's nodes `rows`:
    (‖C‖∞, dmu) per row. Every node of a group whose edges stay inside it: one row per edge of
    the group's stacks (`_group_dual`); otherwise each row's own ends."""
    known = _dc_stacks(group) if len(rows) == group.n and group.n >= 2 and not group.n_y else None
    if known is not None:
        primal, X = _group_dual(group, known, consensus), known[2]
        primal = primal[rows]
        xs = [X[i] for i in rows]
    else:
        group.sync()            # (the group's stacks, e.g. after a sweep, into the nodes' dicts)
        states = [group.programs[i].state["dald"] for i in rows]
        primal = _dual_ends(group, rows, states, consensus)
        xs = [s["x"] for s in states]
        group.forget()          # the nodes' dicts were written (a group's sweep state is void)
    dmu = np.zeros(len(rows))
    if group.constrained:
        for k, (i, x) in enumerate(zip(rows, xs)):
            p = group.programs[i]
            dmu[k] = p.update_multipliers(x)["dmu"] if p.constraints else 0.0
    return primal, dmu


def _dual_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`dald_dc_dual` as a group request, or None."""
    if blocks:
        return None
    return dict(zip(("primal", "dmu"), _dual_rows(group, np.asarray(rows, dtype=np.intp),
                                                  common.get("consensus", 1.0))))


@client_step("dald_dc_dual", {"consensus": "1"}, {"primal": "1", "dmu": "1"}, stacked=_dual_stacked)
def _dc_dual(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """(21) on every incident edge of the rows `members`, and their own constraint multipliers."""
    opts = same_options(payloads, members, ("consensus",))
    if opts is None:
        return None
    rows = np.array([group.index[m] for m in members], dtype=np.intp)
    primal, dmu = _dual_rows(group, rows, opts.get("consensus", 1.0))
    return {m: {"primal": float(p), "dmu": float(c)} for m, p, c in zip(members, primal, dmu)}


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

# Fed-DALD-DC's node steps (`DALD.procedures`)
PROCEDURES = (_dc_init, _dc_links, _dc_receive, _dc_solve, _dc_dual, SWEEP)
