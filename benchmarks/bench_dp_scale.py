"""DP-ADMM per round vs the number of clients n: serial, batched and JAX executors (issue 16).

Workload: synthetic logistic regression (labels ±1), d features, each client with a random
number of rows in [rows_min, rows_max] (ragged), loss scaled by 1/I (I: all records).
DPADMM(epsilon=1, seed=0) — ObjP with per-record clipping (sensitivity "clip", the default) —
and, with --mechanisms, OutP and ε̄ = ∞ (rho_schedule "mnist": no curvature probe). Per
(mechanism, n, d, executor): seconds per round from the history's time stamps (the first
`--skip` rounds, where plans are built and JAX compiles, left out; every round includes the
objective report the history logs), and the largest difference of the final client models
from the serial run's (seeded: the same noise). All in one process, one after the other.

    python benchmarks/bench_dp_scale.py                       # n = 200, 1000; d = 10, 784
    python benchmarks/bench_dp_scale.py --n 200 --d 10 --rounds 6

Not part of the test suite. The machine is shared: the load average is printed with the table.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

if __package__ in (None, ""):   # run as a script: `python benchmarks/bench_dp_scale.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fedmodel as fm
from fedmodel.backends.dp_admm import DPADMM

MECHANISMS = {"objP-clip": dict(epsilon=1.0), "outP": dict(epsilon=1.0, variant="outP"),
              "none": dict()}


def build(n: int, d: int, rows: tuple[int, int], seed: int = 0) -> fm.Problem:
    """n clients of logistic regression with rows[0]..rows[1] records each."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=f"dp-scale-n{n}-d{d}")
    sizes = rng.integers(rows[0], rows[1] + 1, n)
    total = int(sizes.sum())
    truth = rng.normal(size=d) / np.sqrt(d)
    for i, m in enumerate(sizes):
        X = rng.normal(size=(m, d))
        b = np.sign(X @ truth + 0.1 * rng.normal(size=m))
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum(fm.logistic(-fm.multiply(c.data(b, name="b"), c.data(X, name="X") @ w))) / total)
    return prob


def run(prob: fm.Problem, executor: str, options: dict, rounds: int, skip: int):
    """(seconds per round after `skip` rounds, the final client models)."""
    backend = DPADMM(seed=0, max_rounds=rounds, tol=0.0, rho_schedule="mnist", **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # the jax executor's notes on one-off set-up steps
        result = prob.solve(backend, executor=executor)
    times = [h["time"] for h in result.history]
    per_round = (times[-1] - times[skip - 1]) / (len(times) - skip)
    return per_round, result.info["client_values"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--d", type=int, nargs="+", default=[10, 784])
    parser.add_argument("--rows", type=int, nargs=2, default=[10, 100])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--skip", type=int, default=3)
    parser.add_argument("--executors", nargs="+", default=["serial", "batched", "jax"])
    parser.add_argument("--mechanisms", nargs="+", default=["objP-clip"], choices=list(MECHANISMS))
    args = parser.parse_args(argv)
    print(f"load average at start: {os.getloadavg()}")
    print("| mechanism | n | d | " + " | ".join(f"{e} (s/round)" for e in args.executors)
          + " | max |z − z_serial| |")
    print("|---|---|---|" + "---|" * len(args.executors) + "---|")
    for mechanism in args.mechanisms:
        for d in args.d:
            for n in args.n:
                prob = build(n, d, tuple(args.rows))
                cells, models = [], {}
                for name in args.executors:
                    start = time.perf_counter()
                    seconds, models[name] = run(prob, name, MECHANISMS[mechanism], args.rounds, args.skip)
                    cells.append(f"{seconds:.3g}")
                    print(f"  ({mechanism}, n={n}, d={d}, {name}: whole solve {time.perf_counter() - start:.1f} s)",
                          file=sys.stderr)
                diff = "—"
                if "serial" in models:
                    diff = f"{max(float(np.max(np.abs(z[c] - models['serial'][c]))) for z in models.values() for c in z):.1e}"
                print(f"| {mechanism} | {n} | {d} | " + " | ".join(cells) + f" | {diff} |", flush=True)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
