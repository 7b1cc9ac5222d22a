"""bench_large_d's reference cache (issue 25 item 3): CVXPY's solution of a case is kept under a
key of the case's spec and data, read back instead of solved again, and a changed case or data
gives another key."""
import json

import numpy as np
import pytest
import scipy.sparse as sp

from benchmarks import bench_large_d


@pytest.fixture
def tiny(monkeypatch):
    """Every case's data replaced by a small array; `run` counted."""
    state = {"X": np.arange(12.0).reshape(4, 3), "runs": 0}
    monkeypatch.setattr(bench_large_d, "data", lambda case: (state["X"], np.array([1.0, -1, 1, -1])))

    def run(case, solver, timeout, workdir):
        state["runs"] += 1
        return {"case": case, "solver": solver, "status": "converged", "objective": 1.5, "w": np.ones(3)}
    monkeypatch.setattr(bench_large_d, "run", run)
    return state


def test_the_reference_is_solved_once_and_read_back(tiny, tmp_path):
    first = bench_large_d.cached_reference("mnist", 10.0, str(tmp_path), str(tmp_path / "cache"))
    again = bench_large_d.cached_reference("mnist", 10.0, str(tmp_path), str(tmp_path / "cache"))
    assert tiny["runs"] == 1 and "cached" not in first and again["cached"] is True
    np.testing.assert_array_equal(again["w"], first["w"])
    assert again["objective"] == 1.5
    stored = list((tmp_path / "cache").glob("mnist-*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["status"] == "converged"


def test_without_a_cache_every_call_solves(tiny, tmp_path):
    for _ in range(2):
        bench_large_d.cached_reference("mnist", 10.0, str(tmp_path), None)
    assert tiny["runs"] == 2


def test_the_key_follows_the_case_and_its_data(tiny, monkeypatch):
    key = bench_large_d.reference_key("mnist")
    assert key == bench_large_d.reference_key("mnist") and key != bench_large_d.reference_key("a9a")
    tiny["X"] = tiny["X"] + 1e-12
    changed = bench_large_d.reference_key("mnist")
    assert changed != key
    tiny["X"] = sp.csr_matrix(tiny["X"])
    assert bench_large_d.reference_key("mnist") not in (key, changed)
    monkeypatch.setitem(bench_large_d.CASES, "mnist", dict(bench_large_d.CASES["mnist"], radius=4.0))
    assert bench_large_d.reference_key("mnist") not in (key, changed)


def test_a_reference_that_did_not_converge_is_not_kept(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(bench_large_d, "run", lambda *a: {"status": "timeout (10 s)"})
    bench_large_d.cached_reference("mnist", 10.0, str(tmp_path), str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()
