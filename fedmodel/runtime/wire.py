"""Plain data on the wire: a JSON codec for the values of messages that are neither arrays nor
numbers nor strings (multiplier dicts, name lists, node state, a replay log, an error).

A remote executor's client decodes only what this module writes: JSON text whose objects are
tagged plain data — numbers, strings, bytes, lists, tuples, dicts, slices, numpy arrays (dtype
from a fixed table, raw bytes in base64, size checked against the shape), numpy random
generators (bit generator from a fixed table, state as plain data) and records of backends'
node state (instances of classes of `STATE_MODULES` that are already imported, rebuilt as
`object.__new__` plus their plain-data attributes: no constructor, `__setstate__` or
`__reduce__` runs). Nothing here imports a module or calls a constructor the text names
outside those tables, so decoding can run no code: a Python object that is not plain data is
refused when it is encoded, and a tag, dtype or class that is not in the tables is refused
when it is decoded (`WireError`).
"""
from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from ..errors import FedModelError

#: largest JSON text a client decodes (bytes): larger plain-data fields are refused unread
MAX_TEXT = 64 * 2**20
#: array dtypes that travel (numbers and booleans only: never object arrays)
DTYPES = ("float64", "float32", "int64", "int32", "uint64", "uint32", "uint8", "int8", "bool")
#: bit generators of `numpy.random.Generator` states that travel (their state is plain data)
BIT_GENERATORS = {name: getattr(np.random, name) for name in ("PCG64", "PCG64DXSM", "Philox",
                                                               "SFC64", "MT19937")}
#: modules whose classes' instances travel as records (node state of backend procedures:
#: settings dataclasses, noise logs): looked up among modules already imported, never imported
STATE_MODULES = ("fedmodel.backends.", "fedmodel.runtime.privacy")
_DEPTH = 64     # nesting a decoder follows at most (a deeper text is refused, not recursed into)


class WireError(FedModelError):
    """A message that is not what the receiver accepts (undeclared kind or field, a value that is
    not plain data, an array of the wrong shape or size): refused before anything runs."""


def to_plain(value: Any, where: str = "value", depth: int = 0) -> Any:
    """`value` as JSON-able tagged plain data (see the module docstring); anything else is a
    WireError naming `where`."""
    if depth > _DEPTH:
        raise WireError(f"{where} is nested deeper than {_DEPTH} levels")
    if isinstance(value, (np.ndarray, np.generic)):     # (first: np.float64 is a float)
        array = np.asarray(value)
        if array.dtype.name not in DTYPES:
            raise WireError(f"{where}: an array of dtype {array.dtype} does not travel "
                            f"(allowed: {', '.join(DTYPES)})")
        tag = "a" if isinstance(value, np.ndarray) else "s"
        return {tag: [array.dtype.name, list(array.shape),
                      base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")]}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float):
        return {"f": repr(value)}       # (repr round-trips exactly, nan and inf included)
    if isinstance(value, list):
        return [to_plain(v, where, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"t": [to_plain(v, where, depth + 1) for v in value]}
    if isinstance(value, bytes):        # (raw bytes stay bytes: nothing ever unpickles them)
        return {"b": base64.b64encode(value).decode("ascii")}
    if isinstance(value, slice):
        return {"sl": [to_plain(v, where, depth + 1) for v in (value.start, value.stop, value.step)]}
    if isinstance(value, dict):
        return {"d": [[to_plain(k, where, depth + 1), to_plain(v, where, depth + 1)]
                      for k, v in value.items()]}
    if isinstance(value, np.random.Generator):
        state = value.bit_generator.state
        if state.get("bit_generator") not in BIT_GENERATORS:
            raise WireError(f"{where}: a generator with bit generator {state.get('bit_generator')!r} "
                            f"does not travel (allowed: {sorted(BIT_GENERATORS)})")
        return {"rng": to_plain(state, where, depth + 1)}
    cls = type(value)
    if _state_class(cls.__module__, cls.__qualname__) is cls and hasattr(value, "__dict__"):
        return {"obj": [cls.__module__, cls.__qualname__,
                        {k: to_plain(v, where, depth + 1) for k, v in vars(value).items()}]}
    raise WireError(f"{where}: a {type(value).__name__} is not plain data (numbers, strings, "
                    "lists, tuples, dicts, slices, numpy arrays, numpy generators) and does not "
                    "travel; send its parts instead")


def from_plain(obj: Any, where: str = "value", depth: int = 0) -> Any:
    """The value `to_plain` encoded; a WireError for anything it would not have written."""
    if depth > _DEPTH:
        raise WireError(f"{where} is nested deeper than {_DEPTH} levels")
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, list):
        return [from_plain(v, where, depth + 1) for v in obj]
    if not (isinstance(obj, dict) and len(obj) == 1):
        raise WireError(f"{where}: {type(obj).__name__} is not tagged plain data")
    (tag, body), = obj.items()
    if tag == "f" and isinstance(body, str):
        try:
            return float(body)
        except ValueError:
            raise WireError(f"{where}: {body[:40]!r} is not a float") from None
    if tag in ("a", "s"):
        return _array(body, where, scalar=tag == "s")
    if tag == "b" and isinstance(body, str):
        try:
            return base64.b64decode(body.encode("ascii"), validate=True)
        except ValueError:
            raise WireError(f"{where}: bytes that are not base64") from None
    if tag == "t" and isinstance(body, list):
        return tuple(from_plain(v, where, depth + 1) for v in body)
    if tag == "sl" and isinstance(body, list) and len(body) == 3:
        parts = [from_plain(v, where, depth + 1) for v in body]
        if not all(p is None or (isinstance(p, int) and not isinstance(p, bool)) for p in parts):
            raise WireError(f"{where}: a slice of {parts!r} (ints or None only)")
        return slice(*parts)
    if tag == "d" and isinstance(body, list):
        out = {}
        for pair in body:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise WireError(f"{where}: a dict entry must be a [key, value] pair")
            key = from_plain(pair[0], where, depth + 1)
            if not isinstance(key, (str, int, float, bool, tuple, bytes)) and key is not None:
                raise WireError(f"{where}: a dict key of type {type(key).__name__}")
            out[key] = from_plain(pair[1], where, depth + 1)
        return out
    if tag == "rng":
        state = from_plain(body, where, depth + 1)
        name = state.get("bit_generator") if isinstance(state, dict) else None
        if name not in BIT_GENERATORS:
            raise WireError(f"{where}: bit generator {name!r} is not one of {sorted(BIT_GENERATORS)}")
        generator = np.random.Generator(BIT_GENERATORS[name]())
        try:
            generator.bit_generator.state = state
        except (TypeError, ValueError, KeyError) as err:
            raise WireError(f"{where}: not a {name} state ({err})") from None
        return generator
    if tag == "obj" and isinstance(body, list) and len(body) == 3 and isinstance(body[2], dict):
        cls = _state_class(body[0], body[1])
        if cls is None:
            raise WireError(f"{where}: {str(body[0])[:80]}.{str(body[1])[:80]} is not a node-state "
                            f"class of an imported module of {STATE_MODULES}")
        record = object.__new__(cls)        # (no __init__, no __setstate__: attributes only)
        record.__dict__.update({str(k): from_plain(v, where, depth + 1) for k, v in body[2].items()})
        return record
    raise WireError(f"{where}: unknown tag {tag!r}")


def _state_class(module: Any, qualname: Any) -> type | None:
    """The class `qualname` of the already imported module `module` when that module is one of
    `STATE_MODULES` and the class is a plain one defined there (not an exception, with a
    `__dict__`), else None. Nothing is imported."""
    import sys
    if not (isinstance(module, str) and isinstance(qualname, str) and
            any(module == m or (m.endswith(".") and module.startswith(m)) for m in STATE_MODULES)):
        return None
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if found is None or part.startswith("__") or part == "<locals>":
            return None
        found = getattr(found, part, None)
    if not (isinstance(found, type) and found.__module__ == module and found.__qualname__ == qualname
            and not issubclass(found, BaseException) and "__slots__" not in vars(found)
            and found.__new__ is object.__new__):
        return None
    return found


def _array(body: Any, where: str, scalar: bool) -> Any:
    """An array (or numpy scalar) from [dtype, shape, base64 bytes], its size checked."""
    if not (isinstance(body, list) and len(body) == 3 and isinstance(body[0], str)
            and isinstance(body[1], list) and isinstance(body[2], str)):
        raise WireError(f"{where}: an array must be [dtype, shape, base64 data]")
    dtype, shape, text = body
    check_array_form(dtype, shape, where)
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except ValueError:
        raise WireError(f"{where}: array data that is not base64") from None
    array = array_from_bytes(dtype, shape, data, where)
    return array[()] if scalar else array


def check_array_form(dtype: Any, shape: Any, where: str) -> int:
    """Check an array's declared dtype (one of DTYPES) and shape (a list of at most 8
    nonnegative ints) before any of its data is read; its size in bytes."""
    if not (isinstance(dtype, str) and dtype in DTYPES):
        raise WireError(f"{where}: array dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if not (isinstance(shape, list) and len(shape) <= 8 and
            all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise WireError(f"{where}: array shape {shape!r} (at most 8 nonnegative ints)")
    return (int(np.prod(shape, dtype=np.int64)) if shape else 1) * np.dtype(dtype).itemsize


def array_from_bytes(dtype: str, shape: list, data: bytes, where: str) -> np.ndarray:
    """A writable array of a checked form (`check_array_form`) from exactly its raw bytes (C
    order, this machine's byte order, as `tobytes` writes them): read as numbers only, never
    unpickled; a bool array's bytes must be 0 or 1."""
    size = check_array_form(dtype, shape, where)
    if len(data) != size:
        raise WireError(f"{where}: {len(data)} bytes for a {dtype} array of shape {tuple(shape)}")
    if dtype == "bool" and bytes(data).translate(None, b"\x00\x01"):
        raise WireError(f"{where}: a bool array with bytes other than 0 and 1")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def dumps(value: Any, where: str = "value") -> str:
    """`value` as JSON text of tagged plain data."""
    return json.dumps(to_plain(value, where), separators=(",", ":"))


def loads(text: Any, where: str = "value") -> Any:
    """The value of `dumps` text; a WireError for anything else (not text, too long, not JSON,
    not tagged plain data)."""
    if not isinstance(text, str):
        raise WireError(f"{where}: plain data travels as JSON text, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise WireError(f"{where}: {len(text)} characters of plain data, beyond MAX_TEXT = {MAX_TEXT}")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise WireError(f"{where}: not JSON ({err})") from None
    return from_plain(obj, where)


def error_to_plain(err: BaseException) -> dict:
    """A client's error as plain data: its class name (looked up again on the driver among
    fedmodel's own error classes only) and its text."""
    return {"type": type(err).__name__, "message": str(err),
            "fedmodel": isinstance(err, FedModelError)}


def error_from_plain(plain: Any) -> FedModelError:
    """The FedModelError to raise for `error_to_plain`'s record: the same class where it is one
    of `fedmodel.errors`' classes (a DataError stays a DataError), else a FedModelError."""
    from .. import errors
    if not isinstance(plain, dict):
        return FedModelError(f"a malformed error record: {str(plain)[:200]}")
    name, message = str(plain.get("type", "")), str(plain.get("message", ""))
    cls = getattr(errors, name, None)
    if plain.get("fedmodel") and isinstance(cls, type) and issubclass(cls, FedModelError):
        try:
            return cls(message)
        except TypeError:       # (a constructor with other arguments: its base class then)
            pass
    return FedModelError(f"{name}: {message}")
