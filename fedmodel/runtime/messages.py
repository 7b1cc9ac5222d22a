"""Declared message kinds and the node procedures that serve them.

Every request a backend sends to a node program, and every reply, is one of the kinds declared
here with the sizes of its array fields ("x": the flat shared model, "1": a scalar). A payload
that does not match its declaration is refused, so no client array can leave a client by
accident. What is sent is booked in the ledger (`ledger.Ledger`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import FedModelError


@dataclass(frozen=True)
class MessageKind:
    """A method a node program offers, with the sizes of its request and reply arrays."""

    name: str
    request: dict[str, str]
    reply: dict[str, str]
    local: bool = False  # served by the node for the server itself (no network traffic)
    read_only: bool = False  # leaves the node's state as it was (Ray: not logged for replay)


_ABSENT = object()


class _Registry(dict):
    """kind name -> form. A name not registered yet is looked up once in the catalogue of the
    installed backends (`catalogue`): a Flower client or a Ray worker serves what its
    installed fedmodel declares, never what a message names."""

    def __missing__(self, key: str) -> Any:
        _load_catalogue(until=lambda: dict.__contains__(self, key))
        found = dict.get(self, key, _ABSENT)
        if found is _ABSENT:
            raise KeyError(key)
        return found

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        if not dict.__contains__(self, key):
            _load_catalogue(until=lambda: dict.__contains__(self, key))
        return dict.__contains__(self, key)


def _kinds(*kinds: MessageKind) -> dict[str, MessageKind]:
    return {k.name: k for k in kinds}


# Sizes: "x" = shared model size, "x|1" = model-sized or scalar, "1" = scalar, "<=k" = a short
# vector of at most k numbers (statistics such as inner products, never data-sized), "tri" =
# the upper triangle of a symmetric model-by-model matrix (a Hessian: d(d + 1)/2 numbers).
MESSAGES: dict[str, MessageKind] = _Registry(_kinds(
    MessageKind("configure", {"beta": "1", "prox_weight": "1", "center": "x"}, {}),
    MessageKind("merit", {"x": "x"}, {"value": "1", "grad": "x"}, read_only=True),
    MessageKind("solve_local", {"linear": "x", "weight": "x|1", "anchor": "x", "x0": "x", "tol": "1",
                                "method": "str", "max_steps": "1", "lr": "1"},
                {"x": "x", "steps": "1", "grad_norm": "1"}),
    MessageKind("update_multipliers", {"x": "x"}, {"dmu": "1", "dy": "1"}),
    # reporting and bookkeeping, served locally (the harness's metrics, not the algorithm's traffic)
    MessageKind("report", {"x": "x"}, {"objective": "1", "violation": "1"}, local=True, read_only=True),
    MessageKind("multipliers", {}, {"multipliers": "opaque"}, local=True, read_only=True),
    MessageKind("private_values", {}, {"values": "opaque"}, local=True, read_only=True),
    MessageKind("save_state", {}, {"state": "opaque"}, local=True, read_only=True),
    MessageKind("load_state", {"state": "opaque"}, {}, local=True),
    # a no-op round trip that times the transport (`Executor.measure_round_trip`): not the
    # algorithm's traffic, so booked as local, and read-only (never replayed)
    MessageKind("probe", {}, {}, local=True, read_only=True),
))


@dataclass(frozen=True)
class Procedure:
    """A node-side step: its message kind, the function serving it on one node program
    (`serve(program, **payload) -> reply`: the node program's API only, never raw data; its
    own state in `program.state`; a module-level function, so that Ray pickles it by name) and
    its vectorized forms for the batched executor (`batched`, `stacked`: see `BATCHED`,
    `STACKED`; each must leave every node's state exactly as `serve` would)."""

    kind: MessageKind
    serve: Callable
    batched: Callable | None = None
    stacked: Callable | None = None

    @property
    def name(self) -> str:
        return self.kind.name


# The registry, keyed by stable procedure names. Filled explicitly — by `install` when a run
# opens its executor (the backend's `procedures`), by the runtime's own requests (`CORE`) and
# by `catalogue` — never by importing a module. PROCEDURES: kind -> serve(program, **payload).
# BATCHED: kind -> form(group, members, payloads) -> replies by member, or None (not covered:
# those members are served one by one). STACKED: kind -> form(group, rows, blocks, common) ->
# stacked replies, or None (not covered: the group request is split into per-node messages);
# `rows` are the group indices of the request's nodes, `blocks` their per-node fields as
# (len(rows), …) arrays (`Executor.map_stacked`).
PROCEDURES: dict[str, Callable] = _Registry()
# (The forms are installed with their procedure, so a run finds them without the catalogue.)
BATCHED: dict[str, Callable] = {}
STACKED: dict[str, Callable] = {}


def procedure(name: str, request: dict[str, str], reply: dict[str, str], *, local: bool = False,
              read_only: bool = False, batched: Callable | None = None,
              stacked: Callable | None = None) -> Callable[[Callable], Callable]:
    """Decorator: declares the node step's message kind and attaches its `Procedure` (with its
    vectorized forms) to the function as `.procedure`. It registers nothing: a backend lists
    its steps in `Backend.procedures`, which the run installs when it opens its executor."""
    def wrap(fn):
        fn.procedure = Procedure(MessageKind(name, request, reply, local=local, read_only=read_only),
                                 fn, batched, stacked)
        return fn
    return wrap


def as_procedure(step: Any) -> Procedure:
    """`step` as a `Procedure`: itself, or the one `@procedure` attached to a function."""
    found = step if isinstance(step, Procedure) else getattr(step, "procedure", None)
    if not isinstance(found, Procedure):
        raise FedModelError(f"{step!r} is not a node procedure: decorate it with "
                            "fedmodel.runtime.messages.procedure(...) or pass a Procedure")
    return found


def with_forms(step: Any, *, batched: Callable | None = None,
               stacked: Callable | None = None) -> Procedure:
    """`step`'s procedure with vectorized forms added (forms kept beside the algorithm's
    vectorized code)."""
    found = as_procedure(step)
    return Procedure(found.kind, found.serve, batched or found.batched, stacked or found.stacked)


def install(procedures: Any) -> frozenset[str]:
    """Register `procedures` (Procedures or `@procedure` functions) by their kind names and
    return those names. A name registered with another declaration is refused; a form already
    registered is kept (so the first registration, or a test's spy put there, stays)."""
    names = []
    for step in procedures:
        found = as_procedure(step)
        declared = dict.get(MESSAGES, found.name)
        if declared is not None and declared != found.kind:
            raise FedModelError(f"message kind {found.name!r} is already declared differently: "
                                f"{declared} vs {found.kind}")
        MESSAGES[found.name] = found.kind
        for table, form in ((PROCEDURES, found.serve), (BATCHED, found.batched), (STACKED, found.stacked)):
            if form is not None and not dict.__contains__(table, found.name):
                dict.__setitem__(table, found.name, form)
        names.append(found.name)
    return frozenset(names)


def lookup(kind: str) -> Callable:
    """The function serving `kind` on a node program: a registered procedure (this process's
    runs, the runtime's own requests, the installed backends' catalogue). Anything else is
    refused — there is no fallback to a method or a module of that name."""
    found = PROCEDURES.get(kind)
    if found is None:
        raise FedModelError(f"no node procedure is registered for message kind {kind!r}; a backend "
                            "lists its node steps in its `procedures` attribute")
    return found


_CATALOGUE: dict[str, Any] = {"loaded": set(), "busy": False}
_PROVIDER: dict[str, str] = {}      # kind -> the installed backend whose steps registered it


def load_backend(name: str) -> bool:
    """Install the steps of the installed backend `name` (its registry entry point), once per
    process; False if there is no such backend or it fails to import (it serves nothing)."""
    from .. import registry         # (the registry imports nothing of the runtime's)
    if name in _CATALOGUE["loaded"]:
        return True
    if name not in registry.names("backend"):
        return False
    _CATALOGUE["loaded"].add(name)
    try:
        backend = registry.lookup("backend", name)
    except Exception:       # an add-on that fails to import serves nothing here
        return False
    for steps in (getattr(backend, "framework_procedures", ()), getattr(backend, "procedures", ())):
        for kind in install(steps):     # (`Backend.run` sends both)
            _PROVIDER.setdefault(kind, name)
    return True


def provider(kind: str) -> str | None:
    """The installed backend whose steps registered `kind` in this process's catalogue, if
    the catalogue loaded it (a client remembers it: `client_app.KindCache`)."""
    return _PROVIDER.get(kind)


def _load_catalogue(until: Callable[[], bool] = lambda: False) -> None:
    """Install the installed backends' `procedures` (the backend registry's entry points), one
    backend at a time until `until()` holds, each backend once per process. One at a time: a
    Flower deployment starts a client process per message, and importing every backend costs
    seconds (DP accounting's alone ~3 s), where one request needs one backend's steps."""
    if _CATALOGUE["busy"]:          # (a lookup while loading finds nothing more)
        return
    from .. import registry         # (the registry imports nothing of the runtime's)
    _CATALOGUE["busy"] = True
    try:
        for name in registry.names("backend"):
            if until():
                return
            load_backend(name)
    finally:
        _CATALOGUE["busy"] = False


def catalogue() -> dict[str, Callable]:
    """Every procedure this process can serve, by kind (the installed backends' and the
    runtime's own)."""
    _load_catalogue()
    return dict(PROCEDURES)


# The node program's own requests, served by its methods through these explicit procedures
# (every served kind is a registered procedure: no method is found by a message's name).
def _configure(program, **payload) -> dict:
    return program.configure(**payload)


def _merit(program, **payload) -> dict:
    return program.merit(**payload)


def _solve_local(program, **payload) -> dict:
    return program.solve_local(**payload)


def _update_multipliers(program, **payload) -> dict:
    return program.update_multipliers(**payload)


def _report(program, **payload) -> dict:
    return program.report(**payload)


def _multipliers(program) -> dict:
    return program.multipliers()


def _private_values(program) -> dict:
    return program.private_values()


def _save_state(program) -> dict:
    return program.save_state()


def _load_state(program, **payload) -> dict:
    return program.load_state(**payload)


def _probe(program) -> dict:
    return {}


CORE = tuple(Procedure(MESSAGES[name], serve) for name, serve in (
    ("configure", _configure), ("merit", _merit), ("solve_local", _solve_local),
    ("update_multipliers", _update_multipliers), ("report", _report),
    ("multipliers", _multipliers), ("private_values", _private_values),
    ("save_state", _save_state), ("load_state", _load_state), ("probe", _probe)))
CORE_KINDS = install(CORE)


@functools.lru_cache(maxsize=1024)
def allowed_sizes(spec: str, model_size: int) -> range | tuple[int, ...]:
    """The float counts a field declared as `spec` may carry (one place for the size rules).
    Memoized (the answers are immutable): every field of every request asks, ~12 per ADMM step
    and client."""
    if spec.startswith("<="):
        return range(int(spec[2:]) + 1)
    if spec == "tri":       # a symmetric d × d matrix's upper triangle (ProxAL's Newton inner)
        return (model_size * (model_size + 1) // 2,)
    return {"x": (model_size,), "1": (1,), "x|1": (model_size, 1), "0|1": (0, 1)}[spec]


_SCALARS = (float, int, bool, np.float64)


def check_payload(kind: MessageKind, fields: dict[str, str], payload: dict[str, Any],
                  model_size: int, direction: str) -> int:
    """Refuse fields that are undeclared or larger than declared; return the float count."""
    floats = 0
    for key, value in payload.items():
        spec = fields.get(key)
        if spec is None:
            raise FedModelError(f"{direction} of message {kind.name!r} carries undeclared field "
                                f"{key!r}; declared: {sorted(fields)}")
        if spec == "str" or spec == "opaque" or value is None:
            continue
        # (np.size costs more than the rest of the check: the batched executor checks every
        # field of a thousand clients' messages per round)
        kind_of = type(value)
        size = value.size if kind_of is np.ndarray else 1 if kind_of in _SCALARS else int(np.size(value))
        allowed = allowed_sizes(spec, model_size)
        if size not in allowed:
            raise FedModelError(
                f"{direction} of message {kind.name!r}: field {key!r} has {size} numbers but is "
                f"declared as {spec!r} (allowed sizes {allowed}); refusing to send it")
        floats += size
    return floats
