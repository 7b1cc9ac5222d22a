"""`FlowerExecutor`: the ServerApp side of fedmodel on Flower — client node programs inside
Flower ClientApps (`client_app`), requests as Flower Messages (`codec`), docs/flower.md.

Simulation (no `grid` given): the backend's loop runs in the calling thread. Flower's simulation
engine (`flwr.simulation.run_simulation`) runs in a background thread and starts this
executor's ServerApp there; the ServerApp's `main` hands nothing out but serves a queue of jobs:
each job is one batch of Messages that it sends with `grid.send_and_receive(..., timeout=...)`,
so the Grid is only ever used by the thread Flower gave it to. Deployment (`grid=` the Grid of a
running ServerApp, `fedmodel.deploy.server_app`): the executor uses that grid directly, finds each
client's SuperNode by asking the nodes their name, and brings a client whose SuperNode died back
when it rejoins (rebuild + replay of its requests since the build, `replay.ReplayLog`). The
server's own program (its steps are local) stays in the calling process, as with the Ray
executor.

A block's build message carries its spec as JSON and its constants as arrays; in simulation the
driver runs the loaders and sends the arrays (the simulation holds everything in one machine
anyway); in deployment a loader never runs on the server: a client reads its own data (its
node config, `client_app.node_data`).

Secure sums (`secure_sum`): `map_sum` runs Flower's SecAgg+ workflow on the grid (`secagg`) and
the ClientApp's train handler carries Flower's `secaggplus_mod` for its messages, so the server
sees only Σ_i of the summed reply fields (fixed point; docs/flower.md).

Every receive has a timeout: a client that does not reply in time stops the run with a
`FedModelError` naming it, except in `map(..., missing="drop")` (a backend's partial
participation), where it is dropped from the run (`lost`). The ledger books declared floats
exactly as the serial executor does; `wire_bytes` counts the bytes of the Flower objects
(records, arrays) of every message, both ways (Flower's deflated object contents, what its
gRPC transport pushes).
"""
from __future__ import annotations

import copy
import json
import queue
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

from ...errors import FedModelError
from ..executor import Executor, RemoteNode, check_sum_fields, declared_kind, run_on_node
from ..messages import MESSAGES, check_payload
from ..program import NodeProgram, ProgramSpec
from ..replay import ReplayLog
from . import secagg
from .client_app import client_app
from .codec import (BUILD, HELLO, NODE_NAME_KEY, REPLAY, build_payload, decode, encode,
                    raise_remote, send_and_receive, split_rider, wire_size, with_rider)

try:
    from flwr.app import Context, Message
    from flwr.serverapp import Grid, ServerApp
except ImportError:     # optional extra: make_executor("flower") then says how to install it
    ServerApp = None


class NodeTimeout(FedModelError):
    """A client did not reply within the executor's timeout."""


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
        self._thread: threading.Thread | None = None
        self._jobs: queue.Queue = queue.Queue()
        self._grid_box: queue.Queue = queue.Queue()
        self._failure: list[BaseException] = []
        self._n_nodes = 0

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
                if self._thread is not None and self._n_nodes != len(remote):
                    self.shutdown()
                if self._thread is None:
                    self._launch(len(remote))
                self.node_ids = dict(zip(remote, self._wait_for_nodes(len(remote))))
            else:
                self.node_ids = self._identify(list(remote), self.start_timeout)
            # simulation: the driver runs the loaders and sends the arrays; deployment: a
            # loader's data is the client's own (its node config), never loaded here
            ship = _load_here if self.grid is None else (lambda data: None)
            self._specs = {name: build_payload(spec, ship) for name, spec in remote.items()}
            self._exchange(BUILD, self._specs, {}, self.start_timeout)
        except BaseException:       # backends never get to close() when start fails
            self.close()
            raise
        return self

    def _launch(self, n: int) -> None:
        """Start Flower's simulation engine with n SuperNodes in a background thread."""
        from flwr.simulation import run_simulation

        server_app = ServerApp()

        @server_app.main()
        def _main(grid: "Grid", context: "Context") -> None:
            if hasattr(grid, "pull_interval"):     # the in-memory grid polls for replies: 0.1 s
                grid.pull_interval = 0.002
            self._grid_box.put(True)
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                work, box = job
                try:
                    box.put((True, work(grid)))
                except BaseException as err:    # handed to the caller's thread, which raises it
                    box.put((False, err))

        def _simulate() -> None:
            try:
                run_simulation(server_app=server_app, client_app=client_app, num_supernodes=n,
                               backend_config=json.loads(json.dumps(self.backend_config)))
            except BaseException as err:    # reported to the caller by `_ask`
                self._failure.append(err)
            finally:
                self._grid_box.put(False)

        self._failure, self._jobs, self._grid_box = [], queue.Queue(), queue.Queue()
        self._thread = threading.Thread(target=_simulate, name="fedmodel-flower", daemon=True)
        self._n_nodes = n
        self._thread.start()
        try:
            ready = self._grid_box.get(timeout=self.start_timeout)
        except queue.Empty:
            raise FedModelError(f"Flower's simulation did not start within {self.start_timeout:g} s "
                                "(start_timeout)") from None
        if not ready:
            raise FedModelError(f"Flower's simulation failed to start: {self._failure_text()}")

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

    def _identify(self, names: list[str], wait: float) -> dict[str, int]:
        """Deployment: the Flower node of each client in `names`, by asking every node not yet
        known which client it is (its `fedmodel-client` node config), until all have answered
        or `wait` seconds have passed."""
        deadline = time.monotonic() + wait
        found: dict[str, int] = {}
        asked: set[int] = set(self.node_ids.values())
        while True:
            fresh = [i for i in self._ask(lambda grid: list(grid.get_node_ids()), wait) if i not in asked]
            if fresh:
                hello = [Message(encode(HELLO, {}, {}), dst_node_id=i, message_type="query")
                         for i in fresh]
                answers = self._ask(lambda grid: send_and_receive(
                    grid, hello, max(1.0, min(self.timeout, deadline - time.monotonic()))), wait)
                for answer in answers:
                    if answer.has_error():
                        continue
                    name = decode(answer.content)[1].get("name")
                    if name in names and name not in found:
                        found[name] = answer.metadata.src_node_id
                asked.update(a.metadata.src_node_id for a in answers)
            missing = [n for n in names if n not in found]
            if not missing:
                return found
            if time.monotonic() > deadline:
                raise NodeTimeout(
                    f"no SuperNode for client(s) {missing} answered within {wait:g} s (start each "
                    f"with --node-config '{NODE_NAME_KEY}=\"NAME\"'; see docs/flower.md)")
            time.sleep(0.5)

    def _failure_text(self) -> str:
        return repr(self._failure[0]) if self._failure else "it ended"

    def _ask(self, work, timeout: float) -> Any:
        """Run `work(grid)` where the grid lives: in deployment here, in simulation in the
        ServerApp's thread; its result (or its exception)."""
        if self.grid is not None:
            return work(self.grid)
        if self._thread is None or not self._thread.is_alive():
            raise FedModelError(f"Flower's simulation is not running ({self._failure_text()})")
        box: queue.Queue = queue.Queue()
        self._jobs.put((work, box))
        deadline = time.monotonic() + timeout + 30.0     # the grid's own timeout ends it first
        while True:
            try:
                ok, value = box.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    raise FedModelError("Flower's ServerApp stopped answering "
                                        f"({self._failure_text()})") from None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """End of a run: the programs are freed; the simulation ends unless `persistent`."""
        super().close()
        if not self.persistent:
            self.shutdown()

    def shutdown(self) -> None:
        """End Flower's simulation (its ServerApp returns; Flower then stops its workers and
        the Ray it started). In deployment the SuperLink's run ends with the ServerApp."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join()

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
                self._rejoin(node, kind, restarts[node])
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
        """Keep one reply's time stamps (`timings`, `round_trip_breakdown`): the server's
        (sent, pulled) and the client's (`client_app.serve_message`), numbers only."""
        if not isinstance(client, dict):
            return
        stamps = {k: float(v) for k, v in client.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.timings.append({"kind": kind, "node": node, "posted": posted, "pulled": pulled,
                             **stamps})

    def round_trip_breakdown(self) -> dict[str, float]:
        """Median seconds per reply of each stage of a round trip (`timings`; docs/flower.md):
        to_process (server push → the ClientApp's process started: SuperLink, the SuperNode's
        pull, its SuperExec's poll, the process start), imports (process start → Flower and
        fedmodel imported), to_handler (→ fedmodel's handler entered: Flower loads the app and
        the task's Context), lookup / program / serve / save (fedmodel: the request's procedure,
        the node program, the request, its state), to_server (reply ready → pulled by the server), total (push → pull),
        round_trip (push → the batch's last reply pulled); cpu_before / cpu_handler: CPU
        seconds of the client's process before fedmodel's handler and in it."""
        rows = [t for t in self.timings if t.get("pulled") is not None and "left" in t]
        if not rows:
            return {}

        def median(values: list) -> float:
            values = [v for v in values if v is not None]
            return float(np.median(values)) if values else float("nan")

        with_start = [t for t in rows if t.get("started") is not None]
        batches: dict[float, float] = {}    # one round trip: push → its last reply pulled
        for t in rows:
            batches[t["posted"]] = max(batches.get(t["posted"], 0.0), t["pulled"] - t["posted"])
        return {
            "replies": float(len(rows)),
            "round_trip": median(list(batches.values())),
            "to_process": median([t["started"] - t["posted"] for t in with_start]),
            "imports": median([t["imported"] - t["started"] for t in with_start]),
            "to_handler": median([t["entered"] - t["imported"] for t in rows]),
            "lookup": median([t.get("lookup", 0.0) for t in rows]),
            "program": median([t["program"] for t in rows]),
            "serve": median([t["served"] for t in rows]),
            "save": median([t["saved"] for t in rows]),
            "to_server": median([t["pulled"] - t["left"] for t in rows]),
            # CPU seconds of the ClientApp process before fedmodel's handler, and in it
            "cpu_before": median([t.get("cpu_entered") for t in rows]),
            "cpu_handler": median([t["cpu_left"] - t["cpu_entered"] for t in rows
                                   if "cpu_left" in t and "cpu_entered" in t]),
            "total": median([t["pulled"] - t["posted"] for t in rows]),
        }

    def _rejoin(self, node: str, kind: str, restart: int) -> None:
        """Deployment: wait for `node`'s SuperNode to come back (a new Flower node naming the
        same client), rebuild its program there and replay its requests since the build (one
        message), so it holds the state it had before the failed request."""
        record = self.replay.fault(node, kind, old_node_id=self.node_ids[node], restart=restart)
        if restart > self.max_restarts:
            record["fatal"] = True
            raise NodeTimeout(f"client {node!r} did not reply to {kind!r} within {self.timeout:g} s "
                              f"{restart} times; max_restarts={self.max_restarts}")
        try:
            self.node_ids[node] = self._identify([node], self.rejoin_timeout)[node]
        except NodeTimeout:
            record["fatal"] = True
            raise NodeTimeout(f"client {node!r} did not reply to {kind!r} within {self.timeout:g} s "
                              f"and did not rejoin within {self.rejoin_timeout:g} s "
                              "(rejoin_timeout)") from None
        record["new_node_id"] = self.node_ids[node]
        for step, payload, fields in ((BUILD, self._specs[node], {}),
                                      (REPLAY, {"steps": self.replay.steps(node)}, {})):
            _, missing = self._send(step, {node: payload}, fields, self.start_timeout)
            if missing:
                raise NodeTimeout(f"client {node!r} rejoined but did not answer {step!r} within "
                                  f"{self.start_timeout:g} s")
        record["recovered"] = True

    # ---- secure sums (SecAgg+) ---------------------------------------------------------------------
    @property
    def secure_sum(self) -> dict | None:
        """The SecAgg+ settings `map_sum` uses, or None (plain sums)."""
        return self._secure

    @secure_sum.setter
    def secure_sum(self, value: bool | dict) -> None:
        if value is False or value is None:
            self._secure = None
            return
        given = {} if value is True else value
        if not isinstance(given, dict) or set(given) - set(self.SECURE_SUM_DEFAULTS):
            raise FedModelError(f"secure_sum must be True, False or a dict with keys from "
                                f"{sorted(self.SECURE_SUM_DEFAULTS)}, got {value!r}")
        settings = {**self.SECURE_SUM_DEFAULTS, **given}
        try:        # Flower checks the ranges, shares and threshold (ValueError / TypeError)
            secagg.secagg_workflow(settings, None)
        except (ValueError, TypeError) as err:
            raise FedModelError(f"secure_sum: {err}") from None
        self._secure = settings

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
        declared = declared_kind(kind)
        nodes, common, fields = list(nodes), dict(common or {}), list(fields)
        self._serve(nodes)
        check_sum_fields(declared, fields)
        local = [n for n in nodes if n not in self.node_ids]
        if local or len(nodes) < 2:
            raise FedModelError(f"a secure sum needs at least two clients served by Flower, got "
                                f"{nodes}" + (f" ({local} run here)" if local else ""))
        floats = check_payload(declared, declared.request, common, self.model_size, "request")
        fitins = secagg.to_fitins(encode(kind, common, declared.request, {"sum": fields}, pack=False))
        started = time.monotonic()
        sums, failures, seen = self._ask(
            lambda grid: secagg.secure_round(self._secure, grid, self, kind, fitins,
                                             {self.node_ids[n]: n for n in nodes}), 4 * self.timeout)
        missing = [n for n in nodes if self.node_ids[n] not in seen]
        if missing or sums is None:
            # a client's own error (Flower's reason carries its text) or no reply in time
            reasons = "".join(f"\n  {n}: {r.strip().splitlines()[-1] if r.strip() else r}"
                              for n, r in failures.items())
            raise (FedModelError if failures else NodeTimeout)(
                f"client(s) {missing or nodes} did not complete the secure sum of "
                              f"{kind!r} ({time.monotonic() - started:.3g} s; timeout "
                              f"{self.timeout:g} s per SecAgg+ stage)" + reasons)
        out = {}
        for field, total in zip(fields, sums):
            total = np.asarray(total, float) * len(nodes)   # SecAgg+ returns the mean
            out[field] = total
        reply_floats = sum(int(np.size(v)) for v in out.values())
        self.ledger.exchange(kind, nodes)     # (one sum of the algorithm's; SecAgg+'s stages: `round_trips`)
        for node in nodes:
            self.ledger.record("server", node, kind, floats)
            self.ledger.record(node, "server", kind, reply_floats)
            self.replay.record(node, kind, dict(common))
        return out

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


