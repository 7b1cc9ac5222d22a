"""ProxAL vs CVXPY's centralized solve (and vs CentralizedProxAL) on the Neyman-Pearson model
of the constrained-FL paper, as ratios measured in one run (issue 3's benchmark).

For each dataset and n (the `fedmodel reproduce table1` model: no intercept, class-1 loss ≤ 0.2
per client, per-class equal split):
- CVXPY (Clarabel, with fallbacks): CPU and wall time, solver, status; when it reports the
  model infeasible, the smallest achievable worst-client class-1 loss (min_w max_i loss_i);
- ProxAL in serial simulation with the fast preset (`backends.proxal.FAST_PROXAL`): CPU and
  wall time, outer / inner iterations, `fm.verify(res, reference=cvxpy)`, the CVXPY/ProxAL
  ratio; cProx-AL (Algorithm 3, same β, s̄, ε) and the ProxAL/cProx-AL ratio; ProxAL's CPU time
  per outer iteration divided by one hand-written numpy value-and-gradient pass over all data;
- the paper's setting (`PAPER_PROXAL`: fixed ρ_i = 0.01, q = 0.9): inner iterations and time
  of the first outer iteration (capped at 3000 ADMM iterations), against the fast preset's
  first outer iteration.

CPU time (time.process_time, BLAS pinned to one thread) is the headline because the machine is
shared; wall time is printed beside it.

    python benchmarks/bench_proxal.py [--quick]      # --quick: the two small sets only
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before numpy: CPU time = one core's work

import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fedmodel as fm  # noqa: E402
from fedmodel.backends import CentralizedProxAL, ProxAL  # noqa: E402
from benchmarks.common import timed  # noqa: E402
from fedmodel.backends.proxal import FAST_PROXAL, PAPER_PROXAL  # noqa: E402
from fedmodel.reproductions import proxal_table1 as table1  # noqa: E402

CASES = [("breast-cancer-wisc", 5), ("monks-1", 5), ("adult-a", 1), ("adult-a", 5), ("adult-a", 20)]


def full_gradient_seconds(X, y, w, repeats: int = 20) -> float:
    """CPU seconds of one value-and-gradient pass of the NP objective and constraint over all data."""
    X0, X1 = X[y == 0], X[y == 1]
    start = time.process_time()
    for _ in range(repeats):
        z0, z1 = X0 @ w, X1 @ w
        value = np.mean(np.logaddexp(0, z0)) + np.mean(np.logaddexp(0, -z1))
        grad = X0.T @ (0.5 * (1 + np.tanh(z0 / 2))) / len(z0) - X1.T @ (0.5 * (1 - np.tanh(z1 / 2))) / len(z1)
    del value, grad
    return (time.process_time() - start) / repeats



def main(quick: bool = False) -> None:
    cases = CASES[:2] if quick else CASES
    print(f"fast preset: {FAST_PROXAL}\npaper setting: {PAPER_PROXAL}\n")
    print("| dataset | n | CVXPY CPU / wall (solver, status) | ProxAL fast CPU / wall | CVXPY/ProxAL (CPU) "
          "| verified (gap) | outer / inner | ε=(1e-3,1e-3): CPU, outer / inner, verified "
          "| without Anderson: CPU, outer / inner | cProx-AL CPU | ProxAL/cProx-AL | CPU per outer / one full gradient "
          "| outer 1, paper ρ=0.01 q=0.9: inner, CPU | outer 1, fast: inner, CPU |")
    print("|---|---:|---|---:|---:|---|---:|---|---|---:|---:|---:|---:|---:|")
    notes = []
    for name, n in cases:
        X, y = table1.load(name)
        prob, w, parts = table1.build(X, y, n)
        ref, ref_cpu, ref_wall = timed(lambda: prob.solve("cvxpy"))
        repeats = 3 if n <= 5 else 1      # fastest of 3: the machine is shared
        fed, fed_cpu, fed_wall = timed(lambda: prob.solve(ProxAL(**FAST_PROXAL)), repeats)
        loose, loose_cpu, _ = timed(lambda: prob.solve(ProxAL(**dict(FAST_PROXAL, tol=(1e-3, 1e-3)))), repeats)
        plain, plain_cpu, _ = timed(lambda: prob.solve(ProxAL(**dict(FAST_PROXAL, anderson=0))))
        central, c_cpu, _ = timed(lambda: prob.solve(CentralizedProxAL(
            beta=FAST_PROXAL["beta"], s_bar=FAST_PROXAL["s_bar"], tol=FAST_PROXAL["tol"])))
        report = fm.verify(fed, reference=ref)
        grad = full_gradient_seconds(X, y, fed.value(w))
        per_outer = fed_cpu / fed.iterations["outer"]
        paper1, p_cpu, _ = timed(lambda: prob.solve(ProxAL(**PAPER_PROXAL, max_outer=1, max_inner=3000)))
        fast1, f_cpu, _ = timed(lambda: prob.solve(ProxAL(**FAST_PROXAL, max_outer=1)))
        p_inner = paper1.iterations["inner"]
        status = ref.status
        if status != "converged":
            worst = table1.smallest_worst_client_loss(X, y, parts)
            notes.append(f"{name} n={n}: CVXPY says {status}; min_w max_i class-1 loss = {worst:.4f} "
                         f"({'infeasible' if worst > table1.THRESHOLD else 'feasible'} at {table1.THRESHOLD}); "
                         f"ProxAL ended {fed.status!r}, max violation {fed.max_violation:.1e}")
        verified = f"{'yes' if report.ok else 'NO'} ({report.objective_gap:.1e})"
        loose_ok = "yes" if fm.verify(loose, reference=ref).ok else "NO"
        print(f"| {name} | {n} | {ref_cpu:.2f} / {ref_wall:.2f} s ({ref.info.get('solver', '?')}, {status}) | "
              f"{fed_cpu:.2f} / {fed_wall:.2f} s | {ref_cpu / fed_cpu:.1f} | {verified} | "
              f"{fed.iterations['outer']} / {fed.iterations['inner']} ({fed.status}) | "
              f"{loose_cpu:.2f} s, {loose.iterations['outer']} / {loose.iterations['inner']}, {loose_ok} | "
              f"{plain_cpu:.2f} s, {plain.iterations['outer']} / {plain.iterations['inner']} | {c_cpu:.2f} s | "
              f"{fed_cpu / c_cpu:.1f} | {per_outer / grad:.0f} | "
              f"{p_inner}{'+' if p_inner >= 3000 else ''}, {p_cpu:.2f} s | "
              f"{fast1.iterations['inner']}, {f_cpu:.2f} s |", flush=True)
    for note in notes:
        print("note:", note)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
