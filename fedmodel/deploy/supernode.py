"""A deployment's SuperNode: Flower's own `flower-supernode` with its hard-coded waits capped,
and fedmodel's node process started beside it (`python -m fedmodel.deploy flower-supernode ARGS`)."""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

from ..errors import FedModelError

# ours: `run_supernode` caps the SuperNode's hard-coded waits with it (seconds)
SUPERNODE_POLL_ENV = "FEDMODEL_SUPERNODE_POLL"


class _CappedSleep:
    """The `time` module, with `sleep` waiting at most `cap` seconds (`run_supernode`), and
    ending early when `activity` is set (then cleared): the SuperNode's Runtime API stored
    something its loop may be waiting for (a reply, a reply's object, a task's end)."""

    def __init__(self, cap: float, activity: threading.Event | None = None):
        self.cap, self.activity = cap, activity

    def sleep(self, seconds: float) -> None:
        if self.activity is None:
            time.sleep(min(seconds, self.cap))
        elif self.activity.wait(min(seconds, self.cap)):
            self.activity.clear()       # (the loop looks again: a spurious wake costs a look)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _on_stored(cls: type, names: tuple[str, ...], event: threading.Event) -> None:
    """Set `event` after every call of these methods of `cls` (the SuperNode's node state: its
    Runtime API storing what the node process pushed), so that the SuperNode's loop waiting
    for a reply wakes at once instead of after its next sleep."""
    for name in names:
        method = getattr(cls, name, None)
        if method is None or getattr(method, "_fedmodel_wakes", False):
            continue

        def stored(self, *args, _method=method, **kwargs):
            try:
                return _method(self, *args, **kwargs)
            finally:
                event.set()
        stored._fedmodel_wakes = True
        setattr(cls, name, stored)


def run_supernode(argv: list[str], poll: float) -> None:
    """`flower-supernode ARGV`, with the waits Flower 1.42 hard-codes in its SuperNode loop
    (`flwr.supernode.start_client_internal`: 3 s between two pulls of an idle node, 0.5 s
    between two looks for the ClientApp's reply) capped at `poll` seconds. These waits were
    most of a deployment round trip (docs/flower.md, breakdown) and Flower offers no setting
    for them; only that module's sleeps change, its protocol does not. Run as
    `python -m fedmodel.deploy flower-supernode ARGS` (poll: env FEDMODEL_SUPERNODE_POLL).

    With `--isolation process` (what `Deployment` passes) Flower starts no SuperExec and this
    process starts fedmodel's node process instead (`runtime.flower.node_process`: one
    long-lived ClientApp process serving every message of the node), supervised: it ends with
    the SuperNode, and one that dies is logged and started again (`node_process.Supervisor`)."""
    from flwr.supernode import start_client_internal
    from flwr.supernode.cli import flower_supernode
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    if not (math.isfinite(poll) and poll > 0):
        raise FedModelError(f"{SUPERNODE_POLL_ENV} must be positive seconds, got {poll!r}")
    activity = threading.Event()
    _on_stored(InMemoryNodeState, ("store_message_and_object_tree", "store_object", "finish_task"),
               activity)
    start_client_internal.time = _CappedSleep(poll, activity)
    supervisor = None
    runtime = _runtime_api(argv)
    if runtime is not None:
        from ..runtime.flower import node_process
        address, ca = runtime
        supervisor = node_process.Supervisor(
            node_process.command(address, ca, os.getpid(), wake=True),
            give_up=lambda: os.kill(os.getpid(), signal.SIGTERM), wake=True).start()
        _wake_after_pull(start_client_internal, supervisor.wake)
    sys.argv = ["flower-supernode", *argv]
    try:
        flower_supernode()
    finally:
        if supervisor is not None:
            supervisor.stop()


def _wake_after_pull(module: Any, wake: Callable[[], None]) -> None:
    """Call `wake` whenever the SuperNode's loop (`module`: flwr 1.42's
    `start_client_internal`) has pulled a message with all its objects from the SuperLink and
    made its task: the node process claims it then, its objects already there."""
    pull = module._pull_and_store_message

    def pulled(*args: Any, **kwargs: Any) -> Any:
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            wake()
        return run_id
    module._pull_and_store_message = pulled


def _runtime_api(argv: list[str]) -> tuple[str, str | None] | None:
    """For a SuperNode command line with `--isolation process`: the address of its Runtime API
    (`--host`, `--port`, Flower's defaults 127.0.0.1:9094) and the CA certificate that verifies
    it (`--ssl-ca-certfile` when it serves TLS, else None); None for other isolation modes."""
    import argparse
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--isolation", default="subprocess")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9094)
    parser.add_argument("--ssl-certfile", default=None)
    parser.add_argument("--ssl-ca-certfile", default=None)
    args, _ = parser.parse_known_args(argv)
    if args.isolation != "process":
        return None
    host = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host   # (a wildcard bind)
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{args.port}", (args.ssl_ca_certfile if args.ssl_certfile else None)

