"""Deployment on Flower: a model file becomes a Flower app; a real SuperLink and one SuperNode
per client run as separate processes (`fedmodel deploy MODEL.py --clients N`, docs/flower.md).
An application (it solves the model file's problem), on top of the runtime's `FlowerExecutor`.

The model file defines `make_problem(n_clients) -> Problem` (or a module-level `problem`) and
optionally `backend` (a name or a backend instance; default: `Problem.solve`'s),
`solve_options` (a dict for `Problem.solve`) and `flower_options` (a dict for the
`FlowerExecutor`: `secure_sum`, `max_restarts`). `Deployment.write_app` writes a Flower app around a copy of it:

- `server.py`: `server_app` below. Flower starts it in the SuperLink's `flwr-serverapp`
  process; it imports the model, builds the problem (loaders do not run there) and solves it
  with a `FlowerExecutor` on the ServerApp's grid, then writes the result as JSON;
- `client.py`: `client_app` of `fedmodel.runtime.flower.client_app`. Each SuperNode runs it for
  its messages; a node learns which client it is from `--node-config 'fedmodel-client="c0"'`,
  builds that client's program from the declarative spec the server sends, and reads the
  client's data from its own files (`fedmodel-data="DIR"`: DIR/NAME.npy per data name;
  `Deployment(data=...)`). The model file's loaders never run in a deployment (they are what a
  serial run in one process uses).

Each SuperNode runs with `--isolation process` and one long-lived fedmodel process serves all
its messages (`runtime.flower.node_process`, started by `run_supernode`); the app's `client.py`
is then not used (it is for `node_process=False`: Flower's `flwr-clientapp` per message).

`Deployment.start` launches the processes on 127.0.0.1 (insecure, or TLS with a self-signed
certificate: `tls=True`), `run` submits the
app with `flwr run` and waits for the result, `close` ends every process it started by its
process group id. `commands()` are the same commands for separate hosts.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .errors import FedModelError
from .runtime.flower.codec import NODE_CACHE_KEY, NODE_DATA_KEY, NODE_NAME_KEY
from .runtime.flower.driver import FlowerExecutor

try:
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
except ImportError:     # optional extra: Deployment then says how to install it
    ServerApp = None

APP_PACKAGE = "fedmodel_app"
# A SuperNode's SuperExec looks for a message to start a ClientApp for every 1 s by default
# (flwr 1.42); this environment variable is Flower's knob for it, set on every process we start.
# FEDMODEL_SUPERNODE_POLL is ours: `run_supernode` caps the SuperNode's hard-coded waits with it.
POLL_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05", "FEDMODEL_SUPERNODE_POLL": "0.2"}
SUPERNODE_POLL_ENV = "FEDMODEL_SUPERNODE_POLL"
# ... but the SuperLink's SuperExec only starts a ServerApp per `flwr run`: Flower's 1 s there
# (at 0.05 s its polls cost the SuperLink ~20 requests a second for the whole deployment)
SUPERLINK_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "1.0"}
# the SuperLink, and the Flower commands a SuperLink / SuperNode start from PATH (their console
# scripts' targets): `fedmodel deploy` writes them into WORKDIR/bin for this Python, so that
# the ServerApp and every ClientApp import this environment's fedmodel (not that of the first
# `flwr-clientapp` on PATH)
FLOWER_SCRIPTS = {"flower-superlink": "flwr.superlink.cli:flower_superlink",
                  "flwr-serverapp": "flwr.superlink.cli:flwr_serverapp",
                  "flwr-clientapp": "flwr.supernode.cli:flwr_clientapp",
                  "flower-superexec": "flwr.supercore.cli:flower_superexec"}


def model_module(path: str | os.PathLike, name: str = "fedmodel_model") -> Any:
    """A model file (`fedmodel deploy`'s, `fedmodel run FILE`'s), the user's own, as a module
    (its `if __name__ == "__main__"` block does not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_problem(module: Any, n_clients: int):
    """The model file's problem: `make_problem(n_clients)` or its `problem`."""
    if hasattr(module, "make_problem"):
        return module.make_problem(n_clients)
    if hasattr(module, "problem"):
        return module.problem
    raise FedModelError(f"model file {getattr(module, '__file__', module)!r} defines neither "
                        "make_problem(n_clients) nor problem")


def _serve(grid: "Grid", context: "Context") -> None:
    """The ServerApp's main: solve the model with its clients on the SuperNodes, write the
    result (and a progress line per round) as JSON; a failure is written there too, so the
    launcher never waits for a result that will not come."""
    out = Path(str(context.run_config["out"]))
    try:
        _solve(grid, context.run_config, out)
    except Exception as err:
        out.write_text(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        raise


def _solve(grid: "Grid", config: Any, out: Path) -> None:
    model = importlib.import_module(f"{APP_PACKAGE}.model")
    problem = load_problem(model, int(config["clients"]))
    options = dict(getattr(model, "flower_options", {}))     # e.g. {"secure_sum": True}
    unknown = set(options) - {"secure_sum", "max_restarts"}
    if unknown:
        raise FedModelError(f"flower_options in the model file: {sorted(unknown)} are not options "
                            "of a deployment (allowed: secure_sum, max_restarts; the timeouts are "
                            "`fedmodel deploy` flags)")
    executor = FlowerExecutor(grid=grid, timeout=float(config["timeout"]),
                              start_timeout=float(config["start-timeout"]),
                              rejoin_timeout=float(config["rejoin-timeout"]), **options)
    progress = out.with_suffix(".progress")
    stamps: list[float] = []     # when each round ended (seconds per round, benchmarks)

    def callback(record: dict) -> None:
        stamps.append(time.perf_counter())
        # (round trips so far and where they went: a run stopped early still tells)
        line = {"objective": float(record.get("objective", float("nan"))),
                "round_trips": executor.round_trips, "trips": dict(executor.trips),
                "seconds": stamps[-1] - start,
                "breakdown": executor.round_trip_breakdown()}
        with open(progress, "a") as f:
            f.write(json.dumps(line) + "\n")

    start = time.perf_counter()
    # (no `backend` in the model file: Problem.solve's default backend)
    chosen = {"backend": model.backend} if hasattr(model, "backend") else {}
    result = problem.solve(executor=executor, callback=callback, **chosen,
                           **getattr(model, "solve_options", {}))
    summary = {
        "status": result.status, "objective": result.objective,
        "max_violation": result.max_violation, "backend": result.backend,
        "auto": result.info.get("auto"),        # what backend="auto" picked and why
        "values": {label: value.tolist() for label, value in result.values_by_label().items()},
        # (NaN where a round has no report, e.g. FedADMM's rounds(report=False))
        "history": [float(h.get("objective", float("nan"))) for h in result.history],
        "ledger": {"down": result.ledger.total("down"), "up": result.ledger.total("up")},
        "wire_bytes": {"down": executor.wire_total("down"), "up": executor.wire_total("up")},
        "round_trips": executor.round_trips, "trips": dict(executor.trips),
        "faults": executor.faults,
        "node_ids": executor.node_ids, "seconds": time.perf_counter() - start,
        "round_ends": [t - start for t in stamps],
        "secure_sum": executor.sum_only,
        "breakdown": executor.round_trip_breakdown(),
    }
    out.write_text(json.dumps(summary, default=str))


if ServerApp is not None:
    server_app = ServerApp()
    server_app.main()(_serve)
else:
    server_app = None


# `flwr-clientapp` as WORKDIR/bin writes it: Flower's own `flwr_clientapp` (the same function),
# loaded from its file without its package's __init__, which imports the whole SuperNode CLI
# (its SQL object store among it): 0.5–0.9 of the 1.9–2.2 CPU s of Flower's imports that a
# ClientApp process (one per message) paid, measured with flwr 1.42 (bench_flower --client-cpu)
LEAN_CLIENTAPP = """import importlib.util
import sys

import flwr.supernode

try:
    _spec = importlib.util.spec_from_file_location(
        "fedmodel_flwr_clientapp", flwr.supernode.__path__[0] + "/cli/flwr_clientapp.py")
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    main = _module.flwr_clientapp
except (OSError, ImportError, AttributeError):     # another Flower layout: its own entry point
    from flwr.supernode.cli import flwr_clientapp as main
sys.exit(main())
"""


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
        from .runtime.flower import node_process
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exe(name: str) -> str:
    """A Flower command of this environment (beside this Python first)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise FedModelError(f"{name!r} not found: pip install 'fedmodel[flower]'")
    return found


class Deployment:
    """A SuperLink and one SuperNode per client as processes on 127.0.0.1 (see the module
    docstring). `workdir` holds the app, Flower's home (its connection config), the logs and
    the result. `data`: each client's data directory, a path with `{client}` in it (e.g.
    "shards/{client}": client c0 reads shards/c0/A.npy for its data "A"), passed to its
    SuperNode as node config; without it a client whose spec needs data of its own fails
    naming the data. `node_process`: each SuperNode runs with `--isolation process` and one
    long-lived fedmodel ClientApp process serves all its messages (`runtime.flower.node_process`);
    False: Flower's default, a `flwr-clientapp` process per message (~1.9 CPU s each)."""

    def __init__(self, model_path: str | os.PathLike, clients: int, workdir: str | os.PathLike,
                 timeout: float = 120.0, start_timeout: float = 300.0, rejoin_timeout: float = 180.0,
                 tls: bool = False, data: str | None = None, node_process: bool = True):
        if ServerApp is None:
            raise FedModelError("fedmodel deploy needs Flower: pip install 'fedmodel[flower]'")
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise FedModelError(f"model file {str(model_path)!r} not found")
        if not (isinstance(clients, int) and clients >= 1):
            raise FedModelError(f"clients must be a positive integer, got {clients!r}")
        for name, value in (("timeout", timeout), ("start_timeout", start_timeout),
                            ("rejoin_timeout", rejoin_timeout)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise FedModelError(f"{name} must be positive seconds, got {value!r}")
        self.clients, self.workdir = clients, Path(workdir).resolve()
        self.timeouts = {"timeout": float(timeout), "start-timeout": float(start_timeout),
                         "rejoin-timeout": float(rejoin_timeout)}
        self.names = self._client_names()
        self.port = _free_port()
        self.node_ports = [_free_port() for _ in self.names]
        self.superlink: subprocess.Popen | None = None
        self.supernodes: dict[str, subprocess.Popen] = {}
        self.result_path = self.workdir / "result.json"
        self.tls = bool(tls)
        if data is not None and (not isinstance(data, str) or "{client}" not in data or '"' in data):
            raise FedModelError(f"data must be a directory path with {{client}} in it (each "
                                f"client's files there: NAME.npy per data name), got {data!r}")
        self.data = data
        self.node_process = bool(node_process)

    def _client_names(self) -> list[str]:
        """The model's client names (building the problem runs no loader)."""
        return [c.name for c in load_problem(model_module(self.model_path), self.clients).clients]

    # ---- the app --------------------------------------------------------------------------------
    @property
    def app_dir(self) -> Path:
        return self.workdir / "app"

    @property
    def flwr_home(self) -> Path:
        return self.workdir / "flwr-home"

    def write_app(self) -> Path:
        """The Flower app around a copy of the model file, and the CLI's connection config."""
        package = self.app_dir / APP_PACKAGE
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("")
        shutil.copyfile(self.model_path, package / "model.py")
        # (Flower checks the sources for an assignment to `app`, not only an import of it)
        (package / "server.py").write_text(
            "from fedmodel.deploy import server_app\n\napp = server_app\n")
        (package / "client.py").write_text(
            "from fedmodel.runtime.flower.client_app import client_app\n\napp = client_app\n")
        config = {"out": str(self.result_path), "clients": self.clients, **self.timeouts}
        lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in config.items())
        (self.app_dir / "pyproject.toml").write_text(f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedmodel-app"
version = "1.0.0"
description = "{self.model_path.name} on Flower (written by fedmodel deploy)"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedmodel"

[tool.flwr.app.components]
serverapp = "{APP_PACKAGE}.server:app"
clientapp = "{APP_PACKAGE}.client:app"

[tool.flwr.app.config]
{lines}
""")
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        security = f'root-certificates = "{self.certificates()["ca"]}"' if self.tls else "insecure = true"
        (self.flwr_home / "config.toml").write_text(
            f'[superlink]\ndefault = "fedmodel"\n\n[superlink.fedmodel]\n'
            f'address = "127.0.0.1:{self.port}"\n{security}\n')
        return self.app_dir

    def certificates(self) -> dict[str, Path]:
        """A self-signed CA and a SuperLink certificate for 127.0.0.1 / localhost (written once
        into workdir/certificates): for trying TLS out, not for production."""
        folder = self.workdir / "certificates"
        paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
        if not all(p.exists() for p in paths.values()):
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in _self_signed("127.0.0.1").items():
                paths[name].write_bytes(data)
        return paths

    # ---- the processes ----------------------------------------------------------------------------
    def superlink_command(self) -> list[str]:
        if self.tls:
            c = self.certificates()
            security = ["--ssl-ca-certfile", str(c["ca"]), "--ssl-certfile", str(c["cert"]),
                        "--ssl-keyfile", str(c["key"])]
        else:
            security = ["--insecure"]
        # (this Python's own script: a pyenv shim would put its own Python first on the PATH
        # of the SuperLink's children, the ServerApp among them)
        return [str(self._scripts() / "flower-superlink"), *security, "--host", "127.0.0.1",
                "--port", str(self.port), "--disable-runtime-dependency-installation"]

    def supernode_command(self, name: str, superlink: str | None = None) -> list[str]:
        port = self.node_ports[self.names.index(name)]
        security = ["--root-certificates", str(self.certificates()["ca"])] if self.tls else ["--insecure"]
        config = f'{NODE_NAME_KEY}="{name}"'
        if self.data is not None:       # the client's own data directory (its host's config)
            config += f' {NODE_DATA_KEY}="{Path(self.data.format(client=name)).resolve()}"'
        # what the node remembers between its ClientApp processes (client_app.KindCache)
        config += f' {NODE_CACHE_KEY}="{self.workdir / "cache" / name}"'
        # (one fedmodel process serves the node's messages: `run_supernode` starts it)
        isolation = ["--isolation", "process"] if self.node_process else []
        # (this Python runs Flower's SuperNode with its waits capped: `run_supernode`)
        return [sys.executable, "-m", "fedmodel.deploy", "flower-supernode", *security,
                "--superlink", superlink or f"127.0.0.1:{self.port}", "--port", str(port),
                *isolation, "--node-config", config]

    def commands(self) -> list[str]:
        """What to run on separate hosts (SUPERLINK_HOST: the SuperLink's address)."""
        def line(cmd: list[str]) -> str:
            head = "python" if cmd[0] == sys.executable else Path(cmd[0]).name
            return " ".join([head] + [f"'{c}'" if '"' in c else c for c in cmd[1:]])

        link = line(self.superlink_command()).replace("127.0.0.1", "0.0.0.0")
        out = [f"# on the server host:\n{link}"]
        for name in self.names:
            cmd = self.supernode_command(name, f"SUPERLINK_HOST:{self.port}")
            poll = " ".join(f"{k}={v}" for k, v in POLL_ENV.items())
            out.append(f"# on {name}'s host (its data there):\n{poll} {line(cmd)}")
        out.append(f"# then, where the app is:\nFLWR_HOME={self.flwr_home} flwr run {self.app_dir} "
                   "fedmodel --stream")
        return out

    def _scripts(self) -> Path:
        """workdir/bin: Flower's commands that a SuperLink / SuperNode start from PATH, for
        this Python (`FLOWER_SCRIPTS`)."""
        folder = self.workdir / "bin"
        folder.mkdir(parents=True, exist_ok=True)
        for name, target in FLOWER_SCRIPTS.items():
            module, function = target.split(":")
            path = folder / name
            body = LEAN_CLIENTAPP if name == "flwr-clientapp" else \
                f"import sys\nfrom {module} import {function}\nsys.exit({function}())\n"
            path.write_text(f"#!{sys.executable}\n{body}")
            path.chmod(0o755)
        return folder

    def _spawn(self, cmd: list[str], log: str, defaults: dict | None = None) -> subprocess.Popen:
        env = {**POLL_ENV, **(defaults or {}), **os.environ, "FLWR_HOME": str(self.flwr_home)}
        env["PATH"] = os.pathsep.join([str(self._scripts()), env.get("PATH", "")])
        with open(self.workdir / log, "ab") as f:
            # own session: ending it by its group id also ends the ServerApp/ClientApp children
            return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    cwd=self.workdir, start_new_session=True)

    def start(self) -> "Deployment":
        """Write the app, start the SuperLink and one SuperNode per client."""
        self.write_app()
        self.superlink = self._spawn(self.superlink_command(), "superlink.log", SUPERLINK_ENV)
        self._wait_for_port(self.port)
        for name in self.names:
            self.start_supernode(name)
        return self

    def start_supernode(self, name: str) -> subprocess.Popen:
        """(Re)start the SuperNode of client `name`."""
        self.supernodes[name] = self._spawn(self.supernode_command(name), f"supernode-{name}.log")
        return self.supernodes[name]

    def _wait_for_port(self, port: int, wait: float = 60.0) -> None:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.superlink is not None and self.superlink.poll() is not None:
                raise FedModelError(f"flower-superlink exited ({self.workdir / 'superlink.log'})")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise FedModelError(f"flower-superlink did not listen on port {port} within {wait:g} s")

    def run(self, wait: float = 1800.0) -> dict:
        """Submit the app with `flwr run` and wait for the ServerApp's result (JSON)."""
        self.result_path.unlink(missing_ok=True)
        self.result_path.with_suffix(".progress").unlink(missing_ok=True)
        env = dict(os.environ, FLWR_HOME=str(self.flwr_home))
        with open(self.workdir / "flwr-run.log", "ab") as f:
            subprocess.run([_exe("flwr"), "run", str(self.app_dir), "fedmodel"], stdout=f,
                           stderr=subprocess.STDOUT, env=env, check=True, timeout=120)
        deadline = time.monotonic() + wait
        while not self.result_path.exists():
            if time.monotonic() > deadline:
                raise FedModelError(f"no result after {wait:g} s (logs in {self.workdir})")
            if self.superlink is not None and self.superlink.poll() is not None:
                raise FedModelError(f"flower-superlink exited (logs in {self.workdir})")
            time.sleep(0.5)
        time.sleep(0.2)     # (the file is written in one call; let it land)
        result = json.loads(self.result_path.read_text())
        if "error" in result:
            raise FedModelError(f"the run failed on the server: {result['error']} "
                                f"(logs in {self.workdir})")
        return result

    def progress(self) -> int:
        """Rounds the running ServerApp has reported so far."""
        return len(self.progress_lines())

    def progress_lines(self) -> list[dict]:
        """The running ServerApp's line per round: objective, round trips and seconds so far,
        and where the round trips went (`FlowerExecutor.round_trip_breakdown`)."""
        path = self.result_path.with_suffix(".progress")
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines if line.strip()]

    def kill_supernode(self, name: str) -> int:
        """kill -9 the SuperNode of client `name` (and its ClientApp children); its pid."""
        proc = self.supernodes[name]
        _end(proc, signal.SIGKILL)
        return proc.pid

    def close(self) -> None:
        """End every process this deployment started, by its process group id, and the
        process groups its processes started: Flower starts the SuperLink's SuperExec in a
        session of its own, which outlived the SuperLink (with its ServerApps) on a loaded
        machine."""
        procs = [p for p in [*self.supernodes.values(), self.superlink] if p is not None]
        groups = _descendant_groups([p.pid for p in procs])
        for proc in procs:
            _end(proc, signal.SIGTERM)
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.supernodes, self.superlink = {}, None

    def __enter__(self) -> "Deployment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _self_signed(host: str) -> dict[str, bytes]:
    """PEM bytes of a CA certificate ("ca") and of a server certificate ("cert") and its key
    ("key") for `host` and localhost, signed by that CA (valid 30 days)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool, san=None) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=30))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("fedmodel deploy CA", ca_key, "fedmodel deploy CA", ca_key, True)
    server = cert(host, key, "fedmodel deploy CA", ca_key, False,
                  [x509.IPAddress(ipaddress.ip_address(host)), x509.DNSName("localhost")])
    pem = serialization.Encoding.PEM
    return {"ca": ca.public_bytes(pem), "cert": server.public_bytes(pem),
            "key": key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL,
                                     serialization.NoEncryption())}


def _descendant_groups(pids: list[int]) -> set[int]:
    """The process groups of the descendants of `pids` other than their own (psutil)."""
    import psutil
    groups = set()
    for pid in pids:
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for child in children:
            try:
                groups.add(os.getpgid(child.pid))
            except ProcessLookupError:
                pass
    return groups - set(pids) - {os.getpgrp()}


def _end(proc: subprocess.Popen, sig: int) -> None:
    """Signal a process's group (it leads its own session) and wait for it; SIGKILL after 10 s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


if __name__ == "__main__":      # python -m fedmodel.deploy flower-supernode ARGS
    if sys.argv[1:2] != ["flower-supernode"]:
        raise SystemExit("usage: python -m fedmodel.deploy flower-supernode [flower-supernode args]")
    run_supernode(sys.argv[2:], float(os.environ.get(SUPERNODE_POLL_ENV, POLL_ENV[SUPERNODE_POLL_ENV])))
