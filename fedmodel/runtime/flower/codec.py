"""What crosses the wire between fedmodel's Flower driver and its ClientApp: requests and replies
as Flower records (a client's error among them: `raise_remote`), their checks against the declared message kinds, their size, and the build
message of a block (its declarative spec and arrays).

Clients trust no bytes (docs/flower.md, threat model). On the wire there are only arrays
(`ArrayRecord`, numeric dtypes), numbers and strings (`ConfigRecord`) and JSON text: plain data
(`wire`) and the declarative model spec (`spec_codec`) — never pickle, never a module name.
Both sides use this module: the driver encodes requests and decodes replies, the ClientApp the
other way round, with `array_limits` and `check_request` before anything is served; the
server's two senders (the driver and its SecAgg+ rounds) move messages with `send_and_receive`.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any, Callable

import numpy as np

from ...errors import FedModelError
from .. import wire
from ..ledger import MessageKind, allowed_sizes, catalogue, check_payload
from ..program import ProgramSpec
from ..spec_codec import encode_spec
from ..wire import WireError

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
except ImportError:     # optional extra: make_executor("flower") then says how to install it
    RecordDict = None

BUILD = "fedmodel.build"        # message kind that ships a block's spec to its client
HELLO = "fedmodel.hello"        # asks a node which client it is (deployment)
REPLAY = "fedmodel.replay"      # replays a rejoined client's requests since its build
NODE_NAME_KEY = "fedmodel-client"   # a SuperNode's --node-config key naming its client
NODE_DATA_KEY = "fedmodel-data"     # ... and the directory of its data files (NAME.npy)
NODE_CACHE_KEY = "fedmodel-cache"   # ... and a directory of its own for what it remembers
ARRAYS, CONFIG = "fm_arrays", "fm_config"   # the two records of a fedmodel message
SPEC_PREFIX = "spec."           # a build message's array fields: the spec's arrays
PULL_INTERVAL = 0.05    # seconds between two pulls for replies from a deployment's SuperLink
_HEADER_KEYS = frozenset({"kind", "none", "json", "scalar", "failed", "sum", "timing"})
_NUMERIC = frozenset(wire.DTYPES)


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
    return RecordDict({ARRAYS: ArrayRecord(arrays), CONFIG: ConfigRecord(config)})


def header(content: "RecordDict") -> dict[str, Any]:
    """The checked header of a message made by `encode` (WireError: not one)."""
    try:
        config = content[CONFIG]
        content[ARRAYS]
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
    meta = header(content)
    config = dict(content[CONFIG])
    config.pop("fm_header")
    where = f"message {meta['kind']!r}"
    payload: dict[str, Any] = {}
    for key, array in content[ARRAYS].items():
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
            payload[key] = loads(value, f"{where}, field {key!r}")
        elif isinstance(value, (bool, int, float, str)):
            payload[key] = value
        else:
            raise WireError(f"{where}: field {key!r} carries {type(value).__name__} (bytes are "
                            "refused: fedmodel never unpickles what it receives)")
    for key in meta["none"]:
        payload[key] = None
    return meta, payload


def raise_remote(node: str, kind: str, error: Any) -> None:
    """Raise a client's error here: a fedmodel error as its own class (a DataError names the
    data and the client), anything else as a FedModelError with the client's name; the
    record is plain data (`wire.error_to_plain`), its class looked up among fedmodel's."""
    err = wire.error_from_plain(error)
    if isinstance(error, dict) and error.get("fedmodel"):
        raise err
    raise FedModelError(f"client {node!r} failed serving {kind!r}: {err}")


def loads(text: Any, where: str) -> Any:
    """`wire.loads`, with every installed backend's procedures loaded first when the text holds
    node-state records (`wire` finds their classes only among imported modules; a process
    that served only node-program requests has imported none)."""
    if isinstance(text, str) and '{"obj":' in text:
        catalogue()
    return wire.loads(text, where)


def wire_size(content: "RecordDict") -> int:
    """Bytes of the Flower objects of one message's content (each distinct object once, as
    Flower's transport pushes them)."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(content).values())


# ---- a request against its declaration -----------------------------------------------------------
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


def array_limits(declared: MessageKind, model_size: int) -> Callable[[str, tuple], None]:
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


# ---- the build message -----------------------------------------------------------------------------
def build_payload(spec: ProgramSpec, ship: Callable[[Any], Any]) -> dict[str, Any]:
    """The fields of a block's build message: the spec's JSON text and its arrays (`ship(data)`:
    a data leaf's array to send, or None where the client reads its own)."""
    text, arrays = encode_spec(spec, ship)
    return {"spec": text, **{SPEC_PREFIX + k: v for k, v in arrays.items()}}


def build_parts(payload: dict[str, Any]) -> tuple[str, dict[str, np.ndarray]]:
    """The spec's JSON text and its arrays from a decoded build message (`build_payload`'s
    inverse); a message with anything else is refused."""
    text = payload.get("spec")
    arrays = {k[len(SPEC_PREFIX):]: v for k, v in payload.items() if k.startswith(SPEC_PREFIX)}
    if not isinstance(text, str) or len(arrays) != len(payload) - 1:
        raise WireError(f"{BUILD!r} carries a spec text and its arrays only")
    return text, arrays


# ---- the server's transport --------------------------------------------------------------------------
def send_and_receive(grid: Any, messages: list, timeout: float | None,
                     stamps: dict[str, float] | None = None) -> list:
    """`grid.send_and_receive`, but a deployment's grid (Flower's HttpGrid) is polled every
    PULL_INTERVAL s instead of its fixed 3 s (flwr 1.42), which alone added up to 3 s to every
    round trip; the simulation's in-memory grid keeps its own loop (its `pull_interval`).
    `stamps`: filled with the epoch time each reply was pulled, by the id it replies to."""
    if hasattr(grid, "pull_interval"):
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        if stamps is not None:
            stamps.update((m.metadata.reply_to_message_id, time.time()) for m in replies)
        return replies
    waiting = set(grid.push_messages(messages))
    end = time.monotonic() + (timeout if timeout is not None else math.inf)
    replies: list = []
    while waiting:
        got = list(grid.pull_messages(waiting))
        replies.extend(got)
        if stamps is not None:
            stamps.update((m.metadata.reply_to_message_id, time.time()) for m in got)
        waiting.difference_update(m.metadata.reply_to_message_id for m in got)
        if not waiting or time.monotonic() >= end:
            break
        time.sleep(PULL_INTERVAL)
    return replies
