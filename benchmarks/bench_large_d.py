"""Many features, sparse data (issue 25 item 3): every default backend against CVXPY-Clarabel,
time and peak memory, each solve verified against CVXPY's solution.

Models (mean logistic loss over ±1 labels, each client's share weighted so the total is the
mean over all rows; a ball ‖w‖₂ ≤ r on every client; a server ridge λ‖w‖²):

- `a9a`:   LIBSVM a9a, 8,000 rows over 8 clients, the 123 features plus hashed pairwise
           interactions into 16,384 buckets (`datasets.hashed_pairs`): d = 16,507, ~100
           nonzeros a row, scipy.sparse CSR client data;
- `mnist`: MNIST 3 vs 7 (all 12,396 training rows, pixels in [0, 1]) over 10 clients, d = 784;
- `a9a-100k`: the first 4,000 a9a rows over 4 clients hashed into 99,877 buckets: d = 10⁵.

Each solve runs in its own process (`--one`): its peak resident memory (ru_maxrss, the
process's own, model building included) and its wall time for `prob.solve` alone. BLAS is
limited to one thread for every solve (CVXPY's included): on a machine whose cores are shared
with other work, threaded BLAS calls wait for preempted threads (a DALD run was 6.5× slower
with the default threads at load 8 on 2 cores). "verified": the solution within 1e-3 of
CVXPY's (relative 2-norm distance), the objective within 1e-6 relative, constraints within
1e-6·r. The "accurate" rows are the settings the tests use (ProxAL tol 1e-6, FedADMM with
Newton-type local solves) where a default's stopping rule stops short (ProxAL's (11) alone is
an absolute stationarity test; its default now also estimates the distance left, `dist_tol`).

    python benchmarks/bench_large_d.py                 # every case (long: tens of minutes)
    python benchmarks/bench_large_d.py --cases mnist   # one case
    python benchmarks/bench_large_d.py --cases mnist --solvers auto --reference-cache ~/.cache/fedmodel-bench
                                                       # CVXPY once per case and data (opt-in cache)

`--reference-cache DIR`: CVXPY's record and solution are kept in DIR under the case's name and
a SHA-256 of its spec, `build`'s source, its data and CVXPY's version (`reference_key`), and read
back instead of solving again (a reference that did not converge is not kept); the row says
"(cached)" and its times and memory are those of the run that made it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CASES = {"mnist": dict(clients=10, radius=5.0, ridge=1e-3),
         "a9a": dict(rows=8000, clients=8, buckets=16384, radius=10.0, ridge=1e-3),
         "a9a-100k": dict(rows=4000, clients=4, buckets=99877, radius=10.0, ridge=1e-3)}
SOLVERS = {"cvxpy": ("cvxpy", {}),
           "auto": ("auto", {}),        # what `prob.solve()` picks (recorded in the row)
           "proxal": ("proxal", {}),
           "dald": ("dald", {}),
           "fedadmm": ("fedadmm", {}),
           "proxal (accurate)": ("proxal", {"tol": (1e-7, 1e-7)}),
           "fedadmm (accurate)": ("fedadmm", {"local_solver": "newton"})}
DEFAULT_SOLVERS = list(SOLVERS)
# the d = 10⁵ case: CVXPY, ProxAL's default (verified at d = 16,507 since its local solves
# take Newton inside the client balls) and one row per other backend that can verify
CASE_SOLVERS = {"a9a-100k": ["cvxpy", "auto", "proxal", "proxal (accurate)", "dald", "fedadmm (accurate)"]}


def data(case: str):
    """(X, y) of a case: X dense or scipy CSR, y ±1."""
    from fedmodel.datasets import hashed_pairs, load_a9a, load_mnist37
    spec = CASES[case]
    if case.startswith("a9a"):
        found = load_a9a(sparse=True)
        X = hashed_pairs(found.X[:spec["rows"]], spec["buckets"])
        return X, np.where(found.y[:spec["rows"]] > 0, 1.0, -1.0)
    found = load_mnist37()
    return found.X, np.where(found.y > 0, 1.0, -1.0)


def build(case: str):
    """(problem, w) of a case."""
    import fedmodel as fm
    spec = CASES[case]
    X, y = data(case)
    rows = X.shape[0]
    w = fm.Variable(X.shape[1], name="w")
    prob = fm.Problem(case)
    for i, part in enumerate(np.array_split(np.arange(rows), spec["clients"])):
        c = prob.add_client(f"c{i}")
        A = c.data(X[part], name="X")
        c.minimize(len(part) / rows * fm.mean(fm.logistic(-y[part] * (A @ w))))
        c.subject_to(fm.norm2(w) <= spec["radius"])
    prob.server.minimize(spec["ridge"] * fm.sum_squares(w))
    return prob, w


def one(case: str, solver: str, out: str) -> None:
    """Solve one case with one solver in this process; write a JSON record and w (.npy)."""
    import resource
    import warnings
    prob, w = build(case)
    name, options = SOLVERS[solver]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve(name, **options)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    np.save(out + ".npy", res.value(w))
    record = {"case": case, "solver": solver, "seconds": seconds, "cpu_seconds": cpu, "status": res.status,
              "objective": float(res.objective), "violation": float(res.max_violation),
              "iterations": {k: int(v) for k, v in (res.iterations or {}).items()},
              "round_trips": int(res.ledger.round_trips) if "communication" in res.info else None,  # (CVXPY: none)
              "picked": _picked(res),
              "rss_build_mb": before,
              "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "d": int(w.size)}
    Path(out + ".json").write_text(json.dumps(record))


def _picked(res) -> str | None:
    """What `auto` ran: the backend, and its subproblem solver where it named one."""
    choice = res.info.get("auto")
    if not choice:
        return None
    inner = choice.get("inner") or res.info.get("inner", {}).get("name")
    return choice["backend"] + (f" + {inner}" if inner else "")


def run(case: str, solver: str, timeout: float, workdir: str) -> dict:
    """`one` in a child process (one BLAS thread, address space capped at 6 GB)."""
    out = os.path.join(workdir, f"{case}-{solver}".replace(" ", "_").replace("(", "").replace(")", ""))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [sys.executable, "-c",
               "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30)); "
               f"sys.path.insert(0, {str(ROOT)!r}); from benchmarks.bench_large_d import one; "
               f"one({case!r}, {solver!r}, {out!r})"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, env=env, cwd=ROOT, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"case": case, "solver": solver, "status": f"timeout ({timeout:.0f} s)",
                "seconds": time.perf_counter() - start}
    if proc.returncode != 0 or not os.path.exists(out + ".json"):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return {"case": case, "solver": solver, "status": f"failed: {tail[0][:120]}",
                "seconds": time.perf_counter() - start}
    record = json.loads(Path(out + ".json").read_text())
    record["w"] = np.load(out + ".npy")
    return record


def reference_key(case: str) -> str:
    """SHA-256 of a case's spec, model text, data and CVXPY's version: the reference cache's key
    (a changed split, radius, ridge, data file or solver gives another key)."""
    import inspect
    import cvxpy
    X, y = data(case)
    digest = hashlib.sha256(json.dumps([case, CASES[case], cvxpy.__version__], sort_keys=True).encode())
    digest.update(inspect.getsource(build).encode())
    parts = (X.data, X.indices, X.indptr, np.asarray(X.shape)) if hasattr(X, "indptr") else (X,)
    for part in parts + (y,):
        digest.update(np.ascontiguousarray(part).tobytes())
    return digest.hexdigest()


def cached_reference(case: str, timeout: float, workdir: str, cache: "str | None") -> dict:
    """CVXPY's record of a case: from `cache` where it holds one for this case and data, else
    solved (`run`) and, if it converged, stored there."""
    if cache is None:
        return run(case, "cvxpy", timeout, workdir)
    folder = Path(cache).expanduser()
    stem = folder / f"{case}-{reference_key(case)[:20]}"
    if stem.with_suffix(".json").exists() and stem.with_suffix(".npy").exists():
        record = json.loads(stem.with_suffix(".json").read_text())
        return dict(record, w=np.load(stem.with_suffix(".npy")), cached=True)
    record = run(case, "cvxpy", timeout, workdir)
    if "w" in record and record["status"] == "converged":
        folder.mkdir(parents=True, exist_ok=True)
        np.save(stem.with_suffix(".npy"), record["w"])
        stem.with_suffix(".json").write_text(json.dumps({k: v for k, v in record.items() if k != "w"}))
    return record


def verdict(record: dict, reference: dict, radius: float) -> dict:
    """Distance, objective gap and violation against CVXPY's solution; `verified` if all hold."""
    if "w" not in record or "w" not in reference:
        return {"distance": None, "gap": None, "verified": False}
    distance = float(np.linalg.norm(record["w"] - reference["w"]) / np.linalg.norm(reference["w"]))
    gap = abs(record["objective"] - reference["objective"]) / abs(reference["objective"])
    ok = distance <= 1e-3 and gap <= 1e-6 and record["violation"] <= 1e-6 * radius
    return {"distance": distance, "gap": gap, "verified": bool(ok)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--solvers", nargs="*", default=None, choices=list(SOLVERS),
                        help="default: every solver (a case's own list where it has one)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per solve")
    parser.add_argument("--reference-cache", metavar="DIR", default=None,
                        help="keep CVXPY's solution per case and data in DIR and reuse it (module docstring)")
    args = parser.parse_args(argv)
    explicit, solvers = args.solvers is not None, args.solvers or DEFAULT_SOLVERS
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        return
    print(f"load before: {os.getloadavg()}")
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for case in args.cases:
            # (a case's own list applies to the default; solvers named on the command line all run)
            chosen = solvers if explicit else [s for s in solvers if s in CASE_SOLVERS.get(case, SOLVERS)]
            records = {"cvxpy": cached_reference(case, args.timeout, workdir, args.reference_cache)}
            records.update({s: run(case, s, args.timeout, workdir) for s in chosen if s != "cvxpy"})
            ref = records["cvxpy"]
            if "w" in ref:
                size = float(np.linalg.norm(ref["w"]))
                print(f"{case}: CVXPY's ‖w*‖ = {size:.4g}, r = {CASES[case]['radius']} "
                      f"({'active' if size > 0.999 * CASES[case]['radius'] else 'inactive'} ball)", flush=True)
            for solver, record in records.items():
                v = verdict(record, ref, CASES[case]["radius"]) if solver != "cvxpy" else \
                    {"distance": 0.0, "gap": 0.0, "verified": "w" in record}
                status = record["status"] + (f" ({record['picked']})" if record.get("picked") else "") + \
                    (" (cached)" if record.get("cached") else "")
                iterations = dict(record.get("iterations") or {}, round_trips=record.get("round_trips"))
                rows.append((case, record.get("d"), solver, status, record.get("seconds"),
                             record.get("rss_peak_mb"), record.get("rss_build_mb"), v,
                             iterations, ref.get("seconds"), record.get("cpu_seconds"),
                             ref.get("cpu_seconds")))
                print(_line(rows[-1]), flush=True)
    print(f"load after: {os.getloadavg()}")


def _line(row) -> str:
    case, d, solver, status, seconds, peak, base, v, iterations, ref_seconds, cpu, ref_cpu = row
    time_text = f"{seconds:8.1f} s" if seconds is not None else "       -"
    ratio = f"{seconds / ref_seconds:6.2f}×" if seconds and ref_seconds and solver != "cvxpy" else "      "
    # CPU seconds (the process's own): on shared cores the wall-time ratio moves with the load
    if cpu is not None:
        time_text += f" (CPU {cpu:.1f} s" + (f", {cpu / ref_cpu:.2f}×)" if ref_cpu and solver != "cvxpy" else ")")
    memory = f"{peak:7.0f} MB (model {base:5.0f})" if peak else " " * 24
    dist = f"{v['distance']:.1e}" if v["distance"] is not None else "-"
    gap = f"{v['gap']:.1e}" if v["gap"] is not None else "-"
    return (f"| {case} | {d} | {solver} | {status} | {time_text} | {ratio} | {memory} | {dist} | "
            f"{gap} | {'yes' if v['verified'] else 'NO'} | {iterations} |")


if __name__ == "__main__":
    main()
