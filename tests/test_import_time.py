"""`import fedmodel` stays light: it imports neither cvxpy, sympy nor ray (they load when
first used) and takes under 0.5 s (in-process time of the import, best of 3 fresh
interpreters, so a cold disk cache or a busy neighbour does not decide the outcome)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("cvxpy", "sympy", "ray", "matplotlib", "networkx", "sklearn")
MUST_STAY_LAZY = ("cvxpy", "sympy", "ray")
BUDGET_SECONDS = 0.5

PROBE = """
import json, sys, time
start = time.perf_counter()
import fedmodel
elapsed = time.perf_counter() - start
heavy = %r
loaded = sorted(name for name in heavy if name in sys.modules)
print(json.dumps({"seconds": elapsed, "loaded": loaded}))
""" % (HEAVY,)


def run_probe(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probes() -> list[dict]:
    return [run_probe(PROBE) for _ in range(3)]


def test_import_does_not_load_cvxpy_sympy_or_ray(probes):
    for probe in probes:
        assert not set(MUST_STAY_LAZY) & set(probe["loaded"]), probe["loaded"]


def test_import_takes_under_half_a_second(probes):
    best = min(p["seconds"] for p in probes)
    assert best < BUDGET_SECONDS, f"import fedmodel took {best:.3f} s (best of 3)"


def test_building_and_differentiating_stays_lazy_until_lowering():
    """Expressions, gradients and plans need only numpy; the first lowering loads CVXPY."""
    code = """
import json, sys
import numpy as np
import fedmodel as fm
w = fm.Variable(3, name="w")
f = fm.mean(fm.logistic(np.ones((4, 3)) @ w)) + fm.norm1(w)
plan = fm.Plan([f, fm.grad(f, w)], [w])
plan(np.zeros(3))
f.is_convex(); f.is_smooth(); str(fm.grad(f, w))
before = sorted(m for m in ("cvxpy", "sympy", "ray") if m in sys.modules)
fm.to_cvxpy(f)
after = sorted(m for m in ("cvxpy", "sympy", "ray") if m in sys.modules)
print(json.dumps({"before": before, "after": after}))
"""
    result = run_probe(code)
    assert result["before"] == []
    assert result["after"] == ["cvxpy"]


def test_python_X_importtime_agrees():
    """Cross-check with the interpreter's own import profiler: the cumulative time of the
    `fedmodel` import (µs, best of 3) is within the budget, and no heavy package appears."""
    best = float("inf")
    for _ in range(3):
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import fedmodel"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
        rows = [line.split("|") for line in out.stderr.splitlines() if line.startswith("import time:")]
        names = {row[-1].strip() for row in rows}
        assert not {"cvxpy", "sympy", "ray"} & names
        cumulative = [int(row[1]) for row in rows if row[-1].strip() == "fedmodel"]
        assert cumulative, out.stderr[-500:]
        best = min(best, cumulative[0] / 1e6)
    assert best < BUDGET_SECONDS, f"-X importtime: fedmodel {best:.3f} s"
