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

import numpy as np

from fedmodel.runtime.batched_group import Group
from fedmodel.runtime.batched_procedures import same_options
from fedmodel.runtime.client_step import client_step
from fedmodel.runtime.messages import procedure
from . import kernels
from .dc_sweep import SWEEP, _dc_stacks, _group_dual
from .local import SOLVE_OPTIONS, init_state, local_argmin, own_multipliers

_SOLVE_OPTS = tuple(SOLVE_OPTIONS)


@procedure("dald_dc_init", {"x0": "x", "beta": "1"}, {"curvature": "1"})
def _dc_init(program, x0, beta):
    """The node's state at x⁰, and its curvature there (`curvature`: the one scalar the edges'
    penalties are chosen from, `dc.edge_rho`)."""
    x0 = np.asarray(x0, float)
    init_state(program, x0, beta, None)
    return {"curvature": curvature(program, x0)}


def curvature(program, x: np.ndarray) -> float:
    """The curvature of the node's merit at x along its gradient, gᵀ∇²P g / gᵀg (along the
    ones where g = 0): its objective's plus β × its own constraints' AL terms where they are
    active at x, of the order of the largest eigenvalue, as the compiler's scale probe reads it.
    0 where it bends nowhere (no smooth term) or the value is not finite."""
    g = program.gradient(x)
    if not np.any(g):
        g = np.ones_like(x)
    v = np.concatenate([g, np.zeros(np.size(program.y))])
    with np.errstate(all="ignore"):     # (x⁰ off the objective's domain, log 0: a NaN, read as 0)
        bend = float(np.vdot(g, program.hvp(np.concatenate([x, np.ravel(program.y)]), v)[:np.size(x)]))
        value = bend / float(np.vdot(g, g)) if g.size else 0.0
    return value if np.isfinite(value) and value > 0.0 else 0.0


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


def _dual_rows(group: Group, rows: np.ndarray, consensus: float) -> tuple[np.ndarray, ...]:
    """(21) and the nodes' own constraint multipliers (Step 2) for the group's nodes `rows`:
    (‖C‖∞, dmu, unwind) per row (`local.own_multipliers`). Every node of a group whose edges stay inside it: one row per edge of
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
    dmu, unwind = own_multipliers(group, rows, xs)
    return primal, dmu, unwind


def _dual_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`dald_dc_dual` as a group request, or None."""
    if blocks:
        return None
    return dict(zip(("primal", "dmu", "unwind"), _dual_rows(group, np.asarray(rows, dtype=np.intp),
                                                            common.get("consensus", 1.0))))


@client_step("dald_dc_dual", {"consensus": "1"}, {"primal": "1", "dmu": "1", "unwind": "1"},
             stacked=_dual_stacked)
def _dc_dual(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """(21) on every incident edge of the rows `members`, and their own constraint multipliers."""
    opts = same_options(payloads, members, ("consensus",))
    if opts is None:
        return None
    rows = np.array([group.index[m] for m in members], dtype=np.intp)
    primal, dmu, unwind = _dual_rows(group, rows, opts.get("consensus", 1.0))
    return {m: {"primal": float(p), "dmu": float(c), "unwind": float(u)}
            for m, p, c, u in zip(members, primal, dmu, unwind)}


# Fed-DALD-DC's node steps (`DALD.procedures`)
PROCEDURES = (_dc_init, _dc_links, _dc_receive, _dc_solve, _dc_dual, SWEEP)
