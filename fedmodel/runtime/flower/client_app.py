"""The ClientApp side of fedmodel on Flower: what a SuperNode runs (docs/flower.md).

One ClientApp (`client_app`, module level; Flower's object path
`fedmodel.runtime.flower.client_app:client_app`) serves every request:

- a "fedmodel.build" message carries the block's spec as JSON and its constants as arrays; the
  ClientApp rebuilds the block from fedmodel's own atom table and compiles the node program.
  Data the spec gives no array for is the client's own: the `.npy` files of the directory its
  node config names (`--node-config 'fedmodel-data="DIR"'`: DIR/NAME.npy per data name);
- every other message carries one declared request (`ledger.MESSAGES`, `codec`). The ClientApp
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

import importlib
import logging
import os
import sys
import uuid
from typing import Any, Callable

import numpy as np

from ...errors import DataError, FedModelError
from .. import wire
from ..executor import check_sum_fields, run_on_node
from ..ledger import MESSAGES, PROCEDURES, MessageKind
from ..program import NodeProgram
from ..spec_codec import decode_spec
from ..wire import WireError
from . import secagg
from .codec import (BUILD, HELLO, NODE_DATA_KEY, NODE_NAME_KEY, REPLAY, array_limits, build_parts,
                    check_request, decode, encode, header, loads)

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


# ---- what a client serves ------------------------------------------------------------------------
def load_client_modules() -> None:
    """Import the modules the client host lists in `FEDMODEL_CLIENT_MODULES` (its own
    configuration, e.g. a test's wrapped procedures), once per process — never a name that came
    with a message."""
    for module in os.environ.get(CLIENT_MODULES_ENV, "").split(","):
        if module.strip() and module.strip() not in sys.modules:
            importlib.import_module(module.strip())   # the host's own configuration (allowlisted, tests/test_layers.py)


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


# ---- the handlers ----------------------------------------------------------------------------------
# Node programs this worker process has built: (run id, node id) -> (build, token, program). The
# build id names the spec it was compiled from (one per `start`), the token which state of the
# node it holds (`Context.state`, module docstring).
_CACHE: dict[tuple[int, int], tuple[str, str, NodeProgram]] = {}


def serve_message(message: "Message", context: "Context") -> "Message":
    """The ClientApp's one handler: build the node program or serve one request on it; a
    refused or failed request is logged and answered with its error (never a silent reply)."""
    kind = "?"
    key = (message.metadata.run_id, message.metadata.dst_node_id)
    try:
        kind = header(message.content)["kind"]
        if kind == HELLO:       # which client this node is (deployment: its --node-config)
            content = encode(kind, {"name": str(context.node_config.get(NODE_NAME_KEY, ""))})
            return Message(content, reply_to=message)
        if kind == BUILD:
            _, payload = decode(message.content)
            text, arrays = build_parts(payload)
            program = decode_spec(text, arrays, node_data(context)).build()   # its data read here
            build, token = uuid.uuid4().hex, uuid.uuid4().hex
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
                declared = served_kind(step[0])
                check_request(declared, step[1], program.n_shared)
                run_on_node(program, step[0], step[1])
            reply = {}
            _remember(key, context, program)
        else:
            declared = served_kind(kind)
            program = _program_of(key, context)
            _, payload = decode(message.content, array_limits(declared, program.n_shared))
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
    carried as Flower FitIns and reply with only the fields to be summed (`secagg.summed_reply`:
    the mod quantizes and masks them before anything leaves the node)."""
    content = secagg.request_of(message)
    kind = header(content)["kind"]
    declared = served_kind(kind)
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
        program.load_state(loads(record["state"], "node state"))
    _CACHE[key] = (build, token, program)
    return program


if ClientApp is not None:
    client_app = ClientApp()
    client_app.train(mods=[secagg.secure_sum_mod(_serve_summed)])(serve_message)   # state-
    #                   changing requests (and the stages of a secure sum, through SecAgg+'s mod)
    client_app.query()(serve_message)       # read-only requests (reports, queries, save_state)
else:
    client_app = None
