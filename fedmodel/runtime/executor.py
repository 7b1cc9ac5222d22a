"""Executors carry requests from a backend to node programs and replies back.

Backends reach node programs only through an executor: the serial one calls them in-process;
others (batched, Ray) keep the same interface. Every message is checked against its declared
kind and recorded in the ledger.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .. import registry
from ..errors import FedModelError
from .ledger import Ledger
from .messages import CORE_KINDS, MESSAGES, MessageKind, allowed_sizes, check_payload, install, lookup
from .program import NodeProgram, ProgramSpec


@dataclass
class Rider:
    """A read-only request that travels in another request's message (issue 27 item 4: one
    message per round, e.g. the history's `report` inside the round's own step): `kind` must be
    declared `local` and `read_only` (the harness's reports and gathers: they book no traffic
    and change no node state, so carrying them changes neither the ledger nor the iterates).
    It is served on every node the carrier reaches, with `payloads[node]` (or `common` for
    every node), `before` the carrier's step (on the state the previous request left) or after
    it. The carrier's `map` / `map_stacked` fills `replies`: by node (`map`) or stacked like its
    own replies (`map_stacked`). An executor whose clients are in this process serves it just
    before / after the carrier (no message of its own there either); one with a transport
    (`folds_riders`: Flower) puts both in one message per client."""

    kind: str
    common: dict[str, Any] = field(default_factory=dict)
    payloads: dict[str, dict[str, Any]] | None = None
    before: bool = False
    replies: Any = None

    def payload(self, node: str) -> dict[str, Any]:
        """The rider's fields for `node`."""
        return self.common if self.payloads is None else self.payloads[node]


class Executor:
    """Interface: `start(programs)`, `call(node, kind, **payload)`, `map(kind, payloads,
    missing="raise" | "drop", rider=None)`, `map_stacked(kind, nodes, rows, common, rider=None)`
    (one request to a group of nodes whose model-sized fields are the rows of one (n, d)
    array; replies stacked the same way; `rider`: a `Rider`, a local read-only request in the
    same message), `close()`. It is a context manager: `with executor:` closes it however the block ends
    (an error, Ctrl-C).

    One owner per node: an executor serves only the node programs it holds (`program.holder`).
    `start` takes them over from whichever executor held them (that one writes its state back
    first, `hand_back`), `take_over` does so again later, `close` writes back and frees them; a
    free program is taken by the first executor that serves it, one held by another executor
    is refused. In between, an executor may keep the state in its own form (the batched
    executor: stacked arrays) and the programs' own attributes may be stale (`sync`).

    `round_trip_cost`: about how many seconds one round trip (a request to every client and
    their replies) costs on this executor beyond the nodes' own work — a fixed hint, read from
    the class before a run (`backend="auto"` does more local work per round where it is dear).
    In process it is ~1e-4 s; executors whose clients live elsewhere set their own.
    `measure_round_trip()` measures it instead (a no-op request to every client, timed); a
    class with `measure_on_start` does so once when a run opens it (`open_executor`), and
    `round_trip_estimate` prefers a measurement to the hint."""

    round_trip_cost: float = 1e-4
    #: measure the round trip once when a run opens this executor (`open_executor`): for
    #: executors whose transport costs what the hint cannot know (Ray: the cluster's network);
    #: in process the hint is the measurement (a probe there is ~10 µs of Python)
    measure_on_start: bool = False
    #: seconds of the last `measure_round_trip` on this instance (None: never measured)
    measured_round_trip_cost: float | None = None
    #: the clock `measure_round_trip` reads (a test injects one: no sleeping)
    clock = staticmethod(time.perf_counter)
    #: True where a `Rider` travels inside its carrier's message (`_dispatch_riding`); else it
    #: is served here just before / after the carrier (in process it costs no round trip)
    folds_riders: bool = False

    def __init__(self):
        self.programs: dict[str, NodeProgram] = {}
        self.ledger = Ledger()
        self.model_size = 0
        self._holds_all = False     # holds every program since `take_over` (no per-node check then)
        # the kinds this run may send: the runtime's own and its backend's procedures
        # (`open_executor`); None: any registered kind (an executor started by hand)
        self.kinds: frozenset[str] | None = None

    def start(self, programs: dict[str, NodeProgram]) -> "Executor":
        """Take `programs` (a run's node programs) over; those of an earlier run are freed."""
        self._release()
        # blocks with loader data arrive as specs: in-process executors load and compile them here
        self.programs = {name: p.build() if isinstance(p, ProgramSpec) else p
                         for name, p in programs.items()}
        self.model_size = next(iter(programs.values())).n_shared if programs else 0
        self.ledger = Ledger()
        return self.take_over()

    def take_over(self) -> "Executor":
        """Hold every node program of this executor: one that another executor holds is handed
        back by it first (it writes the node's state back into the program)."""
        others = {id(p.holder): p.holder for p in self.programs.values()
                  if p.holder is not None and p.holder is not self}
        for other in others.values():       # once per executor, however many programs it held
            other.hand_back()
        for program in self.programs.values():
            program.holder = self
        self._holds_all = True
        return self

    def hand_back(self) -> None:
        """Give programs up to another executor (`take_over`): the nodes' state as this executor
        holds it is written back into the programs (`sync`), and this executor forgets what it
        knew of them."""
        self._holds_all = False
        self.sync()

    def sync(self) -> None:
        """Write the nodes' state, where this executor keeps it in its own form, back into the
        programs (they stay held by this executor). The serial executor works on the programs
        themselves: nothing to write."""

    def _serve(self, nodes, known: bool = False) -> None:
        """Before serving `nodes`: refuse an unknown node; take each one this executor does not
        hold when it is free, refuse it when another executor holds it (a hand-over is
        explicit: `take_over`). `known`: the caller has already found every node among its
        programs (the batched executor's group of a node list), so no per-node check is left
        while this executor holds them all."""
        programs = self.programs
        if known and self._holds_all:
            return
        for node in nodes:
            if node not in programs:
                raise FedModelError(f"no node program named {node!r}; nodes: {self.nodes}")
        if self._holds_all:
            return
        for node in nodes:
            program = programs[node]
            if program.holder is not self:
                if program.holder is not None:
                    raise FedModelError(f"node program {node!r} is held by another executor; call "
                                        "take_over() on this one first (the other one hands it back)")
                program.holder = self

    def measure_round_trip(self, repeats: int = 2) -> float:
        """Seconds one round trip costs on this started executor beyond the nodes' own work:
        the fastest of `repeats` no-op requests ("probe", served by every client, booked as
        local: not the algorithm's traffic) sent to all clients at once, timed on `clock`. A
        first probe slower than `SLOW_PROBE` seconds is not repeated (a dear transport is
        known from one sample, and each costs as much again). Kept on the instance
        (`measured_round_trip_cost`) and, for later choices on the same kind of executor in
        this process, in `MEASURED_ROUND_TRIPS` (`round_trip_estimate` reads both)."""
        clients = self.clients
        if not clients:
            raise FedModelError(f"{type(self).__name__}.measure_round_trip: the executor holds no "
                                "client programs; start it on a run's programs first "
                                "(ex.start(compile_programs(problem)))")
        best = float("inf")
        for _ in range(max(1, int(repeats))):
            start = self.clock()
            self.map("probe", {client: {} for client in clients})
            best = min(best, self.clock() - start)
            if best > SLOW_PROBE:
                break
        self.measured_round_trip_cost = MEASURED_ROUND_TRIPS[type(self)] = best
        return best

    @property
    def nodes(self) -> list[str]:
        """The node names of this run (clients and the server)."""
        return list(self.programs)

    @property
    def clients(self) -> list[str]:
        """The client nodes of this run (in the order of the node programs)."""
        return [n for n, p in self.programs.items() if p.role == "client"]

    def call(self, node: str, kind: str, **payload: Any) -> dict[str, Any]:
        """Send `kind` to one node (`map` with one payload); its reply."""
        return self.map(kind, {node: payload})[node]

    def map(self, kind: str, payloads: dict[str, dict[str, Any]],
            missing: str = "raise", rider: Rider | None = None) -> dict[str, dict[str, Any]]:
        """Send `kind` to several nodes (conceptually in parallel); replies by node.

        missing: what a client that does not reply means. "raise" (the default): the run stops
        with the executor's error naming it. "drop": the step is one a backend may take without
        some of the clients (its partial-participation rule): the replies that came, and a
        client that did not reply is left out of them and added to `lost`, so no later request
        reaches it. Only an executor that can lose a client (Flower: no reply within its
        timeout) drops one; in this process every node answers and both are the same.

        rider: a `Rider` served on the same nodes in the same message (its replies, by node of
        those that replied, in `rider.replies`); the carrier is booked as one request."""
        if missing not in ("raise", "drop"):
            raise FedModelError(f"map({kind!r}, ...): missing must be 'raise' or 'drop', got {missing!r}")
        if rider is not None and not self.folds_riders:
            return self._around(rider, list(payloads), lambda: self.map(kind, payloads, missing))
        declared = self._declared(kind)
        self._serve(payloads)
        self._refuse_lost(kind, payloads)
        rider_kind = None if rider is None else self._check_rider(rider, payloads)
        self._book_requests(declared, payloads)
        # all requests of one kind go out together, then we wait for every reply
        if rider is not None:
            replies, ridden = self._dispatch_riding(kind, payloads, rider, missing == "drop")
        elif missing == "raise":
            replies = self._dispatch_batch(kind, payloads)
        else:
            replies = self._dispatch_available(kind, payloads)
        if missing == "drop":
            payloads = {node: payloads[node] for node in payloads if node in replies}
        if rider is not None:
            for node in payloads:
                check_payload(rider_kind, rider_kind.reply, ridden[node], self.model_size, "reply")
            rider.replies = {node: ridden[node] for node in payloads}
        for node in payloads:
            self._book_reply(declared, [node], replies[node])
        return {node: replies[node] for node in payloads}

    def _book_requests(self, declared: MessageKind, payloads: dict[str, dict[str, Any]]) -> None:
        """Check each node's request against its declaration and book it (one round trip of
        `declared`'s kind; no message to the server itself: its steps are local)."""
        networked = not declared.local
        for node, payload in payloads.items():
            floats = check_payload(declared, declared.request, payload, self.model_size, "request")
            if networked and node != "server":
                self.ledger.record("server", node, declared.name, floats)
        self.ledger.exchange(declared.name, payloads)

    def _book_reply(self, declared: MessageKind, nodes: Sequence[str], reply: dict[str, Any]) -> None:
        """Check `reply` against its declaration and book it once for each of `nodes` (a group's
        summed reply, `map_sum`, stands for one reply of that size from each member)."""
        floats = check_payload(declared, declared.reply, reply, self.model_size, "reply")
        if not declared.local:
            for node in nodes:
                if node != "server":
                    self.ledger.record(node, "server", declared.name, floats)

    def map_stacked(self, kind: str, nodes: Sequence[str], rows: dict[str, np.ndarray] | None = None,
                    common: dict[str, Any] | None = None, split: bool = True,
                    rider: Rider | None = None) -> dict[str, Any] | None:
        """Send `kind` to every node of `nodes` (conceptually in parallel): node k's payload is
        `common` plus row k of each block in `rows` (arrays with len(nodes) rows). Returns the
        replies stacked: per reply field an array with one row per node, in `nodes` order
        (scalars: shape (n,); "str" / "opaque" fields: a list). The ledger books n messages each
        way, as `map` would. This default splits the group request into per-node messages
        (`map`); the batched executor serves it as one block (the kind's stacked form,
        `messages.STACKED`). `split=False`: a request that no block form serves is not split but
        answered with None (for kinds that only have a block form). `rider`: as in `map`, its
        replies stacked in `rider.replies`."""
        if rider is not None and not self.folds_riders:
            return self._around(rider, list(nodes), stacked=True, send=lambda: self.map_stacked(
                kind, nodes, rows=rows, common=common, split=split))
        declared, nodes, rows, common, _ = self._check_stacked(kind, nodes, rows, common)
        if not split:
            return None
        payloads = {node: dict(common) for node in nodes}
        for key, block in rows.items():
            for node, row in zip(nodes, block):
                payloads[node][key] = row
        if rider is None:
            replies = self.map(kind, payloads)
        else:
            carried = Rider(rider.kind, dict(rider.common), rider.payloads, rider.before)
            replies = self.map(kind, payloads, rider=carried)
            rider.replies = stack_replies(declared_kind(rider.kind), [carried.replies[node] for node in nodes])
        return stack_replies(declared, [replies[node] for node in nodes])

    # ---- riders (`Rider`): a read-only request inside another request's message -----------------
    def _check_rider(self, rider: Rider, nodes) -> MessageKind:
        """The rider's declaration, refusing a kind that is not a local read-only one (only those
        may ride: they book nothing and change nothing) and a request that does not match it."""
        declared = self._declared(rider.kind)
        if not (declared.local and declared.read_only):
            raise FedModelError(f"message kind {rider.kind!r} cannot ride on another request: only "
                                "kinds declared local=True and read_only=True (reports, gathers) "
                                "may; send it with its own map")
        for node in nodes:
            check_payload(declared, declared.request, rider.payload(node), self.model_size, "request")
        return declared

    def _serve_rider(self, rider: Rider, nodes: list[str]) -> dict[str, dict[str, Any]]:
        """Serve `rider` on `nodes` by itself (checked both ways, booked as nothing: a rider is
        local), for an executor that does not fold it into its carrier's message."""
        declared = self._check_rider(rider, nodes)
        replies = self._dispatch_batch(rider.kind, {node: rider.payload(node) for node in nodes})
        for node in nodes:
            check_payload(declared, declared.reply, replies[node], self.model_size, "reply")
        return replies

    def _around(self, rider: Rider, nodes: list[str], send: Callable[[], Any], stacked: bool = False) -> Any:
        """The carrier `send()` with `rider` served just before or after it on its nodes (those
        that replied, after a `map(missing="drop")`), in this process: the carrier alone is
        booked as a request (`Ledger.requests`), as when it travels in the carrier's message."""
        self._serve(nodes)
        ridden = self._serve_rider(rider, nodes) if rider.before else None
        replies = send()
        answered = nodes if stacked else [node for node in nodes if node in replies]
        if ridden is None:
            ridden = self._serve_rider(rider, answered)
        got = [ridden[node] for node in answered]
        rider.replies = stack_replies(declared_kind(rider.kind), got) if stacked else dict(zip(answered, got))
        return replies

    def _dispatch_riding(self, kind: str, payloads: dict[str, dict[str, Any]], rider: Rider,
                         drop: bool) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """(the carrier's replies, the rider's) by node, both in one message per client: what an
        executor with `folds_riders` implements (`_dispatch_batch` / `_dispatch_available` with
        the rider's fields in each message)."""
        raise NotImplementedError(f"{type(self).__name__} sets folds_riders but does not fold")

    @property
    def lost(self) -> frozenset:
        """Clients this run has lost (`map(..., missing="drop")`); executors in this process
        lose none."""
        return frozenset()

    def map_available(self, kind: str, payloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Former name of `map(kind, payloads, missing="drop")`."""
        return self.map(kind, payloads, missing="drop")

    #: True where `map_sum` lets the server see only the sum (secure aggregation): backends then
    #: take the loop of theirs that needs only sums of client vectors (docs/flower.md)
    sum_only = False
    #: True where `map_sum` adds each reply into the sums as it comes and drops it (`_summed`):
    #: the server holds the sums and one reply (a group's summed block on the batched
    #: executor), whatever the node count; else every reply is gathered first (n of them)
    streams_sums = False

    def map_sum(self, kind: str, nodes: Sequence[str], common: dict[str, Any] | None = None,
                fields: Sequence[str] = ("x",)) -> dict[str, Any]:
        """Send `kind` with the same payload `common` to every node of `nodes` and return, per
        reply field in `fields`, its sum over the nodes: the form of a step whose server needs
        only Σ_i of the clients' replies (booked as `map` books it). The replies are added up
        as `_summed` yields them (`streams_sums`); an executor with secure aggregation
        (`sum_only`) serves it so that the server sees only the sums."""
        declared = self._declared(kind)
        nodes = list(nodes)
        check_sum_fields(declared, fields)
        if not nodes:
            raise FedModelError(f"map_sum of {kind!r} needs at least one node")
        payloads = {node: dict(common or {}) for node in nodes}
        self._serve(payloads)
        self._refuse_lost(kind, payloads)
        self._book_requests(declared, payloads)
        totals: dict[str, Any] = {}
        for members, reply in self._summed(kind, payloads, fields):
            self._book_reply(declared, members, reply)
            for name in fields:     # (a fresh array: never a reply's own, which a node may keep)
                if name in totals:
                    totals[name] += np.asarray(reply[name], float)
                else:
                    totals[name] = np.array(reply[name], dtype=float)
        return {name: total[()] if total.ndim == 0 else total for name, total in totals.items()}

    def _summed(self, kind: str, payloads: dict[str, dict[str, Any]], fields: Sequence[str]):
        """(nodes, reply) pairs whose `fields` add up to `map_sum`'s sums: one per node here,
        all gathered first (`_dispatch_batch`: concurrent executors) and handed on one at a
        time. Executors that serve a node at a time (`streams_sums`) yield each as it comes;
        the batched one yields a group's summed block (its form's `summed`) as one reply."""
        replies = self._dispatch_batch(kind, payloads)
        for node in list(replies):
            yield [node], replies.pop(node)

    def _check_stacked(self, kind, nodes, rows, common, known: bool = False):
        """Refuse an undeclared kind or field, an unknown node, or a block whose shape does not
        match its declaration (checked once for the whole block); return the normalized request
        and its float count per node. `known`: see `_serve`."""
        declared = self._declared(kind)
        nodes = nodes if isinstance(nodes, tuple) else list(nodes)     # (a tuple cannot change)
        self._serve(nodes, known)
        rows, common = dict(rows or {}), dict(common or {})
        floats = check_payload(declared, declared.request, common, self.model_size, "request")
        for key, block in rows.items():
            if key in common:
                raise FedModelError(f"request of message {kind!r}: field {key!r} given both per node "
                                    "and in common")
            floats += block_floats(declared, declared.request, key, block, len(nodes), self.model_size,
                                   "request")
        return declared, nodes, rows, common, floats

    def _dispatch_batch(self, kind: str, payloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Serve checked requests of one kind (one per node) and return the replies by node.
        Executors override this (concurrent dispatch) or `_dispatch` (one request at a time)."""
        return {node: self._dispatch(node, kind, payload) for node, payload in payloads.items()}

    def _dispatch(self, node: str, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _dispatch_available(self, kind: str, payloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """`_dispatch_batch` for `map(..., missing="drop")`: the replies of the nodes that
        answered. An executor that can lose a client overrides it (and `lost`); in this
        process every node answers."""
        return self._dispatch_batch(kind, payloads)

    def _refuse_lost(self, kind: str, nodes) -> None:
        """Refuse a request to a client this run has lost (`lost`) before anything is sent."""
        lost = self.lost
        if not lost:
            return
        lost = [node for node in nodes if node in lost]
        if lost:
            raise FedModelError(f"client(s) {lost} were dropped earlier in this run; {kind!r} "
                                "cannot reach them")

    def close(self) -> None:
        """End of a run: the nodes' state written back into their programs, which are then free."""
        self._release()
        self.kinds = None

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *failure: Any) -> None:
        self.close()            # also after an exception or KeyboardInterrupt (never swallowed)

    def _declared(self, kind: str) -> MessageKind:
        """`declared_kind`, refusing a kind that is not among this run's procedures."""
        if self.kinds is not None and kind not in self.kinds:
            raise FedModelError(f"message kind {kind!r} is not a procedure of this run; the "
                                f"backend lists its node steps in `procedures` (this run's: "
                                f"{sorted(self.kinds)})")
        return declared_kind(kind)

    def _release(self) -> None:
        self._holds_all = False
        self.sync()
        for program in self.programs.values():
            if program.holder is self:
                program.holder = None


# A first probe slower than this (seconds) is not repeated (`Executor.measure_round_trip`)
SLOW_PROBE = 0.05
# Seconds per round trip last measured in this process, by executor class
# (`Executor.measure_round_trip`): read by `round_trip_estimate` for an executor not measured
# itself (a name: a new instance per run)
MEASURED_ROUND_TRIPS: dict[type, float] = {}


def round_trip_estimate(executor: Any) -> tuple[float, str]:
    """(seconds a round trip costs on `executor` beyond the nodes' own work, where the number
    comes from): the instance's own measurement, else the last one of its class in this
    process (`MEASURED_ROUND_TRIPS`), else the class's fixed hint `round_trip_cost`.
    `executor`: an instance or an executor class."""
    measured = getattr(executor, "measured_round_trip_cost", None)
    if isinstance(executor, Executor) and measured is not None:
        return float(measured), "measured on this executor"
    kind = executor if isinstance(executor, type) else type(executor)
    if kind in MEASURED_ROUND_TRIPS:
        return MEASURED_ROUND_TRIPS[kind], f"measured on a {kind.__name__} earlier in this process"
    return float(getattr(executor, "round_trip_cost", 0.0)), "the executor's fixed hint"


class SerialExecutor(Executor):
    """Runs every node program in this process, one after the other (the default)."""

    streams_sums = True

    def _dispatch(self, node, kind, payload):
        return run_on_node(self.programs[node], kind, payload)

    def _summed(self, kind, payloads, fields):
        for node, payload in payloads.items():
            yield [node], self._dispatch(node, kind, payload)


class RemoteNode:
    """The driver's view of a client whose program runs elsewhere (a Ray actor, a Flower node):
    its name, role and layout, never its data. `label` names the kind of place in its repr."""

    holder = None       # the executor serving it (`Executor.take_over`); its state lives remotely
    label = "RemoteNode"

    def __init__(self, spec: ProgramSpec):
        self.name, self.role = spec.name, spec.role
        self.shared, self.private = spec.shared, spec.private
        self.n_shared, self.n_private = spec.n_shared, spec.n_private

    def __repr__(self) -> str:
        return f"{self.label}({self.name!r})"


def run_on_node(program: NodeProgram, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Serve one request on a node program (used by every executor, wherever the node lives):
    by the procedure registered for `kind` (`messages.lookup`; an unregistered kind is refused)."""
    return lookup(kind)(program, **payload)


def open_executor(executor: Any, programs: dict[str, NodeProgram], procedures: Any) -> Executor:
    """The executor of one run (`make_executor`), started on `programs`, serving the run's
    `procedures` (registered here, `messages.install`; other kinds than these and the runtime's
    own are refused). Use it as `with open_executor(...) as ex:` so that it is closed — its
    programs handed back, actors and threads ended — however the run ends. A start that fails
    closes it before the error goes on."""
    kinds = CORE_KINDS | install(procedures)
    ex = make_executor(executor)
    try:
        started = ex.start(programs)      # (the auto executor returns the one it chose)
    except BaseException:
        ex.close()
        raise
    started.kinds = kinds
    if started.measure_on_start and started.measured_round_trip_cost is None and started.clients:
        try:
            started.measure_round_trip()
        except BaseException:
            started.close()
            raise
    return started


def declared_kind(kind: str) -> MessageKind:
    """The declaration of message kind `kind`; an undeclared kind is refused."""
    declared = MESSAGES.get(kind)
    if declared is None:
        raise FedModelError(f"message kind {kind!r} is not declared in fedmodel.runtime.ledger")
    return declared


def check_sum_fields(declared: MessageKind, fields: Sequence[str]) -> None:
    """Refuse a field of `fields` that is not a numeric reply field of `declared` (`map_sum`)."""
    for name in fields:
        if declared.reply.get(name) in (None, "str", "opaque"):
            raise FedModelError(f"map_sum: reply field {name!r} of {declared.name!r} is not a "
                                f"declared numeric field; declared: {declared.reply}")


def block_floats(kind: MessageKind, fields: dict[str, str], key: str, block: Any, n: int,
                 model_size: int, direction: str) -> int:
    """Floats per node of a stacked field (a block with one row per node), checking its shape
    once: an undeclared field or a row larger than declared is refused, like `check_payload`."""
    if key not in fields:
        raise FedModelError(f"{direction} of message {kind.name!r} carries undeclared field {key!r}; "
                            f"declared: {sorted(fields)}")
    spec = fields[key]
    if spec in ("str", "opaque"):
        if len(block) != n:
            raise FedModelError(f"{direction} of message {kind.name!r}: field {key!r} has "
                                f"{len(block)} entries for {n} nodes")
        return 0
    shape = np.shape(block)
    width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    allowed = allowed_sizes(spec, model_size)
    if not shape or shape[0] != n or width not in allowed:
        raise FedModelError(
            f"{direction} of message {kind.name!r}: field {key!r} is a block of shape {shape} for "
            f"{n} nodes but is declared as {spec!r} (allowed: {n} rows of {allowed} numbers); "
            "refusing to send it")
    return width


def stack_replies(kind: MessageKind, replies: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-node replies → one block per field (rows in the order of `replies`)."""
    keys = list(replies[0]) if replies else list(kind.reply)
    out: dict[str, Any] = {}
    for key in keys:
        values = [r.get(key) for r in replies]
        if kind.reply.get(key) in ("str", "opaque") or any(v is None for v in values):
            out[key] = values
        else:
            out[key] = np.array(values, dtype=float)
    return out


def make_executor(executor: Any) -> Executor:
    """An `Executor` instance as it is, None for the serial executor, or a new instance of the
    executor registered under that name (`fedmodel.registry`: "serial", "batched", "ray", …)."""
    if isinstance(executor, Executor):
        return executor
    return registry.lookup("executor", "serial" if executor is None else executor)()
