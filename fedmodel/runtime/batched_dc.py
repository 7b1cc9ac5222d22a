"""Fed-DALD-DC on the batched executor: a whole Gauss–Seidel sweep of one client group, and the
edge-multiplier step (21), as array operations (the node procedures are `backends.dald_nodes`'s
`dald_dc_solve` / `dald_dc_receive` / `dald_dc_dual`).

Why a sweep can be batched at all. Node s solves (20) after its earlier neighbours in S, with
one proximal-gradient step (W = 1) warm-started at its own previous iterate x_s:

    x_s ← prox_{αΠ}(x_s − α[∇P_s(x_s) + Σ_e sign_e μ_e + Σ_e 2ρ_e²∘(x_s − x_e)]),

where x_e is the newest copy of the neighbour's model. The expensive part, ∇P_s(x_s) (a pass
over the node's data), depends on nothing but the node's own state, so every node can compute
it before its turn (what a real node would do while it waits); only the cheap neighbour terms
are sequential. So: one batched ∇P for the group, the edge sums as sparse incidence products,
and a loop over S of a few length-d operations per node — the same numbers as the node-by-node
sweep up to rounding (the neighbour term is summed as Σ 2ρ²x_e instead of weight·anchor).

Per-node state stays in `program.state["dald"]` (its edges' μ_e and neighbour copies as row views
of stacks, as `batched.Group.publish` does for Fed-DALD-CC), so the serial path, checkpoints and
a change of executor see the same state. Anything else (W > 1, a cold start, private variables,
a neighbour outside the group such as a hosted server block) takes the per-node path.
"""
from __future__ import annotations

from operator import is_, itemgetter
from typing import Any

import numpy as np
import scipy.sparse as sp

from .batched import Group, STACKED, stacked_procedure
from .kernels import gauss_seidel_soft

# kind of the solve -> (procedure(group, rows, common) -> (new stack, solved rows), relay kind)
SWEEPS: dict[str, tuple] = {}


class EdgeLayout:
    """The group's edges. Ends: node i's edges in its dict order, nodes in group order (owner
    row, neighbour row, the end's dict). Edges: one row per undirected edge {i, j}, i before j in
    S (its "+" end at i, "−" end at j), with 2ρ², and the signed incidence that sums Σ sign μ."""

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
        self.twice_rho2 = np.array([2.0 * np.broadcast_to(self.ends[k]["rho2"], (d,)) for k in plus]).reshape(E, d)
        self.signed = sp.csr_matrix((np.r_[np.ones(E), -np.ones(E)], (np.r_[self.i, self.j], np.r_[np.arange(E), np.arange(E)])),
                                    shape=(n, E))
        # node weight Σ_e 2ρ_e², summed in the order `dald_nodes._dc_solve` sums it
        self.node_weight = np.zeros((n, d))
        for k in range(m):
            o = owner[k]
            self.node_weight[o] = self.node_weight[o] + 2.0 * np.broadcast_to(self.ends[k]["rho2"], (d,))
        self.scalar = bool(np.all(self.twice_rho2 == self.twice_rho2[:, :1])) if d else True
        self.uniform = bool(E and d and np.all(self.twice_rho2 == self.twice_rho2[0, 0]))
        self.chain = bool(E == n - 1 and np.array_equal(self.i, np.arange(E)) and
                          np.array_equal(self.j, np.arange(1, E + 1)))
        self.tables = [state["edges"] for state in states]
        self.counts = [len(t) for t in self.tables]
        self.ends_a = [self.ends[k] for k in self.a]
        self.ends_b = [self.ends[k] for k in self.b]
        self._plan = None

    def valid(self, states: list[dict]) -> bool:
        """Still the same edge tables with as many edges: `dald_dc_init` makes a new table and
        `dald_dc_link` adds to it, both before the first sweep of a run."""
        return len(states) == len(self.tables) and all(map(_same_table, states, self.tables, self.counts))

    def plan(self, order: np.ndarray, step: float, n: int):
        """For one sweep order: which end of each node's edges was solved earlier in the sweep
        (use the new model) or not (the copy held now). Returns (later: a sparse product for
        the latter, early: (ptr, source, weight) per node for `kernels.gauss_seidel_soft`)."""
        key = (order.tobytes(), step)
        if self._plan is not None and self._plan[0] == key:
            return self._plan[1]
        position = np.full(n, -1)
        position[order] = np.arange(len(order))
        rows, cols, weights, early = [], [], [], [[] for _ in range(n)]
        for e in range(len(self.a)):
            for o, j in ((self.i[e], self.j[e]), (self.j[e], self.i[e])):
                if 0 <= position[j] < position[o]:
                    early[o].append((e, j))
                else:
                    rows.append(o)
                    cols.append(j)
                    weights.append(e)
        K = step * self.twice_rho2                                           # α·2ρ² per edge
        if self.scalar:
            later = sp.csr_matrix((K[weights, 0] if weights else np.zeros(0), (rows, cols)), shape=(n, n))
        else:
            later = (sp.csr_matrix((np.ones(len(rows)), (rows, np.arange(len(rows)))), shape=(n, len(rows))),
                     np.array(cols, dtype=np.intp), K[weights])
        ptr = np.cumsum([0] + [len(pairs) for pairs in early])
        edge = np.array([e for pairs in early for e, _ in pairs], dtype=np.intp)
        source = np.array([j for pairs in early for _, j in pairs], dtype=np.intp)
        weight = np.ascontiguousarray(K[edge, :1] if self.scalar else K[edge]).reshape(len(edge), 1 if self.scalar else K.shape[1])
        self._plan = (key, (later, (ptr, source, weight)))
        return self._plan[1]


def _same_table(state: dict, table: dict, count: int) -> bool:
    edges = state["edges"]
    return edges is table and len(edges) == count


def _dc_states(group: Group) -> list[dict] | None:
    states = [p.state.get("dald") for p in group.programs]
    if any(s is None or s.get("rho2") is not None or not isinstance(s.get("edges"), dict) for s in states):
        return None
    return states


def _layout(group: Group, states: list[dict]) -> EdgeLayout | None:
    layout = getattr(group, "_dc_layout", None)
    if layout is None or not layout.valid(states):
        if any(name not in group.index for s in states for name in s["edges"]):
            return None                          # an edge leaves the group: per-node path
        layout = group._dc_layout = EdgeLayout(group, states)
    return layout if layout.complete else None


def _edge_state(group: Group, layout: EdgeLayout, states: list[dict]):
    """(X, μ per edge) with the invariants a Fed-DALD-DC run keeps: every node holds its
    neighbours' current models (relayed after each solve) and both ends of an edge the same μ.
    After a per-node step the copies are separate arrays: checked equal once and replaced by
    shared row views. None when they differ (then: per-node path)."""
    n_x = group.n_x
    X = group.gather("x", states, n_x)
    views = group._stacks["x"][0]
    nbr_views = [views[j] for j in layout.nbr]
    if not all(map(is_, map(itemgetter("x"), layout.ends), nbr_views)):
        copies = np.array([np.broadcast_to(e["x"], (n_x,)) for e in layout.ends]).reshape(len(layout.ends), n_x)
        if not np.array_equal(copies, X[layout.nbr]):
            return None
        for e, j in zip(layout.ends, layout.nbr):
            e["x"] = views[j]
    MU = group.gather("mu", layout.ends_a, n_x, slot="edge:mu+")
    if group.gather("mu", layout.ends_b, n_x, slot="edge:mu-") is not MU:
        if not np.array_equal(group._stacks["edge:mu-"][1], MU):
            return None
        group.publish("mu", MU, layout.ends_b, slot="edge:mu-")
    return X, MU


def _soft_rows(group: Group, Z: np.ndarray, t: float) -> None:
    """Every row's prox step in place; λ‖w‖₁ as z − clip(z, −tλ, tλ) (= sign(z)·max(|z| − tλ, 0))."""
    for cols, weights, k in group.prox:
        if weights is None or not np.all(weights == weights[0]):
            group.apply_prox(Z, t)
            return
        v = Z[:, cols]
        v -= np.clip(v, -t * weights[0], t * weights[0])


def _dc_stacks(group: Group):
    """(states, edge layout, x_i stack, edge μ stack) of the group's DALD-DC nodes, or None (not
    covered)."""
    states = _dc_states(group)
    layout = None if states is None else _layout(group, states)
    known = None if layout is None else _edge_state(group, layout, states)
    return None if known is None else (states, layout, *known)


def dc_sweep(group: Group, order: np.ndarray, common: dict) -> np.ndarray | None:
    """`dald_nodes._dc_solve` (20) for the group rows `order`, one after another (Gauss–Seidel), with
    the neighbour relays in between. Returns the new (n, d) model stack, or None (not covered)."""
    solver, prox = common.get("solver"), bool(group.prox)
    if not (solver == "prox-grad" or (solver == "gd" and prox)) or int(common.get("local_steps", 0)) != 1 \
            or not common.get("warm", 1.0) or group.n_y or group.n < 2:
        return None
    known = _dc_stacks(group)
    if known is None:
        return None
    states, layout, X, MU = known
    step = float(common["step"])
    _, G = group.value_grad(X, np.zeros((group.n, 0)))     # ∇P_s at every warm start
    later, early = layout.plan(order, step, group.n)
    # B = x − α(∇P + Σ sign μ + w∘x) + α Σ_(later ends) 2ρ²∘x_e; the loop adds the early ends
    B = layout.signed @ MU
    B += G
    B += layout.node_weight * X
    B *= -step
    B += X
    if layout.scalar:
        B += later @ X
    else:
        incidence, cols, K = later
        B += incidence @ (K * X[cols])
    weights = [w for _, w, _ in group.prox]
    simple = len(group.prox) == 1 and weights[0] is not None           # λ‖w‖₁: soft-thresholding
    cols = np.arange(group.n_x)[group.prox[0][0]] if simple else np.zeros(0, dtype=np.intp)
    threshold = step * weights[0] if simple else np.full(group.n, -1.0)
    if simple or not prox:                               # the sequential part: S in order
        gauss_seidel_soft(B, order, *early, cols, threshold)
    else:                                                # another prox: node by node
        for k, i in enumerate(order.tolist()):
            gauss_seidel_soft(B, order[k:k + 1], *early, cols, threshold)
            _prox_row(group, B[i], i, step)
    if len(order) < group.n:                             # nodes that sat out keep their model
        out = np.setdiff1d(np.arange(group.n), order)
        B[out] = X[out]
    group.publish("x", B, states)
    views = group._stacks["x"][0]
    for i in order:
        states[i]["solved"] = True
    solved = np.zeros(group.n, dtype=bool)
    solved[order] = True
    for end, j, fresh in zip(layout.ends, layout.nbr.tolist(), solved[layout.nbr].tolist()):
        end["x"] = views[j]                              # the relays (unsolved: the same numbers)
        if fresh:
            end["fresh"] = True
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


SWEEPS["dald_dc_solve"] = (dc_sweep, "dald_dc_receive")


@stacked_procedure("dald_dc_dual")
def _dc_dual_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict):
    """`dald_nodes._dc_dual` (21) for every node of the group, one row per edge: C_ij = x_i − x_j,
    μ_ij += 2ρ²∘C_ij when both ends took part (a dropout keeps μ), ‖C‖∞ per node."""
    if blocks or len(rows) != group.n or group.n_y:
        return None
    known = _dc_stacks(group)
    if known is None:
        return None
    states, layout, X, MU = known
    if layout.chain:                                     # edges (0,1), (1,2), …: no gathers
        C = np.subtract(X[:-1], X[1:])
    else:
        C = X[layout.i]
        C -= X[layout.j]
    size = np.maximum(C.max(axis=1), -C.min(axis=1)) if group.n_x else np.zeros(len(layout.a))
    primal = np.zeros(group.n)
    np.maximum.at(primal, layout.i, size)
    np.maximum.at(primal, layout.j, size)
    if common.get("consensus", 1.0):
        solved = np.array([bool(s.get("solved")) for s in states])
        fresh_a = np.array([bool(e.get("fresh")) for e in layout.ends_a], dtype=bool)
        fresh_b = np.array([bool(e.get("fresh")) for e in layout.ends_b], dtype=bool)
        move = solved[layout.i] & solved[layout.j] & fresh_a & fresh_b
        step = C
        step *= float(layout.twice_rho2[0, 0]) if layout.uniform else layout.twice_rho2
        if move.all():
            new = MU + step
        else:
            new = MU.copy()
            new[move] += step[move]
        group.publish("mu", new, layout.ends_a, slot="edge:mu+")
        group.publish("mu", new, layout.ends_b, slot="edge:mu-")
    for end in layout.ends:
        end["fresh"] = False
    for s in states:
        s["solved"] = False
    dmu = np.zeros(group.n)
    if group.constrained:
        for i in rows:
            p = group.programs[i]
            dmu[i] = p.update_multipliers(p.state["dald"]["x"])["dmu"] if p.constraints else 0.0
    return {"primal": primal[rows], "dmu": dmu[rows]}


def serve_sweep(executor, kind: str, batches, common: dict, relay: str, neighbors) -> dict[str, Any] | None:
    """`Executor.sweep` for a sweep whose nodes all belong to one group, or None (per-node path)."""
    entry = SWEEPS.get(kind)
    nodes = [n for batch in batches for n in batch]
    if entry is None or entry[1] != relay:
        return None
    group = executor._group_of(nodes)
    if group is None:
        return None
    declared, nodes, _, common = executor._check_stacked(kind, nodes, None, common)
    order = np.array([group.index[n] for n in nodes], dtype=np.intp)
    new = entry[0](group, order, common)
    if new is None:
        return None
    from .ledger import MESSAGES, check_payload
    executor.stats[(kind, "batched")] += len(nodes)
    ledger, d = executor.ledger, executor.model_size
    ledger.record_group(tuple(nodes), kind, check_payload(declared, declared.request, common, d, "request"), down=True)
    replies = {"x": new[order], "steps": np.ones(len(order))}
    ledger.record_group(tuple(nodes), kind, d + 1, down=False)
    receivers = tuple(j for n in nodes for j in neighbors[n])
    relayed = MESSAGES[relay]
    if not relayed.local:
        ledger.record_group(receivers, relay, d, down=True)
        ledger.record_group(receivers, relay, 0, down=False)
    return replies


assert "dald_dc_dual" in STACKED
