"""A remote node's way back after a fault, shared by the executors whose clients live elsewhere
(Ray actors, Flower SuperNodes).

Node procedures are deterministic functions of their state and requests (random ones keep their
generator in `program.state`), so a client rebuilt from its spec, given its last snapshot and
sent again the state-changing requests since that snapshot (or since its build), holds the
state it had before the fault. `ReplayLog` keeps, per node, that snapshot and those requests —
only state-changing kinds: a request whose kind is declared `read_only` (`messages.MESSAGES`)
changes nothing and is never replayed — and one bookkeeping record per fault (`faults`: the
node, the request kind, the executor's details, how many requests were replayed, when).
What an executor does to bring a node back (a new actor, a rejoined SuperNode) is its own.
"""
from __future__ import annotations

import time
from typing import Any, Iterable

from .messages import MESSAGES


class ReplayLog:
    """Per node: its last snapshot (the `state` of its `save_state` reply, None for its build)
    and the state-changing requests sent to it since, in order; the run's fault records."""

    def __init__(self):
        self.faults: list[dict] = []
        self._requests: dict[str, list[tuple[str, dict]]] = {}
        self._snapshot: dict[str, Any] = {}

    def start(self, nodes: Iterable[str]) -> None:
        """A run begins: `nodes` were just built (no snapshot, nothing to replay, no faults)."""
        self.faults = []
        self._requests = {node: [] for node in nodes}
        self._snapshot = {node: None for node in self._requests}

    def record(self, node: str, kind: str, payload: dict) -> None:
        """`node` served the request `kind` with `payload`: kept when the kind changes state."""
        if not MESSAGES[kind].read_only:
            self._requests[node].append((kind, payload))

    def snapshot(self, node: str, state: Any) -> None:
        """`node`'s state now (`save_state`): the requests before it need no replay."""
        self._snapshot[node], self._requests[node] = state, []

    def due(self, nodes: Iterable[str], every: int) -> list[str]:
        """The nodes of `nodes` with at least `every` requests since their snapshot (0: never)."""
        return [node for node in nodes if every and len(self._requests[node]) >= every]

    def steps(self, node: str) -> list[tuple[str, dict]]:
        """What brings a rebuilt `node` back, in order: ("load_state", its snapshot) when it has
        one, then the requests since, as (kind, payload)."""
        snapshot = self._snapshot[node]
        restore = [("load_state", {"state": snapshot})] if snapshot is not None else []
        return restore + list(self._requests[node])

    def fault(self, node: str, kind: str, replay: bool = True, **details: Any) -> dict:
        """Book a fault of `node` during request `kind`: the record {"node", "kind", **details,
        "replayed" (requests to replay since the snapshot; left out with `replay=False`: a node
        dropped, not brought back), "time"}, appended to `faults` and returned so that the
        executor adds how it ended ("recovered", "fatal")."""
        record = {"node": node, "kind": kind, **details}
        if replay:
            record["replayed"] = len(self._requests[node])
        record["time"] = time.time()
        self.faults.append(record)
        return record
