"""`FlowerExecutor`: the ServerApp side of fedmodel on Flower — client node programs inside
Flower ClientApps (`client_app`), requests as Flower Messages (`codec`), docs/flower.md.

Simulation (no `grid` given): the backend's loop runs in the calling thread and Flower's
simulation engine in a background thread (`simulation.Simulation`: the Grid is only used by the
thread Flower gave it to). Deployment (`grid=` the Grid of a running ServerApp,
`fedmodel.deploy.server_app`): the executor uses that grid directly, finds each client's
SuperNode by asking the nodes their name, and brings a client whose SuperNode died back when it
rejoins (rebuild + replay of its requests since the build, `replay.ReplayLog`). The server's own
program (its steps are local) stays in the calling process, as with the Ray executor.

A block's build message carries its spec as JSON and its constants as arrays; in simulation the
driver runs the loaders and sends the arrays (the simulation holds everything in one machine
anyway); in deployment a loader never runs on the server: a client reads its own data (its
node config, `client_app.node_data`).

Secure sums (`secure_sum`): `map_sum` runs Flower's SecAgg+ workflow on the grid
(`secagg.secure_map_sum`) and the ClientApp's train handler carries Flower's `secaggplus_mod`
for its messages, so the server sees only Σ_i of the summed reply fields (fixed point).

Every receive has a timeout: a client that does not reply in time stops the run with a
`FedModelError` naming it, except in `map(..., missing="drop")` (a backend's partial
participation), where it is dropped from the run (`lost`). The ledger books declared floats
exactly as the serial executor does; `wire_bytes` counts the bytes of the Flower objects
(records, arrays) of every message, both ways (Flower's deflated object contents, what its
gRPC transport pushes); `round_trip_breakdown` says where the time of a round trip went
(`timings`).
"""
from __future__ import annotations

import copy
import time
from collections import Counter
from typing import Any

import numpy as np

from ...errors import FedModelError
from ..executor import Executor, RemoteNode, run_on_node
from ..messages import MESSAGES
from ..program import NodeProgram, ProgramSpec
from ..replay import ReplayLog
from . import membership, secagg, timings
from .codec import (BUILD, NodeTimeout, build_payload, decode, encode, raise_remote, send_and_receive,
                    split_rider, wire_size, with_rider)
from .simulation import Simulation

try:
    from flwr.app import Message
    from flwr.serverapp import Grid, ServerApp
except ImportError:     # optional extra: make_executor("flower") then says how to install it
    ServerApp = None


class _FlowerNode(RemoteNode):
    """The driver's view of a client on a Flower node: name, role and layout, never its data."""

    label = "FlowerNode"


class FlowerExecutor(Executor):
    """Client node programs in Flower ClientApps; the server's program in this process. See the
    module docstring and docs/flower.md.

    grid: None (run Flower's simulation engine in a background thread) or the `Grid` of a
        running ServerApp (deployment: SuperNodes name their client with
        `--node-config 'fedmodel-client="c0"'`; `fedmodel.deploy.server_app` passes its grid).
    timeout: seconds to wait for the replies of one batch of requests (every receive has one).
        A client that does not reply in time stops the run with `NodeTimeout` naming it; in
        deployment it is first waited for (`rejoin_timeout` s) to rejoin, then rebuilt and its
        requests since its build replayed (`max_restarts` times per client).
    start_timeout: seconds for the simulation to start, the SuperNodes to register, and the
        clients to load their data and compile their programs.
    persistent: (simulation) keep the simulation running when a run ends (`close()`), to serve
        the next `start()` with the same number of clients; `shutdown()` ends it.
    backend_config: Flower's simulation backend config (default: one CPU per ClientApp worker).
    secure_sum: False, True or a dict of SecAgg+ settings (`SECURE_SUM_DEFAULTS`): `map_sum`
        runs Flower's SecAgg+ protocol (`SecAggPlusWorkflow` here, `secaggplus_mod` on the
        clients), so the server sees only the sums; backends then take their sum-only loop
        (`sum_only`). The sums are exact to SecAgg+'s fixed-point precision: one quantum
        2·clipping_range/quantization_range per entry and client (docs/flower.md).
    """

    # a `Rider` (e.g. the history's report) travels inside its carrier's Message: one batch
    folds_riders = True
    round_trip_cost = 0.1    # simulation ~0.08 s a round trip, a deployment ~6.6 s (docs/flower.md)

    #: SecAgg+ settings: Flower's defaults, except weight 1 per client (`max_weight` 1: the
    #: protocol's weighted mean times the count is the plain sum) and every client sharing its
    #: keys with every other (`num_shares` 1.0), two thirds of the shares to reconstruct
    SECURE_SUM_DEFAULTS = {"clipping_range": 8.0, "quantization_range": 2 ** 22,
                           "modulus_range": 2 ** 32, "num_shares": 1.0,
                           "reconstruction_threshold": 2 / 3}

    def __init__(self, timeout: float = 60.0, start_timeout: float = 120.0, persistent: bool = False,
                 backend_config: dict | None = None, grid: "Grid | None" = None,
                 rejoin_timeout: float = 120.0, max_restarts: int = 3,
                 secure_sum: bool | dict = False):
        if ServerApp is None:
            raise FedModelError("executor='flower' needs Flower: pip install 'fedmodel[flower]'")
        for name, value in (("timeout", timeout), ("start_timeout", start_timeout),
                            ("rejoin_timeout", rejoin_timeout)):
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
                raise FedModelError(f"{name} must be positive seconds, got {value!r}")
        if not (isinstance(max_restarts, int) and max_restarts >= 0):
            raise FedModelError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
        super().__init__()
        self.timeout, self.start_timeout = float(timeout), float(start_timeout)
        self.rejoin_timeout, self.max_restarts = float(rejoin_timeout), max_restarts
        self.persistent = bool(persistent)
        self.backend_config = backend_config if backend_config is not None else \
            {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
        self.grid = grid
        self.secure_sum = secure_sum
        self.node_ids: dict[str, int] = {}       # client -> Flower node id
        self.wire_bytes: Counter = Counter()     # (sender, receiver, kind) -> bytes on the wire
        self.round_trips = 0                     # batches sent through the Grid
        # ... by request kind: every batch, the build and the kinds the ledger books `local`
        # (reports, gathers) too, so a run's round trips beyond the ledger's are named
        self.trips: Counter = Counter()
        self.timings: list[dict] = []            # per reply: where its round trip went (`_send`)
        self._lost: dict[str, str] = {}          # client -> why it was dropped (missing="drop")
        self._specs: dict[str, dict] = {}         # client -> its build message (spec text, arrays)
        self.replay = ReplayLog()                # per client: requests since its build; faults
        self._simulation: Simulation | None = None     # (simulation: Flower's engine, started by `start`)

    # ---- life cycle -----------------------------------------------------------------------------
    def start(self, programs: dict[str, NodeProgram | ProgramSpec]) -> "FlowerExecutor":
        remote: dict[str, ProgramSpec] = {}
        for name, program in programs.items():
            spec = program if isinstance(program, ProgramSpec) else getattr(program, "spec", None)
            if program.role != "server" and spec is not None:
                remote[name] = spec
        super().start({name: (_FlowerNode(remote[name]) if name in remote else program)
                       for name, program in programs.items()})
        self.wire_bytes, self.round_trips, self._lost = Counter(), 0, {}
        self.trips = Counter()
        self.timings = []
        self.replay.start(remote)
        self.node_ids = {}
        if not remote:          # every program runs here (e.g. one pooled program): no Flower
            return self
        try:
            if self.grid is None:
                if self._simulation is not None and self._simulation.n != len(remote):
                    self.shutdown()
                if self._simulation is None:
                    self._simulation = Simulation(len(remote), self.backend_config, self.start_timeout)
                self.node_ids = dict(zip(remote, self._wait_for_nodes(len(remote))))
            else:
                self.node_ids = membership.identify(self, list(remote), self.start_timeout)
            # simulation: the driver runs the loaders and sends the arrays; deployment: a
            # loader's data is the client's own (its node config), never loaded here
            ship = _load_here if self.grid is None else (lambda data: None)
            self._specs = {name: build_payload(spec, ship) for name, spec in remote.items()}
            self._exchange(BUILD, self._specs, {}, self.start_timeout)
        except BaseException:       # backends never get to close() when start fails
            self.close()
            raise
        return self

    def _wait_for_nodes(self, n: int) -> list[int]:
        """The ids of the n SuperNodes (the simulation registers them after the ServerApp has
        started)."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            node_ids = sorted(self._ask(lambda grid: list(grid.get_node_ids()), self.start_timeout))
            if len(node_ids) >= n:
                return node_ids[:n]
            if time.monotonic() > deadline:
                raise FedModelError(f"Flower's simulation has {len(node_ids)} of {n} SuperNodes after "
                                    f"{self.start_timeout:g} s (start_timeout)")
            time.sleep(0.05)

    def _ask(self, work, timeout: float) -> Any:
        """Run `work(grid)` where the grid lives: in deployment here, in simulation in the
        ServerApp's thread (`Simulation.ask`); its result (or its exception)."""
        if self.grid is not None:
            return work(self.grid)
        if self._simulation is None:
            raise FedModelError("Flower's simulation is not running (it ended)")
        return self._simulation.ask(work, timeout)

    def close(self) -> None:
        """End of a run: the programs are freed; the simulation ends unless `persistent`."""
        super().close()
        if not self.persistent:
            self.shutdown()

    def shutdown(self) -> None:
        """End Flower's simulation (its ServerApp returns; Flower then stops its workers and
        the Ray it started). In deployment the SuperLink's run ends with the ServerApp."""
        simulation, self._simulation = self._simulation, None
        if simulation is not None:
            simulation.stop()

    # ---- dispatch ---------------------------------------------------------------------------------
    @property
    def lost(self) -> frozenset:
        """Clients dropped in this run: they did not reply in time to a request sent with
        `map(..., missing="drop")` (a backend's partial participation); no request reaches them
        afterwards."""
        return frozenset(self._lost)

    @property
    def faults(self) -> list[dict]:
        """One record per client that had to rejoin or was dropped (`replay.ReplayLog.fault`:
        node, kind, old and new Flower node id, restart, requests replayed, time)."""
        return self.replay.faults

    def _refuse_lost(self, kind: str, nodes) -> None:
        lost = [node for node in nodes if node in self._lost]
        if lost:
            raise NodeTimeout(f"client(s) {lost} were dropped earlier in this run "
                              f"({'; '.join(self._lost[n] for n in lost)}); {kind!r} cannot reach them")

    def _dispatch_batch(self, kind, payloads):
        return self._dispatch_remote(kind, payloads, drop=False)

    def _dispatch_available(self, kind, payloads):
        """A client that does not reply within `timeout` (in deployment too: no rejoin here)
        is dropped for the rest of the run (`lost`, `faults`) and left out of the replies."""
        return self._dispatch_remote(kind, payloads, drop=True)

    def _dispatch_riding(self, kind, payloads, rider, drop):
        """The carrier and its `Rider` in one Message per client (`codec.with_rider`: the
        rider's fields prefixed, its kind in the header); the server's own nodes serve both
        here, in the rider's order."""
        replies = self._dispatch_remote(kind, payloads, drop, rider)
        ridden = {}
        for node, reply in replies.items():
            replies[node], ridden[node] = split_rider(reply)
        return replies, ridden

    def _dispatch_remote(self, kind: str, payloads: dict[str, dict], drop: bool,
                         rider: Any = None) -> dict[str, dict]:
        """Serve the local nodes (the server) in this process and send the clients' requests;
        log the state-changing ones that were served for a later replay. With a `rider`, every
        reply carries the rider's (`codec.with_rider`)."""
        remote = {node: p for node, p in payloads.items() if node in self.node_ids}
        replies = {node: _serve_here(self.programs[node], kind, payload, rider, node)
                   for node, payload in payloads.items() if node not in self.node_ids}
        if not remote:
            return replies
        fields = MESSAGES[kind].request
        if drop:
            got, missing = self._send(kind, remote, fields, self.timeout, rider)
            for node in missing:
                self._lost[node] = f"no reply to {kind!r} within {self.timeout:g} s"
                self.replay.fault(node, kind, replay=False, old_node_id=self.node_ids[node], lost=True)
        else:
            got = self._exchange(kind, remote, fields, self.timeout, rider)
        replies.update(got)
        for node in got:
            self.replay.record(node, kind, remote[node])    # (a rider is read-only: not replayed)
        return replies

    def _exchange(self, kind: str, payloads: dict[str, dict], fields: dict[str, str],
                  timeout: float, rider: Any = None) -> dict[str, dict]:
        """Send one Message per client and wait (at most `timeout` s) for every reply. In
        deployment, a client that did not reply is waited for to rejoin, rebuilt and replayed,
        and asked again."""
        replies, missing = self._send(kind, payloads, fields, timeout, rider)
        restarts: Counter = Counter()
        while missing:
            if self.grid is None or kind == BUILD:
                raise NodeTimeout(
                    f"client(s) {missing} (Flower node {[self.node_ids[n] for n in missing]}) did "
                    f"not reply to {kind!r} within {timeout:g} s; the run stops here (raise the "
                    "executor's timeout if their local work is legitimately slower)")
            for node in missing:
                restarts[node] += 1
                membership.rejoin(self, node, kind, restarts[node])
            again, missing = self._send(kind, {n: payloads[n] for n in missing}, fields, timeout, rider)
            replies.update(again)
        return {node: replies[node] for node in payloads}

    def _send(self, kind: str, payloads: dict[str, dict], fields: dict[str, str],
              timeout: float, rider: Any = None) -> tuple[dict[str, dict], list[str]]:
        """One round trip: the replies that arrived within `timeout`, and the clients missing
        (with a `rider`: its fields in each request and each reply)."""
        message_type = "query" if kind in MESSAGES and MESSAGES[kind].read_only else "train"
        extra = None if rider is None else {"ride": [rider.kind, bool(rider.before)]}
        sent: dict[str, Any] = {}
        for node, payload in payloads.items():
            if rider is not None:
                payload = with_rider(payload, rider.payload(node))
            content = encode(kind, payload, fields, extra=extra)
            sent[node] = Message(content, dst_node_id=self.node_ids[node], message_type=message_type)
            self.wire_bytes[("server", node, kind)] += wire_size(content)
        stamps: dict[str, float] = {}
        posted = time.time()
        answers = self._ask(lambda grid: send_and_receive(grid, list(sent.values()), timeout,
                                                          stamps), timeout)
        self.round_trips += 1
        self.trips[kind] += 1
        by_id = {m.metadata.message_id: node for node, m in sent.items()}
        got = {by_id[a.metadata.reply_to_message_id]: a for a in answers
               if a.metadata.reply_to_message_id in by_id}
        replies = {}
        for node, answer in got.items():
            if answer.has_error():
                raise FedModelError(f"client {node!r}: Flower reported an error serving {kind!r}: "
                                    f"{answer.error.reason}")
            self.wire_bytes[(node, "server", kind)] += wire_size(answer.content)
            meta, reply = decode(answer.content)
            if meta.get("failed"):
                raise_remote(node, kind, reply["error"])
            self._time(kind, node, posted, stamps.get(answer.metadata.reply_to_message_id),
                       meta.get("timing"))
            replies[node] = reply
        return replies, [node for node in payloads if node not in got]

    def _time(self, kind: str, node: str, posted: float, pulled: float | None,
              client: Any) -> None:
        """Keep one reply's time stamps (`timings.stamps`)."""
        found = timings.stamps(kind, node, posted, pulled, client)
        if found is not None:
            self.timings.append(found)

    def round_trip_breakdown(self) -> dict[str, float]:
        """Median seconds per reply of each stage of this run's round trips
        (`timings.breakdown`; docs/flower.md)."""
        return timings.breakdown(self.timings)

    # ---- secure sums (SecAgg+) ---------------------------------------------------------------------
    @property
    def secure_sum(self) -> dict | None:
        """The SecAgg+ settings `map_sum` uses, or None (plain sums)."""
        return self._secure

    @secure_sum.setter
    def secure_sum(self, value: bool | dict) -> None:
        self._secure = secagg.settings_of(value, self.SECURE_SUM_DEFAULTS)

    @property
    def sum_only(self) -> bool:
        """True with `secure_sum`: the server sees only the sums `map_sum` returns."""
        return self._secure is not None

    def map_sum(self, kind, nodes, common=None, fields=("x",)):
        """Σ over `nodes` of the reply fields `fields` of `kind`; with `secure_sum` through
        Flower's SecAgg+ (one protocol run: four round trips), so that the server never sees a
        client's reply, only the sums (exact to the protocol's fixed-point precision). The
        ledger books the request and the summed fields of each reply."""
        if self._secure is None:
            return super().map_sum(kind, nodes, common, fields)
        return secagg.secure_map_sum(self, kind, list(nodes), dict(common or {}), list(fields))

    def wire_total(self, direction: str | None = None) -> int:
        """Bytes of all messages ("down": server → clients, "up": clients → server, None: both)."""
        return sum(b for (s, _, _), b in self.wire_bytes.items()
                   if direction is None or (s == "server") == (direction == "down"))


def _serve_here(program: Any, kind: str, payload: dict, rider: Any, node: str) -> dict:
    """Serve a request on a node of this process (the server), with its rider if any (its
    reply fields prefixed, as a client's: `codec.with_rider`)."""
    if rider is None:
        return run_on_node(program, kind, payload)
    early = run_on_node(program, rider.kind, rider.payload(node)) if rider.before else None
    reply = run_on_node(program, kind, payload)
    return with_rider(reply, early if rider.before else run_on_node(program, rider.kind, rider.payload(node)))


def _load_here(data: Any) -> np.ndarray:
    """(Simulation) a loader's data, loaded in this process to be sent to its client: on a
    copy of the leaf, so the model's Data stays remote here (a DataError names the block)."""
    return copy.copy(data).load()


