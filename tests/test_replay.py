"""What the remote executors share (issue 26, item 4): the replay log that brings a rebuilt client
back (`fedmodel/runtime/replay.py`, used by the Ray and Flower executors) and
`Executor.map(kind, payloads, missing="raise" | "drop")`, the one map that may go on without a
client (it replaced Flower's own `map_available`). No Ray or Flower here: a rebuilt program is
a program compiled again from its spec, a lost client one that a test executor never asks.
"""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime import wire
from fedmodel.runtime.executor import SerialExecutor, run_on_node
from fedmodel.runtime.program import compile_programs
from fedmodel.runtime.replay import ReplayLog

D = 3


def _model(n=1):
    """Least squares with a logistic term and a local constraint on n clients."""
    rng = np.random.default_rng(4)
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i in range(n):
        A, b = rng.normal(size=(8, D)), rng.normal(size=8)
        c = prob.add_client(f"c{i}")
        Ad, bd = c.data(A, name="A"), c.data(b, name="b")
        c.minimize(0.5 * fm.sum_squares(Ad @ w - bd) + 0.1 * fm.sum(fm.logistic(Ad @ w)))
        c.subject_to(fm.sum(w) <= 0.3)
    return prob


def _configure(beta, center):
    return ("configure", {"beta": beta, "prox_weight": 1.0 / beta, "center": np.full(D, center)})


def _solve(x0):
    return ("solve_local", {"linear": np.full(D, 0.1), "weight": 1.0, "anchor": np.zeros(D),
                            "x0": np.full(D, x0), "tol": 1e-10, "method": "lbfgs",
                            "max_steps": 50.0, "lr": None})


def _state_text(program) -> str:
    return wire.dumps(program.save_state()["state"])


# ---- the log -----------------------------------------------------------------------------------------
def test_the_log_keeps_state_changing_requests_since_the_last_snapshot():
    log = ReplayLog()
    log.start(["c0", "c1"])
    configure, solve = _configure(2.0, 0.1), _solve(0.0)
    log.record("c0", *configure)
    log.record("c0", "merit", {"x": np.zeros(D)})        # read-only: never replayed
    log.record("c0", *solve)
    log.record("c1", "report", {"x": np.zeros(D)})       # read-only
    assert log.steps("c0") == [configure, solve] and log.steps("c1") == []
    assert log.due(["c0", "c1"], 2) == ["c0"]
    assert log.due(["c0", "c1"], 3) == [] and log.due(["c0", "c1"], 0) == []   # 0: never
    log.snapshot("c0", {"beta": 2.0})
    assert log.steps("c0") == [("load_state", {"state": {"beta": 2.0}})]
    log.record("c0", *configure)
    assert log.steps("c0") == [("load_state", {"state": {"beta": 2.0}}), configure]
    # the bookkeeping record: requests to replay since the snapshot, and when
    fault = log.fault("c0", "solve_local", reason="actor died", restart=1)
    assert list(fault) == ["node", "kind", "reason", "restart", "replayed", "time"]
    assert (fault["node"], fault["kind"], fault["restart"], fault["replayed"]) == ("c0", "solve_local", 1, 1)
    dropped = log.fault("c1", "merit", replay=False, lost=True)
    assert "replayed" not in dropped and dropped["lost"]
    assert log.faults == [fault, dropped] and fault["time"] <= dropped["time"]
    log.start(["c0"])       # a new run: built again, nothing to replay, no faults
    assert log.steps("c0") == [] and log.faults == []


@pytest.mark.parametrize("snapshot_after", [None, 1, 3])
def test_replaying_the_log_on_a_rebuilt_program_restores_its_state(snapshot_after):
    """A run's state-changing requests (and read-only ones between them), logged with a
    snapshot after `snapshot_after` requests or none: a freshly compiled program given
    `steps` holds the original's state bitwise (same state record, merit and gradient)."""
    programs = compile_programs(_model())
    ex = SerialExecutor().start(programs)
    log = ReplayLog()
    log.start(["c0"])
    requests = [_configure(2.0, 0.1), _solve(0.0), ("merit", {"x": np.ones(D)}),
                _configure(5.0, -0.2), _solve(0.3)]
    for count, (kind, payload) in enumerate(requests, 1):
        ex.call("c0", kind, **payload)
        log.record("c0", kind, payload)
        if count == snapshot_after:
            log.snapshot("c0", ex.call("c0", "save_state")["state"])
    original = ex.programs["c0"]
    rebuilt = original.spec.build()     # (as a new actor or a rejoined SuperNode builds it)
    x = np.array([0.2, -0.1, 0.4])
    assert rebuilt.merit(x)["value"] != original.merit(x)["value"]    # (the requests changed it)
    steps = log.steps("c0")
    assert len(steps) == {None: 4, 1: 4, 3: 3}[snapshot_after]
    for kind, payload in steps:
        run_on_node(rebuilt, kind, payload)
    assert _state_text(rebuilt) == _state_text(original)
    assert rebuilt.merit(x)["value"] == original.merit(x)["value"]
    np.testing.assert_array_equal(rebuilt.merit(x)["grad"], original.merit(x)["grad"])


# ---- map(missing=...) --------------------------------------------------------------------------------
class _LosesC1(SerialExecutor):
    """An executor that can lose a client: c1 never answers a request that may go without it."""

    dropped: frozenset = frozenset()

    @property
    def lost(self) -> frozenset:
        return self.dropped

    def _dispatch_available(self, kind, payloads):
        self.dropped = self.dropped | ({"c1"} & set(payloads))
        return self._dispatch_batch(kind, {n: p for n, p in payloads.items() if n != "c1"})


def test_map_drop_leaves_a_lost_client_out_and_refuses_it_later():
    x = np.array([0.2, -0.1, 0.4])
    serial = SerialExecutor().start(compile_programs(_model(3)))
    expected = serial.map("merit", {c: {"x": x} for c in ("c0", "c1", "c2")})
    ex = _LosesC1().start(compile_programs(_model(3)))
    replies = ex.map("merit", {c: {"x": x} for c in ("c0", "c1", "c2")}, missing="drop")
    assert sorted(replies) == ["c0", "c2"] and ex.lost == {"c1"}
    for node in replies:
        assert replies[node]["value"] == expected[node]["value"]
    # every request sent is booked, and only the replies that came (D + 1 floats each)
    messages, floats = ex.ledger.messages, ex.ledger.floats
    assert [messages[("server", c, "merit")] for c in ("c0", "c1", "c2")] == [1, 1, 1]
    assert [messages[(c, "server", "merit")] for c in ("c0", "c1", "c2")] == [1, 0, 1]
    assert floats[("c0", "server", "merit")] == D + 1 and ex.ledger.round_trips == 1
    # a lost client is refused before anything is sent or booked
    with pytest.raises(fm.FedModelError, match=r"\['c1'\] were dropped earlier.*'merit'"):
        ex.map("merit", {"c0": {"x": x}, "c1": {"x": x}})
    assert ex.ledger.messages[("server", "c0", "merit")] == 1
    assert ex.map("merit", {"c0": {"x": x}})["c0"]["value"] == expected["c0"]["value"]


def test_map_missing_is_raise_or_drop():
    x = np.zeros(D)
    ex = SerialExecutor().start(compile_programs(_model(2)))
    payloads = {c: {"x": x} for c in ("c0", "c1")}
    raised = ex.map("merit", payloads)
    # in this process every node answers: both are the same, and the old name is "drop"
    for replies in (ex.map("merit", payloads, missing="raise"),
                    ex.map("merit", payloads, missing="drop"), ex.map_available("merit", payloads)):
        assert sorted(replies) == ["c0", "c1"]
        for node in replies:
            assert replies[node]["value"] == raised[node]["value"]
            np.testing.assert_array_equal(replies[node]["grad"], raised[node]["grad"])
    assert ex.ledger.messages[("server", "c0", "merit")] == 4
    with pytest.raises(fm.FedModelError, match=r"missing must be 'raise' or 'drop', got 'skip'"):
        ex.map("merit", payloads, missing="skip")
    assert ex.ledger.messages[("server", "c0", "merit")] == 4    # refused before it was sent
