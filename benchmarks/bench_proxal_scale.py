"""ProxAL per outer iteration vs the number of clients n, serial vs batched vs JAX executors
(issue 16; the vectorized client steps of backends/proxal_nodes.py), in one process.

Workload: synthetic logistic regression (labels ±1, d features, 10–100 rows per client), each
client with its own norm ball ‖w − c_i‖² ≤ 1 (an augmented-Lagrangian term: Newton local
solves, "auto"), ProxAL with its defaults (Anderson, adaptive ρ_i) for a fixed number of outer
iterations. Per executor and n: seconds per outer iteration and per ADMM step over the outer
iterations after the first (the first builds the batched plans and compiles JAX's functions;
its time is printed apart), ADMM steps per outer iteration, and the largest difference of the
final w from the serial run's.

    python benchmarks/bench_proxal_scale.py                   # n = 200, 1000; d = 10
    python benchmarks/bench_proxal_scale.py --n 200 --outer 2 --executors batched jax

The machine is shared: the load average is printed with the table. Not part of the test suite.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

if __package__ in (None, ""):   # run as a script
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fedmodel as fm
from fedmodel import backends


def build(n: int, d: int, rows: tuple[int, int] = (10, 100), seed: int = 0) -> tuple[fm.Problem, fm.Variable]:
    """n logistic clients of 10–100 rows, each with the ball ‖w − c_i‖² ≤ 1 (c_i small)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=f"proxal-scale-n{n}-d{d}")
    truth = rng.normal(size=d) / np.sqrt(d)
    sizes = rng.integers(rows[0], rows[1] + 1, n)
    total = int(sizes.sum())
    for i, m in enumerate(sizes):
        X = rng.normal(size=(m, d))
        b = np.sign(X @ truth + 0.1 * rng.normal(size=m))
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum(fm.logistic(-fm.multiply(c.data(b, name="b"), c.data(X, name="X") @ w))) / total)
        c.subject_to(fm.sum_squares(w - 0.1 * rng.normal(size=d) / np.sqrt(d)) <= 1.0)
    return prob, w


def executor(name: str):
    if name == "jax":
        from fedmodel.runtime.jax_executor import JaxExecutor
        return JaxExecutor()
    return name


def run(prob: fm.Problem, w: fm.Variable, name: str, outer: int) -> dict:
    start = time.perf_counter()
    with warnings.catch_warnings():      # the JAX executor's fallback notes (set-up steps)
        warnings.simplefilter("ignore")
        # tol far below reach: every run does `outer` outer iterations
        res = prob.solve(backends.ProxAL(max_outer=outer, tol=(1e-12, 1e-12)), executor=executor(name))
    total = time.perf_counter() - start
    times = [r["time"] for r in res.history]
    inner = [r["inner"] for r in res.history]
    later = (times[-1] - times[0]) / max(len(times) - 1, 1) if len(times) > 1 else float("nan")
    steps = sum(inner[1:]) or 1
    return {"first": times[0], "outer": later, "step": (times[-1] - times[0]) / steps,
            "inner": inner, "w": np.asarray(res.values[w.uid]), "total": total}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--outer", type=int, default=3, help="outer iterations per run")
    parser.add_argument("--executors", nargs="+", default=["serial", "batched", "jax"])
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}; d = {args.d}, {args.outer} outer iterations")
    print("| n | executor | first outer (s) | s / outer | s / ADMM step | ADMM steps per outer "
          "| whole solve (s) | max |w − w_serial| |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.n:
        prob, w = build(n, args.d)
        reference = None
        for name in args.executors:
            out = run(prob, w, name, args.outer)
            if name == "serial":
                reference = out["w"]
            diff = "—" if reference is None else f"{np.max(np.abs(out['w'] - reference)):.1e}"
            print(f"| {n} | {name} | {out['first']:.2f} | {out['outer']:.3f} | {out['step'] * 1e3:.2f} ms | "
                  f"{out['inner']} | {out['total']:.1f} | {diff} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
