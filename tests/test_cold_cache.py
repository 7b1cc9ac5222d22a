"""A cold first solve's fixed costs (issue 27 item 3): numba's on-disk cache and what runs
without numba.

- DALD's kernels take numpy (`numpy_loops`) below `kernels.NUMPY_ROWS` rows: bit for bit the
  compiled loops' numbers (compared here on random graphs and stacks, non-finite entries
  included), and a small DALD run, on a star or a ring, loads no numba.
- The compiled loops are cached on disk where numba finds a place (`compiled_loops.cached_jit`):
  the next process loads them instead of compiling; where numba finds none it compiles them
  per process instead of refusing the import.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedmodel.backends.dald import kernels, numpy_loops
from test_dald_kernels import _sweep_case

ROOT = Path(__file__).resolve().parent.parent


def _all_kernels(rng, kind: str, wide: bool, partial: bool, seed: int) -> list[np.ndarray]:
    """Every DALD kernel's outputs on one random case (a graph of 9 nodes, d = 5): the stacks'
    scale varies, some entries are non-finite or −0.0."""
    X, G, MU, order, adjacency, weight, step, threshold = _sweep_case(kind, 9, 5, wide, partial, seed)
    n, d = X.shape
    X = X * 10.0 ** rng.integers(-4, 5)
    if seed % 3 == 0:
        X[rng.integers(n), rng.integers(d)] = [np.nan, np.inf, -0.0][seed // 3 % 3]
    node_weight = {0: 2.0 ** rng.normal(), 1: rng.random((n, 1)), 2: rng.random((n, d))}[seed % 3]
    xhat, member = rng.normal(size=d), rng.random(n) < 0.6
    ptr, edge, nbr, _ = adjacency
    tail = np.repeat(np.arange(n), np.diff(ptr))        # every edge end as (node, neighbour)
    return [np.asarray(value, dtype=float) for value in (
        *kernels.consensus_gap(X, xhat, node_weight, member),
        kernels.consensus_dual(rng.normal(size=(n, d)), X, xhat, node_weight),
        *kernels.edge_dual(X, MU[edge], tail, nbr, weight[edge], rng.random(len(tail)) < 0.7),
        *kernels.edge_terms(X, MU, order, adjacency, weight),
        kernels.gauss_seidel_sweep(X, G, MU, order, adjacency, weight, step, threshold, slice(1, 4)),
        kernels.gauss_seidel_sweep(X, G, MU, order, adjacency, weight, step, threshold, slice(0, 5),
                                   prox_row=lambda z, i: np.clip(z, -0.1 * (i + 1), 0.2, out=z)),
        *kernels.largest_change(X, X + rng.normal(size=X.shape), member))]


@pytest.mark.parametrize("kind", ["path", "ring", "erdos_renyi", "tree"])
@pytest.mark.parametrize("wide", [False, True])
def test_numpy_loops_are_the_compiled_loops_bit_for_bit(monkeypatch, kind, wide):
    """The same wrappers on the same inputs, once on `numpy_loops` and once on the compiled
    loops (`kernels._loops` forced each way): every output equal to the last bit."""
    compiled = kernels._compiled()
    for seed in range(6):
        results = []
        for loops in (numpy_loops, compiled):
            monkeypatch.setattr(kernels, "_loops", lambda *rows, loops=loops: loops)
            results.append(_all_kernels(np.random.default_rng(seed), kind, wide, seed % 2 == 1, seed))
        for got, want in zip(*results):
            assert got.shape == want.shape and got.tobytes() == want.tobytes()


def test_many_rows_take_the_compiled_loops(monkeypatch):
    """At NUMPY_ROWS rows and above the compiled loop runs (the numpy path is not taken)."""
    calls = []
    loops = kernels._compiled()

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(loops, name)
    monkeypatch.setattr(kernels, "_compiled", lambda: Spy())
    n, d = kernels.NUMPY_ROWS, 3
    X = np.arange(n * d, dtype=float).reshape(n, d)
    total, largest = kernels.consensus_gap(X, np.zeros(d), 1.0, np.ones(n, bool))
    np.testing.assert_array_equal(total, -X.sum(axis=0))
    assert largest == X.max()
    np.testing.assert_array_equal(kernels.consensus_dual(np.ones((n, d)), X, np.zeros(d), 2.0), 1.0 - 2.0 * X)
    assert calls == ["consensus_gap", "consensus_dual"]


def test_the_compiled_loops_take_over_after_numpy_calls_or_once_loaded(monkeypatch):
    """Small stacks take numpy for NUMPY_CALLS calls, then the compiled loops; and the compiled
    loops at once in a process that has loaded them."""
    compiled = kernels._compiled()
    fresh = functools.cache(lambda: compiled)       # "not loaded yet" for this process
    monkeypatch.setattr(kernels, "_compiled", fresh)
    monkeypatch.setattr(kernels, "NUMPY_CALLS", 2)
    monkeypatch.setattr(kernels, "_numpy_calls", [0])
    assert [kernels._loops(5, 3) for _ in range(3)] == [numpy_loops, numpy_loops, compiled]
    monkeypatch.setattr(kernels, "_numpy_calls", [0])
    assert kernels._loops(5) is compiled                # loaded now: no numpy call
    monkeypatch.setattr(kernels, "_compiled", functools.cache(lambda: compiled))
    assert kernels._loops(kernels.NUMPY_ROWS - 1) is numpy_loops and kernels._loops(kernels.NUMPY_ROWS) is compiled


def _child(code: str, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


SMALL_DALD = """
import json, sys
import numpy as np
import fedmodel as fm
rng = np.random.default_rng(3)
w = fm.Variable(4, name="w")
prob = fm.Problem()
for i in range(5):
    A, b = rng.normal(size=(12, 4)), rng.normal(size=12)
    c = prob.add_client(f"c{i}")
    c.minimize(fm.sum_squares(c.data(A, name="A") @ w - b))
    c.subject_to(fm.norm2(w) <= 0.5)
star = prob.solve("dald")
ring = prob.solve("dald", topology=fm.topologies.ring(prob))
print(json.dumps({"numba": "numba" in sys.modules, "status": [str(star.status), str(ring.status)],
                  "w": [star.value(w).tolist(), ring.value(w).tolist()],
                  "exact": prob.solve("cvxpy").value(w).tolist()}))
"""


@pytest.mark.integration      # (a fresh interpreter: ~3 s)
def test_a_small_dald_run_loads_no_numba():
    """DALD-CC on the star and DALD-DC on a ring of 5 clients: right answers, numba never loaded."""
    out = _child(SMALL_DALD)
    assert not out["numba"]
    assert out["status"] == ["converged", "converged"]
    for w in out["w"]:
        np.testing.assert_allclose(w, out["exact"], atol=1e-4)


KERNEL = """
import json, sys
import numpy as np
from fedmodel.runtime import kernels
Z = np.array([[1.0, -2.0, 3.0]])
out = kernels.prox_grad_step(Z, np.zeros((1, 3)), 1.0, np.zeros(3), np.zeros(3), 1.0, 0.5, 3,
                             np.array([0.25]), slice(0, 3))
loops = kernels._compiled()
stats = loops.prox_grad_step.stats
print(json.dumps({"out": out.tolist(), "hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values()),
                  "cached": type(loops.prox_grad_step._cache).__name__}))
"""
# z − 0.5·(z − 0) = z/2, then soft-thresholded at 0.25
WANT = [[0.25, -0.75, 1.25]]

NEVER = """
class Never:
    @classmethod
    def from_function(cls, py_func, source_path):
        return None
"""


@pytest.mark.integration      # (two fresh interpreters, one compiling: ~10 s)
def test_the_next_process_loads_the_compiled_loops_from_the_cache(tmp_path):
    """With the cache outside the source tree (NUMBA_CACHE_DIR, as for a read-only install),
    the first process compiles and writes, the second only loads."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    first, second = _child(KERNEL, env), _child(KERNEL, env)
    assert first["out"] == second["out"] == WANT
    assert first["misses"] >= 1 and any((tmp_path / "cache").rglob("*.nbi"))
    assert second["hits"] >= 1 and second["misses"] == 0


@pytest.mark.integration      # (a fresh interpreter compiling without a cache: ~5 s)
def test_without_a_place_for_the_cache_the_loops_still_compile(tmp_path):
    """numba refuses `cache=True` when no locator finds a writable folder (here: a locator
    list of one that never does); the loops then compile per process, same numbers."""
    (tmp_path / "never_locator.py").write_text(NEVER)
    env = {"NUMBA_CACHE_LOCATOR_CLASSES": "never_locator.Never",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = _child(KERNEL, env)
    assert out["out"] == WANT
    assert out["hits"] == 0 and out["cached"] == "NullCache"
