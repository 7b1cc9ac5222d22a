"""The batched executor: many clients with one model structure served by one numpy computation.

`BatchedExecutor` is an `Executor` (same `start` / `call` / `map`, same checks, same ledger).
At `start` it groups the client programs whose compiled merits have the same structure (same
expressions, data of any compatible shape: `batched_plan.plan_signature`). A request of a kind
that has a batched form (`ledger.BATCHED`, registered with the node step) sent to two or more
members of a group is served for the whole group at once; everything else — other kinds,
singleton groups, the server, options a batched form does not cover — goes through the serial
per-node path (`run_on_node`), so every backend runs on it unchanged.

Per-client state belongs where the serial procedures keep it (`program.state`, `program.y`, the
merit's Parameters), so a run can hand its programs to another executor midway (`take_over`),
checkpoint, or read multipliers back and get the serial answer. While this executor holds the
programs (`Executor`: one holder per node), each group keeps the stacked (n, d) arrays it last
wrote instead of touching n small arrays and dicts in every round, and hands *row views* of
them to the clients' state (`Group.sync`) when the state is read: before this executor serves a
member one by one or by a per-member form, when a program is pickled, when another executor
takes the programs over (`hand_back`), and at `close`. While every client still holds exactly
those row objects the stack is reused, and a form's check of the clients' states holds until
this executor serves a member one by one or hands it over (`Group.forget`). The elementwise
work of a step is done by compiled kernels (`kernels`), one pass over the stacks each.

Group requests (`Executor.map_stacked`: one request to many nodes, model-sized fields as one
(n, d) block) to the nodes of one group are served by the kind's stacked form
(`ledger.STACKED`) without building per-node payloads; the blocks are checked once and the
ledger books the n messages from a count.

The generic forms live here: `report` (objective of unconstrained clients) and `solve_local`
with method "gd", and the building blocks of backends' forms (`local_steps`, `request_rows`,
`same_options`, …); a backend's own forms live beside its node steps.
"""
from __future__ import annotations

from collections import Counter
from operator import is_, itemgetter
from typing import Any, Callable

import numpy as np

from . import kernels
from .batched_plan import BatchedPlan, plan_signature
from ..errors import FedModelError
from .executor import Executor, block_floats, run_on_node
from .ledger import BATCHED, MESSAGES, STACKED, allowed_sizes, check_payload, register
from .program import NodeProgram

def program_signature(program: NodeProgram) -> tuple:
    """Programs with equal signatures can be served by one batched computation."""
    m = program.merit_ir
    prox = tuple((program.shared.variables.index(t.variable), _norm1_weight(t) is not None)
                 for t in m.prox_terms)
    return (program.role, program.n_shared, tuple(v.shape for v in program.private.variables),
            plan_signature(program._value_grad), plan_signature(program._objective), prox,
            len(program.all_constraints), tuple(p.shape for p in m.multipliers.values()))


def _norm1_weight(term) -> float | None:
    """λ of a λ‖w‖₁ prox term (kind "norm1", see `compiler.sets.ProxTerm`), else None."""
    return term.weight() if term.kind == "norm1" else None


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
        self._stacks: dict[str, tuple[list | None, np.ndarray]] = {}    # slot -> (row views, stack)
        self._pending: dict[str, tuple[str, list[dict]]] = {}          # slot -> (key, dicts) to hand over
        self._write_backs: dict[str, Callable[[], None]] = {}
        self._twice: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._checked: dict[str, Any] = {}      # family -> what it validated (until `forget`)
        self.memo: dict[str, Any] = {}          # what a backend's forms keep per group (e.g. a layout)

    # -- checks of the members' states ---------------------------------------------------------
    def forget(self) -> None:
        """A member's state may have changed in any way (it was served node by node, or handed
        to another executor), so the forms' checks of the members' states are void. Only the
        executor holding the members calls it: nothing else can change their state."""
        self._checked.clear()

    def checked(self, family: str, validate: Callable[[], Any]) -> Any:
        """`validate()` (the members' states as a form family needs them, or None), reused
        until a member's state changes outside the forms (`forget`)."""
        known = self._checked.get(family)
        if known is not None:
            return known
        self.sync()
        result = validate()
        if result is not None:
            self._checked[family] = result
        return result

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

    def twice(self, key: str, stack: np.ndarray) -> np.ndarray:
        """2·stack, computed once per published stack (e.g. the weights 2ρ_i∘ρ_i); (n, 1) when
        every row is one number repeated (a scalar ρ_i: the kernels then read no (n, d) array)."""
        cached = self._twice.get(key)
        if cached is None or cached[0] is not stack:
            rows_constant = stack.shape[1] > 0 and bool(np.all(stack == stack[:, :1]))
            cached = self._twice[key] = (stack, 2.0 * (stack[:, :1] if rows_constant else stack))
        return cached[1]

    # -- stacked state -------------------------------------------------------------------------
    def gather(self, key: str, states: list[dict], width: int, slot: str | None = None) -> np.ndarray:
        """(len(states), width) stack of the `state[key]` rows (the clients' states, or any list
        of dicts, cached under `slot`, default `key`). Reused while every dict still holds the
        row views last published (or their hand-over is pending); otherwise stacked afresh."""
        slot = slot or key
        if slot in self._pending and self._pending[slot][1] is states:
            return self._stacks[slot][1]
        if any(k == key for k, _ in self._pending.values()):
            self.sync()                             # our newer `key` rows, held under another slot
        cached = self._stacks.get(slot)
        rows = list(map(itemgetter(key), states))
        if cached is not None and len(rows) == len(cached[0]) and all(map(is_, rows, cached[0])):
            return cached[1]
        stack = np.array([np.broadcast_to(np.asarray(r, float), (width,)) for r in rows], dtype=float) \
            .reshape(len(rows), width)
        self.publish(key, stack, states, slot)
        return stack

    def stack(self, slot: str) -> np.ndarray:
        """The stack last gathered or published under `slot`."""
        return self._stacks[slot][1]

    def row_views(self, slot: str) -> list[np.ndarray]:
        """The row views of the stack under `slot` that its dicts hold (handed over first)."""
        if slot in self._pending:
            self.sync()
        return self._stacks[slot][0]

    def publish(self, key: str, stack: np.ndarray, states: list[dict], slot: str | None = None) -> None:
        """Make `stack` the rows of `state[key]` of the dicts `states`. The dicts get their row
        views on `sync`, which the executor holding the members runs before anything reads them
        (a request it serves node by node or by a per-member form, a hand-over, `close`): a
        batched run does not touch n dicts per step."""
        slot = slot or key
        self._stacks[slot] = (None, stack)
        self._pending[slot] = (key, states)

    def on_sync(self, name: str, write_back: Callable[[], None]) -> None:
        """Run `write_back()` at the next `sync`, after the pending stacks (once per name)."""
        self._write_backs[name] = write_back

    def sync(self) -> None:
        """Hand the pending stacks' row views to their dicts, then run the write-backs."""
        if not self._pending and not self._write_backs:
            return
        for slot, (key, states) in self._pending.items():
            stack = self._stacks[slot][1]
            views = list(stack)
            for state, view in zip(states, views):
                state[key] = view
            self._stacks[slot] = (views, stack)
        self._pending.clear()
        write_backs, self._write_backs = self._write_backs, {}
        for write_back in write_backs.values():
            write_back()

    def kernel_prox(self, t: float, prox: bool) -> tuple[np.ndarray, slice, bool]:
        """How a compiled step applies the prox at step t: (threshold tλ_i per client, its
        columns, whether the prox terms must still be applied after the kernel). The kernels
        soft-threshold when the only prox term is λ_i‖w‖₁; otherwise (threshold −1: none) the
        caller applies every prox term itself, or none when `prox` is False."""
        if prox and len(self.prox) == 1 and self.prox[0][1] is not None:
            return t * self.prox[0][1], self.prox[0][0], False
        return np.full(self.n, -1.0), slice(0, 0), prox

    def apply_prox(self, Z: np.ndarray, t: float) -> np.ndarray:
        """Every client's prox step (in term order, as `NodeProgram.apply_prox`)."""
        for cols, weights, k in self.prox:
            if weights is not None:     # λ‖w‖₁: soft-thresholding at t·λ_i, all clients at once
                v = Z[:, cols]          # Norm1.prox, sign(v)·max(|v| − tλ, 0), in place
                if np.all(weights == weights[0]):   # one λ: v − clip(v, −tλ, tλ), two passes
                    v -= np.clip(v, -t * weights[0], t * weights[0])
                    continue
                shrunk = np.abs(v)      # (copysign: the same numbers, up to the sign of a zero)
                shrunk -= (t * weights)[:, None]
                np.maximum(shrunk, 0.0, out=shrunk)
                np.copysign(shrunk, v, out=v)
            else:
                for i, p in enumerate(self.programs):
                    term = p.merit_ir.prox_terms[k]
                    Z[i, cols] = np.ravel(term.prox(Z[i, cols].reshape(term.variable.shape), t))
        return Z


class BatchedExecutor(Executor):
    """Serves requests to groups of same-structure clients with vectorized procedures.

    min_group: smallest group served in batch (smaller ones take the serial path).
    `stats` counts requests served batched / serially by kind."""

    def __init__(self, min_group: int = 2, tune_malloc: bool = True):
        super().__init__()
        self.min_group = int(min_group)
        self.tune_malloc = bool(tune_malloc)
        self.groups: list[Group] = []
        self._group_of_member: dict[str, Group] = {}
        self._resolved: dict[tuple, tuple] = {}
        self.stats: Counter = Counter()

    def start(self, programs) -> "BatchedExecutor":
        super().start(programs)
        if self.tune_malloc:
            _keep_large_arrays_on_the_heap()
        by_signature: dict[tuple, list[str]] = {}
        for name, program in self.programs.items():
            if program.role == "client":
                by_signature.setdefault(program_signature(program), []).append(name)
        self.groups = [Group(names, [self.programs[n] for n in names])
                       for names in by_signature.values() if len(names) >= self.min_group]
        self._group_of_member = {name: group for group in self.groups for name in group.names}
        self._resolved = {}
        self.stats = Counter()
        return self

    def map(self, kind: str, payloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """`Executor.map` with the same checks and ledger entries, made cheap per node: with a
        thousand clients the per-field checks of `check_payload` cost more than the batched
        computation itself. Any payload the fast check does not accept goes through
        `check_payload`, which raises its usual error."""
        declared = MESSAGES.get(kind)
        if declared is None or len(payloads) < self.min_group:
            return super().map(kind, payloads)
        networked = not declared.local
        record = self.ledger.record
        programs = self.programs
        for node, payload in payloads.items():
            if node not in programs:
                raise FedModelError(f"no node program named {node!r}; nodes: {self.nodes}")
            if not self._holds_all and programs[node].holder is not self:
                self._hold(node)
            floats = _fast_count(declared.request, payload, self.model_size)
            if floats is None:
                floats = check_payload(declared, declared.request, payload, self.model_size, "request")
            if networked and node != "server":
                record("server", node, kind, floats)
        replies = self._dispatch_batch(kind, payloads)
        out = {}
        for node in payloads:
            reply = replies[node]
            floats = _fast_count(declared.reply, reply, self.model_size)
            if floats is None:
                floats = check_payload(declared, declared.reply, reply, self.model_size, "reply")
            if networked and node != "server":
                record(node, "server", kind, floats)
            out[node] = reply
        return out

    def map_stacked(self, kind: str, nodes, rows=None, common=None, split: bool = True) -> dict[str, Any] | None:
        """`Executor.map_stacked` served as one block when every node belongs to one group and
        `kind` has a stacked form: the request's blocks are checked once, the ledger books the
        n messages each way from a count, and no per-node payload is built."""
        procedure = STACKED.get(kind)
        group, index, key = self.group_rows(nodes) if procedure is not None else (None, None, None)
        if group is None:
            return super().map_stacked(kind, nodes, rows, common, split)
        declared, nodes, rows, common = self._check_stacked(kind, nodes, rows, common)
        replies = procedure(group, index, rows, common)
        if replies is None:                     # options the stacked form does not cover
            return super().map_stacked(kind, nodes, rows, common, split)
        self.stats[(kind, "batched")] += len(nodes)
        if not declared.local:
            floats = check_payload(declared, declared.request, common, self.model_size, "request")
            floats += sum(block_floats(declared, declared.request, k, b, len(nodes), self.model_size,
                                       "request") for k, b in rows.items())
            self.ledger.record_group(key, kind, floats, down=True)
        up = sum(block_floats(declared, declared.reply, k, b, len(nodes), self.model_size, "reply")
                 for k, b in replies.items())
        if not declared.local:
            self.ledger.record_group(key, kind, up, down=False)
        return replies

    def group_rows(self, nodes) -> tuple["Group | None", np.ndarray | None, tuple]:
        """(the group holding every node of `nodes` or None, their rows in it, the nodes as a
        tuple); remembered for the last few node lists (a run sends the same lists every round)."""
        key = tuple(nodes)
        hit = self._resolved.get(key)
        if hit is None:
            group = self._group_of(key)
            rows = None if group is None else np.array([group.index[n] for n in key], dtype=np.intp)
            if rows is not None:
                rows.flags.writeable = False    # shared by every request with this node list
            hit = (group, rows)
            if len(self._resolved) >= 8:
                self._resolved.clear()
            self._resolved[key] = hit
        return (*hit, key)

    def _group_of(self, nodes) -> "Group | None":
        """The group holding every node of `nodes` (at least `min_group` of them), else None."""
        if len(nodes) < self.min_group:
            return None
        first = nodes[0]
        for group in self.groups:
            if first in group.index:
                index = group.index
                return group if all(node in index for node in nodes) and \
                    len(set(nodes)) == len(nodes) else None
        return None

    def _dispatch_batch(self, kind: str, payloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        replies: dict[str, dict[str, Any]] = {}
        procedure = BATCHED.get(kind)
        if procedure is not None:
            for group in self.groups:
                members = [n for n in group.names if n in payloads]
                if len(members) < self.min_group:
                    continue
                group.sync()                # per-member forms read the clients' dicts
                out = procedure(group, members, payloads)
                if out is not None:
                    replies.update(out)
                    self.stats[(kind, "batched")] += len(members)
        for node, payload in payloads.items():
            if node not in replies:
                replies[node] = self._dispatch(node, kind, payload)
                self.stats[(kind, "serial")] += 1
        return replies

    def _dispatch(self, node, kind, payload):
        group = self._group_of_member.get(node)
        if group is None:
            return run_on_node(self.programs[node], kind, payload)
        group.sync()                    # the member's state into its program, which serves it
        try:
            return run_on_node(self.programs[node], kind, payload)
        finally:
            group.forget()              # ... and may have changed it in any way

    def sync(self) -> None:
        """Every group's pending stacks written back into its members' programs (`Group.sync`)."""
        for group in self.groups:
            group.sync()

    def hand_back(self, program: NodeProgram) -> None:
        """`Executor.hand_back`; the groups' checks of their members' states are void after it."""
        super().hand_back(program)
        for group in self.groups:
            group.forget()


_MALLOC_TUNED = False


def _keep_large_arrays_on_the_heap() -> None:
    """Raise glibc's mmap threshold to 256 MB (once per process). A batched step allocates
    (n, d) temporaries of several MB; above the default threshold each one is a fresh mmap that
    is page-faulted in on first touch and unmapped on free, which made elementwise steps on
    n = 1000 MNIST clients 3× slower than on reused heap memory. Freed heap memory stays with
    the process (up to 512 MB untrimmed). No effect where glibc is not the allocator."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 256 * 1024 * 1024)      # M_MMAP_THRESHOLD
        libc.mallopt(-1, 512 * 1024 * 1024)      # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _fast_count(fields: dict[str, str], payload: dict[str, Any], model_size: int) -> int | None:
    """Float count of a payload that `ledger.check_payload` accepts (same rules: declared fields
    only, sizes by `ledger.allowed_sizes`), without its per-field error handling; None for
    anything else (the caller then lets `check_payload` say what is wrong)."""
    floats = 0
    for key, value in payload.items():
        spec = fields.get(key)
        if spec is None:
            return None
        if spec == "str" or spec == "opaque" or value is None:
            continue
        if type(value) is np.ndarray:
            size = value.size
        elif type(value) in (float, int, bool, np.float64):
            size = 1
        else:
            return None
        if size not in allowed_sizes(spec, model_size):
            return None
        floats += size
    return floats


# ---- building blocks of batched forms ----------------------------------------------------------
def in_group_order(rows: np.ndarray, n: int) -> bool:
    """`rows` are all n rows of a group, in group order (a stack can then be replied as is)."""
    return len(rows) == n and bool(np.all(rows[1:] > rows[:-1]))


def read_only(stack: np.ndarray) -> np.ndarray:
    """A read-only view of a group's stack, for a reply: the caller cannot write the clients'
    state through it."""
    view = stack.view()
    view.flags.writeable = False
    return view


def same_options(payloads: dict, members: list[str], keys: tuple[str, ...]) -> dict | None:
    """The members' common options, or None when they differ (then: serial path)."""
    first = payloads[members[0]]
    want = tuple(first.get(k) for k in keys)
    for name in members[1:]:
        p = payloads[name]
        if tuple(p.get(k) for k in keys) != want:
            return None
    return first


def request_rows(group: Group, members: list[str], payloads: dict, key: str, default: np.ndarray) -> np.ndarray:
    """(n, d) stack of a model-sized request field; non-members get their `default` row."""
    values = [payloads[m][key] for m in members]
    if len(members) == group.n and all(v is values[0] for v in values):
        return np.broadcast_to(np.asarray(values[0], float), default.shape)
    out = default.copy()
    for m, v in zip(members, values):
        out[group.index[m]] = v
    return out


def private_stack(group: Group) -> np.ndarray:
    """(n, n_y) stack of the clients' private variables (their `program.y`)."""
    if not group.n_y:
        return np.zeros((group.n, 0))
    return np.array([p.y for p in group.programs], dtype=float)


def _add_shared(G: np.ndarray, n_x: int, extra: np.ndarray) -> np.ndarray:
    """G with `extra` (a fresh array) added to its shared columns, as a new array (G may be a
    cached value)."""
    if G.shape[1] == n_x:
        extra += G
        return extra
    out = G.copy()
    out[:, :n_x] += extra
    return out


def local_steps(group: Group, Z: np.ndarray, linear, weight, anchor, step: float, steps: int,
                prox: bool, subtract_linear: bool = False) -> np.ndarray:
    """W steps z ← z − α(∇P_i(z) + linear + weight∘(x − anchor)) for every client, followed by
    the prox step when `prox` (proximal-gradient steps; solvers.gradient_descent without it).
    `subtract_linear`: `linear` holds −linear (e.g. −μ_i, without a pass to negate it).
    Each step is one compiled pass over the stacks (`kernels.prox_grad_step`), the serial
    operations in the same order; when λ‖w‖₁ is the only prox term it is applied in that pass,
    otherwise every prox term after it (`Group.apply_prox`).
    Z is not written (it may be the clients' published state); the result is a fresh array."""
    n_x = group.n_x
    threshold, cols, prox_after = group.kernel_prox(step, prox)
    for _ in range(steps):
        _, G = group.value_grad(Z[:, :n_x], Z[:, n_x:])
        Z = kernels.prox_grad_step(Z, G, weight, anchor, linear, -1.0 if subtract_linear else 1.0,
                                   step, n_x, threshold, cols)
        if prox_after:
            Z = group.apply_prox(Z, step)
    return Z


def _report_block(group: Group, X: np.ndarray, common: np.ndarray | None = None) -> np.ndarray | None:
    """`NodeProgram.report` objectives for clients without constraints: f_i(x, y) + prox-able
    terms; `common`: the one model every row of X holds (its λ‖x‖₁ is computed once)."""
    if group.constrained or any(weights is None for _, weights, _ in group.prox):
        return None
    values = group.objective(np.asarray(X), private_stack(group))
    for cols, weights, k in group.prox:
        norm = np.abs(X[:, cols]).sum(axis=1) if common is None else np.abs(common[cols]).sum()
        values = values + weights * norm
    return values


def _report(group: Group, members: list[str], payloads: dict):
    values = _report_block(group, request_rows(group, members, payloads, "x", np.zeros((group.n, group.n_x))))
    if values is None:
        return None
    return {m: {"objective": float(values[group.index[m]]), "violation": 0.0} for m in members}


def _report_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict):
    if "x" in blocks:
        X = np.zeros((group.n, group.n_x))
        X[rows] = blocks["x"]
    elif "x" in common:
        X = np.broadcast_to(np.asarray(common["x"], float), (group.n, group.n_x))
    else:
        return None
    values = _report_block(group, X, None if "x" in blocks else np.asarray(common["x"], float))
    if values is None:
        return None
    return {"objective": values[rows], "violation": np.zeros(len(rows))}


def _solve_local(group: Group, members: list[str], payloads: dict):
    """`NodeProgram.solve_local` with method "gd" (FedAvg-style local work) for a whole group."""
    opts = same_options(payloads, members, ("method", "max_steps", "lr", "tol"))
    if opts is None or opts.get("method") != "gd" or group.prox:
        return None
    n, n_x = group.n, group.n_x
    zeros = np.zeros((n, n_x))
    linear = request_rows(group, members, {m: {"v": np.zeros(n_x) if payloads[m].get("linear") is None
                                        else payloads[m]["linear"]} for m in members}, "v", zeros)
    anchor = request_rows(group, members, {m: {"v": np.zeros(n_x) if payloads[m].get("anchor") is None
                                        else payloads[m]["anchor"]} for m in members}, "v", zeros)
    weight = request_rows(group, members, {m: {"v": np.broadcast_to(np.asarray(payloads[m]["weight"], float), (n_x,))}
                                    for m in members}, "v", zeros)
    x0 = request_rows(group, members, payloads, "x0", zeros)
    Y = private_stack(group)
    steps = int(opts["max_steps"])
    Z = local_steps(group, np.concatenate([x0, Y], axis=1), linear, weight, anchor,
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


register(MESSAGES["report"], batched=_report, stacked=_report_stacked)
register(MESSAGES["solve_local"], batched=_solve_local)
