"""The ClientApp side of fedmodel on Flower: what a SuperNode runs (docs/flower.md).

One ClientApp (`client_app`, module level; Flower's object path
`fedmodel.runtime.flower.client_app:client_app`) serves every request:

- a "fedmodel.build" message carries the block's spec as JSON and its constants as arrays; the
  ClientApp rebuilds the block from fedmodel's own atom table and compiles the node program.
  Data the spec gives no array for is the client's own: the `.npy` files of the directory its
  node config names (`--node-config 'fedmodel-data="DIR"'`: DIR/NAME.npy per data name);
- every other message carries one declared request (`messages.MESSAGES`, `codec`). The ClientApp
  serves only kinds its installed fedmodel registers (`served_kind`: the installed backends'
  steps, loaded one backend at a time), checks the request against the kind's declaration
  (fields, shapes, sizes) before running anything, and refuses anything else with a logged
  error that goes back to the driver as the reply.

Node state stays on the client: after a state-changing request the node's `save_state` is kept
in Flower's `Context.state` of the node (typed records: the spec's text and arrays, the state as
plain-data JSON) with a fresh token. Flower may run a node's next message in another worker
process (its actor pool); a worker whose cached program does not carry the context's token
rebuilds the program from the spec and loads that state, so the iterates do not depend on which
worker served which message. The stages of a secure sum go through Flower's `secaggplus_mod`
(`secagg.secure_sum_mod`) to `_serve_summed`.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...errors import DataError, FedModelError
from .. import wire
from ..executor import check_sum_fields, run_on_node
from .. import messages
from ..messages import MESSAGES, PROCEDURES, MessageKind
from ..program import NodeProgram
from ..spec_codec import decode_spec
from ..wire import WireError
from . import secagg
from .codec import (BUILD, HELLO, NODE_CACHE_KEY, NODE_DATA_KEY, NODE_NAME_KEY, REPLAY,
                    array_limits, build_parts, check_request, decode, encode, header, loads,
                    rider_of, split_rider, with_rider)

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message
    from flwr.clientapp import ClientApp
except ImportError:     # optional extra: make_executor("flower") then says how to install it
    ClientApp = None

#: the client host's own extra modules that register procedures (comma-separated; its
#: environment, never a message): e.g. a site's own client steps, or a test's
CLIENT_MODULES_ENV = "FEDMODEL_CLIENT_MODULES"
STATE = "fedmodel"              # key of this node's record in Flower's Context.state
SPEC_ARRAYS = "fedmodel.spec"   # ... and of its spec's arrays
log = logging.getLogger(__name__)
_IMPORTED = time.time()     # when this process had imported Flower and fedmodel (timings)


def _process_start() -> float | None:
    """This process's start (epoch seconds; Linux /proc), for the round-trip breakdown: a
    deployment starts a `flwr-clientapp` process per message."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


_STARTED = _process_start()
# A process that serves many messages (`node_process`) gives each its own stamps (epoch s):
# when it claimed the task, when the message and Context had been pulled, and its CPU seconds
# then; empty in a process per message (the process's own start and imports stand for them)
_TASK: dict[str, float] = {}


def begin_task(acquired: float | None, pulled: float = 0.0, cpu: float = 0.0) -> None:
    """The stamps of the message this process serves next (`node_process.serve_task`), for the
    round-trip breakdown: claimed at `acquired`, pulled at `pulled`, CPU time `cpu` at the
    claim; None: none (after the message)."""
    _TASK.clear()
    if acquired is not None:
        _TASK.update(acquired=acquired, pulled=pulled, cpu=cpu)


# ---- what a client serves ------------------------------------------------------------------------
def load_client_modules() -> None:
    """Import the modules the client host lists in `FEDMODEL_CLIENT_MODULES` (its own
    configuration, e.g. a test's wrapped procedures), once per process — never a name that came
    with a message."""
    for module in os.environ.get(CLIENT_MODULES_ENV, "").split(","):
        if module.strip() and module.strip() not in sys.modules:
            importlib.import_module(module.strip())   # the host's own configuration (allowlisted, tests/test_layers.py)


class KindCache:
    """Which installed backend serves which request kind, remembered by this node in its own
    directory (node config `fedmodel-cache`: DIR/kinds.json, written and read by the node only,
    JSON). A deployment starts a ClientApp process per message, and finding a kind by loading
    the installed backends in name order imported all of them for ProxAL's steps (~2 CPU s a
    message, DP accounting's SciPy most of it); with the table a process loads the one backend.
    The file holds backend names only: a name that is not an installed backend's, a file that
    is not this form, or an entry that does not register its kind is ignored and the kind looked
    up the slow way (so a tampered file costs time, never imports anything new)."""

    FILE = "kinds.json"

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(folder) / self.FILE

    def _read(self) -> dict[str, str]:
        try:
            table = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(table, dict):
            return {}
        return {k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, str)}

    def backend_of(self, kind: str) -> str | None:
        """The backend remembered for `kind`, or None."""
        return self._read().get(kind)

    def remember(self, kind: str, backend: str | None) -> None:
        """Keep `kind` → `backend` (atomically replaced file; a failed write is only a miss)."""
        table = self._read()
        if backend is None or table.get(kind) == backend:
            return
        table[kind] = backend
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False,
                                             suffix=".tmp") as f:
                json.dump(table, f)
            os.replace(f.name, self.path)
        except OSError as err:
            log.warning("fedmodel client could not write its kind cache %s: %s", self.path, err)


def kind_cache(context: "Context | None") -> KindCache | None:
    """The node's `KindCache`, if its node config names a directory (`fedmodel-cache`)."""
    folder = context.node_config.get(NODE_CACHE_KEY) if context is not None and \
        context.node_config else None
    return KindCache(str(folder)) if folder else None


def served_kind(kind: str, cache: KindCache | None = None) -> MessageKind:
    """The declaration of a request kind this client serves: one its installed fedmodel
    registers (`messages.MESSAGES` and `messages.PROCEDURES`, which load the installed backends'
    steps one backend at a time until the kind is found — first the backend `cache` remembers
    for it); anything else is refused (WireError), never imported. The one lookup of the
    ClientApp."""
    load_client_modules()
    remembered = cache.backend_of(kind) if cache is not None else None
    if remembered is not None:
        messages.load_backend(remembered)     # (an installed backend's name, or nothing loads)
    if not (kind in MESSAGES and kind in PROCEDURES):
        raise WireError(f"request kind {kind[:80]!r} is not a procedure this client's fedmodel "
                        "registers; refused")
    if cache is not None and remembered != messages.provider(kind):
        cache.remember(kind, messages.provider(kind))
    return MESSAGES[kind]


def node_data(context: "Context") -> Callable[[str, tuple], Callable[[], Any]]:
    """The loaders of this client's own data: data NAME is the file NAME.npy of the directory
    its node config names (`fedmodel-data`), read without pickle."""
    folder = context.node_config.get(NODE_DATA_KEY) if context.node_config else None

    def loader(name: str, shape: tuple) -> Callable[[], Any]:
        def load() -> np.ndarray:
            if not folder:
                raise DataError(f"this client has no data directory: start its SuperNode with "
                                f"--node-config '{NODE_DATA_KEY}=\"DIR\"' (DIR/{name}.npy)")
            return np.load(os.path.join(str(folder), f"{name}.npy"), allow_pickle=False)
        return load
    return loader


def spec_hash(text: str, arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 of a build message's spec: its JSON text and its arrays (names, dtypes, shapes,
    bytes) — the identity of a compiled node program in this process's cache."""
    h = hashlib.sha256(text.encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"|{name} {a.dtype.str} {a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


# ---- the handlers ----------------------------------------------------------------------------------
# Node programs this worker process has built: (run id, node id) -> (build, token, program). The
# build id is the hash of the spec it was compiled from (`spec_hash`), the token which state of
# the node it holds (`Context.state`, module docstring). A process that serves all of a node's
# messages (`node_process`) compiles the program once, at the build message.
_CACHE: dict[tuple[int, int], tuple[str, str, NodeProgram]] = {}


def serve_message(message: "Message", context: "Context") -> "Message":
    """The ClientApp's one handler: build the node program or serve one request on it; a
    refused or failed request is logged and answered with its error (never a silent reply)."""
    kind = "?"
    key = (message.metadata.run_id, message.metadata.dst_node_id)
    # where the time of a round trip goes on the client (docs/flower.md, breakdown): epoch
    # stamps of this process's start, imports and handler entry, and seconds spent finding the
    # request's procedure (`served_kind`: loading its backend), getting the node program
    # (cache / rebuild / state), serving, and saving the state
    # (and the CPU seconds this process had used on entry and on leaving: load-independent)
    # (a process serving many messages: its claim of the task and the pull of its input, and
    # CPU seconds counted from the claim — `begin_task`)
    cpu0 = _TASK.get("cpu", 0.0)
    timing = {"started": _TASK.get("acquired", _STARTED), "imported": _TASK.get("pulled", _IMPORTED),
              "entered": time.time(), "cpu_entered": time.process_time() - cpu0, "lookup": 0.0,
              "program": 0.0, "served": 0.0, "saved": 0.0}
    try:
        kind = header(message.content)["kind"]
        if kind == HELLO:       # which client this node is (deployment: its --node-config)
            content = encode(kind, {"name": str(context.node_config.get(NODE_NAME_KEY, ""))})
            return Message(content, reply_to=message)
        if kind == BUILD:
            _, payload = decode(message.content)
            text, arrays = build_parts(payload)
            program = decode_spec(text, arrays, node_data(context)).build()   # its data read here
            timing["program"] = time.time() - timing["entered"]
            build, token = spec_hash(text, arrays), uuid.uuid4().hex
            context.state[SPEC_ARRAYS] = ArrayRecord({k: Array(np.require(v, requirements="C"))
                                                      for k, v in arrays.items()})
            context.state[STATE] = ConfigRecord({"spec": text, "build": build, "token": token,
                                                 "state": ""})
            _CACHE[key] = (build, token, program)
            reply: dict[str, Any] = {"n_shared": program.n_shared}
        elif kind == REPLAY:     # a rejoined node: the state-changing requests since its build
            program = _program_of(key, context)
            _, payload = decode(message.content)
            steps = payload.get("steps")
            if set(payload) != {"steps"} or not isinstance(steps, list):
                raise WireError(f"{REPLAY!r} carries a list of steps only")
            for step in steps:
                if not (isinstance(step, tuple) and len(step) == 2 and isinstance(step[0], str)
                        and isinstance(step[1], dict)):
                    raise WireError(f"{REPLAY!r}: a step must be (kind, payload)")
                declared = served_kind(step[0], kind_cache(context))
                check_request(declared, step[1], program.n_shared)
                run_on_node(program, step[0], step[1])
            reply = {}
            _remember(key, context, program)
        else:
            declared = served_kind(kind, kind_cache(context))
            ride = rider_of(header(message.content))
            rider = None if ride is None else _rider_kind(ride[0], context)
            timing["lookup"] = time.time() - timing["entered"]
            clock = time.time()
            program = _program_of(key, context)
            timing["program"] = time.time() - clock
            _, payload = decode(message.content, array_limits(declared, program.n_shared, rider))
            payload, ridden = split_rider(payload) if rider is not None else (payload, {})
            check_request(declared, payload, program.n_shared)
            if rider is not None:
                check_request(rider, ridden, program.n_shared)
            clock = time.time()
            # (a rider, read-only, before or after the carrier's step: `executor.Rider`)
            early = run_on_node(program, rider.name, ridden) if rider is not None and ride[1] else None
            reply = run_on_node(program, kind, payload)
            if rider is not None:
                reply = with_rider(reply, early if ride[1] else run_on_node(program, rider.name, ridden))
            timing["served"] = time.time() - clock
            if not declared.read_only:
                clock = time.time()
                _remember(key, context, program)
                timing["saved"] = time.time() - clock
        timing["left"], timing["cpu_left"] = time.time(), time.process_time() - cpu0
        content = encode(kind, reply, extra={"timing": timing})
    except Exception as err:    # sent back to the driver, which raises it
        if isinstance(err, WireError):
            log.error("fedmodel client refused a %r message: %s", kind, err)
        content = encode(kind, {"error": wire.error_to_plain(err)}, extra={"failed": True})
    return Message(content, reply_to=message)


def _rider_kind(kind: str, context: "Context") -> MessageKind:
    """The declaration of a rider's kind, refused unless it is local and read-only (as the
    driver's `Executor._check_rider`: a request that changes state never rides)."""
    declared = served_kind(kind, kind_cache(context))
    if not (declared.local and declared.read_only):
        raise WireError(f"{kind!r} cannot ride on another request (only local, read-only kinds may)")
    return declared


def _serve_summed(message: "Message", context: "Context") -> "Message":
    """Stage 2 of SecAgg+ (`secaggplus_mod` calls this between its stages): serve the request
    carried as Flower FitIns and reply with only the fields to be summed (`secagg.summed_reply`:
    the mod quantizes and masks them before anything leaves the node)."""
    content = secagg.request_of(message)
    kind = header(content)["kind"]
    declared = served_kind(kind, kind_cache(context))
    key = (message.metadata.run_id, message.metadata.dst_node_id)
    program = _program_of(key, context)
    meta, payload = decode(content, array_limits(declared, program.n_shared))
    check_request(declared, payload, program.n_shared)
    fields = meta.get("sum")
    if not (isinstance(fields, list) and fields):
        raise WireError(f"secure sum of {kind!r}: no fields to sum")
    check_sum_fields(declared, fields)
    reply = run_on_node(program, kind, payload)
    _remember(key, context, program)
    return secagg.summed_reply(message, context, kind, [reply[field] for field in fields], fields)


def _remember(key: tuple[int, int], context: "Context", program: NodeProgram) -> None:
    """Keep the node's new state in its Context (plain-data JSON, a fresh token) and in this
    worker's cache."""
    record = context.state[STATE]
    token = uuid.uuid4().hex
    state = wire.dumps(program.save_state()["state"], "node state")
    context.state[STATE] = ConfigRecord({**dict(record), "token": token, "state": state})
    _CACHE[key] = (record["build"], token, program)


def _state(text: str) -> dict:
    """A node state from its plain-data JSON: with the classes of the backends this process
    has loaded (the request's: `served_kind` runs first), else after loading every installed
    backend's (`codec.loads`: a state may hold another backend's records)."""
    try:
        return wire.loads(text, "node state")
    except WireError:
        return loads(text, "node state")


def _program_of(key: tuple[int, int], context: "Context") -> NodeProgram:
    """This node's program holding the state recorded in its Context: the cached one when it
    does, else rebuilt from the spec with that state loaded."""
    if STATE not in context.state:
        raise FedModelError("this Flower node has no fedmodel program: the executor sends "
                            f"{BUILD!r} first")
    record = context.state[STATE]
    build, token = record["build"], record["token"]
    cached = _CACHE.get(key)
    if cached is not None and cached[:2] == (build, token):
        return cached[2]
    # a program of this run's spec compiled here earlier is reused (only its state is stale)
    if cached is not None and cached[0] == build:
        program = cached[2]
    else:
        arrays = {k: np.array(a.numpy()) for k, a in context.state[SPEC_ARRAYS].items()}
        program = decode_spec(record["spec"], arrays, node_data(context)).build()
    if record["state"]:
        program.load_state(_state(record["state"]))
    _CACHE[key] = (build, token, program)
    return program


if ClientApp is not None:
    client_app = ClientApp()
    client_app.train(mods=[secagg.secure_sum_mod(_serve_summed)])(serve_message)   # state-
    #                   changing requests (and the stages of a secure sum, through SecAgg+'s mod)
    client_app.query()(serve_message)       # read-only requests (reports, queries, save_state)
else:
    client_app = None
