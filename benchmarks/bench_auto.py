"""`backend="auto"` beside every backend's defaults on bench_rounds' suite (issue 27, item 5).

For each model and n: one CVXPY reference, then `prob.solve()` (auto, serial executor), auto on
a serial executor declared as dear per round trip (`round_trip_cost` 5 s, a Flower deployment's
order: auto's "dear" settings), and each backend of `--backends` with its defaults. Each run
reports round trips (the ledger's), whether it verifies (`fm.verify` against the reference,
1e-3), CPU and wall seconds of `prob.solve`; the table puts auto's round trips beside the best
verified default's, and the ratio (the test, tests/test_auto.py, asserts ≤ 2 on round trips;
wall times live only here):

    nice -n 19 python benchmarks/bench_auto.py --out auto.jsonl --models ridge logistic --n 5 40
    python benchmarks/bench_auto.py --out auto.jsonl --table

BLAS on one thread (benchmarks/common.py); the records are JSON lines appended to `--out`.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before numpy: a shared machine's cores

import argparse  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fedmodel as fm  # noqa: E402
from benchmarks import bench_rounds  # noqa: E402
from benchmarks.bench_rounds import _append, load, timed_solve  # noqa: E402
from benchmarks.common import machine_info  # noqa: E402
from fedmodel.backends.auto import Auto  # noqa: E402
from fedmodel.runtime.executor import SerialExecutor  # noqa: E402

BACKENDS = ("proxal", "fedadmm", "dald")


class _DearSerial(SerialExecutor):
    round_trip_cost = 5.0


class DearAuto:
    """`backend="auto"` run as if every round trip cost 5 s (the serial executor underneath)."""

    def solve(self, problem, **options):
        options["executor"] = _DearSerial()
        return Auto().solve(problem, **options)


RUNS = {"auto": "auto", "auto-dear": DearAuto()}


def run_case(model: str, n: int, backends, timeout: float, out: Path | None) -> list[dict]:
    """auto (cheap and dear round trips) and each backend's defaults on one model at n clients."""
    prob, _ = bench_rounds.MODELS[model](n)
    reference, cvxpy_wall, _, outcome = timed_solve(prob, "cvxpy", timeout)
    records = []
    for label, backend in [*RUNS.items(), *((b, b) for b in backends)]:
        print(f"# {model} n={n} {label} …", file=sys.stderr, flush=True)
        result, wall, cpu, outcome = timed_solve(prob, backend, timeout)
        record = {"model": model, "n": n, "run": label, "outcome": outcome, "wall_s": wall,
                  "cpu_s": cpu, "cvxpy_s": cvxpy_wall}
        if result is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ok = reference is not None and bool(fm.verify(result, reference).ok)
            record.update(backend=result.backend, status=result.status, verified=ok,
                          round_trips=int(result.info["communication"]["round_trips"]),
                          auto=result.info.get("auto"))
        records.append(record)
        _append(out, [record])
    return records


def table(records: list[dict]) -> str:
    """Markdown: per (model, n), auto's pick and round trips beside the best verified default."""
    cases: dict[tuple, dict[str, dict]] = {}
    for r in records:
        cases.setdefault((r["model"], r["n"]), {})[r["run"]] = r
    order = {name: i for i, name in enumerate(bench_rounds.MODELS)}
    lines = ["| model | n | auto picked (settings) | auto round trips, verified | dear: picked, round trips, verified | "
             "best default: round trips | auto / best | auto CPU / wall s | best's CPU / wall s |",
             "|---|---:|---|---|---|---|---:|---:|---:|"]
    for key in sorted(cases, key=lambda k: (k[1], order.get(k[0], 99))):
        runs = cases[key]
        auto, dear = runs.get("auto", {}), runs.get("auto-dear", {})
        fine = {k: r for k, r in runs.items() if k not in RUNS and r.get("verified")}
        best = min(fine.values(), key=lambda r: r["round_trips"]) if fine else None

        def cell(r):
            if r.get("outcome") != "ok":
                return f"— ({r.get('outcome', 'not run')})"
            return f"{r['round_trips']}, {'yes' if r['verified'] else 'NO'}"

        pick = (f"{auto['auto']['backend']} {auto['auto']['settings'] or ''}".strip()
                if auto.get("auto") else "—")
        dpick = (f"{dear['auto']['backend']} {dear['auto']['settings'] or ''}".strip()
                 if dear.get("auto") else "—")
        ratio = (f"{auto['round_trips'] / best['round_trips']:.2f}"
                 if best and auto.get("round_trips") else "—")
        best_cell = f"{best['run']}: {best['round_trips']}" if best else "none verifies"
        best_time = f"{best['cpu_s']:.2f} / {best['wall_s']:.2f}" if best else "—"
        auto_time = f"{auto['cpu_s']:.2f} / {auto['wall_s']:.2f}" if "cpu_s" in auto else "—"
        lines.append(f"| {key[0]} | {key[1]} | {pick} | {cell(auto)} | {dpick}: {cell(dear)} | "
                     f"{best_cell} | {ratio} | {auto_time} | {best_time} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ridge", "logistic", "logistic-ball", "lasso"],
                        choices=list(bench_rounds.MODELS))
    parser.add_argument("--n", nargs="+", type=int, default=[5, 40])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS),
                        choices=list(bench_rounds.BACKENDS))
    parser.add_argument("--timeout", type=float, default=300.0, help="wall seconds per run")
    parser.add_argument("--out", type=Path, default=Path("bench_auto.jsonl"))
    parser.add_argument("--table", action="store_true", help="print the table of --out only")
    args = parser.parse_args(argv)
    if not args.table:
        info = machine_info()
        print(f"# {info['cpu']}, {info['cores']}, Python {info['python']}, numpy {info['numpy']}",
              flush=True)
        bench_rounds.warm_up(args.backends)
        for n in args.n:
            for model in args.models:
                run_case(model, n, args.backends, args.timeout, args.out)
    print(table(load(args.out)))


if __name__ == "__main__":
    main()
