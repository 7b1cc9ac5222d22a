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
from ..messages import MessageKind, allowed_sizes, catalogue, check_payload
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
# seconds between two pulls for replies from a deployment's SuperLink: the first after a push
# or a pull that brought replies, doubling to the second while none come (each pull is an HTTP
# request that costs the SuperLink CPU: ~20 a second for a whole round trip at a fixed 0.05 s)
PULL_INTERVAL, PULL_MAX = 0.05, 0.2
_HEADER_KEYS = frozenset({"kind", "none", "json", "scalar", "failed", "sum", "timing", "packed", "ride"})
# a rider's fields inside its carrier's message (`executor.Rider`; header "ride": [kind, before])
RIDE_PREFIX = "ride."
PACKED = "fm_packed"    # ConfigRecord entry: a message's arrays, their raw bytes (`encode`)
#: arrays beyond this many bytes in all travel as an ArrayRecord (Flower chunks it) instead
PACK_LIMIT = 4 * 2 ** 20
_NUMERIC = frozenset(wire.DTYPES)


# ---- payload <-> Flower records -------------------------------------------------------------------
class NodeTimeout(FedModelError):
    """A client did not reply within the executor's timeout."""


def encode(kind: str, payload: dict[str, Any], fields: dict[str, str] | None = None,
           extra: dict | None = None, pack: bool = True) -> "RecordDict":
    """One request or reply as a Flower RecordDict: Python bools/ints/floats/strings in a
    ConfigRecord, anything else (dicts, lists, node state) as plain-data JSON text there
    (`wire.dumps`: a value that is not plain data is refused here); None values are listed in
    the header. Numeric numpy arrays (and numpy scalars, as 0-d arrays) go, with `pack`, as one
    bytes entry of that same ConfigRecord (`PACKED`: their raw bytes one after the other, their
    names, dtypes and shapes in the header), so that the message is 3 Flower objects (Message,
    RecordDict, ConfigRecord) whatever its arrays: a deployment moves each object with its own
    HTTP request on each hop, and an ArrayRecord costs 1 + 2 per array (Array, ArrayChunk).
    Arrays beyond PACK_LIMIT bytes in all, or `pack` False (SecAgg+'s FitIns), go as an
    ArrayRecord (Flower chunks it). (`fields`: the kind's declaration, kept for callers; the
    types alone decide the form.)"""
    arrays: dict[str, np.ndarray] = {}
    config: dict[str, Any] = {}
    meta: dict[str, Any] = {"kind": kind, "none": [], "json": [], "scalar": [], **(extra or {})}
    for key, value in payload.items():
        if value is None:
            meta["none"].append(key)
        elif isinstance(value, (np.ndarray, np.generic)) and value.dtype.name in _NUMERIC:
            # (np.require, not ascontiguousarray: that makes a 0-d array 1-d)
            arrays[key] = np.require(value, requirements="C")
            if isinstance(value, np.generic):
                meta["scalar"].append(key)
        elif isinstance(value, (bool, int, float, str)) and not isinstance(value, np.generic):
            config[key] = value
        else:
            config[key] = wire.dumps(value, f"field {key!r} of {kind!r}")
            meta["json"].append(key)
    if pack and sum(a.nbytes for a in arrays.values()) <= PACK_LIMIT:
        if arrays:
            meta["packed"] = [[k, a.dtype.name, list(a.shape)] for k, a in arrays.items()]
            config[PACKED] = b"".join(a.tobytes() for a in arrays.values())
        config["fm_header"] = json.dumps(meta)
        return RecordDict({CONFIG: ConfigRecord(config)})
    config["fm_header"] = json.dumps(meta)
    return RecordDict({ARRAYS: ArrayRecord({k: Array(a) for k, a in arrays.items()}),
                       CONFIG: ConfigRecord(config)})


def header(content: "RecordDict") -> dict[str, Any]:
    """The checked header of a message made by `encode` (WireError: not one)."""
    try:
        config = content[CONFIG]
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
    packed = meta.get("packed", [])
    if not (isinstance(packed, list) and all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) for e in packed)):
        raise WireError(f"message {meta['kind']!r}: header entry 'packed' is not a list of "
                        "[name, dtype, shape]")
    return meta


def decode(content: "RecordDict", limits: Callable[[str, tuple], None] | None = None
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and the payload of a RecordDict made by `encode` (arrays writable copies),
    checked on the way: no bytes but the packed arrays' (read as numbers, nothing is
    unpickled), numeric arrays whose data match their declared dtype and shape, JSON fields as plain data (`wire.loads`). `limits(key, shape)`: raises for
    an array the receiver does not accept, called before the array is read."""
    meta = header(content)
    config = dict(content[CONFIG])
    config.pop("fm_header")
    where = f"message {meta['kind']!r}"
    payload: dict[str, Any] = {}
    for key, array in (content[ARRAYS].items() if ARRAYS in content else ()):
        if array.dtype not in _NUMERIC:
            raise WireError(f"{where}: field {key!r} is an array of dtype {array.dtype!r} "
                            f"(accepted: {', '.join(sorted(_NUMERIC))})")
        if limits is not None:
            limits(key, tuple(array.shape))
        value = np.array(array.numpy())     # (np.load, allow_pickle=False)
        if value.shape != tuple(array.shape) or value.dtype.name not in _NUMERIC:
            raise WireError(f"{where}: field {key!r}: its data is not the declared {array.dtype} "
                            f"array of shape {tuple(array.shape)}")
        payload[key] = value
    payload.update(_unpacked(meta, config.pop(PACKED, None), set(payload), where, limits))
    for key in meta["scalar"]:
        if key in payload:
            payload[key] = payload[key][()]
    for key, value in config.items():
        if key in payload:
            raise WireError(f"{where}: field {key!r} twice")
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


def _unpacked(meta: dict, blob: Any, taken: set, where: str,
              limits: Callable[[str, tuple], None] | None) -> dict[str, np.ndarray]:
    """The arrays of a packed message (`encode`): the header's [name, dtype, shape] entries
    read one after the other from the bytes of `PACKED`, each form checked (`limits` too)
    before its bytes are read, and the bytes exactly used up; numbers only, nothing unpickled."""
    entries = meta.get("packed", [])
    if blob is None and not entries:
        return {}
    if not isinstance(blob, bytes) or not entries:
        raise WireError(f"{where}: packed arrays need both the header's 'packed' entry and the "
                        f"{PACKED!r} bytes")
    forms, offset = [], 0
    for key, dtype, shape in entries:
        if key in taken or key == PACKED:
            raise WireError(f"{where}: field {key!r} twice")
        taken.add(key)
        size = wire.check_array_form(dtype, shape, f"{where}, field {key!r}")
        if limits is not None:
            limits(key, tuple(shape))
        forms.append((key, dtype, shape, offset, size))
        offset += size
    if offset != len(blob):
        raise WireError(f"{where}: {len(blob)} packed bytes for arrays of {offset} bytes")
    view = memoryview(blob)
    return {key: wire.array_from_bytes(dtype, shape, view[start:start + size], f"{where}, field {key!r}")
            for key, dtype, shape, start, size in forms}


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


# ---- a rider inside its carrier's message (`executor.Rider`) --------------------------------------
def with_rider(payload: dict[str, Any], ridden: dict[str, Any]) -> dict[str, Any]:
    """The fields of one message carrying `payload` and a rider's `ridden` (prefixed
    `RIDE_PREFIX`), request or reply."""
    return {**payload, **{RIDE_PREFIX + key: value for key, value in ridden.items()}}


def split_rider(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`with_rider`'s inverse: (the carrier's fields, the rider's)."""
    own = {k: v for k, v in payload.items() if not k.startswith(RIDE_PREFIX)}
    ridden = {k[len(RIDE_PREFIX):]: v for k, v in payload.items() if k.startswith(RIDE_PREFIX)}
    return own, ridden


def rider_of(meta: dict[str, Any]) -> tuple[str, bool] | None:
    """(kind, before) of the rider a request's header names, None without one (WireError: not
    a [kind, before] pair)."""
    ride = meta.get("ride")
    if ride is None:
        return None
    if not (isinstance(ride, list) and len(ride) == 2 and isinstance(ride[0], str)
            and isinstance(ride[1], bool)):
        raise WireError(f"message {meta['kind']!r}: header entry 'ride' is not [kind, before]")
    return ride[0], ride[1]


# ---- a request against its declaration -----------------------------------------------------------
def check_request(declared: MessageKind, payload: dict[str, Any], model_size: int) -> None:
    """Refuse a request that does not match its declaration before it is served: undeclared
    fields, numeric fields that are not numbers or not 0-/1-D, sizes beyond the declared ones
    (`messages.check_payload`)."""
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


def array_limits(declared: MessageKind, model_size: int,
                 rider: MessageKind | None = None) -> Callable[[str, tuple], None]:
    """`decode`'s check of a request's arrays against `declared` (a `RIDE_PREFIX` field against
    the `rider`'s declaration), from their shapes alone."""
    carrier = declared

    def check(key: str, shape: tuple) -> None:
        declared = carrier
        if rider is not None and key.startswith(RIDE_PREFIX):
            declared, key = rider, key[len(RIDE_PREFIX):]
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
    """`grid.send_and_receive`, but a deployment's grid (Flower's HttpGrid) is polled after
    PULL_INTERVAL s, the wait doubling to PULL_MAX while no reply comes, instead of every 3 s
    (flwr 1.42), which alone added up to 3 s to every round trip; the simulation's in-memory
    grid keeps its own loop (its `pull_interval`).
    `stamps`: filled with the epoch time each reply was pulled, by the id it replies to."""
    if hasattr(grid, "pull_interval"):
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        if stamps is not None:
            stamps.update((m.metadata.reply_to_message_id, time.time()) for m in replies)
        return replies
    waiting = set(grid.push_messages(messages))
    end = time.monotonic() + (timeout if timeout is not None else math.inf)
    replies: list = []
    wait = PULL_INTERVAL
    while waiting:
        got = list(grid.pull_messages(waiting))
        replies.extend(got)
        if stamps is not None:
            stamps.update((m.metadata.reply_to_message_id, time.time()) for m in got)
        waiting.difference_update(m.metadata.reply_to_message_id for m in got)
        if not waiting or time.monotonic() >= end:
            break
        if got:     # (after a reply the others are likely close: look again soon)
            wait = PULL_INTERVAL
        time.sleep(min(wait, max(end - time.monotonic(), 0.0)))
        wait = min(2 * wait, PULL_MAX)
    return replies
