"""FlowerExecutor on Flower's simulation engine: the serial executor's iterates, what crosses the
wire, data loaded on the clients, errors and timeouts that name the client.

One persistent executor (one simulation, three SuperNodes) serves every run of the module; tiny
models and a few rounds keep the file within its budget. The timeout test runs last (its slow
client's request is still in flight when the run stops).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends.proxal_newton import NewtonInner
from fedmodel import backends, topologies
from fedmodel.runtime.messages import MESSAGES, PROCEDURES, install, procedure
from test_ray import D, _model, _parts   # the same least-squares model and data as Ray's tests

pytestmark = pytest.mark.integration     # Flower's simulation engine: CI runs it after the fast suite

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedmodel[flower]')")
pytest.importorskip("ray", reason="Flower's simulation engine needs Ray")


HANG_ENV = "FEDMODEL_TEST_HANG"     # a file whose existence makes c1's FedADMM round hang


@pytest.fixture(scope="module")
def flower(tmp_path_factory):
    """One simulation with three SuperNodes for the whole module, ended at its close. Its
    clients serve this module's procedures too: the workers import it at start (their own
    FEDMODEL_CLIENT_MODULES, inherited from this process, never a name from a message)."""
    from fedmodel.runtime.flower.client_app import CLIENT_MODULES_ENV
    from fedmodel.runtime.flower.driver import FlowerExecutor
    saved = {k: os.environ.get(k) for k in (CLIENT_MODULES_ENV, HANG_ENV)}
    os.environ[CLIENT_MODULES_ENV] = __name__
    os.environ[HANG_ENV] = str(tmp_path_factory.mktemp("hang") / "flag")
    ex = FlowerExecutor(timeout=60, persistent=True)
    yield ex
    ex.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    assert ex._simulation is None


CASES = {
    "fedavg": (lambda: backends.FedAvg(step=0.05, local_steps=2, max_rounds=6), False, None),
    "fedprox": (lambda: backends.FedProx(mu=1.0, step=0.05, local_steps=3, max_rounds=6), False, None),
    "dald-cc": (lambda: backends.DALD(rho=1.0, max_iterations=6), True, None),
    # Flower is hub-and-spoke: DALD-DC's neighbour messages go through the server like every
    # other request (the coordinator relays them)
    "dald-dc-ring": (lambda: backends.DALD(rho=1.0, max_iterations=3), True, "ring"),
    "fedadmm": (lambda: backends.FedADMM(max_rounds=6, seed=2), False, None),
    "fedadmm-insa-partial": (lambda: backends.FedADMM(adaptive=True, inexact=True, participation=0.5,
                                                      max_rounds=6, seed=2), False, None),
    "dp-admm": (lambda: backends.DPADMM(epsilon=1.0, max_rounds=6, seed=3, tol=0), False, None),
    "proxal": (lambda: backends.ProxAL(beta=10.0, rho=1.0, max_outer=2, max_inner=10), True, None),
    # Newton steps (auto's pick, dear round trips too): Hessian triangles through Flower's codec
    "proxal-newton": (lambda: backends.ProxAL(inner=NewtonInner(), max_outer=2), True, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_flower_iterates_equal_serial(flower, case):
    make, constrained, topo = CASES[case]
    prob, w = _model(_parts(), constrained=constrained)
    topology = topologies.ring(prob) if topo == "ring" else None
    serial = make().run(prob, topology=topology, executor="serial")
    remote = make().run(prob, topology=topology, executor=flower)
    # every iterate the backend saw: the final model, each round's objective, the multipliers
    np.testing.assert_allclose(remote["values"][w.uid], serial["values"][w.uid], rtol=0, atol=1e-8)
    assert len(remote["history"]) == len(serial["history"]) >= 2
    for a, b in zip(remote["history"], serial["history"]):
        assert abs(a["objective"] - b["objective"]) <= 1e-8 * max(1.0, abs(b["objective"]))
    for name, mu in serial["multipliers"].items():
        np.testing.assert_allclose(remote["multipliers"][name], mu, rtol=0, atol=1e-8)
    # the declared traffic is booked exactly as by the serial executor ...
    assert remote["ledger"].messages == serial["ledger"].messages
    assert remote["ledger"].floats == serial["ledger"].floats
    assert sorted(flower.node_ids) == ["c0", "c1", "c2"]
    # ... and what crossed the wire is counted in bytes: every float of the ledger is 8 bytes
    # of an array on the wire (plus Flower's headers), in both directions, per client
    for (sender, receiver, kind), floats in serial["ledger"].floats.items():
        assert flower.wire_bytes[(sender, receiver, kind)] >= 8 * floats, (sender, receiver, kind)
    assert flower.wire_bytes[("server", "c0", "fedmodel.build")] > 0


class _FedADMMNoReport(backends.FedADMM):
    """FedADMM without the per-round report request (the history's objective / violation)."""

    def rounds(self, ex, z, alpha, max_rounds, callback=None, bar=None, **options):
        return super().rounds(ex, z, alpha, max_rounds, callback, bar, **{"report": False, **options})


def test_round_trips_by_kind_name_what_the_ledger_books_local(flower):
    """Issue 27 item 4: a FedADMM deployment counted two Flower round trips per round where the
    serial ledger counts one: each round's `fedadmm_round` and the history's `report`, a kind
    declared `local` (the harness's metric), so the ledger books no round trip for it although
    on Flower it was a batch of its own. Now round k's report rides in round k + 1's
    `fedadmm_round` Message (`executor.Rider`): one batch per round, the last round's report
    alone; `trips` equals the ledger's `requests` (every request, local kinds included) plus
    the build. Without the report, the batches of the kinds the ledger counts are the serial
    ledger's round trips, the iterates bitwise the same, and what is left is the build and the
    bookkeeping at start and end."""
    prob, w = _model(_parts(), constrained=False)
    serial = backends.FedADMM(max_rounds=6, seed=2, tol=None).run(prob, executor="serial")
    rounds = len(serial["history"])
    assert rounds == 6 and serial["ledger"].round_trips == 1 + rounds     # init + the rounds
    bookkeeping = {"fedmodel.build": 1, "fedadmm_refusal": 1, "fedadmm_beta": 1,
                   "private_values": 1, "multipliers": 1}

    remote = backends.FedADMM(max_rounds=6, seed=2, tol=None).run(prob, executor=flower)
    assert dict(flower.trips) == {**bookkeeping, "fedadmm_init": 1, "fedadmm_round": rounds,
                                  "report": 1}
    assert flower.round_trips == sum(flower.trips.values()) == rounds + 7
    assert remote["ledger"].round_trips == serial["ledger"].round_trips
    assert dict(remote["ledger"].requests) == dict(serial["ledger"].requests) == \
        {k: n for k, n in flower.trips.items() if k != "fedmodel.build"}
    assert repr(remote["history"][-1]["objective"]) == repr(serial["history"][-1]["objective"])

    quiet = _FedADMMNoReport(max_rounds=6, seed=2, tol=None).run(prob, executor=flower)
    assert dict(flower.trips) == {**bookkeeping, "fedadmm_init": 1, "fedadmm_round": rounds}
    counted = {k: n for k, n in flower.trips.items() if k in MESSAGES and not MESSAGES[k].local}
    assert counted == dict(serial["ledger"].trips) == {"fedadmm_init": 1, "fedadmm_round": rounds}
    assert flower.round_trips == serial["ledger"].round_trips + 5
    np.testing.assert_array_equal(quiet["values"][w.uid], serial["values"][w.uid])
    assert [h["z_change"] for h in quiet["history"]] == [h["z_change"] for h in serial["history"]]


def test_wire_bytes_of_one_request():
    """The byte count of a message: an 8-float array and a string field, Flower's records."""
    from fedmodel.runtime.flower.codec import decode, encode, wire_size
    small = encode("solve_local", {"anchor": np.ones(8), "method": "gd"}, MESSAGES["solve_local"].request)
    big = encode("solve_local", {"anchor": np.arange(1000.0), "method": "gd"},
                 MESSAGES["solve_local"].request)
    # 992 more floats: 7936 more bytes of array data; the headers grow only by the longer shape
    # and length fields (a few bytes)
    assert 8 * 992 <= wire_size(big) - wire_size(small) <= 8 * 992 + 16
    meta, payload = decode(big)
    assert meta["kind"] == "solve_local" and payload["method"] == "gd"
    np.testing.assert_array_equal(payload["anchor"], np.arange(1000.0))
    assert payload["anchor"].flags.writeable


def test_payload_types_survive_the_wire():
    """numpy scalars stay numpy scalars, Python scalars stay Python, None stays None, opaque
    fields (node state) come back equal."""
    from fedmodel.runtime.flower.codec import decode, encode
    state = {"y": np.arange(3.0), "procedures": {"rng": np.random.default_rng(1)}}
    payload = {"a": np.float64(0.25), "b": 3, "c": 0.5, "d": True, "e": None, "s": state}
    _, back = decode(encode("k", payload, {"s": "opaque"}))
    assert type(back["a"]) is np.float64 and back["a"] == 0.25
    assert (type(back["b"]), type(back["c"]), type(back["d"])) == (int, float, bool)
    assert back["e"] is None
    np.testing.assert_array_equal(back["s"]["y"], state["y"])
    assert back["s"]["procedures"]["rng"].random() == np.random.default_rng(1).random()


def test_loader_data_sent_as_arrays_in_simulation(flower, tmp_path):
    """In simulation the driver runs the loaders (on copies of the Data) and sends the arrays
    to the clients (docs/flower.md); in deployment the clients read their own files."""
    parts = _parts()
    prob_arrays, w0 = _model(parts)
    prob, w = _model(parts, loader_dir=str(tmp_path))
    make = CASES["dald-cc"][0]
    serial = make().run(prob_arrays, executor="serial")
    remote = make().run(prob, executor=flower)
    np.testing.assert_allclose(remote["values"][w.uid], serial["values"][w0.uid], rtol=0, atol=1e-8)
    # the model's loader Data are still remote here: their arrays were not kept
    assert len(prob.remote_data()) == 2 * len(parts)


def test_client_error_names_the_client(flower, tmp_path):
    """A loader that fails stops the run with a DataError naming its client."""
    prob, w = _model(_parts(), constrained=False, loader_dir=str(tmp_path))
    os.remove(os.path.join(tmp_path, "c1_b.npy"))
    with pytest.raises(fm.DataError, match="'c1'"):
        backends.FedAvg(step=0.05, max_rounds=2).run(prob, executor=flower)


def test_registered_by_name_and_bad_options():
    from fedmodel import registry
    from fedmodel.runtime.flower.driver import FlowerExecutor
    assert registry.lookup("executor", "flower") is FlowerExecutor
    with pytest.raises(fm.FedModelError, match="timeout must be positive"):
        FlowerExecutor(timeout=0)
    with pytest.raises(fm.FedModelError, match="start_timeout must be positive"):
        FlowerExecutor(start_timeout=float("nan"))


def test_import_fedmodel_does_not_import_flwr():
    code = "import sys, json, fedmodel; print(json.dumps('flwr' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) is False


def _quantum(ex) -> float:
    """SecAgg+'s fixed-point step: one client's entry is stochastically rounded to a multiple
    of 2c/Q (c the clipping range, Q the quantization range), an error below one step."""
    return 2 * ex.secure_sum["clipping_range"] / ex.secure_sum["quantization_range"]


@pytest.mark.parametrize("make", [
    lambda: backends.FedAvg(step=0.05, local_steps=2, max_rounds=6, tol=0.0),
    lambda: backends.FedProx(mu=1.0, step=0.05, local_steps=3, max_rounds=6, tol=0.0)],
    ids=["fedavg", "fedprox"])
def test_secure_sum_equals_plain_to_secagg_precision(flower, make):
    """FedAvg / FedProx through Flower's SecAgg+ (the server sees only Σ_i x_i) give the plain
    run's models to SecAgg+'s precision. Bound: each round's mean x̂ = (1/n)Σ_i q(x_i) is off by
    less than one quantum 2c/Q (each q(x_i) is within one quantum, so is their mean); a round's
    map x̂ ↦ mean_i(K GD steps on f_i + (μ/2)‖· − x̂‖² from x̂) has, per eigenvalue λ of ∇²f_i,
    the factor j_K with j_0 = 1, j_(k+1) = (1 − η(λ+μ)) j_k + ημ, so |j_K| ≤ 1 when η(λ+μ) ≤ 2:
    after T rounds the models differ by less than T quanta (6 · 3.8e-6 with Flower's defaults)."""
    largest = max(np.linalg.eigvalsh(A.T @ A).max() for A, _ in _parts())
    assert 0.05 * (largest + 1.0) <= 2      # the bound's premise, for both backends below
    prob, w = _model(_parts(), constrained=False)
    plain = make().run(prob, executor="serial")
    flower.secure_sum = True
    try:
        secure = make().run(prob, executor=flower)
        bound = 6 * _quantum(flower)
    finally:
        flower.secure_sum = False
    error = np.max(np.abs(secure["values"][w.uid] - plain["values"][w.uid]))
    # nonzero: the sum really went through SecAgg+'s fixed point, not in plain
    assert 0 < error <= bound, (error, bound)
    assert secure["info"]["secure_sum"] and "client_values" not in secure["info"]
    assert len(secure["history"]) == len(plain["history"]) == 6
    for a, b in zip(secure["history"], plain["history"]):
        assert np.isnan(a["primal_residual"])           # max_i‖x̂ − x_i‖ is not the server's to see
        assert abs(a["objective"] - b["objective"]) <= 1e-3 * abs(b["objective"])
    # the ledger books each client's x once per round upward, as plain FedAvg does
    assert secure["ledger"].floats[("c0", "server", "dald_cc_solve")] == 6 * D
    # four SecAgg+ stages per round, each one batch through the grid and counted in bytes
    assert flower.wire_bytes[("c1", "server", "dald_cc_solve")] > 0
    assert flower.trips["dald_cc_solve"] == 4 * 6


def test_secure_sum_refuses_values_outside_the_clipping_range(flower):
    """A model entry beyond ±clipping_range would be clipped silently by SecAgg+'s quantizer:
    the client refuses, and the run stops naming the clients and the setting."""
    prob, _ = _model(_parts(), constrained=False)
    flower.secure_sum = {"clipping_range": 1e-3}
    try:
        with pytest.raises(fm.FedModelError, match=r"(?s)secure sum of 'dald_cc_solve'.*c0: .*clipping range"):
            backends.FedAvg(step=0.05, max_rounds=2).run(prob, executor=flower)
    finally:
        flower.secure_sum = False
    with pytest.raises(fm.FedModelError, match="secure_sum"):
        flower.secure_sum = {"clipping": 1.0}
    with pytest.raises(fm.FedModelError, match="modulus_range"):
        flower.secure_sum = {"modulus_range": 1000}


def test_map_sum_default_is_the_sum_of_the_replies():
    """Executor.map_sum on the serial executor: Σ_i of each client's reply field."""
    from fedmodel.runtime.executor import SerialExecutor
    from fedmodel.runtime.program import compile_programs
    prob, _ = _model(_parts(), constrained=False)
    ex = SerialExecutor().start(compile_programs(prob))
    z = np.array([0.1, -0.2, 0.3])
    each = ex.map("merit", {c: {"x": z} for c in ex.clients})
    total = ex.map_sum("merit", ex.clients, {"x": z}, fields=("grad", "value"))
    np.testing.assert_allclose(total["grad"], sum(r["grad"] for r in each.values()), rtol=1e-14)
    assert total["value"] == pytest.approx(sum(r["value"] for r in each.values()), rel=1e-14)
    with pytest.raises(fm.FedModelError, match="not a declared numeric field"):
        ex.map_sum("merit", ex.clients, {"x": z}, fields=("hessian",))
    ex.close()


def _hang_c1_while_flagged() -> None:
    """c1's FedADMM round hangs while the file $FEDMODEL_TEST_HANG exists: a client that never
    returns. Installed wherever this module is imported (the driver and each Flower worker)."""
    serve = PROCEDURES["fedadmm_round"]
    if getattr(serve, "hangs", False):
        return

    def hanging(program, **payload):
        flag = os.environ.get(HANG_ENV)
        while program.name == "c1" and flag and os.path.exists(flag):
            time.sleep(0.05)
        return serve(program, **payload)
    hanging.hangs = True
    PROCEDURES["fedadmm_round"] = hanging


_hang_c1_while_flagged()


def _admm_model():
    """Least squares on three clients."""
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i, (A, b) in enumerate(_parts()):
        c = prob.add_client(f"c{i}")
        c.minimize(0.5 * fm.sum_squares(c.data(A, name="A") @ w - c.data(b, name="b")))
    return prob, w


def test_partial_participation_goes_on_without_a_lost_client(flower, tmp_path):
    """FedADMM with participation < 1: c1 stops answering after round 2; the run drops it when
    it misses its timeout and goes on with the others (its cached w_i, β_i stay in the server's
    average, as for any client not sampled; later rounds sample from the two left). Independent
    answer: the serial executor told to drop c1 at its first sampling after round 2."""
    from fedmodel.runtime.executor import SerialExecutor

    class DropsC1(SerialExecutor):
        armed = gone = False

        @property
        def lost(self):
            return frozenset({"c1"}) if self.gone else frozenset()

        def map(self, kind, payloads, missing="raise"):
            if missing == "drop":
                self.gone = self.gone or (self.armed and "c1" in payloads)
                payloads = {n: p for n, p in payloads.items() if n not in self.lost}
            return super().map(kind, payloads, missing)

    make = lambda: backends.FedADMM(participation=0.67, max_rounds=8, seed=2, tol=None)   # 2 of 3
    prob, w0 = _admm_model()
    serial_ex = DropsC1()
    serial = make().run(prob, executor=serial_ex,
                        callback=lambda r: setattr(serial_ex, "armed", r["round"] >= 2))
    flag = pathlib.Path(os.environ[HANG_ENV])
    prob, w = _admm_model()
    # 2 s from round 1's end on: the run's set-up requests start a cold simulation's ClientApps
    # (alone or first on an xdist worker every client missed 2 s on 'fedadmm_refusal')

    def shorten_then_hang_c1(record):
        flower.timeout = 2.0
        if record["round"] == 2:
            flag.touch()
    try:
        remote = make().run(prob, executor=flower, callback=shorten_then_hang_c1)
    finally:
        flower.timeout = 60
        flag.unlink(missing_ok=True)      # lets c1's hung call end (its late reply is ignored)
    assert remote["info"]["lost"] == serial["info"]["lost"] == ["c1"]
    assert flower.faults[-1]["node"] == "c1" and flower.faults[-1]["lost"]
    rounds = [h["participants"] for h in remote["history"]]
    lost_at = next(i for i, h in enumerate(remote["history"]) if "lost" in h)
    assert any("c1" in p for p in rounds[:lost_at]) and all("c1" not in p for p in rounds[lost_at:])
    assert rounds == [h["participants"] for h in serial["history"]] and len(rounds) == 8
    np.testing.assert_allclose(remote["values"][w.uid], serial["values"][w0.uid], rtol=0, atol=1e-8)
    for a, b in zip(remote["history"], serial["history"]):
        assert abs(a["objective"] - b["objective"]) <= 1e-8 * max(1.0, abs(b["objective"]))


def test_full_participation_stops_naming_the_lost_client(flower, tmp_path):
    """FedADMM with every client in every round has no rule to go on without one: NodeTimeout."""
    from fedmodel.runtime.flower.driver import NodeTimeout
    flag = pathlib.Path(os.environ[HANG_ENV])
    prob, _ = _admm_model()
    flower.timeout = 1.0
    try:
        with pytest.raises(NodeTimeout, match=r"\['c1'\].*fedadmm_round"):
            backends.FedADMM(max_rounds=4, tol=None).run(
                prob, executor=flower, callback=lambda r: r["round"] == 1 and flag.touch())
    finally:
        flower.timeout = 60
        flag.unlink(missing_ok=True)


@procedure("flower_test_sleep", {"seconds": "1", "done": "str"}, {}, read_only=True)
def _sleep_on_c1(program, seconds, done):
    """A client that does not answer in time: c1 sleeps, then touches the file `done` (when
    given); the others reply at once."""
    if program.name == "c1":
        time.sleep(seconds)
        if done:
            pathlib.Path(done).touch()
    return {}


install([_sleep_on_c1])     # (where this module is imported: the driver and each client)


def test_silent_client_fails_the_run_naming_it(flower, tmp_path):
    """Last in the module: c1's request is still running when the run stops (the simulation
    ends after it)."""
    from fedmodel.runtime.flower.driver import NodeTimeout
    from fedmodel.runtime.program import compile_programs
    prob, _ = _model(_parts(), constrained=False)
    flower.start(compile_programs(prob))
    # every node answers once first (a cold simulation — this test alone, or first on its xdist
    # worker — starts its ClientApps within the first request), then a timeout of 2 s, which the
    # others' replies meet on a loaded machine too
    flower.map("flower_test_sleep", {c: {"seconds": 0.0, "done": ""} for c in ("c0", "c1", "c2")})
    flower.timeout = 2.0
    done = tmp_path / "c1_woke"
    try:
        with pytest.raises(NodeTimeout, match=r"\['c1'\].*flower_test_sleep.*2 s"):
            flower.map("flower_test_sleep", {c: {"seconds": 10.0, "done": str(done)}
                                             for c in ("c0", "c1", "c2")})
        assert not done.exists()      # the run stopped at the timeout, while c1 still slept
    finally:
        flower.timeout = 60
        flower.close()
