"""Batched (vectorized-clients) executor vs the serial per-client loop, on the DALD Table II
workload: MNIST 3 vs 7 (12396 × 784 pixels in [0, 1], ~81% zeros), the strided non-IID
partition over n clients, L1-logistic regression f_i(w) = (1/N) Σ_{rows of i} log(1 + e^{−b wᵀa})
+ λ‖w‖₁ on every client, one proximal-gradient local step per iteration (W = 1, α = 0.1).

Part 1 (serial vs batched): for each n it runs Fed-DALD-CC and FedProx (warm-started, as the
paper's baseline) for a few iterations on both executors, checks the two runs agree to 1e-12,
and reports the time per iteration (from the history's time stamps, the first iteration —
which builds the batched plans — left out) and the ratio serial / batched.

Part 2 (issue 4's target, time per DALD iteration at n = 1000 / one pass Xᵀ(X v) ≤ 3×): the
Table II runs themselves (`reproductions.dald_table2`: raw pixels, α = 1e-4, λ = 1e-3, ρ = 1)
of Fed-DALD-CC, FedProx and Fed-DALD-DC on the batched executor, each iteration followed (in
the backend's callback, outside the timed span) by one dense and one CSR pass Xᵀ(X v) over the
same stacked data, so iterations and passes alternate; medians of wall time and of CPU time
(time.process_time) per iteration and per pass, with the history objective every iteration
(the default) and every 1000th (as the Table II grid runs).

Part 3 (`--grid`): the whole Table II grid (`fedmodel reproduce tableII --full`: backends,
batched executor, two processes over the cells), wall and CPU seconds.

The machine is shared: the load average is printed before and after each part.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_batched.py            # parts 1 and 2
    python benchmarks/bench_batched.py --quick                           # n = 10, 100; part 2 short
    python benchmarks/bench_batched.py --target-only                     # part 2 only
    python benchmarks/bench_batched.py --grid                            # part 3 too (≈ 15 min)

Timings are ratios measured in one run, each pair back to back (benchmarks/common.py: BLAS limits).
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np

if __package__ in (None, ""):   # run as a script: `python benchmarks/bench_batched.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.common import blas_threads, machine_info
else:
    from .common import blas_threads, machine_info

import fedmodel as fm
from fedmodel import backends, datasets, partitioners
from fedmodel.runtime.batched import BatchedExecutor

LAMBDA = 1e-6       # small enough that the iterates move (λ only changes the prox threshold)
STEP = 0.1


def build(n: int, data) -> fm.Problem:
    parts = partitioners.strided_split(data.y, n)
    total = sum(len(p) for p in parts)
    w = fm.Variable(data.X.shape[1], name="w")
    prob = fm.Problem(name=f"mnist37-n{n}")
    for i, rows in enumerate(parts):
        c = prob.add_client(f"c{i}")
        X, b = c.data(data.X[rows], name="X"), c.data(2.0 * data.y[rows] - 1.0, name="b")
        c.minimize(fm.sum(fm.logistic(-fm.multiply(b, X @ w))) / total)
        c.minimize(LAMBDA * fm.norm1(w))
    return prob


def algorithms(iterations: int) -> dict:
    return {"DALD-CC": backends.DALD(solver="prox-grad", step=STEP, max_iterations=iterations,
                                     eps_primal=0.0, eps_dual=0.0),
            "FedProx": backends.FedProx(step=STEP, max_rounds=iterations, warm_start=True, tol=0.0)}


def per_iteration(result) -> float:
    times = [r["time"] for r in result.history]
    return (times[-1] - times[0]) / max(len(times) - 1, 1)


def run_pair(prob, backend):
    serial = prob.solve(backend, executor="serial")
    ex = BatchedExecutor()
    batched = prob.solve(backend, executor=ex)
    gap = max(abs(a["objective"] - b["objective"]) for a, b in zip(serial.history, batched.history))
    x_gap = max(float(np.max(np.abs(serial.values[k] - batched.values[k]))) for k in serial.values)
    if max(gap, x_gap) > 1e-12 or serial.ledger.floats != batched.ledger.floats:
        raise AssertionError(f"batched and serial runs differ (objective {gap:.1e}, x {x_gap:.1e})")
    return per_iteration(serial), per_iteration(batched), ex


def load() -> str:
    return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def target_ratio(n: int, iterations: int, report_every: int) -> dict:
    """Per Table II method: medians of (wall, CPU) seconds per iteration at n clients and of one
    dense and one CSR pass Xᵀ(X v) over the stacked client data, alternating with the iterations."""
    import scipy.sparse as sp
    from fedmodel import topologies
    from fedmodel.backends.dald import DALD
    from fedmodel.backends.special_cases import FedProx
    from fedmodel.reproductions import dald_table2 as t2
    exp = t2.experiment(n)
    X = np.abs(np.concatenate(exp.parts))           # the clients' rows (b·a: |·| = the pixels)
    S = sp.csr_matrix(X)
    v = np.random.default_rng(0).random(X.shape[1])
    out = {"rows": X.shape[0], "density": S.nnz / X.size}
    for method in t2.METHODS:
        prob, _ = t2.build_problem(exp, 1e-3)
        if method == "fedprox":
            algo = FedProx(mu=2.0, step=t2.STEP, max_rounds=iterations, tol=0.0, warm_start=True)
        else:
            algo = DALD(rho=1.0, solver="prox-grad", step=t2.STEP, max_iterations=iterations,
                        eps_primal=0.0, eps_dual=0.0)
        algo.report_every = report_every
        topology = topologies.path(prob) if method == "dald-dc" else topologies.star(prob)
        spans = {"iteration": [], "dense": [], "csr": []}
        mark = [None]

        def callback(record):
            now = (time.perf_counter(), time.process_time())
            if mark[0] is not None and record["inner_total"] > 1:     # the first builds the plans
                spans["iteration"].append((now[0] - mark[0][0], now[1] - mark[0][1]))
            for name, fn in (("dense", lambda: X.T @ (X @ v)), ("csr", lambda: S.T @ (S @ v))):
                t0 = (time.perf_counter(), time.process_time())
                fn()
                spans[name].append((time.perf_counter() - t0[0], time.process_time() - t0[1]))
            mark[0] = (time.perf_counter(), time.process_time())
        prob.solve(algo, topology=topology, executor="batched", callback=callback)
        out[method] = {k: (float(np.median([w for w, _ in vals])), float(np.median([c for _, c in vals])))
                       for k, vals in spans.items()}
    return out


def grid() -> dict:
    """The whole Table II grid on the backends (batched executor, two processes)."""
    from fedmodel.reproductions import dald_table2 as t2
    before = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    status = t2.run(full=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    cpu = sum(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before))
    return {"wall": wall, "cpu": cpu, "status": status}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 10, 100 only")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--target-only", action="store_true", help="part 2 only")
    parser.add_argument("--grid", action="store_true", help="also run the whole Table II grid")
    args = parser.parse_args(argv)
    grid_n = (10, 100) if args.quick else (10, 100, 1000)
    data = datasets.load_mnist37()
    for key, value in machine_info().items():
        print(f"# {key}: {value}")
    print(f"# OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    with blas_threads(1) as note:
        print(f"# {note}")
        if not args.target_only:
            print(f"# part 1, {load()}")
            print(f"# MNIST 3 vs 7, strided split, L1-logistic, λ = {LAMBDA:g}, W = 1 prox-grad step, α = {STEP}")
            print(f"{'n':>6} {'algorithm':>9} {'serial ms/it':>13} {'batched ms/it':>14} {'speed-up':>9}")
            for n in grid_n:
                iterations = args.iterations or (30 if n < 1000 else 12)
                prob = build(n, data)
                for name, backend in algorithms(iterations).items():
                    serial, batched, ex = run_pair(prob, backend)
                    print(f"{n:>6} {name:>9} {1e3 * serial:>13.2f} {1e3 * batched:>14.2f} "
                          f"{serial / batched:>8.1f}×", flush=True)
            print(f"# {load()}")
        n = 1000
        iterations = 40 if args.quick else 150
        for report_every in (1, 1000):
            print(f"# part 2: Table II runs at n = {n} (α = 1e-4, λ = 1e-3), batched executor, "
                  f"history objective every {report_every} iteration(s); {load()}")
            ref = target_ratio(n, iterations, report_every)
            print(f"#   stacked data {ref['rows']} × 784, {100 * ref['density']:.0f}% nonzero; medians over "
                  f"{iterations - 2} iterations, each followed by one dense and one CSR pass")
            print(f"{'method':>9} {'ms/it wall':>11} {'ms/it CPU':>10} {'dense pass':>11} {'CSR pass':>9} "
                  f"{'it/dense':>9} {'it/CSR':>7}  (CPU time; wall in brackets)")
            for method in ("dald-cc", "fedprox", "dald-dc"):
                r = ref[method]
                it, dense, csr = r["iteration"], r["dense"], r["csr"]
                print(f"{method:>9} {1e3 * it[0]:>11.2f} {1e3 * it[1]:>10.2f} {1e3 * dense[1]:>11.2f} "
                      f"{1e3 * csr[1]:>9.2f} {it[1] / dense[1]:>8.1f}× {it[1] / csr[1]:>6.1f}×  "
                      f"[{it[0] / dense[0]:.1f}×, {it[0] / csr[0]:.1f}×]", flush=True)
            print(f"# {load()}   (target: DALD iteration ≤ 3× one pass)")
        if args.grid:
            print(f"# part 3: the Table II grid, {load()}", flush=True)
            out = grid()
            print(f"# grid: {out['wall']:.0f} s wall, {out['cpu']:.0f} s CPU (all processes), "
                  f"exit {out['status']}; {load()}   (target: < 15 min wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
