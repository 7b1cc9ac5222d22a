"""Executors carry requests from a backend to node programs and replies back.

Backends reach node programs only through an executor: the serial one calls them in-process;
others (batched, Ray) keep the same interface. Every message is checked against its declared
kind and recorded in the ledger.
"""
from __future__ import annotations

from typing import Any

from ..errors import FedModelError
from .ledger import MESSAGES, PROCEDURES, Ledger, check_payload
from .program import NodeProgram, ProgramSpec


class Executor:
    """Interface: `start(programs)`, `call(node, kind, **payload)`, `map(kind, payloads)`."""

    def __init__(self):
        self.programs: dict[str, NodeProgram] = {}
        self.ledger = Ledger()
        self.model_size = 0

    def start(self, programs: dict[str, NodeProgram]) -> "Executor":
        # blocks with loader data arrive as specs: in-process executors load and compile them here
        self.programs = {name: p.build() if isinstance(p, ProgramSpec) else p
                         for name, p in programs.items()}
        self.model_size = next(iter(programs.values())).n_shared if programs else 0
        self.ledger = Ledger()
        return self

    @property
    def nodes(self) -> list[str]:
        return list(self.programs)

    @property
    def clients(self) -> list[str]:
        return [n for n, p in self.programs.items() if p.role == "client"]

    def call(self, node: str, kind: str, **payload: Any) -> dict[str, Any]:
        return self.map(kind, {node: payload})[node]

    def map(self, kind: str, payloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Send `kind` to several nodes (conceptually in parallel); replies by node."""
        declared = MESSAGES.get(kind)
        if declared is None:
            raise FedModelError(f"message kind {kind!r} is not declared in fedmodel.runtime.ledger")
        networked = {}
        for node, payload in payloads.items():
            if node not in self.programs:
                raise FedModelError(f"no node program named {node!r}; nodes: {self.nodes}")
            floats = check_payload(declared, declared.request, payload, self.model_size, "request")
            networked[node] = not declared.local and node != "server"  # server steps are local
            if networked[node]:
                self.ledger.record("server", node, kind, floats)
        # all requests of one kind go out together, then we wait for every reply
        replies = self._dispatch_batch(kind, payloads)
        for node in payloads:
            floats = check_payload(declared, declared.reply, replies[node], self.model_size, "reply")
            if networked[node]:
                self.ledger.record(node, "server", kind, floats)
        return {node: replies[node] for node in payloads}

    def _dispatch_batch(self, kind: str, payloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Serve checked requests of one kind (one per node) and return the replies by node.
        Executors override this (concurrent dispatch) or `_dispatch` (one request at a time)."""
        return {node: self._dispatch(node, kind, payload) for node, payload in payloads.items()}

    def _dispatch(self, node: str, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SerialExecutor(Executor):
    """Runs every node program in this process, one after the other (the default)."""

    def _dispatch(self, node, kind, payload):
        return run_on_node(self.programs[node], kind, payload)


def run_on_node(program: NodeProgram, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Serve one request on a node program (used by every executor, wherever the node lives)."""
    procedure = PROCEDURES.get(kind)
    if procedure is not None:
        return procedure(program, **payload)
    return getattr(program, kind)(**payload)


def make_executor(executor: Any) -> Executor:
    if isinstance(executor, Executor):
        return executor
    if executor in (None, "serial"):
        return SerialExecutor()
    if executor == "batched":
        from .batched import BatchedExecutor
        return BatchedExecutor()
    if executor == "ray":
        from .ray_executor import RayExecutor
        return RayExecutor()
    raise FedModelError(f"unknown executor {executor!r}; use 'serial', 'batched', 'ray' or an "
                        "Executor instance")
