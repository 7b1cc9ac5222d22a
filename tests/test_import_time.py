"""`import fedmodel` stays light: it imports no third-party package but numpy (cvxpy, sympy, ray,
matplotlib and the rest load when first used).

Asserted on the set of modules a fresh interpreter has loaded after the import, which a loaded
machine does not change; the import's wall time (~0.2 s idle, 0.58 s seen on a busy CI machine)
is a benchmark's business, not a test's."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("cvxpy", "sympy", "ray", "matplotlib", "networkx", "sklearn", "scipy", "pandas",
         "numba", "jax", "flwr", "dp_accounting")
# the only third-party packages `import fedmodel` may load
ALLOWED_THIRD_PARTY = {"numpy"}

PROBE = """
import json, sys
before = set(sys.modules)
import fedmodel
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def run_probe(code: str):
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def third_party(modules) -> set[str]:
    """Top-level packages among `modules` that are neither the standard library nor fedmodel."""
    tops = {name.split(".")[0] for name in modules}
    return {top for top in tops if top not in sys.stdlib_module_names and top != "fedmodel"
            and not top.startswith("_")}


def test_import_loads_no_third_party_package_but_numpy():
    loaded = run_probe(PROBE)
    assert "fedmodel" in loaded and "numpy" in loaded
    assert not set(HEAVY) & {name.split(".")[0] for name in loaded}
    assert third_party(loaded) <= ALLOWED_THIRD_PARTY, sorted(third_party(loaded))


def test_third_party_check_sees_a_heavy_import():
    """The test of the test: a package outside the standard library is reported, submodules
    by their top-level package, the standard library and fedmodel's own modules are not."""
    found = third_party(["numpy.linalg", "cvxpy.atoms", "json", "collections.abc", "_ctypes",
                         "fedmodel.expression", "sympy"])
    assert found == {"numpy", "cvxpy", "sympy"}


@pytest.mark.integration   # (CI's integration run: the fast suite stays under 3 minutes)
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
    """Cross-check with the interpreter's own import profiler: no heavy package appears among
    the modules `-X importtime` reports (its list also holds the interpreter's own start-up:
    site, sitecustomize and .pth imports, so only the heavy names are checked here)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import fedmodel"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    rows = [line.split("|") for line in out.stderr.splitlines() if line.startswith("import time:")]
    names = {row[-1].strip() for row in rows}
    assert "fedmodel" in names, out.stderr[-500:]
    assert not set(HEAVY) & {name.split(".")[0] for name in names}


SOLVE_PROBE = """
import importlib.metadata, json, sys
scans = []
scan = importlib.metadata.entry_points
def counted(*args, **kwargs):
    caller = sys._getframe(1).f_globals.get("__name__", "")
    if caller.split(".")[0] == "fedmodel":      # (numba scans its own once, for its compiler)
        scans.append(caller)
    return scan(*args, **kwargs)
importlib.metadata.entry_points = counted      # before fedmodel binds it
import numpy as np
import fedmodel as fm
from fedmodel import backends, registry
rng = np.random.default_rng(0)
w = fm.Variable(3, name="w")
prob = fm.Problem()
for i in range(2):
    c = prob.add_client(f"c{i}")
    c.minimize(fm.mean(fm.logistic(c.data(rng.standard_normal((6, 3)), name="X") @ w)))
    c.subject_to(fm.norm2(w) <= 1.0)
prob.server.minimize(0.05 * fm.sum_squares(w))
backends.ProxAL, backends.FedADMM, registry.names("backend"), registry.names("executor")
statuses = [str(prob.solve("proxal", max_outer=1).status),
            str(prob.solve("proxal", executor="batched", max_outer=1).status),
            str(prob.solve("fedadmm", max_rounds=2).status),
            str(prob.solve(backends.ProxAL(max_outer=1)).status)]
out = {"scans": len(scans), "networkx": "networkx" in sys.modules, "statuses": statuses}
registry.refresh()
registry.lookup("backend", "proxal"); registry.names("backend")
out["after_refresh"] = len(scans)
star = fm.topologies.star(prob)         # a graph the user asks for: networkx now
out["star"] = [sorted(star.nodes), "networkx" in sys.modules]
print(json.dumps(out))
"""


@pytest.mark.integration      # a fresh interpreter per case: ~4 s, kept out of the fast suite
def test_star_solves_import_no_networkx_and_scan_entry_points_once():
    """Issue 27 item 3 (cold first solve): server backends on their default star never build
    the graph, so networkx (~0.2 s CPU to import) is not imported by `import fedmodel`,
    `fedmodel.backends` and four solves (serial, batched, FedADMM, a backend instance); the
    installed entry points (~16 ms a scan) are read once for every lookup and name list, and
    again only after `registry.refresh()`. Counted, not timed."""
    out = run_probe(SOLVE_PROBE)
    assert out["networkx"] is False
    assert out["scans"] == 1
    assert out["after_refresh"] == 2
    assert len(out["statuses"]) == 4
    assert out["star"] == [["c0", "c1", "server"], True]


def test_default_star_still_needs_a_client():
    """The default star is checked, not built: a problem without clients is refused as
    `topologies.star` refuses it."""
    import fedmodel as fm
    from fedmodel.backends.common import require_star
    prob = fm.Problem()
    with pytest.raises(fm.TopologyError, match="star topology needs at least 1 client"):
        require_star(prob, None, "proxal")
    with pytest.raises(fm.TopologyError, match="star topology needs at least 1 client"):
        fm.topologies.star(prob)
    prob.add_client("c0").minimize(fm.sum_squares(fm.Variable(2, name="w")))
    assert require_star(prob, None, "proxal") is None


def test_builtin_model_reads_its_data_without_importing_sklearn():
    """`fedmodel run`'s built-in model (WDBC) reads scikit-learn's bundled CSV directly:
    importing `sklearn.datasets` took ~3 s of CPU on a loaded machine, a third of the main job."""
    loaded = run_probe("""
import json, sys
from fedmodel import builtin_models
prob = builtin_models.neyman_pearson()
print(json.dumps(sorted(m for m in ("sklearn", "scipy", "cvxpy") if m in sys.modules)))
""")
    assert loaded == []
