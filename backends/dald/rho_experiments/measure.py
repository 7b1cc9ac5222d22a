"""Measure the four DALD reproducers: status, outer, round trips, distance to CVXPY, ρ trace.
python measure.py [cases...]  (env RULE=... sets backends.dald.spectral.RULE if present)"""
import os, sys, time, warnings, json, importlib.util
import numpy as np
import fedmodel as fm
from fedmodel import topologies
warnings.simplefilter("ignore")
import fedmodel.backends.dald.spectral as sp
import fedmodel.backends.dald.cc as cc
for kv in os.environ.get("SET", "").split(","):
    if kv:
        k, v = kv.split("=")
        mod, attr = k.split(".")
        m = {"sp": sp, "cc": cc}[mod]
        old = getattr(m, attr)
        setattr(m, attr, type(old)(v) if not isinstance(old, str) else v)

EXTRA = {}
if os.environ.get('FIXED'):
    EXTRA = dict(rho=float(np.sqrt(float(os.environ['FIXED']) / 2)), adaptive_rho=False)

def trace(res):
    wts = np.array([h.get("weight", np.nan) for h in res.history], float)
    if not np.isfinite(wts).any():
        return ""
    ch = np.flatnonzero(np.diff(wts)) + 1
    last = int(ch[-1]) + 1 if len(ch) else 0
    tail = wts[max(0, last - 60):last + 1] if len(ch) else wts[:1]
    return (f"2rho2 start {wts[0]:.3g} min {np.nanmin(wts):.3g} max {np.nanmax(wts):.3g} last change at {last} "
            f"final {wts[-1]:.3g} last60 span x{tail.max()/tail.min():.3g} changes {len(ch)}")

def report(label, res, x, xr, ref=None):
    d = np.max(np.abs(x - xr)) / np.max(np.abs(xr))
    try:
        ok = fm.verify(res, ref).ok if ref is not None else fm.verify(res).ok
    except Exception as e:
        ok = f"err {e}"[:60]
    print(f"{label:34s} {res.status:14s} outer {res.iterations.get('outer')} rt {res.iterations.get('rounds', res.iterations.get('inner'))} "
          f"dist {d:.2g} verify {ok} f {res.objective:.6g} | {trace(res)}", flush=True)

def away():
    path = os.path.join(os.environ.get("FEDMODEL_DATA", "/work/shared/data"), "regression/abalone.data")
    raw = np.loadtxt(path, dtype=str)
    X = np.column_stack([raw[:, 1:8].astype(float), np.ones(len(raw))]); y = raw[:, 8].astype(float)
    groups = np.searchsorted(["F", "I", "M"], raw[:, 0]); groups[0] = 3
    def build():
        w = fm.Variable(8, name="w"); prob = fm.Problem("abalone")
        for g in np.unique(groups):
            r = groups == g; c = prob.add_client(f"s{g}")
            A, b = c.data(X[r], name="X"), c.data(y[r], name="y")
            c.minimize(fm.sum_squares(A @ w - b) / len(y))
        prob.clients[1].subject_to(fm.norm2(w) <= 8.0)
        prob.server.minimize(1e-3 * fm.sum_squares(w))
        return prob, w
    prob, w = build(); ref = prob.solve("cvxpy"); xr = ref.value(w)
    names = [c.name for c in prob.clients]
    for label, o in {"away: all reachable": {},
                     "away: s0 away [5,60)": dict(coordination="partial", availability=lambda t: [
                         n for n in names if not (n == "s0" and 5 <= t < 60)])}.items():
        prob, w = build(); res = prob.solve("dald", **o, **EXTRA); report(label, res, res.value(w), xr, ref)

def central():
    root = "/work/wt_daldrho"
    spec = importlib.util.spec_from_file_location("cf", os.path.join(root, "examples/centralized_form.py"))
    cf = importlib.util.module_from_spec(spec); spec.loader.exec_module(cf)
    rp = cf.make_problem(5); ref = rp.solve("cvxpy"); xr = ref.value(rp.shared_variables()[0])
    for topo in ("star",) + (("ring",) if os.environ.get("RING") else ()):
        prob = cf.make_problem(5); w = prob.shared_variables()[0]
        res = prob.solve("dald", topology=getattr(topologies, topo)(prob), **EXTRA)
        report(f"central: {topo}", res, res.value(w), xr)

def hyper():
    g = np.random.default_rng(57); wt = np.array([1.0, -2.0, 0.5, 0.0, 3.0])
    Xs = [g.standard_normal((20, 5)) for _ in range(4)]; ys = [X @ wt + 0.1 * g.standard_normal(20) for X in Xs]
    g2 = np.random.default_rng(58); A = [g2.standard_normal(5) for _ in range(3)]
    def build():
        w = fm.Variable(5, name="w"); prob = fm.Problem()
        for i, (X, y) in enumerate(zip(Xs, ys)):
            c = prob.add_client(f"c{i}"); c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)))
            if i < 3:
                c.subject_to(c.data(A[i]) @ w == 0.5)
        return prob, w
    prob, w = build(); ref = prob.solve("cvxpy"); xr = ref.value(w)
    prob, w = build(); res = prob.solve("dald", **EXTRA); report("hyperplanes", res, res.value(w), xr, ref)

def boxes():
    g = np.random.default_rng(66); wt = np.array([1.0, -2.0, 0.5, 0.0, 3.0])
    Xs = [g.standard_normal((4, 5)) for _ in range(50)]; ys = [X @ wt + 0.1 * g.standard_normal(4) for X in Xs]
    bounds = np.random.default_rng(67).uniform(0.5, 2.0, (50, 5))
    def build():
        w = fm.Variable(5, name="w"); prob = fm.Problem()
        for i, (X, y) in enumerate(zip(Xs, ys)):
            c = prob.add_client(f"c{i}"); c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)))
            c.subject_to(w <= bounds[i])
        return prob, w
    prob, w = build(); ref = prob.solve("cvxpy"); xr = ref.value(w)
    prob, w = build(); res = prob.solve("dald", **EXTRA); report("boxes", res, res.value(w), xr, ref)

def flatnp():
    sys.path.insert(0, "/work/wt_daldrho/tests")
    from test_np_convergence import _np_model
    prob, w = _np_model(); ref = prob.solve("cvxpy"); xr = ref.value(w)
    prob, w = _np_model(); res = prob.solve("dald", **EXTRA); report("flat np", res, res.value(w), xr, ref)

if __name__ == "__main__":
  print("SET", os.environ.get("SET", ""), os.popen("uptime").read().strip(), flush=True)
  for name in (sys.argv[1:] or ["away", "central", "hyper", "boxes"]):
      t = time.time(); globals()[name](); print(f"  ({name} {time.time()-t:.0f} s)", flush=True)
