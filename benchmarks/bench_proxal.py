"""ProxAL vs CVXPY's centralized solve (and vs CentralizedProxAL) on the Neyman-Pearson model
of the constrained-FL paper, as ratios measured in one run (issue 3's benchmark).

For each dataset and n: wall time of CVXPY (Clarabel, with fallbacks), of ProxAL in serial
simulation (adaptive ρ, q = 0.9, the paper's β = 300, s̄ = 1e-3, ε = (1e-3, 1e-3)), and of
cProx-AL; whether each answer verifies against CVXPY's; ProxAL's time per outer iteration
divided by the time of one value-and-gradient pass over all the data (numpy, hand-written).
Also the inner iterations of the paper's fixed ρ = 0.01 in the first outer iteration (capped).

    python benchmarks/bench_proxal.py [--quick]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fedmodel as fm  # noqa: E402
from backends import CentralizedProxAL, ProxAL  # noqa: E402
from fedmodel.reproductions import table1  # noqa: E402


def full_gradient_seconds(X, y, w, repeats: int = 20) -> float:
    """One value-and-gradient pass of the NP objective and constraint over all data."""
    X0, X1 = X[y == 0], X[y == 1]
    start = time.perf_counter()
    for _ in range(repeats):
        z0, z1 = X0 @ w, X1 @ w
        value = np.mean(np.logaddexp(0, z0)) + np.mean(np.logaddexp(0, -z1))
        grad = X0.T @ (0.5 * (1 + np.tanh(z0 / 2))) / len(z0) - X1.T @ (0.5 * (1 - np.tanh(z1 / 2))) / len(z1)
    del value, grad
    return (time.perf_counter() - start) / repeats


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(quick: bool = False) -> None:
    cases = [("breast-cancer-wisc", 5), ("monks-1", 5)] if quick else \
        [("breast-cancer-wisc", 5), ("monks-1", 5), ("adult-a", 1), ("adult-a", 5), ("adult-a", 20)]
    print("| dataset | n | CVXPY (solver) | ProxAL | ratio CVXPY/ProxAL | cProx-AL | verified | outer / inner "
          "| s per outer / one full gradient | fixed ρ=0.01: inner its in outer 1 |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for name, n in cases:
        X, y = table1.load(name)
        prob, w, _ = table1.build(X, y, n)
        ref, t_ref = timed(lambda: prob.solve("cvxpy"))
        fed, t_fed = timed(lambda: prob.solve(ProxAL(**table1.SETTINGS)))
        central, t_central = timed(lambda: prob.solve(CentralizedProxAL(
            beta=table1.SETTINGS["beta"], s_bar=table1.SETTINGS["s_bar"], tol=table1.SETTINGS["tol"])))
        report = fm.verify(fed, reference=ref)
        per_outer = t_fed / fed.iterations["outer"]
        grad = full_gradient_seconds(X, y, fed.value(w))
        fixed = prob.solve(ProxAL(beta=300.0, rho=0.01, s_bar=1e-3, max_outer=1, max_inner=3000))
        fixed_inner = fixed.iterations["inner"]
        print(f"| {name} | {n} | {t_ref:.2f} s ({ref.info.get('solver', '?')}) | {t_fed:.2f} s | "
              f"{t_ref / t_fed:.1f} | {t_central:.2f} s | {'yes' if report.ok else 'NO'} "
              f"(gap {report.objective_gap:.1e}) | {fed.iterations['outer']} / {fed.iterations['inner']} | "
              f"{per_outer / grad:.0f} | {fixed_inner}{'+' if fixed_inner >= 3000 else ''} |", flush=True)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
