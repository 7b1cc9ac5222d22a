"""Batched (vectorized-clients) executor vs the serial per-client loop, on the DALD Table II
workload: MNIST 3 vs 7 (12396 × 784 pixels in [0, 1], ~81% zeros), the strided non-IID
partition over n clients, L1-logistic regression f_i(w) = (1/N) Σ_{rows of i} log(1 + e^{−b wᵀa})
+ λ‖w‖₁ on every client, one proximal-gradient local step per iteration (W = 1, α = 0.1).

For each n it runs Fed-DALD-CC and FedProx (warm-started, as the paper's baseline) for a few
iterations on both executors, checks the two runs agree to 1e-12, and reports the time per
iteration (from the history's time stamps, the first iteration — which builds the batched
plans — left out) and the ratio serial / batched. At n = 1000 it also times one pass
Xᵀ(X v) over the stacked client data (dense numpy and scipy CSR) and reports
time per DALD iteration / time per pass (target ≤ 3).

    python benchmarks/bench_batched.py                 # n = 10, 100, 1000 (a few minutes)
    python benchmarks/bench_batched.py --quick         # n = 10, 100

Timings are ratios measured in one run, each pair back to back; see benchmarks/common.py.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

if __package__ in (None, ""):   # run as a script: `python benchmarks/bench_batched.py`
    import os
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.common import blas_threads, compare, machine_info
else:
    from .common import blas_threads, compare, machine_info

import fedmodel as fm
from fedmodel import backends, datasets
from fedmodel.runtime.batched import BatchedExecutor

LAMBDA = 1e-6       # small enough that the iterates move (λ only changes the prox threshold)
STEP = 0.1


def build(n: int, data) -> fm.Problem:
    parts = datasets.strided_split(data.y, n)
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


def stacked_pass(data, n: int) -> dict[str, float]:
    """Seconds for one Xᵀ(X v) over the rows the n clients hold (dense and CSR)."""
    import scipy.sparse as sp
    X = data.X[np.concatenate(datasets.strided_split(data.y, n))]
    S = sp.csr_matrix(X)
    v = np.random.default_rng(0).random(X.shape[1])
    # and one elementwise pass over the clients' (n, d) model copies, c = a + b: DALD reads and
    # writes x_i, μ_i, ρ_i, the gradients… several times per iteration, whatever the data size
    a, b = np.random.default_rng(1).random((2, n, X.shape[1]))
    timing = compare({"dense": lambda: X.T @ (X @ v), "csr": lambda: S.T @ (S @ v),
                      "state": lambda: a + b}, budget=3.0)
    return {"dense": timing.median("dense"), "csr": timing.median("csr"), "rows": X.shape[0],
            "state": timing.median("state"), "density": float(np.count_nonzero(X)) / X.size}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 10, 100 only")
    parser.add_argument("--iterations", type=int, default=None)
    args = parser.parse_args(argv)
    grid = (10, 100) if args.quick else (10, 100, 1000)
    data = datasets.load_mnist37()
    for key, value in machine_info().items():
        print(f"# {key}: {value}")
    with blas_threads(1) as note:
        print(f"# {note}")
        print(f"# MNIST 3 vs 7, strided split, L1-logistic, λ = {LAMBDA:g}, W = 1 prox-grad step, α = {STEP}")
        print(f"{'n':>6} {'algorithm':>9} {'serial ms/it':>13} {'batched ms/it':>14} {'speed-up':>9}")
        last = {}
        for n in grid:
            iterations = args.iterations or (30 if n < 1000 else 12)
            prob = build(n, data)
            for name, backend in algorithms(iterations).items():
                serial, batched, ex = run_pair(prob, backend)
                last[name] = batched
                print(f"{n:>6} {name:>9} {1e3 * serial:>13.2f} {1e3 * batched:>14.2f} "
                      f"{serial / batched:>8.1f}×", flush=True)
        n = grid[-1]
        ref = stacked_pass(data, n)
        print(f"# one pass Xᵀ(X v) over the stacked data of n = {n} ({ref['rows']} × 784, "
              f"{100 * ref['density']:.0f}% nonzero): dense {1e3 * ref['dense']:.2f} ms, "
              f"CSR {1e3 * ref['csr']:.2f} ms; one elementwise pass a + b over (n, d) = ({n}, 784) "
              f"arrays {1e3 * ref['state']:.2f} ms")
        for name, seconds in last.items():
            print(f"# {name} batched iteration / pass: {seconds / ref['dense']:.1f}× dense, "
                  f"{seconds / ref['csr']:.1f}× CSR (target ≤ 3×); "
                  f"{seconds / ref['state']:.0f} elementwise (n, d) passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
