"""`FlowerExecutor`: client node programs inside a Flower ClientApp, requests as Flower Messages
(docs/flower.md).

Simulation (no `grid` given): the backend's loop runs in the calling thread. Flower's simulation
engine (`flwr.simulation.run_simulation`) runs in a background thread and starts this
executor's ServerApp there; the ServerApp's `main` hands nothing out but serves a queue of jobs:
each job is one batch of Messages that it sends with `grid.send_and_receive(..., timeout=...)`,
so the Grid is only ever used by the thread Flower gave it to. Deployment (`grid=` the Grid of a
running ServerApp, `fedmodel.deploy.server_app`): the executor uses that grid directly, finds each
client's SuperNode by asking the nodes their name, and brings a client whose SuperNode died back
when it rejoins (rebuild + replay of its requests). The server's own program (its steps are
local) stays in the calling process, as with the Ray executor.

Clients trust no bytes (docs/flower.md, threat model). On the wire there are only arrays
(`ArrayRecord`, numeric dtypes), numbers and strings (`ConfigRecord`) and JSON text: plain data
(`wire`) and the declarative model spec (`spec_codec`) — never pickle, never a module name.
One ClientApp (`client_app`, module level) serves every request:

- a "fedmodel.build" message carries the block's spec as JSON and its constants as arrays; the
  ClientApp rebuilds the block from fedmodel's own atom table and compiles the node program.
  Data the spec gives no array for is the client's own: the `.npy` files of the directory its
  node config names (`--node-config 'fedmodel-data="DIR"'`: DIR/NAME.npy per data name). In
  simulation the driver runs the loaders and sends the arrays (the simulation holds everything
  in one machine anyway); in deployment a loader never runs on the server;
- every other message carries one declared request (`ledger.MESSAGES`): arrays in an
  `ArrayRecord`, Python scalars and strings in a `ConfigRecord`, other fields (multiplier
  dicts, node state) as plain-data JSON. The ClientApp serves only kinds its installed fedmodel
  registers (`served_kind`, the installed backends' steps, loaded one backend at a time), checks the
  request against the kind's declaration (fields, shapes, sizes) before running anything, and
  refuses anything else with a logged error that goes back to the driver as the reply.

Node state stays on the client: after a state-changing request the node's `save_state` is kept
in Flower's `Context.state` of the node (typed records: the spec's text and arrays, the state as
plain-data JSON) with a fresh token. Flower may run a node's next message in another worker
process (its actor pool); a worker whose cached program does not carry the context's token
rebuilds the program from the spec and loads that state, so the iterates do not depend on which
worker served which message.

Secure sums (`secure_sum`): `map_sum` runs Flower's SecAgg+ workflow on the grid and the
ClientApp's train handler carries Flower's `secaggplus_mod` for its messages, so the server sees
only Σ_i of the summed reply fields (fixed point; docs/flower.md).

Every receive has a timeout: a client that does not reply in time stops the run with a
`FedModelError` naming it, except in `map_available` (a backend's partial participation), where
it is dropped from the run (`lost`). The ledger books declared floats exactly as the serial executor does;
`wire_bytes` counts the bytes of the Flower objects (records, arrays) of every message, both
ways (Flower's deflated object contents, what its gRPC transport pushes).
"""
from __future__ import annotations

import copy
import importlib
import json
import logging
import math
import os
import queue
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any, Callable

import numpy as np

from ..errors import DataError, FedModelError
from . import wire
from .executor import Executor, RemoteNode, check_sum_fields, declared_kind, run_on_node
from .ledger import MESSAGES, PROCEDURES, MessageKind, allowed_sizes, catalogue, check_payload
from .program import NodeProgram, ProgramSpec
from .spec_codec import decode_spec, encode_spec
from .wire import WireError

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from flwr.client.mod import secaggplus_mod
    from flwr.common import (Code, FitIns, FitRes, Status, ndarrays_to_parameters,
                             parameters_to_ndarrays)
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE
    from flwr.compat.common import recorddict_compat as compat
except ImportError:     # optional extra: make_executor("flower") then says how to install it
    ClientApp = None

BUILD = "fedmodel.build"        # message kind that ships a block's spec to its client
HELLO = "fedmodel.hello"        # asks a node which client it is (deployment)
REPLAY = "fedmodel.replay"      # replays a rejoined client's requests since its build
NODE_NAME_KEY = "fedmodel-client"   # a SuperNode's --node-config key naming its client
NODE_DATA_KEY = "fedmodel-data"     # ... and the directory of its data files (NAME.npy)
#: the client host's own extra modules that register procedures (comma-separated; its
#: environment, never a message): e.g. a site's own client steps, or a test's
CLIENT_MODULES_ENV = "FEDMODEL_CLIENT_MODULES"
_ARRAYS, _CONFIG = "fm_arrays", "fm_config"
_STATE = "fedmodel"             # key of this node's record in Flower's Context.state
_SPEC_ARRAYS = "fedmodel.spec"  # ... and of its spec's arrays
_SPEC_PREFIX = "spec."          # a build message's array fields: the spec's arrays
_HEADER_KEYS = frozenset({"kind", "none", "json", "scalar", "failed", "sum"})
_NUMERIC = frozenset(wire.DTYPES)
log = logging.getLogger(__name__)


class NodeTimeout(FedModelError):
    """A client did not reply within the executor's timeout."""


# ---- payload <-> Flower records -------------------------------------------------------------------
def encode(kind: str, payload: dict[str, Any], fields: dict[str, str] | None = None,
           extra: dict | None = None) -> "RecordDict":
    """One request or reply as a Flower RecordDict: numeric numpy arrays (and numpy scalars, as
    0-d arrays) in an ArrayRecord, Python bools/ints/floats/strings in a ConfigRecord, anything
    else (dicts, lists, node state) as plain-data JSON text (`wire.dumps`: a value that is not
    plain data is refused here); None values are listed in the header. (`fields`: the kind's
    declaration, kept for callers; the types alone decide the form.)"""
    arrays: dict[str, Any] = {}
    config: dict[str, Any] = {}
    meta: dict[str, Any] = {"kind": kind, "none": [], "json": [], "scalar": [], **(extra or {})}
    for key, value in payload.items():
        if value is None:
            meta["none"].append(key)
        elif isinstance(value, (np.ndarray, np.generic)) and value.dtype.name in _NUMERIC:
            # (np.require, not ascontiguousarray: that makes a 0-d array 1-d)
            arrays[key] = Array(np.require(value, requirements="C"))
            if isinstance(value, np.generic):
                meta["scalar"].append(key)
        elif isinstance(value, (bool, int, float, str)) and not isinstance(value, np.generic):
            config[key] = value
        else:
            config[key] = wire.dumps(value, f"field {key!r} of {kind!r}")
            meta["json"].append(key)
    config["fm_header"] = json.dumps(meta)
    return RecordDict({_ARRAYS: ArrayRecord(arrays), _CONFIG: ConfigRecord(config)})


def _header(content: "RecordDict") -> dict[str, Any]:
    """The checked header of a message made by `encode` (WireError: not one)."""
    try:
        config = content[_CONFIG]
        content[_ARRAYS]
    except (KeyError, TypeError):
        raise WireError("not a fedmodel message (no fedmodel records)") from None
    text = config.get("fm_header") if hasattr(config, "get") else None
    try:
        meta = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or not isinstance(meta.get("kind"), str):
        raise WireError("a fedmodel message without a valid header")
    if "module" in meta:
        raise WireError(f"message {meta['kind']!r} names a module ({str(meta['module'])[:80]!r}); "
                        "clients import nothing a message names (the server runs an older or "
                        "a modified fedmodel)")
    unknown = set(meta) - _HEADER_KEYS
    if unknown:
        raise WireError(f"message {meta['kind']!r}: unknown header entries {sorted(unknown)}")
    for key in ("none", "json", "scalar"):
        if not (isinstance(meta.get(key), list) and all(isinstance(k, str) for k in meta[key])):
            raise WireError(f"message {meta['kind']!r}: header entry {key!r} is not a list of names")
    return meta


def decode(content: "RecordDict", limits: Callable[[str, tuple], None] | None = None
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and the payload of a RecordDict made by `encode` (arrays writable copies),
    checked on the way: no bytes (nothing is unpickled), numeric arrays whose data match their
    declared shape, JSON fields as plain data (`wire.loads`). `limits(key, shape)`: raises for
    an array the receiver does not accept, called before the array is read."""
    meta = _header(content)
    config = dict(content[_CONFIG])
    config.pop("fm_header")
    where = f"message {meta['kind']!r}"
    payload: dict[str, Any] = {}
    for key, array in content[_ARRAYS].items():
        if array.dtype not in _NUMERIC:
            raise WireError(f"{where}: field {key!r} is an array of dtype {array.dtype!r} "
                            f"(accepted: {', '.join(sorted(_NUMERIC))})")
        if limits is not None:
            limits(key, tuple(array.shape))
        value = np.array(array.numpy())     # (np.load, allow_pickle=False)
        if value.shape != tuple(array.shape) or value.dtype.name not in _NUMERIC:
            raise WireError(f"{where}: field {key!r}: its data is not the declared {array.dtype} "
                            f"array of shape {tuple(array.shape)}")
        payload[key] = value[()] if key in meta["scalar"] else value
    for key, value in config.items():
        if key in meta["json"]:
            payload[key] = _loads(value, f"{where}, field {key!r}")
        elif isinstance(value, (bool, int, float, str)):
            payload[key] = value
        else:
            raise WireError(f"{where}: field {key!r} carries {type(value).__name__} (bytes are "
                            "refused: fedmodel never unpickles what it receives)")
    for key in meta["none"]:
        payload[key] = None
    return meta, payload


def wire_size(content: "RecordDict") -> int:
    """Bytes of the Flower objects of one message's content (each distinct object once, as
    Flower's transport pushes them)."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(content).values())


# ---- what a client serves ------------------------------------------------------------------------
def load_client_modules() -> None:
    """Import the modules the client host lists in `FEDMODEL_CLIENT_MODULES` (its own
    configuration, e.g. a test's wrapped procedures), once per process — never a name that came
    with a message."""
    for module in os.environ.get(CLIENT_MODULES_ENV, "").split(","):
        if module.strip() and module.strip() not in sys.modules:
            importlib.import_module(module.strip())   # the host's own configuration (allowlisted, tests/test_layers.py)


def _loads(text: Any, where: str) -> Any:
    """`wire.loads`, with every installed backend's procedures loaded first when the text holds
    node-state records (`wire` finds their classes only among imported modules; a process
    that served only node-program requests has imported none)."""
    if isinstance(text, str) and '{"obj":' in text:
        catalogue()
    return wire.loads(text, where)


def served_kind(kind: str) -> MessageKind:
    """The declaration of a request kind this client serves: one its installed fedmodel
    registers (`ledger.MESSAGES` and `ledger.PROCEDURES`, which load the installed backends'
    steps one backend at a time until the kind is found); anything else is refused
    (WireError), never imported. The one lookup of the ClientApp."""
    load_client_modules()
    if not (kind in MESSAGES and kind in PROCEDURES):
        raise WireError(f"request kind {kind[:80]!r} is not a procedure this client's fedmodel "
                        "registers; refused")
    return MESSAGES[kind]


def check_request(declared: MessageKind, payload: dict[str, Any], model_size: int) -> None:
    """Refuse a request that does not match its declaration before it is served: undeclared
    fields, numeric fields that are not numbers or not 0-/1-D, sizes beyond the declared ones
    (`ledger.check_payload`)."""
    for key, value in payload.items():
        spec = declared.request.get(key)
        if spec in (None, "str", "opaque") or value is None:
            continue
        if not (isinstance(value, (bool, int, float, np.number, np.bool_)) or
                (isinstance(value, np.ndarray) and value.ndim <= 1)):
            raise WireError(f"request {declared.name!r}: field {key!r} declared {spec!r} carries "
                            f"{type(value).__name__} of shape {np.shape(value)} (numbers, 0-/1-D)")
    try:
        check_payload(declared, declared.request, payload, model_size, "request")
    except FedModelError as err:        # (its text says "refusing to send": here, to serve)
        raise WireError(f"refused: {err}".replace("; refusing to send it", "")) from None


def _array_limits(declared: MessageKind, model_size: int) -> Callable[[str, tuple], None]:
    """`decode`'s check of a request's arrays against `declared`, from their shapes alone."""
    def check(key: str, shape: tuple) -> None:
        spec = declared.request.get(key)
        if spec is None:
            raise WireError(f"request {declared.name!r} carries undeclared field {key!r}")
        size = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if spec not in ("str", "opaque") and (len(shape) > 1 or size not in allowed_sizes(spec, model_size)):
            raise WireError(f"request {declared.name!r}: field {key!r} is an array of shape {shape}, "
                            f"declared {spec!r} (model size {model_size}); refused unread")
    return check


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


# ---- client side ---------------------------------------------------------------------------------
# Node programs this worker process has built: (run id, node id) -> (build, token, program). The
# build id names the spec it was compiled from (one per `start`), the token which state of the
# node it holds (`Context.state`, module docstring).
_CACHE: dict[tuple[int, int], tuple[str, str, NodeProgram]] = {}


def _serve_message(message: "Message", context: "Context") -> "Message":
    """The ClientApp's one handler: build the node program or serve one request on it; a
    refused or failed request is logged and answered with its error (never a silent reply)."""
    kind = "?"
    key = (message.metadata.run_id, message.metadata.dst_node_id)
    try:
        kind = _header(message.content)["kind"]
        if kind == HELLO:       # which client this node is (deployment: its --node-config)
            content = encode(kind, {"name": str(context.node_config.get(NODE_NAME_KEY, ""))})
            return Message(content, reply_to=message)
        if kind == BUILD:
            _, payload = decode(message.content)
            text = payload.pop("spec", None)
            arrays = {k[len(_SPEC_PREFIX):]: v for k, v in payload.items() if k.startswith(_SPEC_PREFIX)}
            if not isinstance(text, str) or len(arrays) != len(payload):
                raise WireError(f"{BUILD!r} carries a spec text and its arrays only")
            program = decode_spec(text, arrays, node_data(context)).build()   # its data read here
            build, token = uuid.uuid4().hex, uuid.uuid4().hex
            context.state[_SPEC_ARRAYS] = ArrayRecord({k: Array(np.require(v, requirements="C"))
                                                       for k, v in arrays.items()})
            context.state[_STATE] = ConfigRecord({"spec": text, "build": build, "token": token,
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
                declared = served_kind(step[0])
                check_request(declared, step[1], program.n_shared)
                run_on_node(program, step[0], step[1])
            reply = {}
            _remember(key, context, program)
        else:
            declared = served_kind(kind)
            program = _program_of(key, context)
            _, payload = decode(message.content, _array_limits(declared, program.n_shared))
            check_request(declared, payload, program.n_shared)
            reply = run_on_node(program, kind, payload)
            if not declared.read_only:
                _remember(key, context, program)
        content = encode(kind, reply)
    except Exception as err:    # sent back to the driver, which raises it
        if isinstance(err, WireError):
            log.error("fedmodel client refused a %r message: %s", kind, err)
        content = encode(kind, {"error": wire.error_to_plain(err)}, extra={"failed": True})
    return Message(content, reply_to=message)


def _serve_summed(message: "Message", context: "Context") -> "Message":
    """Stage 2 of SecAgg+ (`secaggplus_mod` calls this between its stages): serve the request
    carried as Flower FitIns and reply with only the fields to be summed, as FitRes parameters
    (weight 1), which the mod quantizes and masks before anything leaves the node. A value
    outside the protocol's clipping range would be clipped silently: refused instead."""
    fitins = compat.recorddict_to_fitins(message.content, keep_input=True)
    config = dict(fitins.config)
    keys = wire.loads(config.pop("fm_array_keys", None), "fm_array_keys")
    arrays = parameters_to_ndarrays(fitins.parameters)
    if not (isinstance(keys, list) and len(keys) == len(arrays) and all(isinstance(k, str) for k in keys)):
        raise WireError("a secure sum's array names do not match its arrays")
    content = RecordDict({_ARRAYS: ArrayRecord({k: Array(a) for k, a in zip(keys, arrays)}),
                          _CONFIG: ConfigRecord(config)})
    kind = _header(content)["kind"]
    declared = served_kind(kind)
    key = (message.metadata.run_id, message.metadata.dst_node_id)
    program = _program_of(key, context)
    meta, payload = decode(content, _array_limits(declared, program.n_shared))
    check_request(declared, payload, program.n_shared)
    fields = meta.get("sum")
    if not (isinstance(fields, list) and fields):
        raise WireError(f"secure sum of {kind!r}: no fields to sum")
    check_sum_fields(declared, fields)
    reply = run_on_node(program, kind, payload)
    _remember(key, context, program)
    clip = float(context.state.config_records[RECORD_KEY_STATE]["clipping_range"])
    values = []
    for field in fields:
        value = np.asarray(reply[field], dtype=float)
        if not np.all(np.isfinite(value)) or np.any(np.abs(value) > clip):
            raise FedModelError(f"secure sum of {kind!r}: field {field!r} has entries outside the "
                                f"SecAgg+ clipping range ±{clip:g} (they would be clipped); raise "
                                "clipping_range in FlowerExecutor(secure_sum={...})")
        values.append(value)
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(values), 1, {})
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=message)


def _secure_sum_mod(message: "Message", context: "Context", call_next) -> "Message":
    """Flower's `secaggplus_mod` for the messages of a secure sum (they carry its config
    record); every other message goes to the handler as it is."""
    if RECORD_KEY_CONFIGS not in message.content.config_records:
        return call_next(message, context)
    return secaggplus_mod(message, context, lambda m, c: _serve_summed(m, c))


def _remember(key: tuple[int, int], context: "Context", program: NodeProgram) -> None:
    """Keep the node's new state in its Context (plain-data JSON, a fresh token) and in this
    worker's cache."""
    record = context.state[_STATE]
    token = uuid.uuid4().hex
    state = wire.dumps(program.save_state()["state"], "node state")
    context.state[_STATE] = ConfigRecord({**dict(record), "token": token, "state": state})
    _CACHE[key] = (record["build"], token, program)


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
    if cached is not None and cached[0] == build:
        program = cached[2]
    else:
        arrays = {k: np.array(a.numpy()) for k, a in context.state[_SPEC_ARRAYS].items()}
        program = decode_spec(record["spec"], arrays, node_data(context)).build()
    if record["state"]:
        program.load_state(_loads(record["state"], "node state"))
    _CACHE[key] = (build, token, program)
    return program


if ClientApp is not None:
    client_app = ClientApp()
    client_app.train(mods=[_secure_sum_mod])(_serve_message)   # state-changing requests (and
    #                                      the stages of a secure sum, through SecAgg+'s mod)
    client_app.query()(_serve_message)      # read-only requests (reports, queries, save_state)
else:
    client_app = None


# ---- driver side ---------------------------------------------------------------------------------
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
        if ClientApp is None:
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
        self.faults: list[dict] = []             # one record per client that had to rejoin
        self._lost: dict[str, str] = {}          # client -> why it was dropped (map_available)
        self._specs: dict[str, dict] = {}         # client -> its build message (spec text, arrays)
        self._log: dict[str, list] = {}          # client -> state-changing requests since its build
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
        self.wire_bytes, self.round_trips, self.faults, self._lost = Counter(), 0, [], {}
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
            self._specs = {name: _build_payload(spec, ship) for name, spec in remote.items()}
            self._log = {name: [] for name in remote}
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
                answers = self._ask(lambda grid: _send_and_receive(
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
        """Clients dropped in this run: they did not reply in time to a `map_available`
        request (a backend's partial participation); no request reaches them afterwards."""
        return frozenset(self._lost)

    def map_available(self, kind, payloads):
        """`map`, except that a client that does not reply within `timeout` (in deployment too:
        no rejoin here) is dropped for the rest of the run (`lost`, `faults`) and left out of
        the replies. The ledger books every request sent and every reply received."""
        declared = declared_kind(kind)
        self._serve(payloads)
        self._refuse_lost(kind, payloads)
        booked = not declared.local
        for node, payload in payloads.items():
            floats = check_payload(declared, declared.request, payload, self.model_size, "request")
            if booked and node != "server":
                self.ledger.record("server", node, kind, floats)
        self.ledger.exchange(kind, payloads)
        remote = {node: p for node, p in payloads.items() if node in self.node_ids}
        replies = {node: run_on_node(self.programs[node], kind, payload)
                   for node, payload in payloads.items() if node not in self.node_ids}
        if remote:
            got, missing = self._send(kind, remote, declared.request, self.timeout)
            replies.update(got)
            for node in missing:
                self._lost[node] = f"no reply to {kind!r} within {self.timeout:g} s"
                self.faults.append({"node": node, "kind": kind, "old_node_id": self.node_ids[node],
                                    "lost": True, "time": time.time()})
            if not declared.read_only:
                for node in got:
                    self._log[node].append((kind, remote[node]))
        for node, reply in replies.items():
            floats = check_payload(declared, declared.reply, reply, self.model_size, "reply")
            if booked and node != "server":
                self.ledger.record(node, "server", kind, floats)
        return {node: replies[node] for node in payloads if node in replies}

    def _refuse_lost(self, kind: str, nodes) -> None:
        lost = [node for node in nodes if node in self._lost]
        if lost:
            raise NodeTimeout(f"client(s) {lost} were dropped earlier in this run "
                              f"({'; '.join(self._lost[n] for n in lost)}); {kind!r} cannot reach them")

    def _dispatch_batch(self, kind, payloads):
        self._refuse_lost(kind, payloads)
        remote = {node: p for node, p in payloads.items() if node in self.node_ids}
        # local nodes (the server) are served in this process
        replies = {node: run_on_node(self.programs[node], kind, payload)
                   for node, payload in payloads.items() if node not in self.node_ids}
        if remote:
            replies.update(self._exchange(kind, remote, MESSAGES[kind].request, self.timeout))
            if not MESSAGES[kind].read_only:
                for node, payload in remote.items():
                    self._log[node].append((kind, payload))
        return replies

    def _exchange(self, kind: str, payloads: dict[str, dict], fields: dict[str, str],
                  timeout: float) -> dict[str, dict]:
        """Send one Message per client and wait (at most `timeout` s) for every reply. In
        deployment, a client that did not reply is waited for to rejoin, rebuilt and replayed,
        and asked again."""
        replies, missing = self._send(kind, payloads, fields, timeout)
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
            again, missing = self._send(kind, {n: payloads[n] for n in missing}, fields, timeout)
            replies.update(again)
        return {node: replies[node] for node in payloads}

    def _send(self, kind: str, payloads: dict[str, dict], fields: dict[str, str],
              timeout: float) -> tuple[dict[str, dict], list[str]]:
        """One round trip: the replies that arrived within `timeout`, and the clients missing."""
        message_type = "query" if kind in MESSAGES and MESSAGES[kind].read_only else "train"
        sent: dict[str, Any] = {}
        for node, payload in payloads.items():
            content = encode(kind, payload, fields)
            sent[node] = Message(content, dst_node_id=self.node_ids[node], message_type=message_type)
            self.wire_bytes[("server", node, kind)] += wire_size(content)
        answers = self._ask(lambda grid: _send_and_receive(grid, list(sent.values()), timeout),
                            timeout)
        self.round_trips += 1
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
                _raise_remote(node, kind, reply["error"])
            replies[node] = reply
        return replies, [node for node in payloads if node not in got]

    def _rejoin(self, node: str, kind: str, restart: int) -> None:
        """Deployment: wait for `node`'s SuperNode to come back (a new Flower node naming the
        same client), rebuild its program there and replay its requests since the build (one
        message), so it holds the state it had before the failed request."""
        record = {"node": node, "kind": kind, "old_node_id": self.node_ids[node], "restart": restart,
                  "replayed": len(self._log[node]), "time": time.time()}
        self.faults.append(record)
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
                                      (REPLAY, {"steps": self._log[node]}, {})):
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
            _secagg_workflow(settings, None)
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
        content = encode(kind, common, declared.request, {"sum": fields})
        arrays = content[_ARRAYS]
        config = {**dict(content[_CONFIG]), "fm_array_keys": json.dumps(list(arrays))}
        fitins = FitIns(ndarrays_to_parameters([a.numpy() for a in arrays.values()]), config)
        started = time.monotonic()
        sums, failures, seen = self._ask(
            lambda grid: _secure_round(self._secure, grid, self, kind, fitins,
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
            if not declared.read_only:
                self._log[node].append((kind, dict(common)))
        return out

    def wire_total(self, direction: str | None = None) -> int:
        """Bytes of all messages ("down": server → clients, "up": clients → server, None: both)."""
        return sum(b for (s, _, _), b in self.wire_bytes.items()
                   if direction is None or (s == "server") == (direction == "down"))


PULL_INTERVAL = 0.05    # seconds between two pulls for replies from a deployment's SuperLink


def _send_and_receive(grid: "Grid", messages: list, timeout: float | None) -> list:
    """`grid.send_and_receive`, but a deployment's grid (Flower's HttpGrid) is polled every
    PULL_INTERVAL s instead of its fixed 3 s (flwr 1.42), which alone added up to 3 s to every
    round trip; the simulation's in-memory grid keeps its own loop (its `pull_interval`)."""
    if hasattr(grid, "pull_interval"):
        return list(grid.send_and_receive(messages, timeout=timeout))
    waiting = set(grid.push_messages(messages))
    end = time.monotonic() + (timeout if timeout is not None else math.inf)
    replies: list = []
    while waiting:
        got = list(grid.pull_messages(waiting))
        replies.extend(got)
        waiting.difference_update(m.metadata.reply_to_message_id for m in got)
        if not waiting or time.monotonic() >= end:
            break
        time.sleep(PULL_INTERVAL)
    return replies


def _raise_remote(node: str, kind: str, error: Any) -> None:
    """Raise a client's error here: a fedmodel error as its own class (a DataError names the
    data and the client), anything else as a FedModelError with the client's name; the
    record is plain data (`wire.error_to_plain`), its class looked up among fedmodel's."""
    err = wire.error_from_plain(error)
    if isinstance(error, dict) and error.get("fedmodel"):
        raise err
    raise FedModelError(f"client {node!r} failed serving {kind!r}: {err}")


def _load_here(data: Any) -> np.ndarray:
    """(Simulation) a loader's data, loaded in this process to be sent to its client: on a
    copy of the leaf, so the model's Data stays remote here (a DataError names the block)."""
    return copy.copy(data).load()


def _build_payload(spec: ProgramSpec, ship: Callable[[Any], Any]) -> dict[str, Any]:
    """The fields of a block's build message: the spec's JSON text and its arrays."""
    text, arrays = encode_spec(spec, ship)
    return {"spec": text, **{_SPEC_PREFIX + k: v for k, v in arrays.items()}}


# ---- SecAgg+ on the server side ------------------------------------------------------------------
def _secagg_workflow(settings: dict, timeout: float | None) -> Any:
    """Flower's SecAgg+ workflow with `settings` (weight 1 per client: `max_weight` 1)."""
    from flwr.server.workflow import SecAggPlusWorkflow

    return SecAggPlusWorkflow(settings["num_shares"], settings["reconstruction_threshold"],
                              max_weight=1.0, clipping_range=float(settings["clipping_range"]),
                              quantization_range=settings["quantization_range"],
                              modulus_range=settings["modulus_range"], timeout=timeout)


class _CountingGrid:
    """The Grid, counting the bytes and round trips of the SecAgg+ stages by client."""

    def __init__(self, grid: "Grid", executor: FlowerExecutor, kind: str, names: dict[int, str]):
        self.grid, self.executor, self.kind, self.names = grid, executor, kind, names
        self.errors: dict[str, str] = {}     # client -> the error Flower reported for it

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        for m in messages:
            self.executor.wire_bytes[("server", self.names[m.metadata.dst_node_id], self.kind)] += \
                wire_size(m.content)
        replies = _send_and_receive(self.grid, messages, timeout)
        self.executor.round_trips += 1
        for r in replies:
            if r.has_error():
                self.errors[self.names.get(r.metadata.src_node_id, str(r.metadata.src_node_id))] = \
                    str(r.error.reason)
            elif r.metadata.src_node_id in self.names:
                self.executor.wire_bytes[(self.names[r.metadata.src_node_id], "server", self.kind)] += \
                    wire_size(r.content)
        return replies

    def __getattr__(self, name):
        return getattr(self.grid, name)


def _secure_round(settings: dict, grid: "Grid", executor: FlowerExecutor, kind: str, fitins: "FitIns",
                  names: dict[int, str]) -> tuple[list | None, list, set]:
    """One run of Flower's SecAgg+ workflow (setup, share keys, collect masked vectors, unmask)
    asking the nodes `names` for `fitins`: the unmasked weighted mean of their replies (None
    if the protocol halted), the failures, and the node ids whose vectors it holds."""
    from flwr.server.client_proxy import ClientProxy
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.strategy import Strategy

    class _Proxy(ClientProxy):      # the workflow reads only node_id
        def __init__(self, node_id):
            super().__init__(str(node_id))
            self.node_id = node_id

        get_properties = get_parameters = fit = evaluate = reconnect = None

    class _Sum(Strategy):           # hands the same FitIns to each node; keeps what comes back
        result: tuple = (None, [], set())

        def initialize_parameters(self, client_manager):
            return None

        def configure_fit(self, server_round, parameters, client_manager):
            return [(_Proxy(node_id), fitins) for node_id in names]

        def aggregate_fit(self, server_round, results, failures):
            params = parameters_to_ndarrays(results[0][1].parameters) if results else None
            self.result = (params, list(failures), {p.node_id for p, _ in results})
            return None, {}

        def configure_evaluate(self, *args):
            return []

        def aggregate_evaluate(self, *args):
            return None, {}

        def evaluate(self, *args):
            return None

    strategy = _Sum()
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                    run_config={}), strategy=strategy)
    context.state.config_records["config"] = ConfigRecord({"current_round": executor.round_trips})
    context.state.array_records["parameters"] = ArrayRecord()
    counting = _CountingGrid(grid, executor, kind, names)
    _secagg_workflow(settings, executor.timeout)(counting, context)
    sums, _, seen = strategy.result
    return sums, counting.errors, seen
