"""Secure sums on Flower: fedmodel's requests through Flower's SecAgg+ protocol, both sides
(docs/flower.md, "Secure aggregation").

Server side (`FlowerExecutor.map_sum` with `secure_sum`: `secure_map_sum`; its settings
checked by `settings_of`): the request goes out as Flower FitIns
(`to_fitins`), `secure_round` runs Flower's `SecAggPlusWorkflow` on the grid (setup, share
keys, collect masked vectors, unmask) and returns only the sum. Client side: the ClientApp's
train handler carries `secure_sum_mod` (Flower's `secaggplus_mod` for the messages of a secure
sum); between its stages the mod asks the ClientApp's handler to serve the request
(`request_of`: the FitIns back as a fedmodel message) and masks `summed_reply`'s FitRes
(the summed fields only, weight 1) before anything leaves the node.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable

import numpy as np

from ...errors import FedModelError
from .. import wire
from ..wire import WireError
from ..executor import check_sum_fields, declared_kind
from ..messages import check_payload
from .codec import ARRAYS, CONFIG, NodeTimeout, encode, send_and_receive, wire_size

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.client.mod import secaggplus_mod
    from flwr.common import (Code, FitIns, FitRes, Status, ndarrays_to_parameters,
                             parameters_to_ndarrays)
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE
    from flwr.compat.common import recorddict_compat as compat
except ImportError:     # optional extra: make_executor("flower") then says how to install it
    secaggplus_mod = None

_ARRAY_KEYS = "fm_array_keys"   # FitIns config entry: the names of its arrays, in order


# ---- a request as FitIns and back -------------------------------------------------------------------
def to_fitins(content: "RecordDict") -> "FitIns":
    """A fedmodel request (`codec.encode(..., pack=False)`: its arrays in an ArrayRecord) as the
    FitIns SecAgg+ sends: its arrays as the parameters, their names and the config record as
    the config."""
    arrays = content[ARRAYS]
    config = {**dict(content[CONFIG]), _ARRAY_KEYS: json.dumps(list(arrays))}
    return FitIns(ndarrays_to_parameters([a.numpy() for a in arrays.values()]), config)


def request_of(message: "Message") -> "RecordDict":
    """(Client) the fedmodel request a secure sum's FitIns carries (`to_fitins`' inverse); its
    header and fields are checked by `codec.decode` as any request's."""
    fitins = compat.recorddict_to_fitins(message.content, keep_input=True)
    config = dict(fitins.config)
    keys = wire.loads(config.pop(_ARRAY_KEYS, None), _ARRAY_KEYS)
    arrays = parameters_to_ndarrays(fitins.parameters)
    if not (isinstance(keys, list) and len(keys) == len(arrays) and all(isinstance(k, str) for k in keys)):
        raise WireError("a secure sum's array names do not match its arrays")
    return RecordDict({ARRAYS: ArrayRecord({k: Array(a) for k, a in zip(keys, arrays)}),
                       CONFIG: ConfigRecord(config)})


def summed_reply(message: "Message", context: "Context", kind: str, values: list,
                 fields: list[str]) -> "Message":
    """(Client) the reply of a secure sum: the summed fields' `values` as FitRes parameters
    (weight 1), which the mod quantizes and masks. A value outside the protocol's clipping
    range would be clipped silently: refused instead."""
    clip = float(context.state.config_records[RECORD_KEY_STATE]["clipping_range"])
    arrays = []
    for field, value in zip(fields, values):
        value = np.asarray(value, dtype=float)
        if not np.all(np.isfinite(value)) or np.any(np.abs(value) > clip):
            raise FedModelError(f"secure sum of {kind!r}: field {field!r} has entries outside the "
                                f"SecAgg+ clipping range ±{clip:g} (they would be clipped); raise "
                                "clipping_range in FlowerExecutor(secure_sum={...})")
        arrays.append(value)
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 1, {})
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=message)


def secure_sum_mod(serve: Callable[["Message", "Context"], "Message"]) -> Callable:
    """(Client) the mod of the ClientApp's train handler: Flower's `secaggplus_mod` for the
    messages of a secure sum (they carry its config record), serving them with `serve`; every
    other message goes to the handler as it is."""
    def mod(message: "Message", context: "Context", call_next) -> "Message":
        if RECORD_KEY_CONFIGS not in message.content.config_records:
            return call_next(message, context)
        return secaggplus_mod(message, context, serve)
    return mod


# ---- the server side -------------------------------------------------------------------------------
def secagg_workflow(settings: dict, timeout: float | None) -> Any:
    """Flower's SecAgg+ workflow with `settings` (weight 1 per client: `max_weight` 1)."""
    from flwr.server.workflow import SecAggPlusWorkflow

    return SecAggPlusWorkflow(settings["num_shares"], settings["reconstruction_threshold"],
                              max_weight=1.0, clipping_range=float(settings["clipping_range"]),
                              quantization_range=settings["quantization_range"],
                              modulus_range=settings["modulus_range"], timeout=timeout)


class CountingGrid:
    """The Grid, counting the bytes and round trips of the SecAgg+ stages by client on
    `executor` (a FlowerExecutor: its `wire_bytes` and `round_trips`)."""

    def __init__(self, grid: Any, executor: Any, kind: str, names: dict[int, str]):
        self.grid, self.executor, self.kind, self.names = grid, executor, kind, names
        self.errors: dict[str, str] = {}     # client -> the error Flower reported for it

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        for m in messages:
            self.executor.wire_bytes[("server", self.names[m.metadata.dst_node_id], self.kind)] += \
                wire_size(m.content)
        replies = send_and_receive(self.grid, messages, timeout)
        self.executor.round_trips += 1
        self.executor.trips[self.kind] += 1
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


def secure_round(settings: dict, grid: Any, executor: Any, kind: str, fitins: "FitIns",
                 names: dict[int, str]) -> tuple[list | None, dict, set]:
    """One run of Flower's SecAgg+ workflow (setup, share keys, collect masked vectors, unmask)
    asking the nodes `names` for `fitins`: the unmasked weighted mean of their replies (None
    if the protocol halted), the failures by client, and the node ids whose vectors it holds."""
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
    counting = CountingGrid(grid, executor, kind, names)
    secagg_workflow(settings, executor.timeout)(counting, context)
    sums, _, seen = strategy.result
    return sums, counting.errors, seen


# ---- the executor's secure sum -----------------------------------------------------------------------
def settings_of(value: bool | dict | None, defaults: dict) -> dict | None:
    """`FlowerExecutor.secure_sum`'s settings from what a user gave: None (plain sums) for
    False / None, else `defaults` updated by the dict given, checked by Flower's workflow."""
    if value is False or value is None:
        return None
    given = {} if value is True else value
    if not isinstance(given, dict) or set(given) - set(defaults):
        raise FedModelError(f"secure_sum must be True, False or a dict with keys from "
                            f"{sorted(defaults)}, got {value!r}")
    settings = {**defaults, **given}
    try:        # Flower checks the ranges, shares and threshold (ValueError / TypeError)
        secagg_workflow(settings, None)
    except (ValueError, TypeError) as err:
        raise FedModelError(f"secure_sum: {err}") from None
    return settings


def secure_map_sum(executor: Any, kind: str, nodes: list[str], common: dict, fields: list[str]) -> dict:
    """`FlowerExecutor.map_sum` under `secure_sum`: one SecAgg+ run (`secure_round`, four round
    trips) so that the server sees only Σ over `nodes` of the reply fields `fields`; the ledger
    books the request and the summed fields of each reply."""
    declared = declared_kind(kind)
    executor._serve(nodes)
    check_sum_fields(declared, fields)
    local = [n for n in nodes if n not in executor.node_ids]
    if local or len(nodes) < 2:
        raise FedModelError(f"a secure sum needs at least two clients served by Flower, got "
                            f"{nodes}" + (f" ({local} run here)" if local else ""))
    floats = check_payload(declared, declared.request, common, executor.model_size, "request")
    fitins = to_fitins(encode(kind, common, declared.request, {"sum": fields}, pack=False))
    started = time.monotonic()
    sums, failures, seen = executor._ask(
        lambda grid: secure_round(executor.secure_sum, grid, executor, kind, fitins,
                                  {executor.node_ids[n]: n for n in nodes}), 4 * executor.timeout)
    missing = [n for n in nodes if executor.node_ids[n] not in seen]
    if missing or sums is None:
        # a client's own error (Flower's reason carries its text) or no reply in time
        reasons = "".join(f"\n  {n}: {r.strip().splitlines()[-1] if r.strip() else r}"
                          for n, r in failures.items())
        raise (FedModelError if failures else NodeTimeout)(
            f"client(s) {missing or nodes} did not complete the secure sum of {kind!r} "
            f"({time.monotonic() - started:.3g} s; timeout {executor.timeout:g} s per SecAgg+ stage)" + reasons)
    out = {field: np.asarray(total, float) * len(nodes) for field, total in zip(fields, sums)}  # (SecAgg+: the mean)
    reply_floats = sum(int(np.size(v)) for v in out.values())
    executor.ledger.exchange(kind, nodes)     # (one sum of the algorithm's; SecAgg+'s stages: `round_trips`)
    for node in nodes:
        executor.ledger.record("server", node, kind, floats)
        executor.ledger.record(node, "server", kind, reply_floats)
        executor.replay.record(node, kind, dict(common))
    return out
