"""fedmodel's node process (`fedmodel.runtime.flower.node_process`): one long-lived ClientApp
process per SuperNode started with `--isolation process`. Here against Flower's own SuperNode
Runtime API (its FastAPI app and NodeState, served by uvicorn on a loopback port in this
process, the messages put in its state as the SuperNode's loop puts what it pulls from the
SuperLink): it claims each task, serves it with fedmodel's ClientApp and pushes the reply and
the node's Context back; the node program is compiled once, at the build message, and reused
for every later request (counted); a failed task does not end it; the supervisor starts the
process again when it dies and gives up after too many exits; `run_supernode` starts it only
for `--isolation process`.
"""
from __future__ import annotations

import hashlib
import logging
import os
import socket
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedmodel[flower]')")

import uvicorn  # noqa: E402
from flwr.app import Context, Message, Metadata, RecordDict  # noqa: E402
from flwr.common.constant import Status, SubStatus  # noqa: E402
from flwr.supercore.constant import TaskType  # noqa: E402
from flwr.supercore.fab import Fab  # noqa: E402
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents  # noqa: E402
from flwr.supercore.object_store import ObjectStoreFactory  # noqa: E402
from flwr.supercore.run import Run  # noqa: E402
from flwr.supernode.main import create_app  # noqa: E402
from flwr.supernode.nodestate import NodeStateFactory  # noqa: E402
from flwr.supernode.start_client_internal import _insert_message  # noqa: E402

from fedmodel import deploy  # noqa: E402
from fedmodel.deploy import supernode  # noqa: E402
from fedmodel.runtime.flower import client_app as capp, codec, driver, node_process  # noqa: E402
from fedmodel.runtime.messages import install, procedure  # noqa: E402
from fedmodel.runtime.program import compile_programs  # noqa: E402
from test_flower_wire import _model  # noqa: E402

@procedure("node_process_test_wait", {"seconds": "1"}, {"value": "1"}, read_only=True)
def _wait(program, seconds):
    """A request that takes `seconds` (the crash test kills the process while it waits)."""
    time.sleep(float(seconds))
    return {"value": float(seconds)}


install([_wait])    # (this process serves it; a node process imports this module for it)

RUN, NODE = 7, 11
FAB = b"a FAB the node process never installs"
FAB_HASH = hashlib.sha256(FAB).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RuntimeAPI:
    """A SuperNode's Runtime API and state without the SuperNode's loop: `put` a message as the
    loop stores one it pulled (a task for it, its objects), `replies` are what the ClientApp
    pushed back (inflated from the node's object store)."""

    def __init__(self):
        self.factory = NodeStateFactory(objectstore_factory=ObjectStoreFactory())
        self.state = self.factory.state()
        self.state.set_node_id(NODE)
        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(create_app(state_factory=self.factory),
                                                    host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        run = Run.create_empty(RUN)
        run.fab_hash = FAB_HASH
        self.state.store_run(run)
        self.state.store_fab(Fab(FAB_HASH, FAB, {}))
        self.state.set_run_series_context(run.series_id, Context(
            run_id=RUN, node_id=NODE, node_config={"fedmodel-client": "c0"}, state=RecordDict(),
            run_config={}))

    def __enter__(self) -> "RuntimeAPI":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the Runtime API did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def put(self, kind: str, payload: dict, message_type: str = "train") -> str:
        metadata = Metadata(run_id=RUN, message_id="", src_node_id=0, dst_node_id=NODE,
                            reply_to_message_id="", group_id="", created_at=time.time(),
                            ttl=3600.0, message_type=message_type)
        message = Message(codec.encode(kind, payload), metadata=metadata)
        _insert_message(message, self.state, self.state.object_store)
        assert self.state.create_task(task_type=TaskType.CLIENT_APP, run_id=RUN,
                                      fab_hash=FAB_HASH) is not None
        return message.metadata.message_id

    def replies(self, count: int, wait: float = 60.0) -> list[tuple[dict, dict]]:
        """The first `count` replies, decoded (header, payload), in the order they came."""
        got: list[Message] = []
        deadline = time.monotonic() + wait
        while len(got) < count:
            assert time.monotonic() < deadline, f"{len(got)} of {count} replies after {wait} s"
            got += self.state.get_messages_legacy(is_reply=True)
            time.sleep(0.02)
        store = self.state.object_store
        out = []
        for reply in got:
            tree = store.get_object_tree(reply.metadata.message_id)
            # (the reply is listed once pushed; its objects come after it, as the SuperNode waits)
            contents = {t.object_id: store.get(t.object_id) for t in _walk(tree)}
            while not all(contents.values()):
                assert time.monotonic() < deadline, "the reply's objects did not come"
                time.sleep(0.02)
                contents = {t.object_id: store.get(t.object_id) for t in _walk(tree)}
            full = inflate_object_from_contents(tree.object_id, contents)
            out.append(codec.decode(full.content) if not full.has_error() else
                       ({"error": full.error.reason}, {}))
        return out


def _walk(tree):
    yield tree
    for child in tree.children:
        yield from _walk(child)


def _serving(api: RuntimeAPI, tasks: int, app=None) -> tuple[threading.Thread, threading.Event, list]:
    """`node_process.serve` in a thread (as the process runs it) until `tasks` tasks ended."""
    stop, served = threading.Event(), []

    def run():
        served.append(node_process.serve(api.address, stop=stop, app=app))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, stop, served


def _finished(api: RuntimeAPI, count: int, wait: float = 30.0) -> list:
    deadline = time.monotonic() + wait
    while True:
        tasks = [t for t in api.state.get_tasks(statuses=[Status.FINISHED])]
        if len(tasks) >= count or time.monotonic() > deadline:
            return tasks
        time.sleep(0.02)


def test_one_process_serves_the_build_and_two_requests_with_one_compile(monkeypatch):
    """Build, then two `merit` requests through the Runtime API: the serial program's numbers
    bitwise, the node program compiled once (the build) — a process per message compiled it
    again for every request — and each task finished 'completed'; the replies' time stamps are
    the task's (claim → pull → handler), not the process's start."""
    compiles = []
    real = capp.decode_spec

    def counting(*args, **kwargs):
        compiles.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(capp, "decode_spec", counting)
    prob = _model()[0]
    program = compile_programs(prob)["c0"]
    spec = getattr(program, "spec", program)
    xs = [np.array([0.1, -0.2, 0.3]), np.array([1.0, 2.0, -0.5])]
    started = time.time()
    with RuntimeAPI() as api:
        thread, stop, served = _serving(api, 3)
        try:
            api.put(codec.BUILD, codec.build_payload(spec, driver._load_here))
            assert not api.replies(1)[0][0].get("failed")
            for x in xs:
                api.put("merit", {"x": x}, message_type="query")
            replies = api.replies(2)
            tasks = _finished(api, 3)
        finally:
            stop.set()
            thread.join(timeout=30)
    assert served == [3]
    assert len(compiles) == 1, f"the node program was compiled {len(compiles)} times"
    for x, (meta, reply) in zip(xs, replies):
        assert not meta.get("failed"), reply
        assert reply["value"] == program.merit(x)["value"]
        np.testing.assert_array_equal(reply["grad"], program.merit(x)["grad"])
        timing = meta["timing"]
        assert started <= timing["started"] <= timing["imported"] <= timing["entered"] <= timing["left"]
        assert 0.0 <= timing["cpu_entered"] <= timing["cpu_left"] < 60.0
    assert sorted(t.status.sub_status for t in tasks) == [SubStatus.COMPLETED] * 3


def test_a_woken_process_claims_only_when_the_supernode_wakes_it(monkeypatch):
    """With `wake` (the SuperNode's pipe, `--wake-stdin`) an idle node process asks the Runtime
    API for a task once per wake (and after each task it served), never on a clock: 6 claims
    for a build and two requests woken twice — polling made ~5 a second while idle. Wakes
    that come while it serves are not lost (one wake, two messages: both served), and the
    pipe's end (the SuperNode gone) ends it."""
    claims = []
    real = node_process.runtime_client

    def counting(*args, **kwargs):
        client = real(*args, **kwargs)
        acquire = client.AcquireTask

        def counted(request):
            answer = acquire(request)
            claims.append(answer.HasField("task"))
            return answer
        client.AcquireTask = counted
        return client
    monkeypatch.setattr(node_process, "runtime_client", counting)
    program = compile_programs(_model()[0])["c0"]
    spec = getattr(program, "spec", program)
    xs = [np.array([0.1, -0.2, 0.3]), np.array([1.0, 2.0, -0.5])]
    read, write = os.pipe()
    served = []
    with RuntimeAPI() as api:
        thread = threading.Thread(target=lambda: served.append(node_process.serve(
            api.address, wake=node_process.Wake(read), woken_poll=1e6)), daemon=True)
        thread.start()
        try:
            _claimed(claims, 1)         # (its first claim, at start: nothing yet)
            api.put(codec.BUILD, codec.build_payload(spec, driver._load_here))
            os.write(write, b"\1")
            assert not api.replies(1)[0][0].get("failed")
            _claimed(claims, 3)         # (after the build: nothing yet)
            for x in xs:
                api.put("merit", {"x": x}, message_type="query")
            os.write(write, b"\1")
            replies = api.replies(2)
            tasks = _finished(api, 3)
        finally:
            os.close(write)         # (EOF: serve returns)
            thread.join(timeout=30)
            os.close(read)
    assert not thread.is_alive() and served == [3]
    assert sorted(t.status.sub_status for t in tasks) == [SubStatus.COMPLETED] * 3
    for x, (meta, reply) in zip(xs, replies):
        assert reply["value"] == program.merit(x)["value"]
    # [start: none] [wake: the build, none] [one wake: x1, x2, none]
    assert claims == [False, True, False, True, True, False]


def _claimed(claims: list, count: int, wait: float = 60.0) -> None:
    deadline = time.monotonic() + wait
    while len(claims) < count:
        assert time.monotonic() < deadline, f"{len(claims)} of {count} claims after {wait} s"
        time.sleep(0.01)


def test_supervisor_wakes_its_process_on_stdin():
    """`Supervisor(wake=True)` gives its process a pipe on stdin; `wake` writes one byte."""
    sup = node_process.Supervisor(
        [sys.executable, "-c", "import os, sys; sys.exit(os.read(0, 1)[0] + 40)"],
        max_restarts=0, wake=True).start()
    deadline = time.monotonic() + 60
    while sup.process is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sup.wake()
    sup._thread.join(timeout=60)
    assert [code for _, code in sup.exits] == [41]
    node_process.Supervisor(["true"]).wake()        # (not started, no pipe: nothing)


def test_build_id_is_the_spec_hash():
    """The cached program's build id is the hash of the spec it was compiled from: the same
    spec the same id, another array another id."""
    spec = compile_programs(_model()[0])["c0"]
    payload = codec.build_payload(getattr(spec, "spec", spec), driver._load_here)
    text, arrays = codec.build_parts(payload)
    assert capp.spec_hash(text, arrays) == capp.spec_hash(text, {k: v.copy() for k, v in arrays.items()})
    name = sorted(arrays)[0]
    changed = dict(arrays, **{name: arrays[name] + 1.0})
    assert capp.spec_hash(text, changed) != capp.spec_hash(text, arrays)


def test_a_raising_app_is_answered_with_an_error_and_the_process_serves_on():
    """An app that raises: the message gets Flower's error reply (the driver raises it naming
    the client), the task ends 'failed', and the next task is served."""
    calls = []

    def app(message, context):
        calls.append(message.metadata.message_type)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return capp.client_app(message=message, context=context)

    with RuntimeAPI() as api:
        thread, stop, served = _serving(api, 2, app=app)
        try:
            api.put(codec.HELLO, {}, message_type="query")
            first = api.replies(1)[0]
            api.put(codec.HELLO, {}, message_type="query")
            second = api.replies(1)[0]
            tasks = _finished(api, 2)
        finally:
            stop.set()
            thread.join(timeout=30)
    assert "boom" in first[0]["error"]
    assert second[1] == {"name": "c0"}
    assert sorted(t.status.sub_status for t in tasks) == sorted([SubStatus.FAILED, SubStatus.COMPLETED])


def test_supervisor_restarts_a_dead_process_then_gives_up(caplog):
    """A node process that exits is logged with its code and started again; more than
    max_restarts exits within the window: no more starts, and give_up is called."""
    gave_up = threading.Event()
    sup = node_process.Supervisor([sys.executable, "-c", "raise SystemExit(3)"], max_restarts=2,
                                  window=60.0, give_up=gave_up.set)
    with caplog.at_level(logging.ERROR, logger=node_process.__name__):
        sup.start()
        assert gave_up.wait(60), "the supervisor did not give up"
        sup.stop()
    assert sup.starts == 3 and [code for _, code in sup.exits] == [3, 3, 3]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("starting it again" in m for m in messages) == 2
    assert any("not restarted" in m for m in messages)


def test_supervisor_stop_ends_a_running_process():
    """stop() ends the node process it runs and starts no other."""
    sup = node_process.Supervisor([sys.executable, "-c", "import time; time.sleep(60)"]).start()
    deadline = time.monotonic() + 30
    while sup.process is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sup.stop()
    assert sup.process.poll() is not None and sup.starts == 1 and sup.exits == []


@pytest.mark.integration     # (real node processes, seconds each: CI's integration run)
def test_node_process_ends_with_its_parent(tmp_path):
    """`--parent-pid`: the node process ends when that process ends (`_end_with`), here
    with no SuperNode listening at all."""
    assert _exit_code_after_the_parent_ends(
        lambda pid: node_process.command(f"127.0.0.1:{_free_port()}", None, pid)) == 0


def _exit_code_after_the_parent_ends(child_command) -> int:
    """Start a parent process and the child `child_command(parent's pid)`; once the child has
    run 1 s, kill the parent: the child's exit code (it must end within 30 s)."""
    import subprocess
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child = subprocess.Popen(child_command(parent.pid))
    try:
        time.sleep(1.0)
        assert child.poll() is None
        parent.kill()
        parent.wait()
        return child.wait(timeout=30)
    finally:
        for proc in (parent, child):
            if proc.poll() is None:
                proc.kill()


@pytest.mark.integration     # (two processes, ~2 s)
def test_node_process_exits_after_its_parent_even_if_the_interrupt_is_lost():
    """`_end_with`'s fallback: with SIGINT ignored (an interrupt swallowed, or a main thread
    blocked where the monitor thread's signal cannot reach it) the process still exits, 0,
    PARENT_GRACE s after its parent ends."""
    def ignoring_sigint(pid: int) -> list[str]:
        return [sys.executable, "-c",
                "import signal, threading, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "from fedmodel.runtime.flower import node_process as n; n.PARENT_GRACE = 0.5; "
                f"n._end_with({pid}, threading.Event()); time.sleep(60)"]

    assert _exit_code_after_the_parent_ends(ignoring_sigint) == 0


def test_run_supernode_starts_the_node_process_only_for_process_isolation():
    """The Runtime API a `--isolation process` SuperNode serves (its --host/--port, TLS when
    it has a certificate), and none for Flower's default isolation."""
    assert supernode._runtime_api(["--insecure", "--port", "9101"]) is None
    assert supernode._runtime_api(["--isolation", "process", "--port", "9101"]) == ("127.0.0.1:9101", None)
    assert supernode._runtime_api(["--isolation", "process", "--host", "0.0.0.0", "--port", "9", "--ssl-certfile",
                                "c.pem", "--ssl-ca-certfile", "ca.pem"]) == ("127.0.0.1:9", "ca.pem")


def test_deployment_supernodes_run_with_the_node_process(tmp_path):
    """`fedmodel deploy`'s SuperNodes (and its printed commands) run with --isolation process,
    so `run_supernode` starts a node process for each; node_process=False keeps Flower's
    process per message. The SuperLink's SuperExec polls at Flower's 1 s."""
    from test_flower_deploy import _model_file
    model = _model_file(tmp_path, "backends.FedAvg(step=0.05, max_rounds=2)")
    on = deploy.Deployment(model, 2, tmp_path / "on")
    off = deploy.Deployment(model, 2, tmp_path / "off", node_process=False)
    for name in on.names:
        assert supernode._runtime_api(on.supernode_command(name)[4:]) is not None
        assert supernode._runtime_api(off.supernode_command(name)[4:]) is None
    assert all("--isolation process" in line for line in on.commands()[1:-1])
    assert deploy.SUPERLINK_ENV["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "1.0"


@pytest.mark.integration     # (real node processes, seconds each: CI's integration run)
def test_a_process_killed_mid_request_is_reported_and_started_again(monkeypatch, tmp_path):
    """kill -9 of the node process while it serves a request: Flower's SuperNode expires the
    task's token (no heartbeat; its 30 s interval made 3 s here) and answers the message
    'ClientApp stopped responding' (which the driver raises naming the client, never a hang),
    the supervisor starts the process again, and the new process serves the next message
    (rebuilding the program from the spec in the Context)."""
    import os
    import signal
    from flwr.supercore.corestate import in_memory_corestate
    monkeypatch.setattr(in_memory_corestate, "HEARTBEAT_DEFAULT_INTERVAL", 3.0)
    # the node process imports this module for `node_process_test_wait` (its host's own config)
    monkeypatch.setenv(capp.CLIENT_MODULES_ENV, "test_flower_node_process")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.dirname(__file__),
                                                      os.environ.get("PYTHONPATH", "")]))
    spec = compile_programs(_model()[0])["c0"]
    with RuntimeAPI() as api:
        sup = node_process.Supervisor(node_process.command(api.address, None, os.getpid())).start()
        try:
            api.put(codec.BUILD, codec.build_payload(getattr(spec, "spec", spec), driver._load_here))
            assert not api.replies(1, wait=120)[0][0].get("failed")
            first = sup.process
            api.put("node_process_test_wait", {"seconds": 60.0}, message_type="query")
            deadline = time.monotonic() + 60
            while not api.state.get_tasks(statuses=[Status.RUNNING]):
                assert time.monotonic() < deadline, "the request was not taken"
                time.sleep(0.05)
            time.sleep(0.5)     # (it is in the handler: the module loaded, sleeping)
            os.kill(first.pid, signal.SIGKILL)
            crashed = api.replies(1, wait=60)[0]
            api.put("node_process_test_wait", {"seconds": 0.0}, message_type="query")
            after = api.replies(1, wait=120)[0]
        finally:
            sup.stop()
    assert crashed[0] == {"error": "ClientApp stopped responding."}
    assert sup.starts == 2 and sup.process is not first and sup.exits[0][1] == -signal.SIGKILL
    assert not after[0].get("failed") and after[1] == {"value": 0.0}
