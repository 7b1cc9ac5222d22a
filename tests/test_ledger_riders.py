"""Issue 27 item 4, fewest messages per round: a local read-only request (the history's
`report`) rides in the message of a request the round sends anyway (`executor.Rider`). The
iterates, histories and the algorithm's traffic stay bitwise those of the report sent by
itself; `Ledger.requests` (every request that reaches a client, local kinds included: a
deployment's batches) loses one request per round."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import backends
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.executor import Rider, SerialExecutor
from fedmodel.runtime.messages import install, procedure
from fedmodel.runtime.program import compile_programs
from conftest import StopRun, stop_after

D = 3


def _parts(n=3, m=6, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(m, D)), rng.normal(size=m)) for _ in range(n)]


def _model(constrained: bool):
    """Least squares over three clients' (A_i, b_i); constrained: a client and a server set."""
    parts = _parts()
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i, (A, b) in enumerate(parts):
        c = prob.add_client(f"c{i}")
        c.minimize(0.5 * fm.sum_squares(c.data(A, name="A") @ w - c.data(b, name="b")))
        if constrained:
            c.subject_to(fm.sum(w) <= 0.3)
    if constrained:
        prob.server.subject_to(fm.norm2(w) <= 0.6)
    return prob, w, parts


class _Unfolded(SerialExecutor):
    """The protocol before riders: a rider is sent as a request of its own (`map` /
    `map_stacked` of its kind) just before or after its carrier, as the backends did."""

    def _around(self, rider, nodes, send, stacked=False):
        def alone():
            if stacked:
                return self.map_stacked(rider.kind, nodes, common=rider.common)
            return self.map(rider.kind, {node: rider.payload(node) for node in nodes})
        got = alone() if rider.before else None
        replies = send()
        rider.replies = got if rider.before else alone()
        return replies


def _history(result) -> str:
    # (repr: equal floats bit for bit, NaN included; the wall clock left out)
    return repr([{k: v for k, v in h.items() if k != "time"} for h in result["history"]])


def check_report_rides(make, executor, rounds: int, key: str = "round",
                       constrained: bool = False) -> tuple[dict, dict]:
    """A run whose round reports ride on the next round's request against the same run on an
    executor sending each alone (`_Unfolded`): the same history (bit for bit on serial), the
    callback saw every round once, in order (records numbered by `key`), the last record's
    objective is the model's at the answer, and one report went alone. Returns (riding,
    unfolded) runs."""
    prob, w, parts = _model(constrained=constrained)
    seen_old, seen_new = [], []
    old = make().run(prob, executor=_Unfolded(), callback=lambda r: seen_old.append(dict(r)))
    new = make().run(prob, executor=executor, callback=lambda r: seen_new.append(dict(r)))
    assert len(new["history"]) == rounds
    if isinstance(executor, SerialExecutor) or executor == "serial":   # (batched sums: last bits)
        assert _history(new) == _history(old)
        np.testing.assert_array_equal(new["values"][w.uid], old["values"][w.uid])
        assert new["ledger"] == old["ledger"]       # the algorithm's traffic: the same
    else:
        np.testing.assert_allclose([h["objective"] for h in new["history"]],
                                   [h["objective"] for h in old["history"]], rtol=1e-12)
    assert [r[key] for r in seen_new] == list(range(1, rounds + 1))
    assert [r["objective"] for r in seen_new] == [h["objective"] for h in new["history"]]
    x = new["values"][w.uid]                        # (independent: numpy)
    expected = sum(0.5 * float(np.sum((A @ x - b) ** 2)) for A, b in parts)
    assert abs(new["history"][-1]["objective"] - expected) <= 1e-9 * max(1.0, expected)
    assert old["ledger"].requests["report"] == rounds and new["ledger"].requests["report"] == 1
    return new, old


@pytest.mark.parametrize("executor", [SerialExecutor, BatchedExecutor])
def test_fedadmm_report_rides_on_the_next_rounds_request(executor):
    """Round k's report (at z_k) travels in round k + 1's `fedadmm_round`, served before its
    step; only the last round's goes by itself. R = 8 rounds: 8 report requests → 1."""
    rounds = 8
    new, old = check_report_rides(lambda: backends.FedADMM(max_rounds=rounds, seed=2, tol=None), executor(), rounds)
    assert new["ledger"].requests["fedadmm_round"] == old["ledger"].requests["fedadmm_round"] == rounds
    assert sum(new["ledger"].requests.values()) == sum(old["ledger"].requests.values()) - (rounds - 1)
    assert new["ledger"].round_trips == old["ledger"].round_trips == 1 + rounds


def test_fedadmm_thinned_reports_and_partial_participation_keep_their_requests():
    """`report_every=3`: the reports of rounds 3 and 6 ride on rounds 4 and 7 (NaN between);
    partial participation asks the clients' report by itself (its rounds reach a sample)."""
    prob, w, _ = _model(constrained=False)
    thin = lambda: backends.FedADMM(max_rounds=7, seed=2, tol=None, report_every=3)
    old, new = thin().run(prob, executor=_Unfolded()), thin().run(prob, executor="serial")
    assert _history(new) == _history(old)
    assert np.isnan(new["history"][0]["objective"]) and np.isfinite(new["history"][2]["objective"])
    assert old["ledger"].requests["report"] == 2 and new["ledger"].requests["report"] == 0
    partial = lambda: backends.FedADMM(participation=0.67, max_rounds=5, seed=2, tol=None)
    old, new = partial().run(prob, executor=_Unfolded()), partial().run(prob, executor="serial")
    assert _history(new) == _history(old)
    assert new["ledger"].requests["report"] == old["ledger"].requests["report"] == 5


def test_proxal_report_rides_on_update_multipliers():
    """ProxAL's report at w_{k+1} travels with `update_multipliers` (served after it); the
    history (objective, violation per node) and the answer bit for bit as before."""
    prob, w, _ = _model(constrained=True)
    make = lambda: backends.ProxAL(beta=10.0, rho=1.0, max_outer=4, max_inner=10)
    old, new = make().run(prob, executor=_Unfolded()), make().run(prob, executor="serial")
    outer = len(new["history"])
    assert outer == 4
    assert _history(new) == _history(old)
    np.testing.assert_array_equal(new["values"][w.uid], old["values"][w.uid])
    assert new["ledger"] == old["ledger"]
    # ("proxal_report": "report" and the complementarity of the stop, `proxal_outer.settled`)
    assert old["ledger"].requests["proxal_report"] == outer and new["ledger"].requests["proxal_report"] == 0
    assert new["ledger"].requests["update_multipliers"] == outer
    # the record: the nodes' own objective at the iterate and the largest violation of the
    # sets (the clients' sum(w) ≤ 0.3, the server's ‖w‖₂ ≤ 0.6; independent: numpy)
    x = new["values"][w.uid]
    expected = sum(0.5 * float(np.sum((A @ x - b) ** 2)) for A, b in _parts())
    assert abs(new["history"][-1]["objective"] - expected) <= 1e-9 * max(1.0, expected)
    violation = max(0.0, float(np.sum(x)) - 0.3, float(np.linalg.norm(x)) - 0.6)
    assert abs(new["history"][-1]["violation"] - violation) <= 1e-9


@pytest.mark.parametrize("options, alone", [({}, 0), ({"variant": "objT"}, 0), ({"log_every": 3}, 0),
                                             ({"variant": "outP"}, 1)])
def test_dp_admm_report_rides_on_the_rounds_step(options, alone):
    """DP-ADMM (ObjP, ObjT): a logged round's report at w^{t+1} travels with that round's
    `dp_admm_step`, which carries w^{t+1}; OutP's step carries w^t, so its report rides on the
    next round's step (tests/test_dp_admm_riders.py), the last one alone. The history and the
    answer (noise included) bit for bit as before."""
    prob, w, _ = _model(constrained=False)
    make = lambda: backends.DPADMM(epsilon=1.0, max_rounds=7, seed=3, tol=0, **options)
    old, new = make().run(prob, executor=_Unfolded()), make().run(prob, executor="serial")
    assert _history(new) == _history(old) and len(new["history"]) == (3 if options.get("log_every") else 7)
    np.testing.assert_array_equal(new["values"][w.uid], old["values"][w.uid])
    assert new["ledger"] == old["ledger"]
    assert old["ledger"].requests["report"] == len(old["history"])
    assert new["ledger"].requests["report"] == alone
    assert new["ledger"].requests["dp_admm_step"] == 7


# ---- the mechanism, on two test procedures: a state change and a peek at the state ----------------
@procedure("riders_bump", {"by": "1"}, {"count": "1"})
def _bump(program, by):
    program.state["bumped"] = program.state.get("bumped", 0.0) + float(by)
    return {"count": program.state["bumped"]}


@procedure("riders_peek", {"scale": "1"}, {"seen": "1"}, local=True, read_only=True)
def _peek(program, scale):
    return {"seen": float(scale) * program.state.get("bumped", 0.0)}


@pytest.mark.parametrize("executor", [SerialExecutor, BatchedExecutor])
def test_a_rider_is_served_before_or_after_its_carrier(executor):
    install([_bump, _peek])
    prob, _, _ = _model(constrained=False)
    with executor().start(compile_programs(prob)) as ex:
        clients = ex.clients
        before = Rider("riders_peek", {"scale": 10.0}, before=True)
        ex.map("riders_bump", {c: {"by": 1.0} for c in clients}, rider=before)
        assert before.replies == {c: {"seen": 0.0} for c in clients}     # the state before
        after = Rider("riders_peek", payloads={c: {"scale": float(i + 1)} for i, c in enumerate(clients)})
        replies = ex.map_stacked("riders_bump", clients, common={"by": 2.0}, rider=after)
        np.testing.assert_array_equal(replies["count"], [3.0, 3.0, 3.0])
        np.testing.assert_array_equal(after.replies["seen"], [3.0, 6.0, 9.0])      # after: 3 each
        assert dict(ex.ledger.requests) == {"riders_bump": 2}
        assert ex.ledger.round_trips == 2


def test_only_a_local_read_only_kind_may_ride():
    install([_bump, _peek])
    prob, _, _ = _model(constrained=False)
    with SerialExecutor().start(compile_programs(prob)) as ex:
        x = np.zeros(D)
        with pytest.raises(fm.FedModelError, match="cannot ride on another request"):
            ex.map("merit", {c: {"x": x} for c in ex.clients}, rider=Rider("riders_bump", {"by": 1.0}))
        with pytest.raises(fm.FedModelError, match="undeclared field 'y'"):
            ex.map("merit", {c: {"x": x} for c in ex.clients}, rider=Rider("report", {"y": x}))
        assert all("bumped" not in ex.programs[c].state for c in ex.clients)    # nothing served


def test_a_rider_on_the_wire():
    """Flower's message: the rider's fields prefixed in the carrier's request (its kind and
    order in the header), checked against the rider's declaration before anything is read."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedmodel[flower]')")
    from fedmodel.runtime.flower.codec import (array_limits, decode, encode, header, rider_of,
                                               split_rider, with_rider)
    from fedmodel.runtime.messages import MESSAGES
    from fedmodel.runtime.wire import WireError
    z = np.arange(4.0)
    content = encode("merit", with_rider({"x": z}, {"x": 2 * z}), extra={"ride": ["report", True]})
    meta = header(content)
    assert rider_of(meta) == ("report", True)
    _, payload = decode(content, array_limits(MESSAGES["merit"], 4, MESSAGES["report"]))
    own, ridden = split_rider(payload)
    np.testing.assert_array_equal(own["x"], z)
    np.testing.assert_array_equal(ridden["x"], 2 * z)
    wrong = encode("merit", with_rider({"x": z}, {"x": np.arange(5.0)}), extra={"ride": ["report", False]})
    with pytest.raises(WireError, match="'report'"):
        decode(wrong, array_limits(MESSAGES["merit"], 4, MESSAGES["report"]))
    with pytest.raises(WireError, match="not \\[kind, before\\]"):
        rider_of(header(encode("merit", {"x": z}, extra={"ride": "report"})))


@pytest.mark.parametrize("make", [
    lambda: backends.FedADMM(max_rounds=9, seed=5, tol=None),
    lambda: backends.DPADMM(epsilon=1.0, max_rounds=9, seed=5, tol=0, variant="outP")],   # (w^{t+1} rides)
    ids=["fedadmm", "dp-admm-outP"])
def test_with_checkpoints_each_report_is_asked_before_its_checkpoint(tmp_path, make):
    """Round k's callback runs before checkpoint k is written (docs/checkpoints.md), so a run
    that checkpoints asks each round's report at the end of its round, by itself, as before
    riders: a callback that stops the run at round 6 leaves checkpoint 4, and the resumed run
    ends bit for bit as the uninterrupted one (which sent one report alone)."""
    prob, w, _ = _model(constrained=False)
    reference = prob.solve(make())

    path = tmp_path / "run.ckpt"
    with pytest.raises(StopRun):
        prob.solve(make(), checkpoint=path, checkpoint_every=2, callback=stop_after(6))
    from fedmodel.runtime import checkpoint as ck
    saved = ck.read(path)
    assert saved["iteration"] == 4 and all("objective" in h for h in saved["loop"]["history"])
    seen = []
    resumed = prob.solve(make(), checkpoint=path, resume=True, callback=seen.append)
    assert [r["round"] for r in seen] == [5, 6, 7, 8, 9]
    assert _history({"history": resumed.history}) == _history({"history": reference.history})
    np.testing.assert_array_equal(resumed.value(w), reference.value(w))
    assert resumed.ledger.requests["report"] == 9      # (the ledger resumed with the run)
    assert reference.ledger.requests["report"] == 1
