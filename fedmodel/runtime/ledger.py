"""The communication ledger: each message (sender, receiver, kind, number of floats) a run
sends, booked per direction, node and kind (the kinds: `messages.MESSAGES`)."""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Sequence

import numpy as np

from .messages import MESSAGES

# Bytes of one float on the wire as declared (float64); a transport's own framing is measured
# by that transport (Flower: `FlowerExecutor.wire_bytes`), not estimated here.
FLOAT_BYTES = 8


class Ledger:
    """Messages and floats per direction, per node and per kind, and the round trips.

    `record` books one message; `record_group` books one message per node of a group request
    (`Executor.map_stacked`) from a count: it is kept as one pending entry and spread over the
    per-node counters only when `messages` / `floats` are read.

    A round trip is one server → clients → server exchange: one request of a kind that is not
    `local`, sent to one or more clients at once, and their replies (`exchange`, booked by
    every executor once per request it sends, whatever its kind and however it is served: a
    `map`, a group request, a Flower batch of Messages). `round_trips` counts them and
    `trips` counts them by kind. `rounds` is the algorithm's own count of its iterations, as
    the backend sets it (ProxAL: outer + inner ADMM iterations): it leaves out the set-up, the
    reports and the extra exchanges of an iteration, so it is not the communication cost.

    `requests` counts by kind every request sent to one or more clients, the `local` kinds
    included (reports, gathers: a transport carries each as a message batch of its own, which
    `round_trips` leaves out as not the algorithm's traffic); a `Rider` travels in its
    carrier's message and is not counted. It is what a deployment's batches come to (Flower's
    `trips`, less its build), whichever executor ran; `__eq__` leaves it out."""

    def __init__(self, messages: Counter | None = None, floats: Counter | None = None, rounds: int = 0,
                 round_trips: int = 0, trips: Counter | None = None):
        self._messages = Counter() if messages is None else messages
        self._floats = Counter() if floats is None else floats
        self.rounds = rounds
        self.round_trips = round_trips
        self.trips = Counter() if trips is None else trips
        self.requests: Counter = Counter()
        # (id of a node tuple, kind, direction, floats each) -> repeats; the tuples by id (kept
        # alive here, so an id stays theirs): hashing a 10⁴-node tuple per request cost more
        # than the rest of the booking
        self._pending: Counter = Counter()
        self._node_lists: dict[int, tuple[str, ...]] = {}

    def record(self, sender: str, receiver: str, kind: str, floats: int) -> None:
        self._messages[(sender, receiver, kind)] += 1
        self._floats[(sender, receiver, kind)] += floats

    def exchange(self, kind: str, nodes: Iterable[str], times: int = 1) -> None:
        """Book `times` round trips of `kind` with `nodes` (the nodes one request went to):
        none when `kind` is served locally or every node is the server itself (its steps run
        where the server is), else one per request, however many clients it reached. Every
        request that reaches a client, local or not, is counted in `requests`."""
        if times <= 0 or all(node == "server" for node in nodes):
            return
        self.requests[kind] += times
        if MESSAGES[kind].local:
            return
        self.round_trips += times
        self.trips[kind] += times

    def record_group(self, nodes: tuple[str, ...], kind: str, floats: int, down: bool) -> None:
        """One message of `floats` floats between the server and each of `nodes` (down:
        server → node, else node → server), booked in O(1)."""
        nodes = nodes if type(nodes) is tuple else tuple(nodes)
        self._node_lists[id(nodes)] = nodes     # (a live object's id is its own)
        self._pending[(id(nodes), kind, bool(down), int(floats))] += 1
        if len(self._node_lists) > 64:          # many distinct node lists: bound what is kept
            self._fold()

    def _fold(self) -> None:
        pending, self._pending = self._pending, Counter()
        node_lists, self._node_lists = self._node_lists, {}
        for (nodes_id, kind, down, floats), times in pending.items():
            for node in node_lists[nodes_id]:
                key = ("server", node, kind) if down else (node, "server", kind)
                self._messages[key] += times
                self._floats[key] += times * floats

    def __getstate__(self) -> dict:
        """Pickled folded: the pending entries' ids mean nothing in another process."""
        if self._pending:
            self._fold()
        return self.__dict__.copy()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "round_trips" not in state:      # pickled before round trips were counted
            self.round_trips, self.trips = 0, Counter()
        if "requests" not in state:         # pickled before requests were counted
            self.requests = Counter()
        if "_node_lists" not in state:      # pickled before the node tuples were kept by id
            pending, self._pending, self._node_lists = self._pending, Counter(), {}
            for (nodes, kind, down, floats), times in pending.items():
                self._node_lists[id(nodes)] = nodes
                self._pending[(id(nodes), kind, down, floats)] += times

    @property
    def messages(self) -> Counter:
        if self._pending:
            self._fold()
        return self._messages

    @property
    def floats(self) -> Counter:
        if self._pending:
            self._fold()
        return self._floats

    def __eq__(self, other) -> bool:
        return isinstance(other, Ledger) and \
            (self.messages, self.floats, self.rounds, self.round_trips, self.trips) == \
            (other.messages, other.floats, other.rounds, other.round_trips, other.trips)

    def total(self, direction: str | None = None) -> dict[str, int]:
        """{"messages": …, "floats": …}; direction "down" (server→clients) or "up"."""
        keep = (lambda s, r: True) if direction is None else \
            (lambda s, r: (s == "server") == (direction == "down"))
        messages = sum(n for (s, r, _), n in self.messages.items() if keep(s, r))
        floats = sum(n for (s, r, _), n in self.floats.items() if keep(s, r))
        return {"messages": messages, "floats": floats}

    def kinds(self) -> set[str]:
        return {k for (_, _, k) in self.messages}

    def per_node(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (sender, receiver, _), n in self.floats.items():
            for node, key in ((sender, "floats_sent"), (receiver, "floats_received")):
                out.setdefault(node, {"floats_sent": 0, "floats_received": 0})[key] += n
        return out

    def summary(self, clients: Sequence[str]) -> dict[str, Any]:
        """The run's communication as a user reads it (`Result.info["communication"]`): round
        trips (in all and by kind), messages and floats each way, and per client of `clients`
        (every client of the model, so one never asked counts as 0) the floats and bytes each
        way, mean and max. Bytes are FLOAT_BYTES per declared float."""
        clients = list(clients)
        down, up = Counter(), Counter()
        for (sender, receiver, _), n in self.floats.items():
            if sender == "server":
                down[receiver] += n
            elif receiver == "server":
                up[sender] += n

        def spread(per_node: Counter, scale: int = 1) -> dict[str, float]:
            amounts = [scale * per_node.get(c, 0) for c in clients] or [0]
            return {"mean": float(np.mean(amounts)), "max": float(max(amounts))}
        totals = {"down": self.total("down"), "up": self.total("up")}
        return {"round_trips": int(self.round_trips), "by_kind": dict(self.trips),
                "messages": {d: t["messages"] for d, t in totals.items()},
                "floats": {d: t["floats"] for d, t in totals.items()},
                "clients": len(clients),
                "floats_per_client": {"down": spread(down), "up": spread(up)},
                "bytes_per_client": {"down": spread(down, FLOAT_BYTES), "up": spread(up, FLOAT_BYTES)}}

    def __str__(self) -> str:
        down, up = self.total("down"), self.total("up")
        return (f"{self.round_trips} round trips ({self.rounds} rounds of the algorithm); "
                f"server→nodes {down['messages']} messages / {down['floats']} floats; "
                f"nodes→server {up['messages']} messages / {up['floats']} floats")
