"""Issue 27 items 1/4 for FedAvg and FedProx: fewer round trips a round. Without the consensus
multiplier step (15) (μ ≡ 0), what is left of a round's Step 2 is the clients' own constraint
multipliers at the x̂ of the round's solve (`cc_nodes._own_at_xhat`), which the request brought: it is done in
the round's solve request (`dald_cc_solve` with `own`) instead of a `dald_cc_dual` request of its
own. The reference is the same backend with `one_message=False` (the two-message round, as
before). Histories and answers bit for bit as before; the ledger's round trips drop from
2 + 2R to 2 + R (set-up: the curvature estimate and `dald_cc_init`), and to 1 + R with the
set-up in the first solve request (tests/test_riders_setup.py).

The history's report (objective, violation at x̂^k; a local kind, so no round trip in the
ledger, but a request — a Flower batch — of its own) rides on round k + 1's solve request,
which carries x̂^k (`executor.Rider`); the reference is an executor that sends each rider alone
(`_Unfolded`, as in tests/test_ledger_riders.py)."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import backends
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.executor import SerialExecutor
from test_ledger_riders import _Unfolded


class _UnfoldedBatched(BatchedExecutor):
    """The batched executor sending each rider as a request of its own (as `_Unfolded`)."""

    _around = _Unfolded._around


ROUNDS = 12


def _boxes(n: int = 4):
    """Least-squares clients whose boxes [−1 + 0.4i, 1 + 0.4i]³ overlap in [0.2, 1]³; the data
    pull w above 1, so the boxes act (the clients' multipliers move every round). The bounds
    are client data, so the clients hold them (constant boxes the server projects on)."""
    rng = np.random.default_rng(0)
    w = fm.Variable(3, name="w")
    prob = fm.Problem(name="boxes")
    for i in range(n):
        client = prob.add_client(f"c{i}")
        A, b = rng.standard_normal((10, 3)), rng.standard_normal(10) + 3
        client.minimize(fm.sum_squares(client.data(A, name="A") @ w - client.data(b, name="b")))
        client.subject_to(w >= client.data(np.full(3, -1.0 + 0.4 * i), name="low"),
                          w <= client.data(np.full(3, 1.0 + 0.4 * i), name="high"))
    return prob, w


def _history(result) -> str:
    # (repr: equal floats bit for bit, NaN included; the wall clock left out)
    return repr([{k: v for k, v in h.items() if k != "time"} for h in result["history"]])


def _make(name: str, one_message: bool = True, **options):
    backend = getattr(backends, name)(max_rounds=ROUNDS, tol=0.0, **options)
    backend.one_message = one_message        # False: Step 2 as a request of its own (before)
    return backend


@pytest.mark.parametrize("executor", ["serial", "batched"])
@pytest.mark.parametrize("name", ["FedAvg", "FedProx"])
def test_the_clients_multiplier_step_rides_in_the_solve_request(name, executor):
    prob, w = _boxes()
    old = _make(name, one_message=False).run(prob, executor=executor)
    new = _make(name).run(prob, executor=executor)
    assert len(new["history"]) == ROUNDS
    assert _history(new) == _history(old)
    np.testing.assert_array_equal(new["values"][w.uid], old["values"][w.uid])
    # the multipliers did move every round (the step is not an empty one), as before
    assert all(h["constraint_residual"] > 1e-3 for h in new["history"])
    assert old["ledger"].trips["dald_cc_dual"] == ROUNDS and "dald_cc_dual" not in new["ledger"].trips
    assert new["ledger"].trips["dald_cc_solve"] == old["ledger"].trips["dald_cc_solve"] == ROUNDS
    # (the clients' check of their own bounds, which are data; the curvature; the set-up in the
    # first solve)
    assert old["ledger"].round_trips == 2 + 2 * ROUNDS
    assert new["ledger"].round_trips == 2 + ROUNDS


def test_the_clients_multipliers_end_as_before():
    """The clients' own multipliers (what the KKT certificate reads) after the last round:
    the same arrays, and the gathered result's certificate the same numbers."""
    prob, w = _boxes()
    old = prob.solve(_make("FedProx", one_message=False))
    new = prob.solve(_make("FedProx"))
    assert set(new.multipliers) == set(old.multipliers) and new.multipliers
    for name, value in old.multipliers.items():
        np.testing.assert_array_equal(np.asarray(new.multipliers[name]), np.asarray(value))
    assert np.max(np.abs(np.concatenate([np.ravel(v) for v in new.multipliers.values()]))) > 1e-2
    assert new.ledger.round_trips == old.ledger.round_trips - ROUNDS


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_a_capped_run_is_still_stalled_with_one_round_trip_a_round(name):
    """Issue 25 item 4's honest status after the change: at a cap of 5 rounds client 3's box is
    violated by 0.17–0.19 at the average (its fixed point keeps each box at the client's own
    iterate), so the run says "stalled" and names the box; 5 rounds cost 1 + 5 round trips, and
    1 more for the clients' check of their own bounds (data) before the run."""
    prob, w = _boxes()
    with pytest.warns(RuntimeWarning, match="round cap"):
        result = prob.solve(name, max_rounds=5)
    assert result.status == "stalled" and 0.1 < result.max_violation < 0.3
    assert list(result.info["violated"])[0].startswith("c3.con0")
    assert result.ledger.round_trips == 1 + 1 + 5 and "dald_cc_dual" not in result.ledger.trips


@pytest.mark.parametrize("executor", [_Unfolded, _UnfoldedBatched])
@pytest.mark.parametrize("name", ["FedAvg", "FedProx"])
def test_the_report_rides_on_the_next_rounds_solve(name, executor):
    """R = 12 rounds: 12 report requests → 1 (the last round's, alone); the callback sees every
    round once, in order, with its objective; the histories bit for bit those of the reports
    sent alone."""
    prob, w = _boxes()
    folded = SerialExecutor if executor is _Unfolded else BatchedExecutor
    seen_old, seen_new = [], []
    old = _make(name).run(prob, executor=executor(), callback=lambda r: seen_old.append(dict(r)))
    new = _make(name).run(prob, executor=folded(), callback=lambda r: seen_new.append(dict(r)))
    assert _history(new) == _history(old)
    np.testing.assert_array_equal(new["values"][w.uid], old["values"][w.uid])
    assert _history({"history": seen_new}) == _history({"history": seen_old})
    assert [r["iteration"] for r in seen_new] == list(range(1, ROUNDS + 1))
    assert [r["objective"] for r in seen_new] == [h["objective"] for h in new["history"]]
    assert all(np.isfinite(r["objective"]) and np.isfinite(r["violation"]) for r in seen_new)
    # each record's objective is the model's at that round's x̂ (independent: numpy at the last)
    x = new["values"][w.uid]
    rng = np.random.default_rng(0)
    expected = sum(float(np.sum((A @ x - b) ** 2)) for A, b in
                   ((rng.standard_normal((10, 3)), rng.standard_normal(10) + 3) for _ in range(4)))
    assert abs(new["history"][-1]["objective"] - expected) <= 1e-9 * expected
    assert old["ledger"].requests["report"] == ROUNDS and new["ledger"].requests["report"] == 1
    assert sum(new["ledger"].requests.values()) == sum(old["ledger"].requests.values()) - (ROUNDS - 1)
    # (+ 1: the clients' check of their own bounds, which are data, before the run)
    assert new["ledger"].round_trips == old["ledger"].round_trips == 1 + 1 + ROUNDS


def test_with_checkpoints_each_report_goes_before_its_checkpoint(tmp_path):
    """A run that checkpoints asks each round's report at the end of its round, by itself (the
    callback runs before the checkpoint is written): the same history, R report requests."""
    prob, w = _boxes()
    plain = prob.solve(_make("FedAvg"))
    saved = prob.solve(_make("FedAvg"), checkpoint=tmp_path / "run.ckpt", checkpoint_every=3)
    assert _history({"history": saved.history}) == _history({"history": plain.history})
    assert saved.ledger.requests["report"] == ROUNDS and plain.ledger.requests["report"] == 1


@pytest.mark.integration      # Flower's simulation engine (CI runs it after the fast suite)
def test_on_flower_one_batch_a_round():
    """On Flower's simulation engine the `own` field and the previous round's report travel in
    the round's `dald_cc_solve` Message: no `dald_cc_dual` batch, one `report` batch (the last
    round's); the iterates and the history's objectives those of the serial executor."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedmodel[flower]')")
    pytest.importorskip("ray", reason="Flower's simulation engine needs Ray")
    from fedmodel.runtime.flower.driver import FlowerExecutor
    prob, w = _boxes(n=3)
    serial = _make("FedProx", step=0.01).run(prob, executor="serial")
    flower = FlowerExecutor(timeout=60)
    try:
        remote = _make("FedProx", step=0.01).run(prob, executor=flower)
        trips = dict(flower.trips)
    finally:
        flower.shutdown()
    assert trips["dald_cc_solve"] == ROUNDS and "dald_cc_dual" not in trips and trips["report"] == 1
    # (step given; + 1: the clients' check of their own bounds, data, before the run)
    assert remote["ledger"].round_trips == serial["ledger"].round_trips == 1 + ROUNDS
    np.testing.assert_allclose(remote["values"][w.uid], serial["values"][w.uid], rtol=0, atol=1e-12)
    np.testing.assert_allclose([h["constraint_residual"] for h in remote["history"]],
                               [h["constraint_residual"] for h in serial["history"]], rtol=1e-12, atol=0)
    np.testing.assert_allclose([h["objective"] for h in remote["history"]],
                               [h["objective"] for h in serial["history"]], rtol=1e-12, atol=0)
