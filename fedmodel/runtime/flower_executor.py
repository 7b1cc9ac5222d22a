"""`FlowerExecutor`: client node programs inside a Flower ClientApp, requests as Flower Messages.

The backend's loop runs in the calling thread. Flower's simulation engine
(`flwr.simulation.run_simulation`) runs in a background thread and starts this executor's
ServerApp there; the ServerApp's `main` hands nothing out but serves a queue of jobs: each job
is one batch of Messages that it sends with `grid.send_and_receive(..., timeout=...)`, so the
Grid is only ever used by the thread Flower gave it to. The server's own program (its steps are
local) stays in the calling process, as with the Ray executor.

On the client side, one ClientApp (`client_app`, module level) serves every request:

- a "fedmodel.build" message carries the block's `ProgramSpec` (pickled); the ClientApp runs
  the block's loaders there and compiles the node program (its data is loaded on the client
  only), and keeps the spec in the node's Flower `Context.state`;
- every other message carries one declared request (`ledger.MESSAGES`): arrays in an
  `ArrayRecord`, Python scalars and strings in a `ConfigRecord`, "opaque" fields (node state,
  multiplier dicts) pickled as bytes. The ClientApp serves it with `executor.run_on_node`, the
  same function every executor uses, so backends' `@procedure` steps run unchanged.

Node state lives in Flower's `Context.state` of the node: after a state-changing request the
node's `save_state` is stored there with a fresh token. Flower may run a node's next message in
another worker process (its actor pool); a worker whose cached program does not carry the
context's token rebuilds the program from the spec and loads that state, so the iterates do not
depend on which worker served which message.

Every receive has a timeout: a client that does not reply in time stops the run with a
`FedModelError` naming it. The ledger books declared floats exactly as the serial executor does;
`wire_bytes` counts the bytes of the Flower objects (records, arrays) of every message, both
ways (Flower's deflated object contents, what its gRPC transport pushes).
"""
from __future__ import annotations

import importlib
import json
import pickle
import queue
import threading
import time
import traceback
import uuid
from collections import Counter
from typing import Any

import numpy as np

from ..errors import FedModelError
from .executor import Executor, run_on_node
from .ledger import MESSAGES, PROCEDURES
from .program import NodeProgram, ProgramSpec

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
except ImportError:     # optional extra: make_executor("flower") then says how to install it
    ClientApp = None

BUILD = "fedmodel.build"        # message kind that ships a block's spec to its client
_META, _ARRAYS, _CONFIG = "fm_meta", "fm_arrays", "fm_config"
_STATE = "fedmodel"             # key of this node's record in Flower's Context.state


class NodeTimeout(FedModelError):
    """A client did not reply within the executor's timeout."""


# ---- payload <-> Flower records -------------------------------------------------------------------
def encode(kind: str, payload: dict[str, Any], fields: dict[str, str], extra: dict | None = None) -> "RecordDict":
    """One request or reply as a Flower RecordDict: numpy arrays (and numpy scalars, as 0-d
    arrays) in an ArrayRecord, Python bools/ints/floats/strings in a ConfigRecord, declared
    "opaque" fields and anything else pickled as bytes; None values are listed in the header."""
    arrays: dict[str, Any] = {}
    config: dict[str, Any] = {}
    meta: dict[str, Any] = {"kind": kind, "none": [], "pickled": [], "scalar": [], **(extra or {})}
    for key, value in payload.items():
        if value is None:
            meta["none"].append(key)
        elif fields.get(key) == "opaque" or not isinstance(value, (np.ndarray, np.generic, bool, int,
                                                                       float, str)):
            config[key] = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            meta["pickled"].append(key)
        elif isinstance(value, np.ndarray):
            arrays[key] = Array(np.ascontiguousarray(value))
        elif isinstance(value, np.generic):
            arrays[key] = Array(np.asarray(value))
            meta["scalar"].append(key)
        else:
            config[key] = value
    config["fm_header"] = json.dumps(meta)
    return RecordDict({_ARRAYS: ArrayRecord(arrays), _CONFIG: ConfigRecord(config)})


def decode(content: "RecordDict") -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and the payload of a RecordDict made by `encode` (arrays writable copies)."""
    config = dict(content[_CONFIG])
    meta = json.loads(config.pop("fm_header"))
    payload: dict[str, Any] = {}
    for key, array in content[_ARRAYS].items():
        value = np.array(array.numpy())
        payload[key] = value[()] if key in meta["scalar"] else value
    for key, value in config.items():
        payload[key] = pickle.loads(value) if key in meta["pickled"] else value
    for key in meta["none"]:
        payload[key] = None
    return meta, payload


def wire_size(content: "RecordDict") -> int:
    """Bytes of the Flower objects of one message's content (each distinct object once, as
    Flower's transport pushes them)."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(content).values())


# ---- client side ---------------------------------------------------------------------------------
# Node programs this worker process has built: (run id, node id) -> (build, token, program). The
# build id names the spec it was compiled from (one per `start`), the token which state of the
# node it holds (`Context.state`, module docstring).
_CACHE: dict[tuple[int, int], tuple[str, str, NodeProgram]] = {}


def _serve_message(message: "Message", context: "Context") -> "Message":
    """The ClientApp's one handler: build the node program or serve one request on it."""
    meta, payload = decode(message.content)
    kind = meta["kind"]
    key = (message.metadata.run_id, message.metadata.dst_node_id)
    try:
        if kind == BUILD:
            spec_bytes = payload["spec"]
            program = pickle.loads(spec_bytes).build()   # runs the loaders here, on the client
            build, token = uuid.uuid4().hex, uuid.uuid4().hex
            context.state[_STATE] = ConfigRecord({"spec": spec_bytes, "build": build, "token": token,
                                                  "state": b""})
            _CACHE[key] = (build, token, program)
            reply = {"n_shared": program.n_shared}
            fields: dict[str, str] = {}
        else:
            if meta.get("module"):      # importing the module registers the backend's procedure
                importlib.import_module(meta["module"])
            program = _program_of(key, context)
            reply = run_on_node(program, kind, payload)
            fields = MESSAGES[kind].reply
            if not MESSAGES[kind].read_only:
                record = context.state[_STATE]
                token = uuid.uuid4().hex
                state = program.save_state()["state"]
                context.state[_STATE] = ConfigRecord({**dict(record), "token": token,
                                                      "state": pickle.dumps(state)})
                _CACHE[key] = (record["build"], token, program)
        content = encode(kind, reply, fields)
    except Exception as err:    # sent back to the driver, which raises it (never a silent reply)
        content = encode(kind, {"error": _portable(err)}, {"error": "opaque"}, {"failed": True})
    return Message(content, reply_to=message)


def _program_of(key: tuple[int, int], context: "Context") -> NodeProgram:
    """This node's program holding the state recorded in its Context: the cached one when it
    does, else rebuilt from the spec with that state loaded."""
    if _STATE not in context.state:
        raise FedModelError("this Flower node has no fedmodel program: the executor sends "
                            f"{BUILD!r} first")
    record = context.state[_STATE]
    build, token = record["build"], record["token"]
    cached = _CACHE.get(key)
    if cached is not None and cached[:2] == (build, token):
        return cached[2]
    # a program of this run's spec compiled here earlier is reused (only its state is stale)
    program = cached[2] if cached is not None and cached[0] == build else \
        pickle.loads(record["spec"]).build()
    if record["state"]:
        program.load_state(pickle.loads(record["state"]))
    _CACHE[key] = (build, token, program)
    return program


def _portable(err: Exception) -> Any:
    """The exception itself when it survives pickling (a FedModelError naming the data and the
    client), else its type, message and traceback as text."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:   # an unpicklable exception: its text still reaches the driver
        return f"{type(err).__name__}: {err}\n{traceback.format_exc()}"


if ClientApp is not None:
    client_app = ClientApp()
    client_app.train()(_serve_message)      # state-changing requests
    client_app.query()(_serve_message)      # read-only requests (reports, queries, save_state)
else:
    client_app = None


# ---- driver side ---------------------------------------------------------------------------------
class _RemoteNode:
    """The driver's view of a client on a Flower node: name, role and layout, never its data."""

    holder = None

    def __init__(self, spec: ProgramSpec):
        self.name, self.role = spec.name, spec.role
        self.shared, self.private = spec.shared, spec.private
        self.n_shared, self.n_private = spec.n_shared, spec.n_private

    def __repr__(self) -> str:
        return f"FlowerNode({self.name!r})"


class FlowerExecutor(Executor):
    """Client node programs in Flower ClientApps on Flower's simulation engine; the server's
    program in the calling process. See the module docstring and docs/flower.md.

    timeout: seconds to wait for the replies of one batch of requests (every receive has one);
        a client that does not reply in time stops the run with `NodeTimeout` naming it.
    start_timeout: seconds for the simulation to start and for the clients to load their data
        and compile their programs.
    persistent: keep the simulation running when a run ends (`close()`), to serve the next
        `start()` with the same number of clients; `shutdown()` ends it.
    backend_config: Flower's simulation backend config (default: one CPU per ClientApp worker).
    """

    def __init__(self, timeout: float = 60.0, start_timeout: float = 120.0, persistent: bool = False,
                 backend_config: dict | None = None):
        if ClientApp is None:
            raise FedModelError("executor='flower' needs Flower: pip install 'fedmodel[flower]'")
        for name, value in (("timeout", timeout), ("start_timeout", start_timeout)):
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
                raise FedModelError(f"{name} must be positive seconds, got {value!r}")
        super().__init__()
        self.timeout, self.start_timeout = float(timeout), float(start_timeout)
        self.persistent = bool(persistent)
        self.backend_config = backend_config if backend_config is not None else \
            {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
        self.node_ids: dict[str, int] = {}       # client -> Flower node id
        self.wire_bytes: Counter = Counter()     # (sender, receiver, kind) -> bytes on the wire
        self.round_trips = 0                     # batches sent through the Grid
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
        super().start({name: (_RemoteNode(remote[name]) if name in remote else program)
                       for name, program in programs.items()})
        self.wire_bytes, self.round_trips = Counter(), 0
        self.node_ids = {}
        if not remote:          # every program runs here (e.g. one pooled program): no Flower
            return self
        try:
            if self._thread is not None and self._n_nodes != len(remote):
                self.shutdown()
            if self._thread is None:
                self._launch(len(remote))
            self.node_ids = dict(zip(remote, self._wait_for_nodes(len(remote))))
            specs = {name: {"spec": pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)}
                     for name, spec in remote.items()}
            self._exchange(BUILD, specs, {"spec": "opaque"}, self.start_timeout)
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

    def _failure_text(self) -> str:
        return repr(self._failure[0]) if self._failure else "it ended"

    def _ask(self, work, timeout: float) -> Any:
        """Run `work(grid)` in the ServerApp's thread; its result (or its exception)."""
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
        the Ray it started)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join()

    # ---- dispatch ---------------------------------------------------------------------------------
    def _dispatch_batch(self, kind, payloads):
        remote = {node: p for node, p in payloads.items() if node in self.node_ids}
        # local nodes (the server) are served in this process
        replies = {node: run_on_node(self.programs[node], kind, payload)
                   for node, payload in payloads.items() if node not in self.node_ids}
        if remote:
            replies.update(self._exchange(kind, remote, MESSAGES[kind].request, self.timeout))
        return replies

    def _exchange(self, kind: str, payloads: dict[str, dict], fields: dict[str, str],
                  timeout: float) -> dict[str, dict]:
        """Send one Message per client and wait (at most `timeout` s) for every reply."""
        procedure = PROCEDURES.get(kind)
        extra = {"module": procedure.__module__} if procedure is not None else {}
        message_type = "query" if kind in MESSAGES and MESSAGES[kind].read_only else "train"
        sent: dict[str, Any] = {}
        for node, payload in payloads.items():
            content = encode(kind, payload, fields, extra)
            sent[node] = Message(content, dst_node_id=self.node_ids[node], message_type=message_type)
            self.wire_bytes[("server", node, kind)] += wire_size(content)
        answers = self._ask(lambda grid: list(grid.send_and_receive(list(sent.values()),
                                                                    timeout=timeout)), timeout)
        self.round_trips += 1
        by_id = {m.metadata.message_id: node for node, m in sent.items()}
        got = {by_id[a.metadata.reply_to_message_id]: a for a in answers
               if a.metadata.reply_to_message_id in by_id}
        missing = [node for node in payloads if node not in got]
        if missing:
            raise NodeTimeout(
                f"client(s) {missing} (Flower node {[self.node_ids[n] for n in missing]}) did not "
                f"reply to {kind!r} within {timeout:g} s; the run stops here (raise the "
                "executor's timeout if their local work is legitimately slower)")
        replies = {}
        for node in payloads:
            answer = got[node]
            if answer.has_error():
                raise FedModelError(f"client {node!r}: Flower reported an error serving {kind!r}: "
                                    f"{answer.error.reason}")
            self.wire_bytes[(node, "server", kind)] += wire_size(answer.content)
            meta, reply = decode(answer.content)
            if meta.get("failed"):
                _raise_remote(node, kind, reply["error"])
            replies[node] = reply
        return replies

    def wire_total(self, direction: str | None = None) -> int:
        """Bytes of all messages ("down": server → clients, "up": clients → server, None: both)."""
        return sum(b for (s, _, _), b in self.wire_bytes.items()
                   if direction is None or (s == "server") == (direction == "down"))


def _raise_remote(node: str, kind: str, error: Any) -> None:
    """Raise a client's error here: a FedModelError as itself (it names the data and the
    client), anything else wrapped with the client's name and its remote traceback."""
    if isinstance(error, FedModelError):
        raise error
    raise FedModelError(f"client {node!r} failed serving {kind!r}: {error!r}")
