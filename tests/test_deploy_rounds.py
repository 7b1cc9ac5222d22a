"""A deployment that finishes (issue 27, item 4), the parts that need no running Flower
processes: where a round trip goes (the ClientApp's time stamps and the driver's breakdown),
the SuperNode launcher that caps Flower's hard-coded waits, the Flower commands written for
this Python, and every example deployable (`make_problem`, nothing run by `--print-only`).
The deployments themselves are in tests/test_flower_deploy.py (integration/slow) and their
timings in benchmarks/bench_flower.py (--goal)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import fedmodel as fm

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedmodel[flower]')")

from fedmodel import deploy  # noqa: E402
from fedmodel.runtime.flower import codec  # noqa: E402
from fedmodel.runtime.flower.driver import FlowerExecutor  # noqa: E402
from test_flower_wire import _built, _serve  # noqa: E402

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


def test_replies_carry_the_clients_time_stamps():
    """Every reply of the handler says when its process started and imported, when the
    handler ran, and how long the program, the request and the state took (numbers)."""
    context, _ = _built()
    meta, reply = _serve(codec.encode("merit", {"x": np.array([0.1, -0.2, 0.3])}), context)
    assert not meta.get("failed") and "grad" in reply
    timing = meta["timing"]
    assert {"started", "imported", "entered", "left", "lookup", "program", "served", "saved",
            "cpu_entered", "cpu_left"} <= set(timing)
    assert timing["imported"] <= timing["entered"] <= timing["left"]
    assert timing["started"] is None or timing["started"] <= timing["imported"]
    assert 0.0 <= timing["cpu_entered"] <= timing["cpu_left"]
    assert min(timing["program"], timing["served"]) >= 0.0 and timing["saved"] == 0.0   # read-only


def test_round_trip_breakdown_is_the_median_of_each_stage():
    """Two round trips of two clients with known stamps: each stage's median per reply, the
    round trip as push → the last reply of its batch; a reply without stamps is left out."""
    ex = FlowerExecutor()
    for posted, late in ((100.0, 0.0), (200.0, 2.0)):
        for node, shift in (("c0", 0.0), ("c1", late)):
            ex._time("step", node, posted, posted + 6.0 + shift,
                     {"started": posted + 1.0, "imported": posted + 2.5 + shift,
                      "entered": posted + 3.0 + shift, "left": posted + 4.0 + shift,
                      "lookup": 0.0625, "program": 0.25, "served": 0.5, "saved": 0.125,
                      "cpu_entered": 1.5, "cpu_left": 2.0})
    ex._time("step", "c0", 300.0, 301.0, None)       # (an old client: no stamps)
    b = ex.round_trip_breakdown()
    assert b["replies"] == 4
    # (c1's late start in the second round trip: its imports 3.5 s, its total 8 s)
    expected = {"to_process": 1.0, "imports": 1.5, "to_handler": 0.5, "lookup": 0.0625, "program": 0.25,
                "serve": 0.5, "save": 0.125, "to_server": 2.0, "total": 6.0,
                "round_trip": (6.0 + 8.0) / 2, "cpu_before": 1.5, "cpu_handler": 0.5}
    for key, value in expected.items():
        assert b[key] == pytest.approx(value, abs=1e-12), key


def _restored_after(monkeypatch) -> None:
    """What `run_supernode` changes in this process, put back after the test: the SuperNode
    loop module's `time`, the node state's methods that wake it, `sys.argv`."""
    from flwr.supernode import start_client_internal
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    monkeypatch.setattr(start_client_internal, "time", start_client_internal.time)
    for name in ("store_message_and_object_tree", "store_object", "finish_task"):
        monkeypatch.setattr(InMemoryNodeState, name, getattr(InMemoryNodeState, name))
    monkeypatch.setattr(sys, "argv", list(sys.argv))


def test_supernode_waits_are_capped_and_only_there(monkeypatch):
    """`run_supernode` caps the sleeps of Flower's SuperNode loop module (its 3 s idle pull,
    its 0.5 s reply polls) and no other module's, ends them early when the node's Runtime API
    stores what the loop waits for (a reply, its objects, a task's end: no clock between the
    node process's push and the SuperNode's), then runs Flower's own `flower-supernode` with
    the arguments given."""
    import time as real_time

    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode import start_client_internal
    from flwr.supernode import cli
    from flwr.supernode.nodestate import NodeStateFactory

    ran = []
    monkeypatch.setattr(cli, "flower_supernode", lambda: ran.append(list(sys.argv)))
    _restored_after(monkeypatch)
    deploy.run_supernode(["--insecure", "--superlink", "h:1"], poll=0.2)
    assert ran == [["flower-supernode", "--insecure", "--superlink", "h:1"]]
    capped = start_client_internal.time
    waited = []

    class Recorder:
        def wait(self, seconds):
            waited.append(seconds)
            return False
    activity, capped.activity = capped.activity, Recorder()
    capped.sleep(3)
    capped.sleep(0.5)
    capped.sleep(0.05)
    assert waited == [0.2, 0.2, 0.05]
    assert capped.monotonic is real_time.monotonic   # the rest is `time`'s
    # the node's Runtime API storing a task's end (a reply, an object) wakes the loop's sleep
    capped.activity = activity
    state = NodeStateFactory(objectstore_factory=ObjectStoreFactory()).state()
    assert not activity.is_set()
    state.finish_task(12345, "completed", "")
    assert activity.is_set()
    capped.sleep(3600)          # (returns at once: the activity is there; then cleared)
    assert not activity.is_set()
    with pytest.raises(fm.FedModelError, match="must be positive seconds"):
        deploy.run_supernode([], poll=0.0)


def test_the_supernode_wakes_its_node_process_after_each_pull(monkeypatch):
    """With `--isolation process` the node process is woken (`Supervisor.wake`) each time the
    SuperNode's loop has pulled a message whole, and only then (not on an empty pull)."""
    from flwr.supernode import start_client_internal
    from flwr.supernode import cli
    from fedmodel.runtime.flower import node_process

    started, woken = [], []

    class FakeSupervisor:
        def __init__(self, command, give_up=None, wake=False):
            started.append((command, wake))

        def start(self):
            return self

        def wake(self):
            woken.append(1)

        def stop(self):
            pass
    pulls = iter([None, 7, None, 8])
    monkeypatch.setattr(node_process, "Supervisor", FakeSupervisor)
    monkeypatch.setattr(start_client_internal, "_pull_and_store_message", lambda **kw: next(pulls))
    _restored_after(monkeypatch)

    def loop():     # (Flower's loop, four times)
        got = [start_client_internal._pull_and_store_message(state=None) for _ in range(4)]
        assert got == [None, 7, None, 8]
    monkeypatch.setattr(cli, "flower_supernode", loop)
    deploy.run_supernode(["--insecure", "--isolation", "process", "--port", "9101"], poll=0.2)
    (command, wake), = started
    assert wake and command[-1] == "--wake-stdin"
    assert len(woken) == 2


def test_flower_commands_run_this_python(tmp_path):
    """The SuperLink, the SuperNodes and the Flower commands they start from PATH
    (flwr-serverapp, flower-superexec, flwr-clientapp) are this Python's, so the ServerApp
    and the ClientApps import this environment's fedmodel."""
    model = tmp_path / "m.py"
    model.write_text("import fedmodel as fm\n\ndef make_problem(n):\n    p = fm.Problem()\n"
                     "    w = fm.Variable(2, name='w')\n    for i in range(n):\n"
                     "        p.add_client(f'c{i}').minimize(fm.sum_squares(w - i))\n    return p\n")
    dep = deploy.Deployment(model, 2, tmp_path / "w")
    link = Path(dep.superlink_command()[0])
    assert link.parent == tmp_path / "w" / "bin" and link.name == "flower-superlink"
    for name in ("flower-superlink", "flwr-serverapp", "flwr-clientapp", "flower-superexec"):
        text = (link.parent / name).read_text()
        assert text.startswith(f"#!{sys.executable}\n") and (link.parent / name).stat().st_mode & 0o111
    assert dep.supernode_command("c1")[:4] == [sys.executable, "-m", "fedmodel.deploy",
                                               "flower-supernode"]
    assert f'fedmodel-cache="{tmp_path / "w" / "cache" / "c1"}"' in dep.supernode_command("c1")[-1]
    printed = "\n".join(dep.commands())
    assert "FEDMODEL_SUPERNODE_POLL=0.2" in printed and "python -m fedmodel.deploy flower-supernode" in printed


_LOOKUP = """
import json, sys
from fedmodel.runtime import messages
from fedmodel.runtime.flower.client_app import KindCache, served_kind
declared = served_kind(sys.argv[2], KindCache(sys.argv[1]))
print(json.dumps({"loaded": sorted(messages._CATALOGUE["loaded"]), "name": declared.name,
                  "provider": messages.provider(sys.argv[2])}))
"""


def _lookup_in_a_fresh_process(folder: Path, kind: str) -> dict:
    """What a new ClientApp process loads to serve `kind` with the node's cache in `folder`."""
    import json
    import subprocess
    done = subprocess.run([sys.executable, "-c", _LOOKUP, str(folder), kind], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.integration     # five fresh Python processes, each importing fedmodel's backends
def test_a_node_remembers_which_backend_serves_a_kind(tmp_path):
    """A ClientApp process (one per message in a deployment) finds ProxAL's step by loading
    the installed backends in name order, all of them for it; the node remembers the backend
    in its own cache (JSON), and the next process loads that one backend only. A tampered
    cache (garbage, a name that is no installed backend, a backend without the kind) costs the
    slow lookup and is corrected; nothing else is loaded."""
    import json
    from fedmodel import registry
    folder, kind = tmp_path / "node-cache", "proxal_admm_step"
    first = _lookup_in_a_fresh_process(folder, kind)
    assert first["name"] == kind and first["provider"] in registry.names("backend")
    assert len(first["loaded"]) > 1      # (ProxAL's backends come late in name order)
    table = json.loads((folder / "kinds.json").read_text())
    assert table == {kind: first["provider"]}
    second = _lookup_in_a_fresh_process(folder, kind)
    assert second["loaded"] == [first["provider"]] and second["name"] == kind
    others = [n for n in registry.names("backend") if n != first["provider"]]
    for tampered in ("not json", json.dumps({kind: "no-such-backend"}), json.dumps({kind: others[0]})):
        (folder / "kinds.json").write_text(tampered)
        again = _lookup_in_a_fresh_process(folder, kind)
        assert again["name"] == kind and set(again["loaded"]) <= set(registry.names("backend"))
        assert json.loads((folder / "kinds.json").read_text())[kind] == first["provider"]


def test_close_ends_the_sessions_its_processes_started(tmp_path):
    """Flower starts the SuperLink's SuperExec in a session of its own: `close` ends that
    process group too, not only the groups of the processes it started itself."""
    import os
    import subprocess
    import time
    pidfile = tmp_path / "child"
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "c = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
         f"open({str(pidfile)!r}, 'w').write(str(c.pid))\ntime.sleep(300)\n"],
        start_new_session=True)
    for _ in range(600):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert os.getpgid(child) == child != parent.pid       # its own session, like the SuperExec
    dep = deploy.Deployment.__new__(deploy.Deployment)
    dep.supernodes, dep.superlink = {}, parent
    dep.close()
    assert parent.poll() is not None
    for _ in range(200):        # (killed; reaped by init, or a zombie until then)
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the child's session outlived close()")


def test_every_example_defines_make_problem():
    """Each example builds its model for any number of clients (what a deployment asks)."""
    assert len(EXAMPLES) >= 3
    for path in EXAMPLES:
        module = _load(path)
        for n in (2, 3):
            prob = module.make_problem(n)
            assert [c.name for c in prob.clients] == [f"c{i}" for i in range(n)], path.name


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_deploy_print_only_does_not_run_the_example(path, tmp_path, capsys, monkeypatch):
    """`fedmodel deploy examples/X.py --clients 2 --print-only` writes the app and prints the
    commands for 2 clients without solving anything here."""
    from fedmodel import cli

    def refuse(*args, **kwargs):
        raise AssertionError(f"{path.name} solved a problem under --print-only")

    monkeypatch.setattr(fm.Problem, "solve", refuse)
    assert cli.main(["deploy", str(path), "--clients", "2", "--workdir", str(tmp_path / "w"),
                     "--print-only"]) == 0
    out = capsys.readouterr().out
    assert out.count("flower-supernode --insecure") == 2
    assert 'fedmodel-client="c0"' in out and 'fedmodel-client="c1"' in out


def _load(path: Path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_server_pulls_soon_after_a_push_or_a_reply_and_less_while_none_come(monkeypatch):
    """`codec.send_and_receive` on a deployment grid: the first pull at once, then waits of
    0.05 s doubling to 0.2 s while no reply comes (each pull costs the SuperLink an HTTP
    request: a fixed 0.05 s made ~20 a second for a whole round trip), back to 0.05 s after a
    pull that brought a reply; every reply collected."""
    from types import SimpleNamespace

    from fedmodel.runtime.flower import codec

    answers = {5: ["m1"], 7: ["m2", "m3"]}      # pull number -> the replies it brings

    class Grid:
        pulls = 0

        def push_messages(self, messages):
            return list(messages)

        def pull_messages(self, ids):
            Grid.pulls += 1
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))
                    for i in answers.get(Grid.pulls, [])]
    slept = []
    monkeypatch.setattr(codec.time, "sleep", slept.append)
    replies = codec.send_and_receive(Grid(), ["m1", "m2", "m3"], timeout=3600)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m1", "m2", "m3"]
    assert slept == [0.05, 0.1, 0.2, 0.2, 0.05, 0.1]
