"""The batched executor: many clients with one model structure served by one numpy computation.

`BatchedExecutor` is an `Executor` (same `start` / `call` / `map`, same checks, same ledger).
At `start` it groups the client programs whose compiled merits have the same structure (same
expressions, data of any compatible shape: `batched_plan.plan_signature`). A request of a kind
that has a batched procedure (`BATCHED`, beside `ledger.PROCEDURES`) sent to two or more
members of a group is served for the whole group at once; everything else — other kinds,
singleton groups, the server, options a batched procedure does not cover — goes through the
serial per-node path (`run_on_node`), so every backend runs on it unchanged.

Per-client state stays where the serial procedures keep it (`program.state`, `program.y`, the
merit's Parameters), so a run can switch executors midway, checkpoint, or read multipliers
back and get the serial answer. To avoid re-stacking n small arrays in every round, each group
keeps the stacked (n, d) arrays it last wrote and stores *row views* of them in the clients'
state; while every client still holds exactly those row objects the stack is reused.

Batched procedures (hot paths of DALD-CC, FedProx and FedAvg): `dald_cc_solve` with the "gd"
and "prox-grad" solver layers (W local steps, soft-thresholding for λ‖w‖₁), `dald_cc_dual`,
`report` (objective of unconstrained clients) and `solve_local` with method "gd".
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import numpy as np

from ..atoms import Norm1
from ..compiler.sets import norm1_term
from ..expression import Variable
from .batched_plan import BatchedPlan, plan_signature
from .executor import Executor, run_on_node
from .program import NodeProgram

# kind -> batched procedure(group, members, payloads) -> replies by member, or None (not covered:
# the executor then serves those members one by one)
BATCHED: dict[str, Callable] = {}

_NORM1_CODE = norm1_term(Variable(1, name="_probe"), 1.0).prox.__code__


def batched_procedure(kind: str):
    """Register the vectorized form of the node-side procedure `kind`."""
    def wrap(fn):
        BATCHED[kind] = fn
        return fn
    return wrap


def program_signature(program: NodeProgram) -> tuple:
    """Programs with equal signatures can be served by one batched computation."""
    m = program.merit_ir
    prox = tuple((program.shared.variables.index(t.variable), _norm1_weight(t) is not None)
                 for t in m.prox_terms)
    return (program.role, program.n_shared, tuple(v.shape for v in program.private.variables),
            plan_signature(program._value_grad), plan_signature(program._objective), prox,
            len(program.all_constraints), tuple(sorted((k, p.shape) for k, p in m.multipliers.items())))


def _norm1_weight(term) -> float | None:
    """λ of a λ‖w‖₁ prox term (built by `compiler.sets.norm1_term`), else None."""
    code = getattr(term.prox, "__code__", None)
    if code is not _NORM1_CODE:
        return None
    return float(term.prox.__closure__[code.co_freevars.index("weight")].cell_contents)


class Group:
    """Client programs of one structure, with their batched plans and stacked state."""

    def __init__(self, names: list[str], programs: list[NodeProgram]):
        self.names, self.programs = names, programs
        self.n = len(names)
        self.index = {name: i for i, name in enumerate(names)}
        first = programs[0]
        self.n_x, self.n_y = first.n_shared, first.n_private
        self.variables = first.variables
        self.constrained = bool(first.all_constraints)
        self.prox = []                      # (column slice, λ per client or None, term index)
        for k, term in enumerate(first.merit_ir.prox_terms):
            i = first.shared.variables.index(term.variable)
            cols = slice(int(first.shared.offsets[i]), int(first.shared.offsets[i + 1]))
            weights = [_norm1_weight(p.merit_ir.prox_terms[k]) for p in programs]
            self.prox.append((cols, None if None in weights else np.array(weights), k))
        self._plans: dict[str, BatchedPlan] = {}
        self._blocks: dict = {}             # block-diagonal data matrices shared by the plans
        self._stacks: dict[str, tuple[list, np.ndarray]] = {}

    # -- plans ---------------------------------------------------------------------------------
    def plan(self, which: str) -> BatchedPlan:
        if which not in self._plans:   # built on first use: stacking data costs one pass over it
            self._plans[which] = BatchedPlan([getattr(p, which) for p in self.programs], self._blocks)
        return self._plans[which]

    def _inputs(self, X: np.ndarray, Y: np.ndarray) -> list[np.ndarray]:
        """Flat per-variable inputs from stacked shared (n, n_x) and private (n, n_y) values."""
        p = self.programs[0]
        cols = [X[:, p.shared.offsets[i]:p.shared.offsets[i + 1]] for i in range(len(p.shared.variables))]
        cols += [Y[:, p.private.offsets[i]:p.private.offsets[i + 1]] for i in range(len(p.private.variables))]
        return [np.ascontiguousarray(c).ravel() for c in cols]

    def value_grad(self, X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """P_i and ∇P_i (w.r.t. z = (x, y)) of every client: (n,), (n, n_x + n_y)."""
        plan = self.plan("_value_grad")
        out = plan(*self._inputs(X, Y))
        grads = [self._per_client(g, seg, v.shape) for g, seg, v in
                 zip(out[1:], plan.output_segs[1:], self.variables)]
        G = grads[0] if len(grads) == 1 else np.concatenate(grads, axis=1) if grads else np.zeros((self.n, 0))
        return self._per_client(out[0], plan.output_segs[0], ()).ravel(), G

    def objective(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        plan = self.plan("_objective")
        return self._per_client(plan(*self._inputs(X, Y))[0], plan.output_segs[0], ()).ravel()

    def _per_client(self, flat, seg, shape) -> np.ndarray:
        """Flat per-client values → (n, size of `shape`), broadcasting each client's value."""
        size = int(np.prod(shape))
        if seg.uniform is not None and int(np.prod(seg.uniform)) == size:
            return flat.reshape(self.n, size)
        rows = [np.ravel(np.broadcast_to(v, shape)) for v in seg.split(flat)]
        return np.array(rows, dtype=float).reshape(self.n, size)

    # -- stacked state -------------------------------------------------------------------------
    def gather(self, key: str, rows: list, width: int) -> np.ndarray:
        """(n, width) stack of per-client rows, reused while the rows are the published views."""
        cached = self._stacks.get(key)
        if cached is not None and all(a is b for a, b in zip(rows, cached[0])):
            return cached[1]
        return np.array([np.broadcast_to(np.asarray(r, float), (width,)) for r in rows], dtype=float) \
            if rows else np.zeros((0, width))

    def publish(self, key: str, stack: np.ndarray, store: Callable[[int, np.ndarray], None]) -> None:
        """Hand each client its row (a view) and remember the stack for the next gather."""
        views = list(stack)
        for i, view in enumerate(views):
            store(i, view)
        self._stacks[key] = (views, stack)

    def apply_prox(self, Z: np.ndarray, t: float) -> np.ndarray:
        """Every client's prox step (in term order, as `dald._apply_prox`)."""
        for cols, weights, k in self.prox:
            if weights is not None:     # λ‖w‖₁: soft-thresholding at t·λ_i, all clients at once
                Z[:, cols] = Norm1.prox(Z[:, cols], (t * weights)[:, None])
            else:
                for i, p in enumerate(self.programs):
                    term = p.merit_ir.prox_terms[k]
                    Z[i, cols] = np.ravel(term.prox(Z[i, cols].reshape(term.variable.shape), t))
        return Z


class BatchedExecutor(Executor):
    """Serves requests to groups of same-structure clients with vectorized procedures.

    min_group: smallest group served in batch (smaller ones take the serial path).
    `stats` counts requests served batched / serially by kind."""

    def __init__(self, min_group: int = 2):
        super().__init__()
        self.min_group = int(min_group)
        self.groups: list[Group] = []
        self.stats: Counter = Counter()

    def start(self, programs) -> "BatchedExecutor":
        super().start(programs)
        by_signature: dict[tuple, list[str]] = {}
        for name, program in self.programs.items():
            if program.role == "client":
                by_signature.setdefault(program_signature(program), []).append(name)
        self.groups = [Group(names, [self.programs[n] for n in names])
                       for names in by_signature.values() if len(names) >= self.min_group]
        self.stats = Counter()
        return self

    def _dispatch_batch(self, kind: str, payloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        replies: dict[str, dict[str, Any]] = {}
        procedure = BATCHED.get(kind)
        if procedure is not None:
            for group in self.groups:
                members = [n for n in group.names if n in payloads]
                if len(members) < self.min_group:
                    continue
                out = procedure(group, members, payloads)
                if out is not None:
                    replies.update(out)
                    self.stats[(kind, "batched")] += len(members)
        for node, payload in payloads.items():
            if node not in replies:
                replies[node] = run_on_node(self.programs[node], kind, payload)
                self.stats[(kind, "serial")] += 1
        return replies

    def _dispatch(self, node, kind, payload):
        return run_on_node(self.programs[node], kind, payload)


# ---- batched procedures ------------------------------------------------------------------------
def _same(payloads: dict, members: list[str], keys: tuple[str, ...]) -> dict | None:
    """The members' common options, or None when they differ (then: serial path)."""
    first = payloads[members[0]]
    for name in members[1:]:
        p = payloads[name]
        if any(p.get(k) != first.get(k) for k in keys):
            return None
    return first


def _rows(group: Group, members: list[str], payloads: dict, key: str, default: np.ndarray) -> np.ndarray:
    """(n, d) stack of a model-sized request field; non-members get their `default` row."""
    values = [payloads[m][key] for m in members]
    if len(members) == group.n and all(v is values[0] for v in values):
        return np.broadcast_to(np.asarray(values[0], float), default.shape)
    out = default.copy()
    for m, v in zip(members, values):
        out[group.index[m]] = v
    return out


def _private(group: Group) -> np.ndarray:
    if not group.n_y:
        return np.zeros((group.n, 0))
    return np.array([p.y for p in group.programs], dtype=float)


def _add_shared(G: np.ndarray, n_x: int, extra: np.ndarray) -> np.ndarray:
    """G with `extra` added to its shared columns, as a new array (G may be a cached value)."""
    if G.shape[1] == n_x:
        return G + extra
    out = G.copy()
    out[:, :n_x] += extra
    return out


def _local_steps(group: Group, Z: np.ndarray, linear, weight, anchor, step: float, steps: int,
                 prox: bool) -> np.ndarray:
    """W steps z ← z − α(∇P_i(z) + linear + weight∘(x − anchor)) for every client, followed by
    the prox step when `prox` (dald._prox_grad; solvers.gradient_descent without it)."""
    n_x = group.n_x
    for _ in range(steps):
        _, G = group.value_grad(Z[:, :n_x], Z[:, n_x:])
        G = _add_shared(G, n_x, linear + weight * (Z[:, :n_x] - anchor))
        Z = Z - step * G
        if prox:
            Z = group.apply_prox(Z, step)
    return Z


@batched_procedure("dald_cc_solve")
def _cc_solve(group: Group, members: list[str], payloads: dict):
    """`dald._cc_solve` (13) with the "gd" / "prox-grad" solver layers for a whole group."""
    opts = _same(payloads, members, ("tol", "solver", "step", "local_steps", "warm"))
    if opts is None or opts["solver"] not in ("gd", "prox-grad"):
        return None
    states = [p.state.get("dald") for p in group.programs]
    if any(s is None or s.get("rho2") is None for s in states):
        return None
    has_prox = bool(group.prox)
    n, n_x = group.n, group.n_x
    X = group.gather("x", [s["x"] for s in states], n_x)
    MU = group.gather("mu", [s["mu"] for s in states], n_x)
    RHO2 = group.gather("rho2", [s["rho2"] for s in states], n_x)
    XHAT = _rows(group, members, payloads, "xhat", X)
    x0 = X if opts.get("warm", 1.0) else XHAT
    if group.n_y:              # re-center the private variables' proximal term (local_argmin)
        for m in members:
            p = group.programs[group.index[m]]
            p.configure(float(p.merit_ir.beta.value), 0.0, x0[group.index[m]])
    Z = np.concatenate([x0, _private(group)], axis=1)
    prox = opts["solver"] == "prox-grad" or has_prox
    Z = _local_steps(group, Z, -MU, 2.0 * RHO2, XHAT, float(opts["step"]), int(opts["local_steps"]), prox)
    rows = [group.index[m] for m in members]
    new_x = X.copy()
    new_x[rows] = Z[rows, :n_x]
    group.publish("x", new_x, lambda i, v: states[i].__setitem__("x", v))
    group.publish("mu", MU, lambda i, v: states[i].__setitem__("mu", v))
    group.publish("rho2", RHO2, lambda i, v: states[i].__setitem__("rho2", v))
    if group.n_y:
        for i in rows:
            group.programs[i].y = Z[i, n_x:].copy()
    steps = int(opts["local_steps"])
    return {m: {"x": new_x[group.index[m]], "steps": steps} for m in members}


@batched_procedure("dald_cc_dual")
def _cc_dual(group: Group, members: list[str], payloads: dict):
    """`dald._cc_dual` (15): μ_i += 2ρ_i∘ρ_i∘(x̂ − x_i) for a whole group; a node's own
    constraint multipliers (Step 2) are updated client by client."""
    opts = _same(payloads, members, ("consensus",))
    states = [p.state.get("dald") for p in group.programs]
    if opts is None or any(s is None or s.get("rho2") is None for s in states):
        return None
    n_x = group.n_x
    X = group.gather("x", [s["x"] for s in states], n_x)
    MU = group.gather("mu", [s["mu"] for s in states], n_x)
    RHO2 = group.gather("rho2", [s["rho2"] for s in states], n_x)
    if opts.get("consensus", 1.0):
        XHAT = _rows(group, members, payloads, "xhat", X)
        rows = [group.index[m] for m in members]
        new = MU.copy()
        new[rows] = (MU + 2.0 * RHO2 * (XHAT - X))[rows]
        group.publish("mu", new, lambda i, v: states[i].__setitem__("mu", v))
    group.publish("x", X, lambda i, v: states[i].__setitem__("x", v))
    replies = {}
    for m in members:
        p = group.programs[group.index[m]]
        change = p.update_multipliers(p.state["dald"]["x"])["dmu"] if p.constraints else 0.0
        replies[m] = {"dmu": change}
    return replies


@batched_procedure("report")
def _report(group: Group, members: list[str], payloads: dict):
    """`NodeProgram.report` for clients without constraints: f_i(x, y) + prox-able terms."""
    if group.constrained:
        return None
    X = _rows(group, members, payloads, "x", np.zeros((group.n, group.n_x)))
    values = group.objective(np.asarray(X), _private(group))
    for cols, weights, k in group.prox:
        if weights is None:
            return None
        values = values + weights * np.abs(X[:, cols]).sum(axis=1)
    return {m: {"objective": float(values[group.index[m]]), "violation": 0.0} for m in members}


@batched_procedure("solve_local")
def _solve_local(group: Group, members: list[str], payloads: dict):
    """`NodeProgram.solve_local` with method "gd" (FedAvg-style local work) for a whole group."""
    opts = _same(payloads, members, ("method", "max_steps", "lr", "tol"))
    if opts is None or opts.get("method") != "gd" or group.prox:
        return None
    n, n_x = group.n, group.n_x
    zeros = np.zeros((n, n_x))
    linear = _rows(group, members, {m: {"v": np.zeros(n_x) if payloads[m].get("linear") is None
                                        else payloads[m]["linear"]} for m in members}, "v", zeros)
    anchor = _rows(group, members, {m: {"v": np.zeros(n_x) if payloads[m].get("anchor") is None
                                        else payloads[m]["anchor"]} for m in members}, "v", zeros)
    weight = _rows(group, members, {m: {"v": np.broadcast_to(np.asarray(payloads[m]["weight"], float), (n_x,))}
                                    for m in members}, "v", zeros)
    x0 = _rows(group, members, payloads, "x0", zeros)
    Y = _private(group)
    steps = int(opts["max_steps"])
    Z = _local_steps(group, np.concatenate([x0, Y], axis=1), linear, weight, anchor,
                     float(opts["lr"]), steps, prox=False)
    _, G = group.value_grad(Z[:, :n_x], Z[:, n_x:])   # the serial solver reports ‖∇‖∞ at the end
    G = _add_shared(G, n_x, linear + weight * (Z[:, :n_x] - anchor))
    replies = {}
    for m in members:
        i = group.index[m]
        group.programs[i].y = Z[i, n_x:].copy()
        replies[m] = {"x": Z[i, :n_x].copy(), "steps": steps,
                      "grad_norm": float(np.max(np.abs(G[i]), initial=0.0))}
    return replies
