"""The batched executor: many clients with one model structure served by one computation.

`BatchedExecutor` is an `Executor` (same `start` / `call` / `map`, same checks, same ledger).
At `start` it groups the client programs whose compiled merits have the same structure
(`batched_group.program_signature`) and has its *engine* build each group, once: the numpy
engine (`NumpyEngine`, the default: `batched_group.Group`, numpy batched plans) or the JAX
engine (`engine="jax"`, `jax_engine.JaxEngine`: a `JaxGroup`, the merits by `jax.vmap`;
`executor="jax"` is this executor with that engine). Everything else — grouping, stacked
state, the client steps' forms, checks, ledger, `stats` — is the executor's, whatever the
engine (`Engine` says what an engine provides; `ENGINES` names them). A request of a kind
that has a batched form (`messages.BATCHED`, registered with the node step) sent to two or more
members of a group is served for the whole group at once; everything else — other kinds,
singleton groups, the server, options a batched form does not cover — goes through the serial
per-node path (`run_on_node`), so every backend runs on it unchanged.

Per-client state belongs where the serial procedures keep it (`program.state`, `program.y`, the
merit's Parameters), so a run can hand its programs to another executor midway (`take_over`),
checkpoint, or read multipliers back and get the serial answer. While this executor holds the
programs (`Executor`: one holder per node), each group keeps the stacked (n, d) arrays it last
wrote (`batched_group.Group`) and hands row views of them to the clients' state when the state
is read: before this executor serves a member one by one or by a per-member form, when a
program is pickled, when another executor takes the programs over (`hand_back`), and at
`close`. A form's check of the clients' states holds until this executor serves a member one by
one or hands it over (`Group.forget`).

Group requests (`Executor.map_stacked`: one request to many nodes, model-sized fields as one
(n, d) block) to the nodes of one group are served by the kind's stacked form
(`messages.STACKED`) without building per-node payloads; the blocks are checked once and the
ledger books the n messages from a count.

The runtime's generic forms (`report`, `solve_local` with method "gd") live in
`batched_procedures`, imported here so that they are registered wherever this executor runs; a
backend's own forms live beside its node steps.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from ..errors import FedModelError
from .batched_group import Group, program_signature
from .executor import Executor, block_floats, run_on_node
from .batched_procedures import GENERIC
from .messages import BATCHED, STACKED, install


@runtime_checkable
class Engine(Protocol):
    """How a `BatchedExecutor`'s groups compute. The executor asks its engine to build each
    group of same-structure clients once, at `start` (`group`: a `batched_group.Group` or a
    subclass that evaluates the members' merits its own way); the engine reports what it did
    not serve itself (`served_alone`, `fallbacks`) and counts what it did (`calls`)."""

    name: str
    fallbacks: list[str]        # what ran without the engine's own arithmetic, and why

    def start(self) -> None:
        """A run starts (`BatchedExecutor.start`): forget what the previous one reported."""

    def group(self, names: list[str], programs: list) -> Group:
        """The group of the client programs `programs` (named `names`), built once per run."""

    def served_alone(self, group: Group, kind: str) -> None:
        """A member of `group` is about to be served node by node for `kind`."""

    def calls(self, groups: list[Group]) -> Counter:
        """Evaluations the engine served over `groups`, by kind."""


class NumpyEngine:
    """The numpy engine (`Engine`): `batched_group.Group`, whose merits are numpy batched plans
    (`batched_plan.BatchedPlan`: block-diagonal sparse or dense-block products). A member served
    node by node is only counted (`BatchedExecutor.stats`); it reports no fallbacks."""

    name = "numpy"

    def __init__(self) -> None:
        self.fallbacks: list[str] = []

    def start(self) -> None:
        self.fallbacks = []

    def group(self, names: list[str], programs: list) -> Group:
        return Group(names, programs)

    def served_alone(self, group: Group, kind: str) -> None:
        pass

    def calls(self, groups: list[Group]) -> Counter:
        return Counter()


def _jax_engine() -> Engine:
    from .jax_engine import JaxEngine     # (imports JAX: only when this engine is asked for)
    return JaxEngine()


#: engine name -> factory (`BatchedExecutor(engine=name)`); an `Engine` instance is also accepted
ENGINES: dict[str, Callable[[], Engine]] = {"numpy": NumpyEngine, "jax": _jax_engine}


def make_engine(engine: "str | Engine") -> Engine:
    """The engine named `engine` (`ENGINES`), or `engine` itself when it is an `Engine` (an
    instance serves one executor: its reports are that executor's)."""
    if isinstance(engine, str) and engine in ENGINES:
        return ENGINES[engine]()
    if not isinstance(engine, str) and isinstance(engine, Engine):
        return engine
    raise FedModelError(f"BatchedExecutor: unknown engine {engine!r}; use one of {sorted(ENGINES)} "
                        "or an Engine instance (fedmodel.runtime.batched.Engine)")


class BatchedExecutor(Executor):
    """Serves requests to groups of same-structure clients with vectorized procedures.

    min_group: smallest group served in batch (smaller ones take the serial path).
    engine: "numpy" (default), "jax" (`executor="jax"`) or an `Engine`: how the groups compute.
    `stats` counts requests served batched / serially by kind; `fallbacks` lists what the
    engine reported running without it (JAX), `jax_calls` what JAX evaluated."""

    def __init__(self, min_group: int = 2, tune_malloc: bool = True, engine: "str | Engine" = "numpy"):
        super().__init__()
        self.engine = make_engine(engine)
        self.min_group = int(min_group)
        self.tune_malloc = bool(tune_malloc)
        self.groups: list[Group] = []
        self._group_of_member: dict[str, Group] = {}
        self._resolved: dict[tuple, tuple] = {}
        self.stats: Counter = Counter()

    streams_sums = True     # (`_summed`)

    def start(self, programs) -> "BatchedExecutor":
        install(GENERIC)        # the vectorized forms of the runtime's own requests
        super().start(programs)
        if self.tune_malloc:
            _keep_large_arrays_on_the_heap()
        by_signature: dict[tuple, list[str]] = {}
        for name, program in self.programs.items():
            if program.role == "client":
                by_signature.setdefault(program_signature(program), []).append(name)
        self.engine.start()
        self.groups = [self.engine.group(names, [self.programs[n] for n in names])
                       for names in by_signature.values() if len(names) >= self.min_group]
        self._group_of_member = {name: group for group in self.groups for name in group.names}
        self._resolved = {}
        self.stats = Counter()
        return self

    @property
    def fallbacks(self) -> list[str]:
        """What the engine reported serving without its own arithmetic this run, and why (the
        JAX engine: groups on numpy, kinds served node by node; the numpy engine: none)."""
        return self.engine.fallbacks

    @property
    def jax_calls(self) -> Counter:
        """Evaluations the engine served over all groups: with JAX "value_grad", "objective",
        "hessian" (one per vmapped call) and "local_steps" (steps inside the fused loop);
        empty on the numpy engine."""
        return self.engine.calls(self.groups)

    def map_stacked(self, kind: str, nodes, rows=None, common=None, split: bool = True,
                    rider=None) -> dict[str, Any] | None:
        """`Executor.map_stacked` served as one block when every node belongs to one group and
        `kind` has a stacked form: the request's blocks are checked once, the ledger books the
        n messages each way from a count, and no per-node payload is built. (A `rider` is
        served around it: `Executor._around`.)"""
        if rider is not None:
            return super().map_stacked(kind, nodes, rows, common, split, rider)
        procedure = STACKED.get(kind)
        group, index, key = self.group_rows(nodes) if procedure is not None else (None, None, None)
        if group is None:
            return super().map_stacked(kind, nodes, rows, common, split)
        declared, nodes, rows, common, floats = self._check_stacked(kind, nodes, rows, common, known=True)
        replies = procedure(group, index, rows, common)
        if replies is None:                     # options the stacked form does not cover
            return super().map_stacked(kind, nodes, rows, common, split)
        self.stats[(kind, "batched")] += len(nodes)
        if not declared.local:
            self.ledger.record_group(key, kind, floats, down=True)
        self.ledger.exchange(kind, key)     # (a local kind: a request, not a round trip)
        up = sum(block_floats(declared, declared.reply, k, b, len(nodes), self.model_size, "reply")
                 for k, b in replies.items())
        if not declared.local:
            self.ledger.record_group(key, kind, up, down=False)
        return replies

    def group_rows(self, nodes) -> tuple["Group | None", np.ndarray | None, tuple]:
        """(the group holding every node of `nodes` or None, their rows in it, the nodes as a
        tuple); remembered for the last few node lists (a run sends the same lists every round).
        A tuple sent again is found by identity, without hashing its n names."""
        for hit in self._resolved.values():
            if hit[2] is nodes:
                return hit
        key = tuple(nodes)
        hit = self._resolved.get(key)
        if hit is None:
            group = self._group_of(key)
            rows = None if group is None else np.array([group.index[n] for n in key], dtype=np.intp)
            if rows is not None:
                rows.flags.writeable = False    # shared by every request with this node list
            hit = (group, rows, key)            # (the same tuple every round: the ledger keeps it by id)
            if len(self._resolved) >= 8:
                self._resolved.clear()
            self._resolved[key] = hit
        return hit

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

    def _summed(self, kind, payloads, fields):
        """`Executor._summed`: a group of at least `min_group` members whose kind's form has a
        summed variant (`form.summed(group, members, payloads, fields)` → the members' sums of
        `fields`, or None where it does not cover them) yields those sums as one reply (its
        memory one reply's, whatever the group's size); the other nodes one at a time, as the
        serial executor does."""
        summed = getattr(BATCHED.get(kind), "summed", None)
        rest = dict(payloads)
        for group in self.groups if summed is not None else ():
            members = [n for n in group.names if n in rest]
            if len(members) < self.min_group:
                continue
            group.sync()                # (as `_dispatch_batch`: forms read the clients' dicts)
            out = summed(group, members, payloads, fields)
            if out is not None:
                self.stats[(kind, "batched")] += len(members)
                for member in members:
                    del rest[member]
                yield members, out
        for node, payload in rest.items():     # one at a time (the review: gathered, n Hessians held)
            self.stats[(kind, "serial")] += 1
            yield [node], self._dispatch(node, kind, payload)

    def _dispatch(self, node, kind, payload):
        group = self._group_of_member.get(node)
        if group is None:
            return run_on_node(self.programs[node], kind, payload)
        self.engine.served_alone(group, kind)
        group.sync()                    # the member's state into its program, which serves it
        try:
            return run_on_node(self.programs[node], kind, payload)
        finally:
            group.forget()              # ... and may have changed it in any way

    def sync(self) -> None:
        """Every group's pending stacks written back into its members' programs (`Group.sync`)."""
        for group in self.groups:
            group.sync()

    def hand_back(self) -> None:
        """`Executor.hand_back`; the groups' checks of their members' states are void after it."""
        super().hand_back()
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

