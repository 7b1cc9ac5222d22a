"""Issue 27, item 1: the round-trip benchmark's harness (benchmarks/bench_rounds.py) on one tiny
case: its records carry the ledger's round trips and per-client traffic of the very run, the
verification against CVXPY, and its table shows them; a run over its time is "timeout", a
model a backend refuses is "refused". (Before: there was no such harness; on main the import
of benchmarks.bench_rounds fails.)"""
from __future__ import annotations

import json

import pytest

import fedmodel as fm
from benchmarks import bench_rounds


@pytest.mark.integration      # ~20 s on a loaded 2-core machine (CVXPY + two solves + by hand)
def test_records_carry_the_ledger_of_the_run(tmp_path):
    out = tmp_path / "rounds.jsonl"
    bench_rounds.main(["--models", "ridge", "--n", "3", "--backends", "fedadmm", "cproxal",
                       "--out", str(out), "--timeout", "120"])
    records = {r["backend"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == {"fedadmm", "cproxal"}
    # the same run by hand: FedADMM's defaults are deterministic
    prob, _ = bench_rounds.ridge(3)
    res = prob.solve("fedadmm")
    total = res.ledger.total()
    fed = records["fedadmm"]
    assert fed["outcome"] == "ok" and fed["verified"] is True and fed["n"] == 3
    # round trips: the ledger's count (FedADMM: its set-up exchange + one per round)
    assert fed["round_trips"] == res.ledger.round_trips == res.info["communication"]["round_trips"]
    assert fed["round_trips"] == res.iterations["rounds"] + 1
    assert fed["rounds"] == res.ledger.rounds == res.iterations["rounds"] > 0
    assert fed["messages_per_client"] == pytest.approx(total["messages"] / 3, rel=1e-12)
    assert fed["floats_per_client"] == pytest.approx(total["floats"] / 3, rel=1e-12)
    assert fed["cvxpy_s"] > 0 and fed["wall_s"] > 0 and fed["cpu_s"] > 0
    assert records["cproxal"]["rounds"] == 0 and records["cproxal"]["verified"] is True
    text = bench_rounds.table(bench_rounds.load(out))
    row = next(line for line in text.splitlines() if "| fedadmm |" in line)
    cells = [c.strip() for c in row.split("|")]
    assert cells[4].strip("*") == str(res.ledger.round_trips) and cells[5] == "yes"
    assert "0 (centralized)" in text
    # a record made before the ledger counted round trips shows the backend's count, marked
    old = {k: v for k, v in fed.items() if k not in ("round_trips", "trips_by_kind", "floats_max")}
    row = next(line for line in bench_rounds.table([old]).splitlines() if "| fedadmm |" in line)
    assert row.split("|")[4].strip() == f"{res.ledger.rounds}†"


def test_timeout_and_refusal_are_recorded():
    prob, _ = bench_rounds.ridge(2)
    result, wall, _, outcome = bench_rounds.timed_solve(prob, "proxal", 1e-4)
    assert (result, outcome) == (None, "timeout") and wall < 60

    class Refuses:
        def solve(self, problem, **kwargs):
            raise fm.FedModelError("this backend cannot take client constraints; use proxal")
    result, _, _, outcome = bench_rounds.timed_solve(prob, Refuses(), 10.0)
    assert result is None
    assert outcome == "refused: this backend cannot take client constraints; use proxal"
