"""Default `ProxAL()` vs the paper's setting `ProxAL.paper()` vs CVXPY-Clarabel on the
Neyman-Pearson model of the constrained-FL paper, in one run (issue 13, point 3's targets:
monks-1 (one-hot) at n = 5 in < 1 s verified; adult at n = 1 and 5 in ≤ 1/20 of Clarabel's time,
verified).

For each case (the `fedmodel reproduce table1` model: no intercept, class-1 loss ≤ 0.2 per
client, per-class equal split): CVXPY with Clarabel alone at its default tolerances (CPU and
wall time, status); default ProxAL (fastest of `--repeats` runs); the paper preset, stopped by a
callback once it has run `--cap` seconds (reported as "> cap"); each ProxAL answer checked by
`fm.verify` against the Clarabel answer. CPU time (BLAS pinned to one thread) is the headline
because the machine is shared; wall time beside it.

    python benchmarks/bench_proxal_defaults.py [--cap SECONDS] [--repeats N] [--quick]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before numpy: CPU time = one core's work

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fedmodel as fm  # noqa: E402
from fedmodel.backends import CVXPY, ProxAL  # noqa: E402
from benchmarks.common import capped_solve, timed  # noqa: E402
from fedmodel.reproductions import proxal_table1 as table1  # noqa: E402

CASES = [("monks-1", 5), ("adult-a", 1), ("adult-a", 5)]


def capped_paper(prob, cap: float):
    """`ProxAL.paper()` until it ends or `cap` wall seconds pass (then None: "> cap")."""
    return capped_solve(prob, ProxAL.paper, None, cap)["result"]


def describe(result, reference) -> str:
    report = fm.verify(result, reference=reference)
    return (f"{result.status}, {result.iterations['outer']} / {result.iterations['inner']}, "
            f"{'yes' if report.ok else 'NO'} ({report.objective_gap:.1e})")


def main(cap: float, repeats: int, quick: bool) -> None:
    print("| dataset | n | CVXPY-Clarabel CPU / wall (status) | default ProxAL CPU / wall "
          "| Clarabel / default (CPU) | default: status, outer / inner, verified (gap) "
          "| ProxAL.paper() CPU / wall | paper: status, outer / inner, verified (gap) |")
    print("|---|---:|---|---:|---:|---|---:|---|")
    for name, n in CASES[:1] if quick else CASES:
        X, y = table1.load(name)
        prob, _, _ = table1.build(X, y, n)
        ref, ref_cpu, ref_wall = timed(lambda: prob.solve(CVXPY(solver="CLARABEL")))
        reference = ref if ref.status == "converged" else prob.solve("cvxpy")   # the fallback chain
        fast, cpu, wall = timed(lambda: prob.solve(ProxAL()), repeats)
        paper, p_cpu, p_wall = timed(lambda: capped_paper(prob, cap))
        paper_time = f"> {cap:g} s (capped)" if paper is None else f"{p_cpu:.2f} / {p_wall:.2f} s"
        paper_row = "stopped at the cap" if paper is None else describe(paper, reference)
        print(f"| {name} | {n} | {ref_cpu:.2f} / {ref_wall:.2f} s ({ref.status}) | {cpu:.2f} / {wall:.2f} s | "
              f"{ref_cpu / cpu:.1f} | {describe(fast, reference)} | {paper_time} | {paper_row} |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=60.0, help="seconds for the paper preset")
    parser.add_argument("--repeats", type=int, default=3, help="default ProxAL: fastest of N")
    parser.add_argument("--quick", action="store_true", help="monks-1 only")
    args = parser.parse_args()
    main(args.cap, args.repeats, args.quick)
