"""Clients trust no bytes: the Flower ClientApp handler, called directly with crafted Messages
(as a malicious server or anyone on the SuperNode's channel could send them), refuses every
message that is not typed, declared data — a pickle whose unpickling would run code, an unknown
procedure, a module name, an oversized or mis-shaped array, a spec naming an unknown atom —
without executing anything, and logs it; the honest path (spec as JSON, arrays, plain-data
state) gives the serial program's numbers bitwise.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import time

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime import wire
from fedmodel.runtime.messages import install, procedure
from fedmodel.runtime.program import compile_programs
from fedmodel.runtime.spec_codec import decode_spec, encode_spec

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedmodel[flower]')")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict  # noqa: E402

from fedmodel.runtime.flower import client_app as capp, codec, driver  # noqa: E402

D = 3
CALLS: list[str] = []      # the probe procedure's calls in this process


@procedure("wire_test_probe", {"x": "x"}, {"value": "1"}, read_only=True)
def _probe(program, x):
    """A procedure that records that it ran (a refused request must never reach it)."""
    CALLS.append(program.name)
    return {"value": float(np.sum(x))}


install([_probe])       # (explicit registration: this process serves it)


class _Marker:
    """Unpickling this writes a file: proof that received bytes were executed."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _model(loader_dir=None):
    rng = np.random.default_rng(4)
    A, b = rng.normal(size=(8, D)), rng.normal(size=8)
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    c = prob.add_client("c0")
    if loader_dir is None:
        Ad, bd = c.data(A, name="A"), c.data(b, name="b")
    else:
        np.save(os.path.join(loader_dir, "A.npy"), A)
        np.save(os.path.join(loader_dir, "b.npy"), b)
        Ad = c.data(loader=lambda: A, shape=A.shape, name="A")
        bd = c.data(loader=lambda: b, shape=b.shape, name="b")
    c.minimize(0.5 * fm.sum_squares(Ad @ w - bd) + 0.1 * fm.sum(fm.logistic(Ad @ w)))
    c.subject_to(fm.sum(w) <= 0.3)
    return prob, A, b


def _message(content, kind="train", node=5):
    metadata = Metadata(run_id=1, message_id=f"m{time.monotonic_ns()}", src_node_id=0,
                        dst_node_id=node, reply_to_message_id="", group_id="",
                        created_at=time.time(), ttl=3600.0, message_type=kind)
    return Message(content, metadata=metadata)


def _context(data_dir=None, node=5):
    config = {"fedmodel-client": "c0"}
    if data_dir is not None:
        config["fedmodel-data"] = str(data_dir)
    return Context(run_id=1, node_id=node, node_config=config, state=RecordDict(), run_config={})


def _serve(content, context):
    """The handler's reply: (header, payload)."""
    return codec.decode(capp.serve_message(_message(content), context).content)


def _refused(content, context, caplog, match):
    """Assert the handler refused `content` (an error reply naming `match`, logged)."""
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger=capp.__name__):
        meta, reply = _serve(content, context)
    assert meta.get("failed"), reply
    assert reply["error"]["type"] == "WireError" and match in reply["error"]["message"], reply
    assert any("refused" in r.getMessage() for r in caplog.records)
    return reply["error"]["message"]


def _built(data_dir=None, ship=True):
    """A Flower context holding the compiled client program of `_model`, and that program as
    the serial executor compiles it."""
    program = compile_programs(_model()[0])["c0"]
    spec = compile_programs(_model(None if ship else str(data_dir))[0])["c0"]
    spec = getattr(spec, "spec", spec)
    payload = codec.build_payload(spec, driver._load_here if ship else (lambda d: None))
    context = _context(data_dir)
    meta, reply = _serve(codec.encode(codec.BUILD, payload), context)
    assert not meta.get("failed"), reply
    return context, program


def test_spec_round_trip_is_bitwise():
    """JSON spec → client program: the same merit, gradient and report bitwise."""
    prob, _, _ = _model()
    program = compile_programs(prob)["c0"]
    text, arrays = encode_spec(program.spec, lambda d: None)
    back = decode_spec(text, arrays).build()
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.normal(size=D)
        assert program.merit(x)["value"] == back.merit(x)["value"]
        np.testing.assert_array_equal(program.merit(x)["grad"], back.merit(x)["grad"])
        assert program.report(x) == back.report(x)
    assert json.loads(text)["format"] == "fedmodel.spec/1"


def test_honest_requests_are_served(tmp_path):
    """Build from the spec (arrays sent, simulation) and serve a declared request: the serial
    program's numbers bitwise; node state kept as plain-data JSON in Context.state."""
    context, program = _built()
    program.configure(beta=2.0, prox_weight=1.0, center=np.zeros(D))
    x = np.array([0.1, -0.2, 0.3])
    meta, reply = _serve(codec.encode("configure", {"beta": 2.0, "prox_weight": 1.0,
                                                 "center": np.zeros(D)}), context)
    assert not meta.get("failed"), reply
    meta, reply = _serve(codec.encode("merit", {"x": x}), context)
    assert reply["value"] == program.merit(x)["value"]
    np.testing.assert_array_equal(reply["grad"], program.merit(x)["grad"])
    state = context.state[capp.STATE]["state"]
    assert isinstance(state, str) and wire.loads(state)["beta"] == 2.0


def test_pickle_payloads_are_never_unpickled(tmp_path, caplog):
    """A pickle whose unpickling writes a file, in a request field (the old "pickled" form),
    as the build's spec and as node state: refused, and the file never appears."""
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Marker(str(marker)))
    context, _ = _built()
    header = json.dumps({"kind": "load_state", "none": [], "json": [], "scalar": [], "pickled": ["state"]})
    content = RecordDict({codec.ARRAYS: ArrayRecord({}),
                          codec.CONFIG: ConfigRecord({"state": evil, "fm_header": header})})
    _refused(content, context, caplog, "unknown header entries ['pickled']")
    header = json.dumps({"kind": "load_state", "none": [], "json": [], "scalar": []})
    content = RecordDict({codec.ARRAYS: ArrayRecord({}),
                          codec.CONFIG: ConfigRecord({"state": evil, "fm_header": header})})
    _refused(content, context, caplog, "bytes are refused")
    header = json.dumps({"kind": codec.BUILD, "none": [], "json": [], "scalar": []})
    content = RecordDict({codec.ARRAYS: ArrayRecord({}),
                          codec.CONFIG: ConfigRecord({"spec": evil, "fm_header": header})})
    _refused(content, _context(), caplog, "bytes are refused")
    # plain data has no pickle: a "state" JSON text naming a class is not a tag it knows
    _refused(RecordDict({
        codec.ARRAYS: ArrayRecord({}),
        codec.CONFIG: ConfigRecord({"state": json.dumps({"pickle": evil.hex()}), "fm_header": json.dumps(
            {"kind": "load_state", "none": [], "json": ["state"], "scalar": []})})}),
        context, caplog, "unknown tag 'pickle'")
    assert not marker.exists()


def test_unknown_procedures_and_module_names_are_refused(tmp_path, caplog):
    context, _ = _built()
    CALLS.clear()
    message = _refused(codec.encode("os.system", {"x": np.zeros(D)}), context, caplog,
                       "not a procedure this client")
    assert "'os.system'" in message
    # the old wire's module field: refused, nothing imported
    name = "fedmodel_wire_test_never_imported"
    content = codec.encode("wire_test_probe", {"x": np.zeros(D)}, extra={"module": name})
    _refused(content, context, caplog, "names a module")
    assert name not in __import__("sys").modules and CALLS == []
    # a declared procedure with a correct request runs (the probe is registered here)
    meta, reply = _serve(codec.encode("wire_test_probe", {"x": np.ones(D)}), context)
    assert reply == {"value": 3.0} and CALLS == ["c0"]


def test_oversized_and_misshaped_arrays_are_refused(caplog):
    context, _ = _built()
    CALLS.clear()
    _refused(codec.encode("wire_test_probe", {"x": np.zeros(D + 5)}), context, caplog,
             "field 'x' is an array of shape (8,), declared 'x'")
    _refused(codec.encode("wire_test_probe", {"x": np.zeros((D, 1))}), context, caplog,
             "shape (3, 1)")
    _refused(codec.encode("wire_test_probe", {"x": np.zeros(D), "extra": np.zeros(1)}), context,
             caplog, "undeclared field 'extra'")
    _refused(codec.encode("wire_test_probe", {"x": "abc"}), context, caplog, "carries str")
    assert CALLS == []


def test_spec_naming_an_unknown_atom_is_refused(caplog):
    prob, _, _ = _model()
    payload = codec.build_payload(compile_programs(prob)["c0"].spec, lambda d: None)
    assert '"atom":"SumSquares"' in payload["spec"]
    for bad, match in (("os.system", "is not one of fedmodel's atoms"),
                       ("__import__", "is not one of fedmodel's atoms")):
        forged = dict(payload, spec=payload["spec"].replace('"atom":"SumSquares"', f'"atom":"{bad}"'))
        _refused(codec.encode(codec.BUILD, forged), _context(), caplog, match)
    # an argument that is a later node (a cycle) and a data name that is a path
    doc = json.loads(payload["spec"])
    atom = next(i for i, n in enumerate(doc["nodes"]) if n["op"] == "atom")
    doc["nodes"][atom]["args"] = [atom]
    _refused(codec.encode(codec.BUILD, dict(payload, spec=json.dumps(doc))), _context(), caplog,
             "indices of earlier nodes")
    doc = json.loads(payload["spec"])
    data = next(n for n in doc["nodes"] if n["op"] == "data")
    data["name"], data["value"] = "../../etc/passwd", None
    _refused(codec.encode(codec.BUILD, dict(payload, spec=json.dumps(doc))), _context("/tmp"), caplog,
             "is not a plain name")


def test_client_data_comes_from_its_node_config(tmp_path):
    """Deployment: the spec carries no data; the client reads DIR/NAME.npy of its own node
    config, and a client without it fails naming the data and the client (DataError)."""
    context, program = _built(tmp_path, ship=False)
    x = np.array([0.3, 0.1, -0.4])
    meta, reply = _serve(codec.encode("merit", {"x": x}), context)
    assert reply["value"] == program.merit(x)["value"]
    prob, _, _ = _model(str(tmp_path))
    payload = codec.build_payload(compile_programs(prob)["c0"], lambda d: None)
    assert all(np.size(v) < 8 for k, v in payload.items() if k != "spec")   # no data in it
    meta, reply = _serve(codec.encode(codec.BUILD, payload), _context())
    assert meta["failed"] and reply["error"]["type"] == "DataError"
    with pytest.raises(fm.DataError, match="client 'c0'.*fedmodel-data"):
        codec.raise_remote("c0", codec.BUILD, reply["error"])


def test_replay_serves_declared_steps_only(caplog):
    """A rejoined client's replay (plain-data JSON steps): the same state as serving the steps
    one by one; a step of an unknown kind or with a mis-sized field refuses the whole replay."""
    context, program = _built()
    steps = [("configure", {"beta": 3.0, "prox_weight": 0.5, "center": np.full(D, 0.1)}),
             ("solve_local", {"linear": np.zeros(D), "weight": 1.0, "anchor": np.zeros(D),
                              "x0": np.zeros(D), "tol": 1e-10, "method": "lbfgs", "max_steps": 50.0,
                              "lr": None})]
    for kind, payload in steps:
        getattr(program, kind)(**payload)
    meta, reply = _serve(codec.encode(codec.REPLAY, {"steps": steps}), context)
    assert not meta.get("failed"), reply
    x = np.array([0.2, 0.0, -0.1])
    meta, reply = _serve(codec.encode("merit", {"x": x}), context)
    assert reply["value"] == program.merit(x)["value"]
    _refused(codec.encode(codec.REPLAY, {"steps": [("os.system", {})]}), context, caplog,
             "not a procedure this client")
    _refused(codec.encode(codec.REPLAY, {"steps": [("merit", {"x": np.zeros(D + 1)})]}), context, caplog,
             "has 4 numbers but is declared as 'x'")


@pytest.mark.integration   # (CI's integration run: the fast suite stays under 3 minutes)
def test_node_state_records_load_in_a_fresh_process():
    """A deployment serves each message in a new process: node state holding a backend's record
    (DP-ADMM's LaplaceObjective) decodes there although no backend was imported yet (the fixed
    list is loaded first, nothing named in the text is imported)."""
    import subprocess
    import sys
    from fedmodel.backends.dp_admm.client import LaplaceObjective
    text = wire.dumps({"layer": LaplaceObjective(1.0, "clip", 0.1)})
    code = ("import sys; import fedmodel.runtime.flower.client_app; "
            "from fedmodel.runtime.flower.codec import loads; "
            "assert 'fedmodel.backends.dp_admm.client' not in sys.modules; "
            "s = loads(sys.stdin.read(), 'state'); print(type(s['layer']).__name__, s['layer'].record_bound)")
    out = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True, text=True)
    assert out.stdout.split() == ["LaplaceObjective", "0.1"], out.stderr[-2000:]


def test_the_former_module_re_exports_the_package():
    """`fedmodel.runtime.flower_executor` (named by entry points, imports and the client.py of
    apps written before the split) gives the very objects of `fedmodel.runtime.flower`; the
    executor named "flower" is the driver's."""
    from fedmodel import registry
    from fedmodel.runtime import flower_executor as former
    rooms = (capp, codec, driver)
    for name in former.__all__:
        homes = [getattr(room, name) for room in rooms if hasattr(room, name)]
        assert homes and all(getattr(former, name) is home for home in homes), name
    assert former.client_app is capp.client_app and former.FlowerExecutor is driver.FlowerExecutor
    assert registry.lookup("executor", "flower") is driver.FlowerExecutor


def test_plain_data_codec_refuses_what_is_not_plain():
    with pytest.raises(wire.WireError, match="is not plain data"):
        wire.dumps({"f": len})
    with pytest.raises(wire.WireError, match="dtype"):
        wire.dumps(np.array([object()]))
    with pytest.raises(wire.WireError, match="unknown tag"):
        wire.loads('{"cls": "os.system"}')
    with pytest.raises(wire.WireError, match="bytes for a float64 array"):
        wire.loads('{"a": ["float64", [1000000], "AAAAAAAAAAA="]}')
    state = {"y": np.arange(3.0), 7: (1, 2.5, None), "rng": np.random.default_rng(1), "k": slice(0, 4, 2)}
    back = wire.loads(wire.dumps(state))
    np.testing.assert_array_equal(back["y"], state["y"])
    assert back[7] == (1, 2.5, None) and back["k"] == slice(0, 4, 2)
    assert back["rng"].random() == np.random.default_rng(1).random()


def _packed(kind, header_extra, config):
    """A crafted one-record message: `config` and a header with `header_extra` entries."""
    meta = {"kind": kind, "none": [], "json": [], "scalar": [], **header_extra}
    return RecordDict({codec.CONFIG: ConfigRecord({**config, "fm_header": json.dumps(meta)})})


def test_a_request_is_three_flower_objects_with_its_arrays_bitwise():
    """The message layout of a deployment: every array of a request in one bytes entry of its
    one ConfigRecord, so a message is 3 Flower objects (Message, RecordDict, ConfigRecord;
    each an HTTP request per hop) however many arrays it carries (on main: 4 + 2 per array,
    8 for FedADMM's two-array round); the arrays come back bitwise with their dtypes and
    shapes, scalars as numpy scalars, the rest as before."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    rng = np.random.default_rng(3)
    arrays = {"z": rng.normal(size=7), "u": np.array([np.nan, -0.0, np.inf, 5e-324, -1.5]),
              "m": rng.normal(size=(2, 3)).astype(np.float32), "i": np.arange(-3, 4, dtype=np.int64),
              "k": np.array([1, 2], dtype=np.uint8), "mask": np.array([True, False, True]),
              "e": np.zeros(0), "s": np.float64(-0.0), "t": np.int32(7)}
    payload = {**arrays, "rho": 2.5, "name": "gd", "none": None, "d": {"a": (1, 2)}}
    content = codec.encode("fedadmm_round", payload)
    assert set(content) == {codec.CONFIG}
    assert len(get_all_nested_objects(content)) == 2        # + the Message: 3 objects
    meta, back = codec.decode(content)
    assert set(back) == set(payload)
    for key, value in arrays.items():
        assert type(back[key]) is type(value) and back[key].dtype == value.dtype, key
        assert np.shape(back[key]) == np.shape(value), key
        assert np.asarray(back[key]).tobytes() == np.asarray(value).tobytes(), key   # bitwise
    assert back["z"].flags.writeable and back["m"].flags.c_contiguous
    assert (back["rho"], back["name"], back["none"], back["d"]) == (2.5, "gd", None, {"a": (1, 2)})
    # a two-array request (FedADMM's round: z and its multiplier) against the ArrayRecord form
    two = {"z": np.ones(5), "u": np.zeros(5)}
    assert len(get_all_nested_objects(codec.encode("k", two))) == 2
    assert len(get_all_nested_objects(codec.encode("k", two, pack=False))) == 7
    assert codec.wire_size(codec.encode("k", two)) < codec.wire_size(codec.encode("k", two, pack=False)) - 500
    # arrays beyond PACK_LIMIT in all go as an ArrayRecord (Flower chunks it); decoded the same
    big = np.arange(codec.PACK_LIMIT // 8 + 1, dtype=np.float64)
    content = codec.encode("k", {"x": big, "y": np.ones(2)})
    assert codec.ARRAYS in content
    _, back = codec.decode(content)
    assert back["x"].tobytes() == big.tobytes() and back["y"].tobytes() == np.ones(2).tobytes()


def test_packed_arrays_refuse_anything_but_their_declared_numbers(tmp_path, caplog):
    """The packed bytes are read as arrays of the header's whitelisted dtypes and shapes, and
    only if they add up exactly; undeclared or mis-sized fields are refused before the bytes
    are read; bytes anywhere else are refused as before; nothing is unpickled."""
    marker = tmp_path / "executed"
    evil = pickle.dumps(_Marker(str(marker)))
    x = np.arange(D, dtype=np.float64)
    calls = len(CALLS)

    def refused(extra, config, match):
        with pytest.raises(wire.WireError, match=match):
            codec.decode(_packed("wire_test_probe", extra, config))

    refused({"packed": [["x", "object", [1]]]}, {codec.PACKED: evil}, "dtype 'object'")
    refused({"packed": [["x", "float64", [D]]]}, {codec.PACKED: evil}, "packed bytes for arrays of")
    refused({"packed": [["x", "float64", [D]]]}, {codec.PACKED: x.tobytes() + b"\0"},
            "packed bytes for arrays of")
    refused({"packed": [["x", "float64", [-1]]]}, {codec.PACKED: b""}, "shape")
    refused({"packed": [["x", "float64", "3"]]}, {codec.PACKED: x.tobytes()}, "shape")
    refused({"packed": [["x", "float64", [D]]]}, {}, "need both")
    refused({}, {codec.PACKED: x.tobytes()}, "need both")
    refused({"packed": [["x", "float64", [D]]]}, {codec.PACKED: x.tobytes().hex()}, "need both")
    refused({"packed": "x"}, {codec.PACKED: x.tobytes()}, "not a list of")
    refused({"packed": [["x", "float64", [D]], ["x", "float64", [D]]]},
            {codec.PACKED: x.tobytes() * 2}, "twice")
    refused({"packed": [["x", "float64", [D]]]}, {codec.PACKED: x.tobytes(), "x": 1.0}, "twice")
    refused({"packed": [["m", "bool", [2]]]}, {codec.PACKED: b"\x01\x02"}, "bool array")
    refused({}, {"state": evil}, "bytes are refused")          # (the only bytes: the packed ones)
    # the receiver's limits run on the header's shapes before the bytes are read
    context, _ = _built()
    _refused(_packed("wire_test_probe", {"packed": [["x", "float64", [D + 1]]]},
                     {codec.PACKED: np.zeros(D + 1).tobytes()}), context, caplog, "refused unread")
    _refused(_packed("wire_test_probe", {"packed": [["extra", "float64", [1]], ["x", "float64", [D]]]},
                     {codec.PACKED: np.zeros(D + 1).tobytes()}), context, caplog, "undeclared field")
    assert not marker.exists() and len(CALLS) == calls
    meta, reply = _serve(_packed("wire_test_probe", {"packed": [["x", "float64", [D]]]},
                                 {codec.PACKED: x.tobytes()}), context)
    assert not meta.get("failed") and reply["value"] == 3.0 and len(CALLS) == calls + 1


MALICIOUS_SERVER = '''
"""A ServerApp that sends crafted messages to the fedmodel ClientApp of a real SuperNode."""
import json
import pickle
import time
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import ServerApp

import fedmodel as fm
from fedmodel.runtime.flower import codec
from fedmodel.runtime.program import compile_programs

MARKER = {marker!r}


class Marker:
    def __reduce__(self):
        return (open, (MARKER, "w"))


def _raw(kind, config, extra=None):
    header = json.dumps({{"kind": kind, "none": [], "json": [], "scalar": [], **(extra or {{}})}})
    return RecordDict({{codec.ARRAYS: ArrayRecord({{}}), codec.CONFIG: ConfigRecord({{**config, "fm_header": header}})}})


def _spec():
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    c = prob.add_client("c0")
    c.minimize(0.5 * fm.sum_squares(c.data(np.eye(3), name="A") @ w - c.data(np.ones(3), name="b")))
    return codec.build_payload(compile_programs(prob)["c0"].spec, lambda d: None)


app = ServerApp()


@app.main()
def main(grid, context):
    out = Path(str(context.run_config["out"]))
    deadline = time.monotonic() + 120
    while not list(grid.get_node_ids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    node = sorted(grid.get_node_ids())[0]
    spec = _spec()
    probes = [
        ("build", codec.encode(codec.BUILD, spec)),
        ("pickle", _raw(codec.BUILD, {{"spec": pickle.dumps(Marker())}}, {{"pickled": ["spec"]}})),
        ("pickle-bytes", _raw("load_state", {{"state": pickle.dumps(Marker())}})),
        ("module", codec.encode("merit", {{"x": np.zeros(3)}}, extra={{"module": "os"}})),
        ("unknown", codec.encode("os.system", {{"x": np.zeros(3)}})),
        ("oversized", codec.encode("merit", {{"x": np.zeros(10**6)}})),
        ("misshaped", codec.encode("merit", {{"x": np.zeros((3, 1))}})),
        ("atom", codec.encode(codec.BUILD, dict(spec, spec=spec["spec"].replace("SumSquares", "Evil")))),
        ("honest", codec.encode("merit", {{"x": np.zeros(3)}})),
    ]
    results = {{}}
    for name, content in probes:
        message = Message(content, dst_node_id=node, message_type="train")
        replies = codec.send_and_receive(grid, [message], 60)
        meta, payload = codec.decode(replies[0].content)
        results[name] = payload["error"] if meta.get("failed") else {{"ok": sorted(payload)}}
    out.write_text(json.dumps({{"probes": results}}))
'''


@pytest.mark.integration
def test_real_supernode_refuses_a_malicious_server(tmp_path):
    """A real flower-superlink and flower-supernode (fedmodel's ClientApp) with a malicious
    ServerApp: each crafted message is refused, the pickle's marker file never appears, and an
    honest request after them is still served."""
    from fedmodel.deploy import Deployment
    from test_flower_deploy import _data, _model_file
    model = _model_file(tmp_path, "backends.FedAvg(max_rounds=1)", n=1)
    marker = tmp_path / "pwned"
    dep = Deployment(model, 1, tmp_path / "work", timeout=60, data=_data(model))
    try:
        dep.start()
        (dep.app_dir / "fedmodel_app" / "server.py").write_text(MALICIOUS_SERVER.format(marker=str(marker)))
        result = dep.run(wait=600)["probes"]
    finally:
        dep.close()
    assert not marker.exists()
    # each refusal is logged on the client (its SuperNode's log)
    assert (dep.workdir / "supernode-c0.log").read_text().count("fedmodel client refused") == 7
    expected = {"pickle": "unknown header entries ['pickled']", "pickle-bytes": "bytes are refused",
                "module": "names a module", "unknown": "not a procedure this client",
                "oversized": "shape (1000000,)", "misshaped": "shape (3, 1)",
                "atom": "'Evil' is not one of fedmodel's atoms"}
    for name, text in expected.items():
        assert result[name]["type"] == "WireError" and text in result[name]["message"], (name, result[name])
    assert result["build"] == {"ok": ["n_shared"]} and result["honest"] == {"ok": ["grad", "value"]}


def test_node_state_after_a_newton_solve_is_plain_data_and_resumes_bitwise():
    """A node's saved state after Newton solves (its chord Hessian kept) travels as plain data
    (the factor is not kept: an `Inverse` does not travel) and a restored node takes the same
    next solve bit for bit (the factor is recomputed from the kept Hessian)."""
    rng = np.random.default_rng(0)
    w, prob = fm.Variable(4, name="w"), fm.Problem()
    c = prob.add_client("c0")
    X, y = rng.normal(size=(30, 4)), np.sign(rng.normal(size=30))
    c.minimize(fm.mean(fm.logistic(-fm.multiply(c.data(y, name="y"), c.data(X, name="X") @ w))))
    programs = [compile_programs(prob)["c0"] for _ in range(2)]
    solve = dict(linear=np.zeros(4), weight=1.0, anchor=np.zeros(4), tol=1e-12, method="newton")
    programs[0].solve_local(x0=np.zeros(4), **solve)
    state = wire.loads(wire.dumps(programs[0].save_state()))          # raises on non-plain data
    programs[1].load_state(state["state"])
    again = [p.solve_local(x0=np.full(4, 0.3), **solve)["x"] for p in programs]
    assert np.array_equal(again[0], again[1])
