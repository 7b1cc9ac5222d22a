"""One long-lived ClientApp process per SuperNode (docs/flower.md, "The node process").

Flower 1.42's SuperNode in its default `--isolation subprocess` starts `flower-superexec`, which
starts a `flwr-clientapp` process for every message: ~1.9 CPU s of Python start, Flower's
imports and the app's load per message, most of a deployment's round trip. With `--isolation
process` the SuperNode starts nothing and waits for an outside process to claim its tasks on
its Runtime API (HTTP, `--host`/`--port`). `serve` is that process for fedmodel: it claims each
ClientApp task (`AcquireTask`, as `flower-superexec` does), then does in-process what
`flwr-clientapp` does with the task's token — Flower's `push_message` and `push_task_output`
of `flwr.supernode.runtime.run_clientapp`, its `pull_task_input` (here with a shorter first
retry), a task heartbeat — and calls
fedmodel's `client_app` (imported once) on the message. The node's compiled program stays in
`client_app`'s cache across messages (keyed by the spec's hash and the state's token), so a
request costs its HTTP calls and its computation.

What it runs is the installed fedmodel's ClientApp, whatever the run's FAB holds: the FAB (the
server's package) is neither installed nor imported here (`flwr-clientapp` installs it and
imports its client module).

`Supervisor` (used by `fedmodel.deploy.run_supernode`, inside the SuperNode's process) starts
it with `--parent-pid` of the SuperNode, so it ends when the SuperNode ends, and with
`--wake-stdin`: the SuperNode writes a byte on the process's stdin when it has pulled a
message whole, and the process claims then instead of polling (`Wake`). It restarts the
process when it dies (logged, at most `max_restarts` times a minute, then the SuperNode is stopped). A
message whose process died while serving it is answered by Flower itself: the SuperNode
expires the task's token (no heartbeat for 60 s) and replies `ClientApp stopped responding`,
which the driver raises naming the client (`FedModelError`), so a crash stops the run, reported.

    python -m fedmodel.runtime.flower.node_process --runtime-api-address 127.0.0.1:9094 \
        --insecure --parent-pid PID
"""
from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from ...errors import FedModelError
from ..blas import run_blas_threads
from . import client_app as client_app_module

# (imported when this module is, before the first task: a task's token must be used within 30 s
# of its claim, and Flower's runtime modules take seconds to import on a loaded machine)
try:
    import httpx
    from flwr.app import Error, Message
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.common.serde import context_from_proto
    from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
    from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
        AcquireTaskRequest, PullAppMessagesRequest, PullTaskInputRequest)
    from flwr.supercore.constant import TaskType
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf, make_pull_object_fn_protobuf)
    from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import RetryInvoker, exponential
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output
except ImportError:     # optional extra: `serve` then says how to install it
    RuntimeHttpClient = None

log = logging.getLogger(__name__)

#: seconds between two claims of an idle node: the wait doubles from the first to the second
#: while no task comes (a busy node answers fast, an idle one costs ~5 HTTP calls a second)
POLL = (0.01, 0.2)
#: ... and of a node process the SuperNode wakes (`--wake-stdin`: a byte on its stdin for every
#: message the SuperNode has pulled whole): a claim only when woken, and this often in case
WOKEN_POLL = 5.0
#: seconds of a task before its heartbeat starts: Flower's token of a task expires after 60 s
#: without one (flwr 1.42: 2 × 30 s); a request served in milliseconds needs none (each
#: heartbeat is an HTTP call and a thread, Flower's sender beats at once when started)
HEARTBEAT_AFTER = 15.0
#: seconds before the first and the longest retry of a message's object not yet on the node
PULL_BACKOFF = (0.02, 0.5)
#: seconds a task's calls to the Runtime API are retried on transport errors (then it fails)
TASK_RETRY_S = 30.0


def _task_retry_invoker() -> Any:
    """Retries for one task's calls: transport errors and 502/503/504 for TASK_RETRY_S s, no
    retry of a refusal (a 4xx: an expired token, a stopped run). Flower's own HTTP invoker
    (`make_simple_http_retry_invoker`) answers a 401 by SIGINT to its process, which ends a
    `flwr-clientapp` after its one task — and would end this process for one expired token."""
    def give_up(err: Exception) -> bool:
        return isinstance(err, httpx.HTTPStatusError) and err.response.status_code not in (502, 503, 504)

    return RetryInvoker(lambda: exponential(base_delay=0.1, max_delay=2),
                        (httpx.TransportError, httpx.HTTPStatusError), max_tries=None,
                        max_time=TASK_RETRY_S, should_giveup=give_up)


def pull_task_input(client: Any) -> tuple[Any, Any]:
    """The task's message and the node's Context, as flwr 1.42's `run_clientapp.pull_task_input`
    pulls them (Flower's calls and object-tree functions), with the first retry of an object
    not yet there after 0.02 s instead of Flower's 1 s: this process claims a task as soon as
    the SuperNode creates it, which is before the SuperNode has downloaded the message's
    objects from the SuperLink (a process per message started seconds later never waited;
    FedAvg n = 2 deployed at load 6–7: claim → pulled 1.18 s median with Flower's 1 s first
    retry, 0.75 s with this one)."""
    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id, TaskIdentity.run_id = res.task_id, res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("no message for this task on the SuperNode's Runtime API")
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree, make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node,
                                                  context.run_id),
        return_type=Message, initial_backoff=PULL_BACKOFF[0], backoff_cap=PULL_BACKOFF[1])
    # (the deflated message does not carry its own id: its object id, as Flower sets it)
    message.metadata.__dict__["_message_id"] = tree.object_id
    return message, context


def runtime_client(address: str, root_certificates: str | None, interceptors: list) -> Any:
    """Flower's HTTP client of a SuperNode's Runtime API (insecure without certificates)."""
    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=root_certificates is None,
        root_certificates=root_certificates,
        interceptors=[RuntimeTracingInterceptor(), *interceptors],
        retry_invoker=_task_retry_invoker())


def serve_task(address: str, token: str, root_certificates: str | None = None,
               app: Any = None) -> str:
    """Serve one claimed ClientApp task in this process, as `flwr-clientapp --token` would
    (flwr 1.42's `run_clientapp`, without installing or loading the FAB): pull the message and
    the node's Context, run fedmodel's ClientApp (`app`, default `client_app.client_app`),
    push the reply, then the Context (the node state the app kept there) and the task's end.
    Returns the task's sub-status ("completed" or "failed"); an app that raises is answered
    with Flower's error reply, as `flwr-clientapp` does."""
    app = client_app_module.client_app if app is None else app
    acquired, cpu = time.time(), time.process_time()
    client = runtime_client(address, root_certificates,
                            [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                             RuntimeTokenHttpInterceptor(token)])
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    later = threading.Timer(HEARTBEAT_AFTER, heartbeat.start)   # (a long task's only)
    later.daemon = True
    context, status, details = None, SubStatus.FAILED, "fedmodel node process: task not served"
    try:
        later.start()
        message, context = pull_task_input(client)     # (the run's FAB is not installed)
        # the round-trip breakdown's process stages for this message (client_app.serve_message)
        client_app_module.begin_task(acquired, time.time(), cpu)
        try:
            reply = app(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
        except Exception as err:    # fedmodel's handler answers its own errors; a mod's land here
            log.exception("fedmodel node process: the ClientApp raised")
            details = f"{type(err)}:<'{err}'>"
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details),
                            reply_to=message)
        finally:
            client_app_module.begin_task(None)
        push_message(client, reply, context)
    except Exception as err:        # a refused token, the SuperNode gone: this task only
        log.error("fedmodel node process: task failed: %s: %s", type(err).__name__, err)
        details = f"{type(err).__name__}: {err}"
    finally:
        try:
            push_task_output(client, context, status, details)
        finally:
            later.cancel()
            later.join()        # (a heartbeat starting right now has started)
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()
    return status


class Wake:
    """The read end of a pipe on which the SuperNode (`deploy.run_supernode`) writes a byte
    whenever it has pulled a message whole and made its task: the node process claims then,
    instead of asking the Runtime API five times a second while idle. Bytes that come while a
    task is served stay in the pipe, so no wake is lost: the next `wait` returns at once. The
    pipe's end (the SuperNode gone) ends `serve`."""

    def __init__(self, fd: int):
        self.fd, self.closed = fd, False
        os.set_blocking(fd, False)

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` s for a wake; True when woken (every pending byte read)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            while True:
                data = os.read(self.fd, 4096)
                if not data:        # the writer closed its end: the SuperNode is gone
                    self.closed = True
                    break
                if len(data) < 4096:
                    break
        except BlockingIOError:     # (drained)
            pass
        return True


#: seconds a node process whose parent ended may take to finish its task before it exits anyway
PARENT_GRACE = 10.0


def _end_with(parent_pid: int, stop: threading.Event) -> None:
    """End this process when `parent_pid` ends: SIGINT as Flower's monitor sends it (which ends
    a task in progress), `stop` for the claim loop, and an exit after PARENT_GRACE s in case the
    interrupt was swallowed or the main thread is blocked where a thread's signal cannot reach it
    (integration runs under load saw a node process outlive its parent by 30 s, twice)."""
    import psutil       # (the flower extra's)

    def watch() -> None:
        while psutil.pid_exists(parent_pid):
            time.sleep(0.2)
        stop.set()
        signal.raise_signal(signal.SIGINT)
        time.sleep(PARENT_GRACE)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="fedmodel-parent-monitor").start()


def serve(address: str, root_certificates: str | None = None, parent_pid: int | None = None,
          stop: threading.Event | None = None, app: Any = None,
          poll: tuple[float, float] = POLL, wake: Wake | None = None,
          woken_poll: float = WOKEN_POLL) -> int:
    """Claim and serve the SuperNode's ClientApp tasks, one at a time, until `stop` is set or
    the parent process ends (`parent_pid`: `_end_with`); the tasks served. With
    `wake` an idle node claims when the SuperNode wakes it (and every `woken_poll` s), else
    every `poll` s (doubling from the first to the second while no task comes)."""
    if RuntimeHttpClient is None:
        raise FedModelError("fedmodel's node process needs Flower: pip install 'fedmodel[flower]'")
    stop = stop or threading.Event()
    if parent_pid is not None:
        _end_with(parent_pid, stop)
    client_app_module.load_client_modules()     # (the host's own modules: once, before any claim)
    client = runtime_client(address, root_certificates,
                            [RuntimeVersionHttpInterceptor(component_name="SuperExec")])
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
    served, wait = 0, poll[0]
    try:
        while not stop.is_set():
            try:
                claimed = client.AcquireTask(request)
            except (httpx.TransportError, httpx.HTTPStatusError) as err:
                # (the SuperNode starts its Runtime API after this process: wait for it)
                log.debug("fedmodel node process: Runtime API not reachable: %s", err)
                claimed = None
            if claimed is not None and claimed.HasField("task") and claimed.token:
                serve_task(address, claimed.token, root_certificates, app)
                served, wait = served + 1, poll[0]
                continue
            if wake is not None:
                wake.wait(woken_poll)
                if wake.closed:
                    break
                continue
            stop.wait(wait)
            wait = min(2 * wait, poll[1])
    finally:
        client.close()
    return served


class Supervisor:
    """Runs `command` (the node process) as a child and starts it again when it exits while
    the supervisor is running: each exit is logged with its code; more than `max_restarts`
    exits within `window` s stop restarting and call `give_up` (`run_supernode`: stop the
    SuperNode, so the server sees the node gone instead of waiting on a node that serves
    nothing). `starts` counts the processes started."""

    def __init__(self, command: list[str], max_restarts: int = 3, window: float = 60.0,
                 give_up: Callable[[], None] | None = None, wake: bool = False):
        self.command, self.max_restarts, self.window = list(command), max_restarts, window
        self.give_up, self.wakeable = give_up, wake
        self.starts, self.exits = 0, []     # (monotonic time, exit code) of each exit
        self.process: subprocess.Popen | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fedmodel-node-process", daemon=True)

    def start(self) -> "Supervisor":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE if self.wakeable else None)
            if self.wakeable:
                os.set_blocking(self.process.stdin.fileno(), False)
            self.starts += 1
            code = self.process.wait()
            if self.process.stdin is not None:
                self.process.stdin.close()      # (a new process gets a new pipe)
            if self._stopped.is_set():
                return
            self.exits.append((time.monotonic(), code))
            recent = [t for t, _ in self.exits if time.monotonic() - t <= self.window]
            if len(recent) > self.max_restarts:
                log.error("fedmodel node process exited with code %s, %d times within %g s: not "
                          "restarted; a message it was serving is answered by Flower with "
                          "'ClientApp stopped responding'", code, len(recent), self.window)
                if self.give_up is not None:
                    self.give_up()
                return
            log.error("fedmodel node process (pid %d) exited with code %s; starting it again (a "
                      "message it was serving is answered by Flower with 'ClientApp stopped "
                      "responding')", self.process.pid, code)

    def wake(self) -> None:
        """(`wake` True) Wake the node process: a byte on its stdin (`Wake`). A full pipe holds
        wakes it has not read yet, and a process that has died claims when started again: both
        are ignored."""
        proc = self.process
        if proc is None or proc.stdin is None:
            return
        try:
            os.write(proc.stdin.fileno(), b"\1")
        except (BlockingIOError, BrokenPipeError, OSError, ValueError):
            pass

    def stop(self, wait: float = 10.0) -> None:
        """Stop supervising and end the node process (SIGTERM, SIGKILL after `wait` s)."""
        self._stopped.set()
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=wait)
        self._thread.join(timeout=wait)


def command(address: str, root_certificates: str | None, parent_pid: int,
            wake: bool = False) -> list[str]:
    """The node process's command line, for this Python (`wake`: woken on its stdin)."""
    security = ["--root-certificates", root_certificates] if root_certificates else ["--insecure"]
    return [sys.executable, "-m", __name__, "--runtime-api-address", address, *security,
            "--parent-pid", str(parent_pid), *(["--wake-stdin"] if wake else [])]


def main(argv: list[str] | None = None) -> int:
    """`python -m fedmodel.runtime.flower.node_process` (see the module docstring)."""
    parser = argparse.ArgumentParser(description="fedmodel's ClientApp process for a SuperNode "
                                                 "started with --isolation process")
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--insecure", action="store_true")
    group.add_argument("--root-certificates", help="CA certificate of the Runtime API (PEM)")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="end when this process (the SuperNode) ends")
    parser.add_argument("--wake-stdin", action="store_true",
                        help="claim a task when a byte comes on stdin (the SuperNode's wake, "
                             f"deploy.run_supernode), else every {WOKEN_POLL:g} s only")
    args = parser.parse_args(argv)
    if args.root_certificates and not os.path.isfile(args.root_certificates):
        raise FedModelError(f"--root-certificates {args.root_certificates!r}: no such file")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)    # (a line per HTTP call otherwise)
    # Flower's parent monitor raises SIGINT; SIGTERM (Deployment.close) ends the loop the same way
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with run_blas_threads():        # (the client steps' small matrices: one BLAS thread, as in-process)
            serve(args.runtime_api_address, args.root_certificates, args.parent_pid,
                  wake=Wake(sys.stdin.fileno()) if args.wake_stdin else None)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
