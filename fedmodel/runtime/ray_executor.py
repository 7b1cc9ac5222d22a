"""`RayExecutor`: each client's node program lives in its own Ray actor (docs/ray.md).

The driver keeps the server's program (its steps are local) and, per client, only a handle to
the actor and the program's layout. Each actor compiles its client's program from the block's
`ProgramSpec` — after running the block's data loaders there, so loader data never reaches the
driver — and serves every request with `executor.run_on_node`, so backends' `@procedure` steps
run on the actor unchanged. `Executor.map` checks and records messages exactly as the serial
executor does; this class only dispatches a batch of requests concurrently and waits.

Faults (a dead actor, or a request that exceeds `timeout`) are handled here, for every backend:
the actor is replaced, its program rebuilt (loaders run again on the new worker), the node's
last snapshot (`save_state`, every `snapshot_every` state-changing requests) loaded, the
requests sent since that snapshot replayed (`replay.ReplayLog`, shared with the Flower
executor), and the failed request retried. Node procedures are
deterministic functions of their state and requests (random ones keep their generator in
`program.state`), so the run continues with the iterates it would have had without the fault.
A node that fails more than `max_restarts` times stops the run with `NodeFailure`.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import FedModelError
from .executor import Executor, RemoteNode, run_on_node
from .ledger import Ledger
from .messages import MESSAGES, PROCEDURES, check_payload
from .program import NodeProgram, ProgramSpec
from .replay import ReplayLog

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
except ImportError:          # optional extra: make_executor("ray") then says how to install it
    ray = None


class NodeFailure(FedModelError):
    """A client's actor failed more often than `max_restarts` allows (or could not start)."""


class _NodeActor:
    """One client's node program, on a Ray worker."""

    def __init__(self):
        self.program: NodeProgram | None = None

    def build(self, spec: ProgramSpec) -> dict:
        self.program = spec.build()          # runs the block's loaders here (DataError on failure)
        return {"node_id": ray.get_runtime_context().get_node_id(), "n_shared": self.program.n_shared}

    def serve(self, kind: str, payload: dict, procedure: Callable | None = None) -> dict:
        if procedure is not None:            # unpickling it imports (and registers) its module
            PROCEDURES.setdefault(kind, procedure)
        return run_on_node(self.program, kind, _writable(payload))


def _writable(message: dict) -> dict:
    """Arrays deserialized by Ray are read-only views; nodes and backends may update them."""
    return {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in message.items()}


class RayExecutor(Executor):
    """Client node programs in Ray actors, one per client; the server's program in the driver.

    address: None (use the running Ray, else start a local one) or "auto" / "ray://…" (an
        existing cluster). A Ray this executor starts is shut down by `close()`.
    resources: Ray custom resources per client actor, for placement on cluster nodes: a dict
        (same for every client), {client: dict}, or a callable client -> dict.
    timeout: seconds to wait for a batch of replies (None: no limit); a client that does not
        answer in time is treated as dead (restarted, see the module docstring).
    max_restarts: restarts allowed per client per run before `NodeFailure`.
    snapshot_every: state-changing requests between node snapshots (0: never snapshot; replay
        every request since the start). start_timeout: seconds for an actor to start and load.
    persistent: keep the actors when a run ends (`close()`), to serve the next `start()` (same
        client names) without starting new workers; `shutdown()` releases them.
    """

    round_trip_cost = 0.015    # loopback Ray, 10 clients: ~58 ms a FedAvg round of 4 (docs/BENCHMARKS.md)
    measure_on_start = True    # a cluster's network is not loopback's: one probe when a run opens

    def __init__(self, address: str | None = None, resources: Any = None,
                 timeout: float | None = None, max_restarts: int = 3, snapshot_every: int = 50,
                 start_timeout: float = 120.0, num_cpus: float | None = None,
                 persistent: bool = False, init_options: dict | None = None):
        if ray is None:
            raise FedModelError("executor='ray' needs Ray: pip install 'fedmodel[ray]'")
        if timeout is not None and not timeout > 0:
            raise FedModelError(f"timeout must be positive seconds or None, got {timeout!r}")
        if int(max_restarts) < 0 or int(snapshot_every) < 0:
            raise FedModelError("max_restarts and snapshot_every must be ≥ 0")
        super().__init__()
        self.address, self.resources, self.timeout = address, resources, timeout
        self.max_restarts, self.snapshot_every = int(max_restarts), int(snapshot_every)
        self.start_timeout, self.num_cpus = float(start_timeout), num_cpus
        self.persistent = bool(persistent)
        self.init_options = dict(init_options or {})
        self.actors: dict[str, Any] = {}
        self.placement: dict[str, str] = {}     # client -> Ray node id it runs on
        self.recovery = Ledger()                # traffic spent on replays (not the algorithm's)
        self.replay = ReplayLog()               # per client: snapshot and requests since; faults
        self._specs: dict[str, Any] = {}
        self._restarts: dict[str, int] = {}
        self._started_ray = False

    # ---- life cycle -------------------------------------------------------------------------
    def start(self, programs: dict[str, NodeProgram | ProgramSpec]) -> "RayExecutor":
        self._connect()
        local, remote = {}, {}
        for name, program in programs.items():
            spec = program if isinstance(program, ProgramSpec) else getattr(program, "spec", None)
            if program.role == "server" or spec is None:
                local[name] = program
            else:
                remote[name] = spec
        # the server (and programs built outside compile_programs) run here, as in the serial case
        super().start({name: (RemoteNode(remote[name]) if name in remote else local[name])
                       for name in programs})
        self.recovery = Ledger()
        self.replay.start(remote)
        self._specs = {name: ray.put(spec) for name, spec in remote.items()}
        self._restarts = {name: 0 for name in remote}
        for name in [n for n in self.actors if n not in remote]:
            _kill(self.actors.pop(name))
        # a persistent executor's actors (same client) rebuild their program in place
        pending = {name: self._rebuild(name) if name in self.actors else self._spawn(name)
                   for name in remote}
        try:
            for name, ref in pending.items():
                self._await_build(name, ref)
        except BaseException:   # a bad loader or unplaceable client: backends never get to close()
            self.close()
            raise
        return self

    def _connect(self) -> None:
        if ray.is_initialized():
            return
        options = {"include_dashboard": False, "logging_level": "WARNING", **self.init_options}
        ray.init(address=self.address, **options)
        self._started_ray = True

    def _spawn(self, name: str):
        """A fresh actor for client `name`; returns the reference of its build (data loading)."""
        options: dict[str, Any] = {"max_restarts": 0, "max_concurrency": 1}
        resources = self._resources_of(name)
        if resources:
            options["resources"] = resources
        if self.num_cpus is not None:
            options["num_cpus"] = self.num_cpus
        actor = _remote_actor_class().options(**options).remote()
        self.actors[name] = actor
        return actor.build.remote(self._specs[name])

    def _rebuild(self, name: str):
        return self.actors[name].build.remote(self._specs[name])

    @property
    def faults(self) -> list[dict]:
        """One record per recovered (or fatal) fault (`replay.ReplayLog.fault`: node, request
        kind, reason, restart, requests replayed, time)."""
        return self.replay.faults

    def _resources_of(self, name: str) -> dict | None:
        res = self.resources
        if callable(res):
            res = res(name)
        elif isinstance(res, dict) and name in res and isinstance(res[name], dict):
            res = res[name]
        elif isinstance(res, dict) and any(isinstance(v, dict) for v in res.values()):
            res = None                           # a per-client dict without this client
        return dict(res) if res else None

    def _await_build(self, name: str, ref, respawn: bool = True) -> None:
        try:
            info = ray.get(ref, timeout=self.start_timeout)
        except RayActorError:
            if not respawn:
                raise NodeFailure(f"client {name!r}: its actor died while loading its data and "
                                  "compiling its program") from None
            return self._await_build(name, self._spawn(name), respawn=False)   # a dead kept actor
        except GetTimeoutError:
            raise NodeFailure(
                f"client {name!r}: its actor did not start and load its data within "
                f"{self.start_timeout:g} s (requested resources {self._resources_of(name)}; does "
                "a node of the cluster offer them? see docs/ray.md)") from None
        except RayTaskError as err:
            raise _cause(err) from None
        self.placement[name] = info["node_id"]

    def close(self) -> None:
        """End of a run: release the actors (unless `persistent`) and a Ray we started."""
        super().close()
        if not self.persistent:
            self.shutdown()

    def shutdown(self) -> None:
        self._kill_actors()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False

    def _kill_actors(self) -> None:
        for actor in self.actors.values():
            _kill(actor)
        self.actors = {}

    # ---- dispatch -----------------------------------------------------------------------------
    def _dispatch_batch(self, kind, payloads):
        procedure = PROCEDURES.get(kind)
        refs = {node: self.actors[node].serve.remote(kind, payload, procedure)
                for node, payload in payloads.items() if node in self.actors}
        # local nodes (the server) are served while the clients work
        replies = {node: run_on_node(self.programs[node], kind, payload)
                   for node, payload in payloads.items() if node not in self.actors}
        ready: set = set()
        if refs:
            done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.timeout)
            ready = set(done)
        for node, ref in refs.items():
            reason = None if ref in ready else f"no reply within {self.timeout:g} s"
            reply = self._get(node, ref) if reason is None else None
            if reply is None:
                reply = self._recover(node, kind, payloads[node], procedure, reason or "actor died")
            replies[node] = _writable(reply)
            self.replay.record(node, kind, payloads[node])   # (a state-changing request only)
        self._maybe_snapshot(list(refs))
        return replies

    def _get(self, node: str, ref, timeout: float | None = None) -> dict | None:
        """The reply, or None when the actor died (or did not answer within `timeout`)."""
        try:
            return ray.get(ref, timeout=timeout)
        except (RayActorError, GetTimeoutError):
            return None
        except RayTaskError as err:           # the request itself failed: the user's error
            raise _cause(err) from None

    def _recover(self, node: str, kind: str, payload: dict, procedure, reason: str) -> dict:
        """Replace the actor, restore snapshot + replay, retry the request (module docstring)."""
        while True:
            self._restarts[node] += 1
            record = self.replay.fault(node, kind, reason=reason, restart=self._restarts[node])
            if self._restarts[node] > self.max_restarts:
                record["fatal"] = True
                raise NodeFailure(f"client {node!r} failed {self._restarts[node]} times (last: "
                                  f"{reason} during {kind!r}); max_restarts={self.max_restarts}")
            _kill(self.actors[node])
            self._await_build(node, self._spawn(node))
            actor = self.actors[node]
            try:
                for step_kind, step_payload in self.replay.steps(node):   # replay, in order
                    self._record_recovery(node, step_kind, step_payload)
                    step = actor.serve.remote(step_kind, step_payload, PROCEDURES.get(step_kind))
                    if self._get(node, step, self.timeout) is None:
                        raise _Retry
                reply = self._get(node, actor.serve.remote(kind, payload, procedure), self.timeout)
            except _Retry:
                reply = None
            if reply is not None:
                record["recovered"] = True
                return reply
            reason = "failed again during recovery"

    def _record_recovery(self, node: str, kind: str, payload: dict) -> None:
        declared = MESSAGES.get(kind)
        if declared is not None:
            self.recovery.record("server", node, kind,
                                 check_payload(declared, declared.request, payload, self.model_size,
                                               "request"))

    def _maybe_snapshot(self, nodes: list[str]) -> None:
        """Every `snapshot_every` state-changing requests, keep the node's `save_state` (in the
        object store, referenced by the driver) and forget the replay log before it."""
        refs = {n: self.actors[n].serve.remote("save_state", {}, None)
                for n in self.replay.due(nodes, self.snapshot_every)}
        for node, ref in refs.items():
            reply = self._get(node, ref, self.timeout)
            if reply is not None:      # a failed snapshot keeps the log: recovery still works
                self.replay.snapshot(node, reply["state"])


class _Retry(Exception):
    pass


_ACTOR_CLASS = None


def _remote_actor_class():
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(_NodeActor)
    return _ACTOR_CLASS


def _kill(actor) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:   # already dead or never started: nothing to clean up
        pass


def _cause(err: "RayTaskError") -> BaseException:
    """A FedModelError raised on the worker (e.g. a DataError naming the client) as itself,
    without Ray's wrapper; anything else (a bug) keeps Ray's error with the remote traceback."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, FedModelError) else err
