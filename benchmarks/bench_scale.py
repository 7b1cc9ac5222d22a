"""Scale (issue 16, part 3, skeleton): time per iteration vs the number of clients n for the
serial, batched and JAX executors, as a ratio to one pass Xᵀ(X v) over the stacked data
measured in the same run.

Workload: synthetic logistic regression (labels ±1) or least squares, d features, each client
with a random number of rows in [rows_min, rows_max] (ragged), Fed-DALD-CC with one
gradient local step per iteration (W = 1, α = STEP). Per executor and n: the seconds per
iteration from the run's history time stamps (the first iterations — which compile the JAX
functions and build the batched plans — left out), its ratio to the fastest of REPS dense
passes Xᵀ(X v) over the stacked (Σm_i, d) data (the fastest, not the median: on the shared
2-core machine a BLAS pass slows down many times while another process runs), the process's
peak resident memory after the run (ru_maxrss: a running maximum over the whole process, so read it as an upper bound), and
the largest difference of the final iterate from the serial run's (when serial ran).

    python benchmarks/bench_scale.py                         # n = 100, 1000; d = 10, 784
    python benchmarks/bench_scale.py --n 100 --d 10 --quick  # a few seconds
    python benchmarks/bench_scale.py --n 10000 --executors batched jax --loss least_squares

Serial is skipped above --max-serial-n (its cost is n compiled programs run one by one). The
machine is shared: the load average is printed with the table. Not part of the test suite.

`--solve` measures a whole `prob.solve` instead, each (n, executor) in a fresh process (so
peak RSS is that run's), by phase: the checks before the run (validate, convexity, data
scaling), compiling the node programs (`compile_programs`), the executor's start, the first two
iterations (JAX's jit / the batched plans are built there), the later iterations (s / iteration
and the ratio to the fastest of REPS passes), and the final objective and KKT certificate over the whole model.

    python benchmarks/bench_scale.py --solve --n 1000 10000 --d 10 --executors batched jax
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
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


def one_pass(X: np.ndarray, statistic=np.median) -> float:
    """Median (or `statistic`) seconds of Xᵀ(X v) over the stacked data; with np.min, the
    fastest over BLAS's own thread count and one thread (on the shared 2-core machine a
    two-thread BLAS pass waits for a core another process holds: 5–20× slower at times)."""
    v = np.random.default_rng(1).normal(size=X.shape[1])

    def timed() -> list[float]:
        times = []
        for _ in range(REPS):
            start = time.perf_counter()
            X.T @ (X @ v)
            times.append(time.perf_counter() - start)
        return times
    times = timed()
    if statistic is np.min:
        from threadpoolctl import threadpool_limits
        with threadpool_limits(limits=1, user_api="blas"):
            times += timed()
    return float(statistic(times))


def gpu_pass(X: np.ndarray) -> float | None:
    """The fastest of REPS passes Xᵀ(X v) in float64 on JAX's GPU (jitted, the data on the
    device, timed to `block_until_ready`), or None when JAX's default device is not a GPU: the
    reference for the JAX executor's rows on a GPU machine. JAX is imported only where it can
    see a GPU (`auto_executor.gpu_available`: no import, and no 100+ MB in the RSS column, on a
    CPU-only machine)."""
    from fedmodel.runtime.auto_executor import gpu_available
    if not gpu_available():
        return None
    import jax
    from fedmodel.compiler.jax_codegen import float64
    with float64():
        data = jax.device_put(X)
        v = jax.device_put(np.random.default_rng(1).normal(size=X.shape[1]))
        product = jax.jit(lambda A, u: A.T @ (A @ u))
        product(data, v).block_until_ready()
        times = []
        for _ in range(REPS):
            start = time.perf_counter()
            product(data, v).block_until_ready()
            times.append(time.perf_counter() - start)
        del data
    return min(times)


def gpu_note(name: str, seconds: float, reference: float | None) -> str:
    """For a row that ran on the JAX executor (`name`: the executor that ran) on a GPU: the ratio
    to the GPU's own pass and the device's peak memory so far in this process (a running maximum:
    `gpu_pass`'s copy of the data and earlier rows included)."""
    if name != "jax" or reference is None:
        return ""
    import jax
    peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use", 0) / 2**20
    return (f" (GPU: pass {reference:.2e} s, ratio {seconds / reference:.1f}, "
            f"process's peak device memory so far {peak:.0f} MB)")


def machine() -> str:
    """The processor, its cores and JAX's devices: printed with every table."""
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "?") if os.path.exists("/proc/cpuinfo") else "?"
    from fedmodel.runtime.auto_executor import gpu_available
    devices = "no GPU"
    if gpu_available():                 # (JAX is not imported on a CPU-only machine)
        import jax
        devices = ", ".join(sorted({getattr(d, "device_kind", d.platform) for d in jax.devices()}))
    return f"{cpu}, {os.cpu_count()} cores; GPU: {devices}"


def per_iteration(result: dict, skip: int) -> float:
    times = [r["time"] for r in result["history"]][skip:]
    return (times[-1] - times[0]) / max(len(times) - 1, 1)


def executor(name: str):
    """The executor to pass to a run (`auto`: an AutoExecutor, whose `chosen` names its pick)."""
    if name == "jax":
        from fedmodel.runtime.jax_executor import JaxExecutor
        return JaxExecutor()
    if name == "auto":
        from fedmodel.runtime.auto_executor import AutoExecutor
        return AutoExecutor()
    return name


def ran(chosen, name: str) -> str:
    """The executor that ran: `auto`'s pick, or the name given."""
    return getattr(chosen, "chosen", None) or name


def solve_once(n: int, d: int, loss: str, rows: tuple[int, int], iterations: int,
               name: str) -> str:
    """One `prob.solve` (Fed-DALD-CC, W = 1 gradient step) timed by phase: a table row."""
    import fedmodel.backends.base as base
    import fedmodel.backends.dald.backend as dald_backend
    prob, X = build(n, d, loss, rows)
    # the fastest pass: on the shared 2-core machine a BLAS pass slows down up to 30× while
    # another process runs, and the median then follows the neighbours' load
    reference = one_pass(X, np.min)
    on_gpu = gpu_pass(X) if name in ("jax", "auto") else None
    del X
    phases: dict[str, float] = {}

    def timed(module, attribute: str):       # the backend's own call of module.attribute, timed
        original = getattr(module, attribute)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = original(*args, **kwargs)
            phases[attribute] = time.perf_counter() - start
            return out
        setattr(module, attribute, wrapper)

    timed(dald_backend, "compile_programs")
    timed(base, "finish_result")
    backend = backends.DALD(solver="gd", step=STEP, max_iterations=iterations, eps_primal=0.0,
                            eps_dual=0.0)
    chosen = executor(name)                  # imports JAX: not part of the solve
    start = time.perf_counter()
    result = prob.solve(backend, executor=chosen)
    total = time.perf_counter() - start
    history = result.history
    loop = history[-1]["time"]               # from the start of the first iteration
    first = history[1]["time"]               # the first two iterations: JIT / plan building
    t = per_iteration({"history": history}, 2)
    checks = total - result.wall_time - phases["finish_result"]   # validate, convexity, scaling
    other = result.wall_time - loop - phases["compile_programs"]  # executor start, x0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (f"| {n} | {d} | {name} | {checks:.1f} | {phases['compile_programs']:.1f} | {other:.1f} "
            f"| {first:.1f} | {t:.2e} | {t / reference:.1f} | {phases['finish_result']:.1f} "
            f"| {total:.1f} | {rss:.0f} |{gpu_note(ran(chosen, name), t, on_gpu)}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--d", type=int, nargs="+", default=[10, 784])
    parser.add_argument("--loss", choices=["logistic", "least_squares"], default="logistic")
    parser.add_argument("--rows", type=int, nargs=2, default=[10, 100])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--executors", nargs="+", default=["serial", "batched", "jax"],
                        help="serial, batched, jax, auto (the executor `auto` picks: named in "
                             "the row)")
    parser.add_argument("--max-serial-n", type=int, default=1000)
    parser.add_argument("--backend", choices=["dald", "fedadmm"], default="dald",
                        help="Fed-DALD-CC (W = 1 gradient step) or FedADMM-InSa (its defaults: "
                             "inexact local gradient steps, adaptive β_i)")
    parser.add_argument("--report-every", type=int, default=1,
                        help="Fed-DALD-CC's report_every: the objective over every client's data "
                             "every k-th iteration (the default 1 is DALD's; a larger k measures "
                             "the algorithm's own step without that monitoring pass)")
    parser.add_argument("--quick", action="store_true", help="8 iterations")
    parser.add_argument("--solve", action="store_true",
                        help="time whole prob.solve runs by phase, one fresh process each")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a --solve child
    args = parser.parse_args(argv)
    iterations = 8 if args.quick else args.iterations
    if args.one:
        print(solve_once(args.n[0], args.d[0], args.loss, tuple(args.rows), iterations,
                         args.executors[0]), flush=True)
        return
    if args.solve:
        print(f"# bench_scale --solve: {args.loss}, rows per client {args.rows[0]}–{args.rows[1]}, "
              f"{iterations} Fed-DALD-CC iterations, load average {os.getloadavg()[0]:.2f}")
        print(f"# machine: {machine()}")
        print("| n | d | executor | checks (s) | compile_programs (s) | executor start (s) "
              "| first 2 iterations (s) | s / iteration | ratio | objective + certificate (s) "
              "| whole solve (s) | peak RSS (MB) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for d in args.d:
            for n in args.n:
                for name in args.executors:
                    child = subprocess.run(
                        [sys.executable, os.path.abspath(__file__), "--one", "--n", str(n), "--d",
                         str(d), "--loss", args.loss, "--rows", *map(str, args.rows),
                         "--iterations", str(iterations), "--executors", name],
                        capture_output=True, text=True)
                    rows = [line for line in child.stdout.splitlines() if line.startswith("|")]
                    print(rows[-1] if rows and child.returncode == 0 else
                          f"| {n} | {d} | {name} | failed: {child.stderr.strip().splitlines()[-1:]} |",
                          flush=True)
        print(f"# load average after: {os.getloadavg()[0]:.2f}")
        return
    skip = 2                        # compile / plan-building iterations left out
    print(f"# bench_scale: {args.loss}, rows per client {args.rows[0]}–{args.rows[1]}, "
          f"{iterations} {args.backend} iterations (objective reported every {args.report_every}), "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"# machine: {machine()}")
    print("| n | d | rows | executor | s / iteration | one pass Xᵀ(Xv) (s) | ratio | peak RSS (MB) | max |Δ| vs serial |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in args.d:
        for n in args.n:
            prob, X = build(n, d, args.loss, tuple(args.rows))
            reference = one_pass(X, np.min)     # the fastest: robust to the neighbours' load
            on_gpu = gpu_pass(X) if {"jax", "auto"} & set(args.executors) else None
            rows = X.shape[0]
            del X                               # (a copy of the data: 3.4 GB at n = 10⁴, d = 784)
            serial_values = None
            for name in args.executors:
                if name == "serial" and n > args.max_serial_n:
                    print(f"| {n} | {d} | {rows} | serial | skipped (n > {args.max_serial_n}) | | | | |")
                    continue
                backend = backends.DALD(solver="gd", step=STEP, max_iterations=iterations,
                                        eps_primal=0.0, eps_dual=0.0,
                                        report_every=args.report_every) if args.backend == "dald" else \
                    backends.FedADMM(max_rounds=iterations, tol=None)
                chosen = executor(name)
                start = time.perf_counter()
                # Backend.run, not prob.solve: solve's final objective evaluates the whole
                # model as one plan, which Python cannot compile at n = 10⁴ (RecursionError)
                result = backend.run(prob, topology=None, executor=chosen, callback=None,
                                     verbose=False, checkpoint=None, checkpoint_every=None,
                                     resume=False)
                wall = time.perf_counter() - start
                t = per_iteration(result, skip)
                values = np.concatenate([np.ravel(v) for v in result["values"].values()])
                if name == "serial":
                    serial_values = values
                diff = "" if serial_values is None else f"{np.max(np.abs(values - serial_values)):.1e}"
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                label = f"auto ({ran(chosen, name)})" if name == "auto" else name
                print(f"| {n} | {d} | {rows} | {label} | {t:.2e} | {reference:.2e} | "
                      f"{t / reference:.1f} | {rss:.0f} | {diff} |  (whole solve {wall:.1f} s)"
                      f"{gpu_note(ran(chosen, name), t, on_gpu)}", flush=True)
    print(f"# load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
