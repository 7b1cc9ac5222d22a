"""Scale (issue 16, part 3, skeleton): time per iteration vs the number of clients n for the
serial, batched and JAX executors, as a ratio to one pass Xᵀ(X v) over the stacked data
measured in the same run.

Workload: synthetic logistic regression (labels ±1) or least squares, d features, each client
with a random number of rows in [rows_min, rows_max] (ragged), Fed-DALD-CC with one
gradient local step per iteration (W = 1, α = STEP). Per executor and n: the seconds per
iteration from the run's history time stamps (the first iterations — which compile the JAX
functions and build the batched plans — left out), its ratio to the median of REPS dense
passes Xᵀ(X v) over the stacked (Σm_i, d) data, the process's peak resident memory after the
run (ru_maxrss: a running maximum over the whole process, so read it as an upper bound), and
the largest difference of the final iterate from the serial run's (when serial ran).

    python benchmarks/bench_scale.py                         # n = 100, 1000; d = 10, 784
    python benchmarks/bench_scale.py --n 100 --d 10 --quick  # a few seconds
    python benchmarks/bench_scale.py --n 10000 --executors batched jax --loss least_squares

Serial is skipped above --max-serial-n (its cost is n compiled programs run one by one). The
machine is shared: the load average is printed with the table. Not part of the test suite.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np

if __package__ in (None, ""):   # run as a script: `python benchmarks/bench_scale.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fedmodel as fm
from fedmodel import backends

STEP = 0.05
REPS = 20


def build(n: int, d: int, loss: str, rows: tuple[int, int], seed: int = 0):
    """The problem and its stacked data matrix (for the reference pass)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=f"scale-{loss}-n{n}-d{d}")
    blocks = []
    sizes = rng.integers(rows[0], rows[1] + 1, n)
    total = int(sizes.sum())
    truth = rng.normal(size=d) / np.sqrt(d)
    for i, m in enumerate(sizes):
        X = rng.normal(size=(m, d))
        c = prob.add_client(f"c{i}")
        Xd = c.data(X, name="X")
        if loss == "logistic":
            b = np.sign(X @ truth + 0.1 * rng.normal(size=m))
            c.minimize(fm.sum(fm.logistic(-fm.multiply(c.data(b, name="b"), Xd @ w))) / total)
        else:
            y = X @ truth + 0.1 * rng.normal(size=m)
            c.minimize(fm.sum_squares(Xd @ w - c.data(y, name="y")) / total)
        blocks.append(X)
    return prob, np.concatenate(blocks, axis=0)


def one_pass(X: np.ndarray) -> float:
    """Median seconds of Xᵀ(X v) over the stacked data."""
    v = np.random.default_rng(1).normal(size=X.shape[1])
    times = []
    for _ in range(REPS):
        start = time.perf_counter()
        X.T @ (X @ v)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def per_iteration(result: dict, skip: int) -> float:
    times = [r["time"] for r in result["history"]][skip:]
    return (times[-1] - times[0]) / max(len(times) - 1, 1)


def executor(name: str):
    if name == "jax":
        from fedmodel.runtime.jax_executor import JaxExecutor
        return JaxExecutor()
    return name


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--d", type=int, nargs="+", default=[10, 784])
    parser.add_argument("--loss", choices=["logistic", "least_squares"], default="logistic")
    parser.add_argument("--rows", type=int, nargs=2, default=[10, 100])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--executors", nargs="+", default=["serial", "batched", "jax"])
    parser.add_argument("--max-serial-n", type=int, default=1000)
    parser.add_argument("--backend", choices=["dald", "fedadmm"], default="dald",
                        help="Fed-DALD-CC (W = 1 gradient step) or FedADMM-InSa (its defaults: "
                             "inexact local gradient steps, adaptive β_i)")
    parser.add_argument("--quick", action="store_true", help="8 iterations")
    args = parser.parse_args(argv)
    iterations = 8 if args.quick else args.iterations
    skip = 2                        # compile / plan-building iterations left out
    print(f"# bench_scale: {args.loss}, rows per client {args.rows[0]}–{args.rows[1]}, "
          f"{iterations} {args.backend} iterations, load average {os.getloadavg()[0]:.2f}")
    print("| n | d | rows | executor | s / iteration | one pass Xᵀ(Xv) (s) | ratio | peak RSS (MB) | max |Δ| vs serial |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in args.d:
        for n in args.n:
            prob, X = build(n, d, args.loss, tuple(args.rows))
            reference = one_pass(X)
            serial_values = None
            for name in args.executors:
                if name == "serial" and n > args.max_serial_n:
                    print(f"| {n} | {d} | {X.shape[0]} | serial | skipped (n > {args.max_serial_n}) | | | | |")
                    continue
                backend = backends.DALD(solver="gd", step=STEP, max_iterations=iterations,
                                        eps_primal=0.0, eps_dual=0.0) if args.backend == "dald" else \
                    backends.FedADMM(max_rounds=iterations, tol=None)
                start = time.perf_counter()
                # Backend.run, not prob.solve: solve's final objective evaluates the whole
                # model as one plan, which Python cannot compile at n = 10⁴ (RecursionError)
                result = backend.run(prob, topology=None, executor=executor(name), callback=None,
                                     verbose=False, checkpoint=None, checkpoint_every=None,
                                     resume=False)
                wall = time.perf_counter() - start
                t = per_iteration(result, skip)
                values = np.concatenate([np.ravel(v) for v in result["values"].values()])
                if name == "serial":
                    serial_values = values
                diff = "" if serial_values is None else f"{np.max(np.abs(values - serial_values)):.1e}"
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                print(f"| {n} | {d} | {X.shape[0]} | {name} | {t:.2e} | {reference:.2e} | "
                      f"{t / reference:.1f} | {rss:.0f} | {diff} |  (whole solve {wall:.1f} s)", flush=True)
    print(f"# load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
