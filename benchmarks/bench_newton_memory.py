"""Peak memory of ProxAL's Newton steps at many clients (issue 27 item 2): bench_rounds'
mnist-ball (d = 784) at n clients under `ProxAL(inner=NewtonInner())`, one fresh process per
run, reporting the round trips, wall seconds, the process's peak RSS before and after the
solve (`ru_maxrss`: the data's load is the first) and tracemalloc's peak over the solve in
d × d matrices (`--tracemalloc`: slower). `--budget` raises `DENSE_NEWTON_FLOATS` (the code
before the streaming sums refused n ≥ 32 at the default).

    python benchmarks/bench_newton_memory.py --n 40 200
    python benchmarks/bench_newton_memory.py --n 40 --budget 1e10 --tracemalloc
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before numpy: a shared machine's cores

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one(n: int, budget: float | None, traced: bool) -> dict:
    """One solve in this process (the child's part)."""
    from benchmarks import bench_rounds
    from fedmodel.runtime import solvers
    if budget:
        solvers.DENSE_NEWTON_FLOATS = budget
    prob, _ = bench_rounds.mnist_ball(n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    res = prob.solve(bench_rounds._proxal_newton())
    wall = time.perf_counter() - start
    record = {"n": n, "status": res.status, "round_trips": res.info["communication"]["round_trips"],
              "wall_s": round(wall, 2), "rss_before_MB": round(before), "budget": budget,
              "rss_peak_MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    if traced:
        record["traced_peak_dxd"] = round(tracemalloc.get_traced_memory()[1] / (8 * 784 * 784), 1)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", nargs="+", type=int, default=[40, 200])
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one(args.n[0], args.budget, args.tracemalloc)))
        return
    for n in args.n:            # a fresh process each: ru_maxrss is the process's peak
        command = [sys.executable, __file__, "--child", "--n", str(n)] + \
            (["--budget", str(args.budget)] if args.budget else []) + (["--tracemalloc"] if args.tracemalloc else [])
        out = subprocess.run(command, capture_output=True, text=True)
        print(out.stdout.strip().splitlines()[-1] if out.returncode == 0 else f"n = {n}: {out.stderr[-500:]}",
              flush=True)


if __name__ == "__main__":
    main()
