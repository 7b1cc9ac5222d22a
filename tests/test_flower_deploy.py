"""`fedmodel deploy`: a real flower-superlink and one flower-supernode per client as separate
processes on 127.0.0.1 (TLS with a self-signed certificate, or insecure), the run submitted with
`flwr run`; the serial executor's
iterates; a SuperNode killed with kill -9 mid-run and restarted rejoins and the run ends with the
same answer. Every process a test starts is ended by the test (by its process group id).

Flower's SuperNode polls the SuperLink every 3 s when idle and starts a ClientApp process per
message, so a round trip costs several seconds: the runs are marked slow (pytest -m slow).
"""
from __future__ import annotations

import importlib.util
import json
import os
import threading
import time

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedmodel[flower]')")

pytestmark = pytest.mark.integration     # real SuperLink/SuperNode processes: CI runs it after the fast suite

MODEL = '''
import numpy as np
import fedmodel as fm
from fedmodel import backends

DATA = {data!r}


class Shard:
    """Reads one client's array (the serial run in one process; a deployment's clients read
    their own files, DIR/NAME.npy of their node config, and this loader never runs there)."""

    def __init__(self, path):
        self.path = path

    def __call__(self):
        return np.load(self.path)


def make_problem(n_clients):
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    for i in range(n_clients):
        c = prob.add_client(f"c{{i}}")
        A = c.data(loader=Shard(f"{{DATA}}/c{{i}}/A.npy"), shape=(6, 3), name="A")
        b = c.data(loader=Shard(f"{{DATA}}/c{{i}}/b.npy"), shape=(6,), name="b")
        c.minimize(0.5 * fm.sum_squares(A @ w - b))
        if {constrained}:
            c.subject_to(fm.sum(w) <= 0.3)
    return prob


backend = {backend}
flower_options = {options}
'''


def _model_file(tmp_path, backend, n=2, constrained=False, options=None):
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        (data / f"c{i}").mkdir()
        np.save(data / f"c{i}" / "A.npy", rng.normal(size=(6, 3)))
        np.save(data / f"c{i}" / "b.npy", rng.normal(size=6))
    path = tmp_path / "model.py"
    path.write_text(MODEL.format(data=str(data), backend=backend, constrained=constrained,
                                 options=options or {}))
    return path


def _data(model):
    """The clients' data directories of `_model_file`'s model (Deployment's `data`)."""
    return str(model.parent / "data" / "{client}")


def _serial(path, n=2):
    """The same model file solved in this process on the serial executor."""
    spec = importlib.util.spec_from_file_location("deploy_test_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    res = module.make_problem(n).solve(module.backend)
    return res.values_by_label()["w"], [h["objective"] for h in res.history]


def test_print_only_writes_the_app_and_the_commands(tmp_path, capsys):
    from fedmodel import cli
    model = _model_file(tmp_path, "backends.FedAvg(step=0.05, max_rounds=2)", n=3)
    work = tmp_path / "work"
    assert cli.main(["deploy", str(model), "--clients", "3", "--workdir", str(work), "--print-only",
                     "--data", _data(model)]) == 0
    out = capsys.readouterr().out
    assert out.count("flower-supernode --insecure") == 3
    for name in ("c0", "c1", "c2"):
        assert f"fedmodel-client=\"{name}\"" in out
        assert f"fedmodel-data=\"{tmp_path / 'data' / name}\"" in out     # its own data files
    assert (work / "app" / "fedmodel_app" / "model.py").read_text() == model.read_text()
    assert 'clientapp = "fedmodel_app.client:app"' in (work / "app" / "pyproject.toml").read_text()
    # the ClientApp the SuperNodes run is fedmodel's, named where it lives
    from fedmodel.runtime.flower.client_app import client_app
    client = {}
    exec((work / "app" / "fedmodel_app" / "client.py").read_text(), client)
    assert client["app"] is client_app
    assert "fedmodel.runtime.flower.client_app" in (work / "app" / "fedmodel_app" / "client.py").read_text()


def test_deploy_refuses_a_model_without_a_problem(tmp_path):
    from fedmodel import FedModelError
    from fedmodel.deploy import Deployment
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(FedModelError, match="neither make_problem"):
        Deployment(bad, 2, tmp_path / "w")
    with pytest.raises(FedModelError, match="not found"):
        Deployment(tmp_path / "missing.py", 2, tmp_path / "w")
    good = _model_file(tmp_path, "backends.FedAvg(max_rounds=1)")
    with pytest.raises(FedModelError, match="timeout must be positive"):
        Deployment(good, 2, tmp_path / "w", timeout=-1)
    with pytest.raises(FedModelError, match="with {client} in it"):
        Deployment(good, 2, tmp_path / "w", data=str(tmp_path / "data"))


def test_tls_certificates_are_a_ca_and_a_server_certificate_it_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from fedmodel.deploy import Deployment
    model = _model_file(tmp_path, "backends.FedAvg(max_rounds=1)")
    dep = Deployment(model, 2, tmp_path / "w", tls=True)
    paths = dep.certificates()
    ca = x509.load_pem_x509_certificate(paths["ca"].read_bytes())
    server = x509.load_pem_x509_certificate(paths["cert"].read_bytes())
    ca.public_key().verify(server.signature, server.tbs_certificate_bytes,
                           ec.ECDSA(server.signature_hash_algorithm))   # raises if not signed by ca
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    assert "--insecure" not in dep.superlink_command() + dep.supernode_command("c0")
    assert str(paths["ca"]) in dep.supernode_command("c1")


@pytest.mark.slow
def test_deploy_equals_serial(tmp_path, capsys):
    """`fedmodel deploy --tls` end to end: SuperLink + 2 SuperNodes over TLS (self-signed
    certificate), DALD-CC for 2 iterations."""
    from fedmodel import cli
    model = _model_file(tmp_path, "backends.DALD(rho=1.0, max_iterations=2)", constrained=True)
    work = tmp_path / "work"
    assert cli.main(["deploy", str(model), "--clients", "2", "--workdir", str(work),
                     "--timeout", "60", "--tls", "--data", _data(model)]) == 0
    assert "running on https://127.0.0.1" in (work / "superlink.log").read_text()
    result = json.loads((work / "result.json").read_text())
    w, history = _serial(model)
    np.testing.assert_allclose(result["values"]["w"], w, rtol=0, atol=1e-8)
    np.testing.assert_allclose(result["history"], history, rtol=0, atol=1e-8)
    assert sorted(result["node_ids"]) == ["c0", "c1"] and not result["faults"]
    assert result["wire_bytes"]["up"] >= 8 * result["ledger"]["up"]["floats"]


@pytest.mark.slow
def test_supernode_killed_mid_run_rejoins(tmp_path):
    """kill -9 of c1's SuperNode after the first round; restarted, it rejoins as a new Flower
    node, is rebuilt and replayed, and the run ends with the uninterrupted answer."""
    from fedmodel.deploy import Deployment
    model = _model_file(tmp_path, "backends.FedAvg(step=0.05, local_steps=2, max_rounds=4)")
    dep = Deployment(model, 2, tmp_path / "work", timeout=25, rejoin_timeout=120, data=_data(model))
    box: dict = {}
    try:
        dep.start()
        runner = threading.Thread(target=lambda: box.update(result=dep.run(wait=900)))
        runner.start()
        deadline = time.monotonic() + 600
        while dep.progress() < 1 and runner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert dep.progress() >= 1 and runner.is_alive(), "the run ended before the kill"
        pid = dep.kill_supernode("c1")
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)                    # gone (and reaped)
        dep.start_supernode("c1")
        runner.join(timeout=900)
        assert not runner.is_alive()
    finally:
        dep.close()
    result = box["result"]
    w, history = _serial(model)
    np.testing.assert_allclose(result["values"]["w"], w, rtol=0, atol=1e-8)
    np.testing.assert_allclose(result["history"], history, rtol=0, atol=1e-8)
    faults = result["faults"]
    assert [f["node"] for f in faults] == ["c1"] and faults[0]["recovered"]
    assert faults[0]["new_node_id"] != faults[0]["old_node_id"]


@pytest.mark.slow
def test_deploy_secure_sum_fedavg(tmp_path):
    """FedAvg with Flower's SecAgg+ across real SuperNode processes (`flower_options` in the
    model file): the serial answer to SecAgg+'s precision, 2 rounds → at most 2 quanta
    2c/Q (docs/flower.md), and not bitwise (the sum went through the fixed point)."""
    from fedmodel.deploy import Deployment
    from fedmodel.runtime.flower.driver import FlowerExecutor
    model = _model_file(tmp_path, "backends.FedAvg(step=0.05, local_steps=2, max_rounds=2, tol=0.0)",
                        options={"secure_sum": True})
    dep = Deployment(model, 2, tmp_path / "work", timeout=60, data=_data(model))
    try:
        dep.start()
        result = dep.run(wait=900)
    finally:
        dep.close()
    assert result["secure_sum"] is True and not result["faults"]
    w, history = _serial(model)
    quantum = 2 * FlowerExecutor.SECURE_SUM_DEFAULTS["clipping_range"] / \
        FlowerExecutor.SECURE_SUM_DEFAULTS["quantization_range"]
    error = np.max(np.abs(np.array(result["values"]["w"]) - w))
    assert 0 < error <= 2 * quantum, error
    assert len(result["history"]) == len(history) == 2


# The remaining star backends, one deployment for all: the model file picks its run from
# `run.txt` beside the data, read when Flower's ServerApp process imports it (a new process per
# `flwr run`), so the SuperLink and SuperNodes start once and serve one run after the other.
RUNS = '''
from pathlib import Path

RUNS = {
    "fedprox": (lambda: backends.FedProx(mu=1.0, step=0.05, local_steps=3, max_rounds=2, tol=0.0), False),
    "fedadmm": (lambda: backends.FedADMM(adaptive=False, inexact=False, max_rounds=2, seed=2), False),
    "fedadmm-insa": (lambda: backends.FedADMM(adaptive=True, inexact=True, max_rounds=2, seed=2), False),
    "dp-admm": (lambda: backends.DPADMM(epsilon=1.0, max_rounds=2, seed=3, tol=0), False),
    "proxal": (lambda: backends.ProxAL(beta=10.0, rho=1.0, max_outer=1, max_inner=2), True),
}
CHOICE = Path(DATA, "run.txt").read_text().strip()
backend = RUNS[CHOICE][0]()
'''


@pytest.mark.slow
def test_deploy_every_remaining_star_backend_equals_serial(tmp_path):
    """FedProx, FedADMM (exact, fixed penalty), FedADMM-InSa, DP-ADMM (seeded noise) and ProxAL (1 outer, 2 inner
    iterations, constrained) on one deployment (SuperLink + 2 SuperNodes), one `flwr run` each:
    each run's iterates are the serial executor's to 1e-8, and its noise (DP-ADMM) too."""
    from fedmodel.deploy import Deployment
    model = _model_file(tmp_path, "None", constrained="RUNS[CHOICE][1]")
    model.write_text(model.read_text() + RUNS)
    choice = tmp_path / "data" / "run.txt"
    choice.write_text("fedprox")      # (the model file needs it to name its clients)
    dep = Deployment(model, 2, tmp_path / "work", timeout=60, data=_data(model))
    results = {}
    try:
        dep.start()
        for name in ("fedprox", "fedadmm", "fedadmm-insa", "dp-admm", "proxal"):
            choice.write_text(name)
            results[name] = dep.run(wait=600)
    finally:
        dep.close()
    for name, result in results.items():
        choice.write_text(name)
        w, history = _serial(model)
        assert not result["faults"] and sorted(result["node_ids"]) == ["c0", "c1"], name
        assert len(result["history"]) == len(history) >= 1, name
        np.testing.assert_allclose(result["values"]["w"], w, rtol=0, atol=1e-8, err_msg=name)
        np.testing.assert_allclose(result["history"], history, rtol=0, atol=1e-8, err_msg=name)
    # the runs differ from each other (each backend really ran, not a cached answer)
    ws = [np.array(r["values"]["w"]) for r in results.values()]
    assert min(np.max(np.abs(a - b)) for i, a in enumerate(ws) for b in ws[i + 1:]) > 1e-6


def test_deployment_grid_is_pulled_often_and_within_the_timeout():
    """The executor's own push/pull loop on a deployment grid (Flower's HttpGrid sleeps 3 s
    between pulls): replies that arrive on later pulls are all collected, well under 3 s; a
    message never answered ends the loop at the timeout with the others' replies."""
    from types import SimpleNamespace

    from fedmodel.runtime.flower.codec import send_and_receive

    class FakeGrid:      # replies to message k from the k-th pull on; "never" is never answered
        def __init__(self):
            self.pulls = 0

        def push_messages(self, messages):
            return list(messages)

        def pull_messages(self, ids):
            self.pulls += 1
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))
                    for i in sorted(ids) if i != "never" and int(i[1:]) <= self.pulls]

    grid = FakeGrid()
    start = time.monotonic()
    replies = send_and_receive(grid, ["m1", "m2", "m3"], timeout=30)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m1", "m2", "m3"]
    assert grid.pulls == 3 and time.monotonic() - start < 1.0
    start = time.monotonic()
    replies = send_and_receive(FakeGrid(), ["m1", "never"], timeout=0.3)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m1"]
    assert 0.3 <= time.monotonic() - start < 1.5
