"""`Deployment`: a SuperLink and one SuperNode per client as processes on 127.0.0.1, the app
written around the model file, its run and its end (the package docstring)."""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..errors import FedModelError
from ..runtime.flower.codec import NODE_CACHE_KEY, NODE_DATA_KEY, NODE_NAME_KEY
from .app import APP_PACKAGE, ServerApp, load_problem, model_module
from .supernode import SUPERNODE_POLL_ENV

# A SuperNode's SuperExec looks for a message to start a ClientApp for every 1 s by default
# (flwr 1.42); this environment variable is Flower's knob for it, set on every process we start.
# SUPERNODE_POLL_ENV is ours: `run_supernode` caps the SuperNode's hard-coded waits with it.
POLL_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05", SUPERNODE_POLL_ENV: "0.2"}
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

