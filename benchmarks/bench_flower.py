"""Flower's simulation vs the serial and Ray executors (issue 14, item 6), and what SecAgg+ costs.

FedAvg (one local GD step, tol = 0 so every round runs) on least squares, d = 5, 10 rows per
client, n clients, R rounds, in ONE process, one executor after the other:

1. Seconds per communication round: the median of the differences of the rounds' time stamps
   (`history[k]["time"]`), so start-up (Ray actors, Flower's simulation, the clients' builds)
   is excluded; start-up is reported on its own. Ratios to the serial executor are what to read.
   Flower runs plain and with `secure_sum=True` (Flower's SecAgg+: the server sees only Σ_i x_i)
   on the same simulation.
2. Per round (differences between consecutive rounds, read in the backend's callback, so the
   build and the final gather are excluded): round trips through Flower's Grid; bytes of the
   Flower objects on the wire (`FlowerExecutor.wire_bytes`, both ways); floats in the ledger,
   beside FedAvg's theoretical count 2·n·d (x̂ down and x_i up, once per client).

    python benchmarks/bench_flower.py [--sizes 5,50] [--rounds 10]
    python benchmarks/bench_flower.py --deploy [--sizes 5] [--rounds 4]
    python benchmarks/bench_flower.py --client-cpu
    python benchmarks/bench_flower.py --goal fedadmm-ridge [--sizes 5] [--no-report]
    python benchmarks/bench_flower.py --goal proxal-np-adult [--sizes 5]
    python benchmarks/bench_flower.py --idle --sizes 5

--deploy: the same FedAvg model as a `fedmodel deploy` (`fedmodel.deploy.Deployment`): a real
flower-superlink and one flower-supernode process per client on 127.0.0.1 (insecure), the run
submitted with `flwr run`. Seconds per round = median of the differences of the ServerApp's
round time stamps (start-up and the build excluded); beside it the serial executor on the same
problem in this process. Processes are counted (`ps`) while the deployment is up.

--deploy and --goal run each SuperNode with fedmodel's node process (one long-lived ClientApp
process per SuperNode, `Deployment(node_process=True)`); --process-per-message runs Flower's
default instead (a `flwr-clientapp` process per message), for the before/after comparison. Both
report the deployment's CPU seconds (every process of it, psutil) per round trip and the load
average: wall times on a shared machine depend on the others' load, CPU seconds do not.

--client-cpu: CPU seconds of one ClientApp process before it serves its request (Flower's and
fedmodel's imports, the procedure lookup), Flower's entry point and the catalogue in name order
(before) against `fedmodel deploy`'s lean entry point and the node's kind cache (after).

--goal: issue 27 item 4's deployments, a backend's defaults to the end on a bench_rounds model
(FedADMM on ridge, ProxAL on NP adult): wall seconds from `Deployment.start` to the result,
round trips, the solution's distance to CVXPY's (solved here), and where a round trip goes
(`FlowerExecutor.round_trip_breakdown`: medians over the replies of the run's client-side and
server-side time stamps). --deploy and --goal print that breakdown too. --no-report (FedADMM):
the same run without the per-round `report` request, a Flower round trip of its own that the
ledger books `local` (docs/flower.md, "Messages per round"); the round trips by kind are printed.

--idle: % of a core each kind of process of an idle deployment (n SuperNodes with the node
process, no run) uses: the polling left when no message moves.

Ray: `ray.init(num_cpus=2)` on this machine, shut down before Flower starts its own (Flower's
simulation engine runs on Ray and ends it when it stops).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedmodel.backends import FedAvg  # noqa: E402
from benchmarks.bench_executors import D, model  # noqa: E402
from fedmodel.runtime.executor import SerialExecutor  # noqa: E402


SPARSE = 0.2     # num_shares of the second SecAgg+ run (a fraction of the clients; Flower takes n
#                 when that is 2 or less, so at n = 5 both runs share with everyone)


class _PerRound:
    """Callback: the executor's counters after every round (ledger floats, Flower's round
    trips and wire bytes)."""

    def __init__(self, ex):
        self.ex, self.samples = ex, []

    def __call__(self, record) -> None:
        ex = self.ex
        floats = ex.ledger.total("down")["floats"] + ex.ledger.total("up")["floats"]
        trips = getattr(ex, "round_trips", 0)
        down = ex.wire_total("down") if hasattr(ex, "wire_total") else 0
        up = ex.wire_total("up") if hasattr(ex, "wire_total") else 0
        self.samples.append((floats, trips, down, up))

    def median(self, column: int) -> float:
        values = np.array([s[column] for s in self.samples], float)
        return float(np.median(np.diff(values)))


def run(prob, ex, rounds: int) -> dict:
    """One FedAvg run on `ex`: seconds per round and the per-round counters."""
    counters = _PerRound(ex)
    backend = FedAvg(step=0.1, local_steps=1, max_rounds=rounds, tol=0.0)
    out = backend.run(prob, executor=ex, callback=counters)
    assert out["iterations"]["rounds"] == rounds, out["iterations"]
    seconds = float(np.median(np.diff([r["time"] for r in out["history"]])))
    return {"s": seconds, "floats": counters.median(0), "trips": counters.median(1),
            "down": counters.median(2), "up": counters.median(3)}


DEPLOY_MODEL = """
import sys
sys.path.insert(0, {root!r})
from fedmodel.backends import FedAvg
from benchmarks.bench_executors import model

make_problem = model
backend = FedAvg(step=0.1, local_steps=1, max_rounds={rounds}, tol=0.0)
"""


def _tree(pids: list[int]) -> list:
    """These processes and all their descendants (psutil)."""
    import psutil
    procs = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return list(set(procs))


def _memory_mb(pids: list[int]) -> tuple[float, int]:
    """Resident memory (MB) and count of these processes and all their descendants (psutil)."""
    import psutil
    rss = 0
    procs = _tree(pids)
    for proc in procs:
        try:
            rss += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return rss / 2**20, len(procs)


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) of these processes and their descendants, the children
    they have already waited for included (a process per message: its ClientApps)."""
    import psutil
    total = 0.0
    for proc in _tree(pids):
        try:
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


GOAL_MODEL = """
import sys
sys.path.insert(0, {root!r})
from benchmarks import bench_rounds


def make_problem(n_clients):
    return bench_rounds.MODELS[{model!r}](n_clients)[0]


backend = {backend}
"""
# --no-report (FedADMM): the same backend without the per-round report (the history's
# objective / violation, booked `local` by the ledger; FedADMM(report_every=k) thins it). Since
# the report rides in the next round's request (`executor.Rider`) it costs one batch per run, not
# one per round: the defaults send what this sends plus one; the iterates are bitwise the same
NO_REPORT = """
from fedmodel.backends import FedADMM

backend = FedADMM(report_every=10 ** 6)
"""
# name: (bench_rounds model, the model file's `backend = ...` source)
GOALS = {"fedadmm-ridge": ("ridge", "'fedadmm'"), "proxal-np-adult": ("np-adult", "'proxal'"),
         "auto-ridge": ("ridge", "'auto'"), "auto-np-adult": ("np-adult", "'auto'")}
STAGES = ("to_process", "imports", "to_handler", "lookup", "program", "serve", "save", "to_server", "total",
          "round_trip", "cpu_before", "cpu_handler")


def breakdown_row(label: str, breakdown: dict) -> str:
    """One markdown row of `FlowerExecutor.round_trip_breakdown` (seconds)."""
    return f"| {label} | " + " | ".join(f"{breakdown.get(k, float('nan')):.3f}" for k in STAGES) + " |"


def breakdown_header() -> str:
    return ("| run | " + " | ".join(STAGES) + " |\n|" + "---|" * (len(STAGES) + 1))


def _deployed(text: str, n: int, work: Path, wait: float, timeout: float = 600,
              node_process: bool = True) -> tuple[dict, float]:
    """Run a model file's text as a deployment of n clients; (result, wall s start → result).
    A run without a result after `wait` s is stopped; its result is then the ServerApp's last
    progress line, with "status" "stopped after WAIT s". The result's "cpu_s": CPU seconds of
    every process of the deployment (SuperLink, ServerApp, SuperNodes, ClientApps)."""
    from fedmodel import FedModelError
    from fedmodel.deploy import Deployment
    path = work / "model.py"
    path.write_text(text)
    dep = Deployment(path, n, work / "run", timeout=timeout, start_timeout=1800,
                     node_process=node_process)
    try:
        begin = time.perf_counter()
        dep.start()
        try:
            result = dep.run(wait=wait)
        except FedModelError as err:
            if "no result after" not in str(err):
                raise
            lines = dep.progress_lines()
            result = {**(lines[-1] if lines else {"round_trips": 0, "seconds": float("nan")}),
                      "status": f"stopped after {wait:g} s ({len(lines)} rounds)", "values": {}}
        wall = time.perf_counter() - begin
        result["cpu_s"] = _cpu_s([p.pid for p in [dep.superlink, *dep.supernodes.values()]])
        return result, wall
    finally:
        dep.close()


def goal(name: str, sizes: list[int], wait: float, node_process: bool = True,
         report: bool = True) -> None:
    """--goal: a backend's defaults to the end in a deployment, checked against CVXPY.
    `report` False (FedADMM only): without the per-round report request (`NO_REPORT`)."""
    import tempfile
    from benchmarks import bench_rounds
    model, backend = GOALS[name]
    if not report and backend != "'fedadmm'":
        raise SystemExit("--no-report is FedADMM's (--goal fedadmm-ridge)")
    root = str(Path(__file__).resolve().parent.parent)
    text = GOAL_MODEL + ("" if report else NO_REPORT)
    rows = []
    for n in sizes:
        prob, _ = bench_rounds.MODELS[model](n)
        reference = prob.solve("cvxpy").values_by_label()
        load = os.getloadavg()[0]       # (at the start; the print gives the end's)
        with tempfile.TemporaryDirectory() as work:
            result, wall = _deployed(text.format(root=root, model=model, backend=backend),
                                     n, Path(work), wait, node_process=node_process)
        distance = max((float(np.max(np.abs(np.asarray(result["values"][k]) - v)))
                        for k, v in reference.items() if k in result["values"]), default=float("nan"))
        scale = max(float(np.max(np.abs(v))) for v in reference.values())
        rows.append((n, result, wall, distance, scale))
        print(f"{name} n = {n}: {result['status']}, wall {wall:.0f} s (ServerApp {result['seconds']:.0f} s), "
              f"{result['round_trips']} round trips, {wall / max(result['round_trips'], 1):.2f} s per "
              f"round trip, max |w − w_cvxpy| {distance:.2e} (|w_cvxpy|∞ {scale:.2f}), deployment CPU "
              f"{result['cpu_s']:.0f} s ({result['cpu_s'] / max(result['round_trips'], 1):.2f} per round "
              f"trip), load average {load:.1f} → {os.getloadavg()[0]:.1f}; "
              f"{result.get('backend')} {(result.get('auto') or {}).get('settings', '')}; round trips by kind "
              f"{result.get('trips', {})}", flush=True)
    print(breakdown_header())
    for n, result, *_ in rows:
        print(breakdown_row(f"{name} n = {n}", result.get("breakdown", {})))


def idle(sizes: list[int], settle: float = 40.0, span: float = 20.0) -> None:
    """--idle: % of a core each kind of process of an idle deployment uses (n SuperNodes with
    the node process, no run; measured over `span` s after `settle` s of start-up): the polling
    that costs CPU while no message moves (docs/flower.md, "No idle polling")."""
    import tempfile

    import psutil
    from fedmodel.deploy import Deployment
    root = str(Path(__file__).resolve().parent.parent)

    def by_role(pids: list[int]) -> dict[str, float]:
        out: dict[str, float] = {}
        for proc in _tree(pids):
            try:
                cmd = " ".join(proc.cmdline())
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            role = next((r for r in ("node_process", "flower-supernode", "superlink") if r in cmd), "other")
            out[role] = out.get(role, 0.0) + times.user + times.system
        return out
    for n in sizes:
        with tempfile.TemporaryDirectory() as work:
            path = Path(work) / "model.py"
            path.write_text(GOAL_MODEL.format(root=root, model="ridge", backend="'fedadmm'"))
            dep = Deployment(path, n, Path(work) / "run")
            try:
                dep.start()
                time.sleep(settle)
                pids = [p.pid for p in [dep.superlink, *dep.supernodes.values()]]
                before, start = by_role(pids), time.perf_counter()
                time.sleep(span)
                after, seconds = by_role(pids), time.perf_counter() - start
            finally:
                dep.close()
        share = {k: 100 * (after[k] - before.get(k, 0.0)) / seconds for k in after}
        print(f"idle deployment, n = {n}: " + ", ".join(f"{k} {v:.1f} %" for k, v in sorted(share.items()))
              + f" of a core (all {sum(share.values()):.1f} %), load average {os.getloadavg()[0]:.1f}")


CLIENT_PROCESS = """
import json, sys, time
t0 = time.process_time()
if sys.argv[1] == "lean":       # what fedmodel deploy's flwr-clientapp imports (deploy.LEAN_CLIENTAPP)
    import importlib.util, flwr.supernode
    spec = importlib.util.spec_from_file_location(
        "lean", flwr.supernode.__path__[0] + "/cli/flwr_clientapp.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
else:                            # Flower's own flwr-clientapp entry point
    import flwr.supernode.cli.flwr_clientapp
import flwr.clientapp, flwr.app
t1 = time.process_time()
from fedmodel.runtime.flower import client_app
t2 = time.process_time()
cache = client_app.KindCache(sys.argv[3]) if sys.argv[3] != "-" else None
client_app.served_kind(sys.argv[2], cache)
t3 = time.process_time()
print(json.dumps([t1 - t0, t2 - t1, t3 - t2]))
"""


def client_cpu(kinds: tuple[str, ...] = ("fedadmm_round", "proxal_admm_step"), repeat: int = 3) -> None:
    """--client-cpu: CPU seconds (load-independent) of what every ClientApp process of a
    deployment does before fedmodel serves its request — Flower's imports, fedmodel's, finding
    the request's procedure — before (Flower's entry point, the catalogue in name order) and
    after (the lean entry point, the node's kind cache); medians of `repeat` fresh processes."""
    import json
    import subprocess
    import tempfile
    print("| request kind | Flower imports (entry point / lean) | fedmodel client_app | "
          "procedure lookup (name order / node's cache) | total before / after |")
    print("|---|---|---|---|---|")
    for kind in kinds:
        with tempfile.TemporaryDirectory() as cache:
            def cpu(form: str, folder: str) -> list[float]:
                out = subprocess.run([sys.executable, "-c", CLIENT_PROCESS, form, kind, folder],
                                     capture_output=True, text=True, check=True).stdout
                return json.loads(out.strip().splitlines()[-1])
            cpu("lean", cache)                  # (fills the node's cache)
            before = np.median([cpu("entry", "-") for _ in range(repeat)], axis=0)
            after = np.median([cpu("lean", cache) for _ in range(repeat)], axis=0)
        print(f"| {kind} | {before[0]:.2f} / {after[0]:.2f} | {after[1]:.2f} | {before[2]:.2f} / "
              f"{after[2]:.2f} | {before.sum():.2f} / {after.sum():.2f} |", flush=True)


def deploy(sizes: list[int], rounds: int, node_process: bool = True) -> None:
    """--deploy: serial vs a real deployment, seconds per FedAvg round."""
    import tempfile
    from fedmodel.deploy import Deployment

    root = str(Path(__file__).resolve().parent.parent)
    print(f"FedAvg, d = {D}, 10 rows per client, {rounds} rounds; deployment on 127.0.0.1 "
          "(SuperLink + n SuperNodes, insecure), ClientApps: "
          + ("one node process per SuperNode" if node_process else "a process per message"))
    print("| n | serial ms/round | deployment s/round | deployment / serial | round trips (run) | "
          "s per round trip | start-up, build, 1st round, gather s | processes | resident MB | "
          "CPU s per round trip | load average |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    breakdowns = []
    for n in sizes:
        serial = run(model(n), SerialExecutor(), rounds)["s"]
        with tempfile.TemporaryDirectory() as work:
            path = Path(work) / "model.py"
            path.write_text(DEPLOY_MODEL.format(root=root, rounds=rounds))
            dep = Deployment(path, n, Path(work) / "run", timeout=600, start_timeout=1800,
                             node_process=node_process)
            try:
                begin = time.perf_counter()
                dep.start()
                result = dep.run(wait=3600)
                total = time.perf_counter() - begin
                # (after the run: every SuperNode has started its SuperExec by then)
                pids = [p.pid for p in [dep.superlink, *dep.supernodes.values()]]
                mb, procs = _memory_mb(pids)
                cpu = _cpu_s(pids)
            finally:
                dep.close()
        ends = result["round_ends"]
        per_round = float(np.median(np.diff(ends)))
        trips = result["round_trips"]
        print(f"| {n} | {1e3 * serial:.2f} | {per_round:.2f} | {per_round / serial:.0f} | {trips} | "
              f"{result['seconds'] / trips:.2f} | {total - (ends[-1] - ends[0]):.0f} | {procs} | "
              f"{mb:.0f} | {cpu / trips:.2f} | {os.getloadavg()[0]:.1f} |", flush=True)
        breakdowns.append((n, result.get("breakdown", {})))
    print(breakdown_header())
    for n, b in breakdowns:
        print(breakdown_row(f"FedAvg n = {n}", b))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5,50")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--deploy", action="store_true", help="a real deployment (see above)")
    parser.add_argument("--goal", choices=sorted(GOALS), help="a backend's defaults deployed (above)")
    parser.add_argument("--wait", type=float, default=3600.0,
                        help="--goal: stop a deployment without a result after this many s")
    parser.add_argument("--client-cpu", action="store_true",
                        help="CPU seconds of a ClientApp process before its request (above)")
    parser.add_argument("--process-per-message", action="store_true",
                        help="--deploy/--goal: Flower's default isolation, a flwr-clientapp "
                             "process per message (before issue 27 item 4), not the node process")
    parser.add_argument("--no-report", action="store_true",
                        help="--goal fedadmm-ridge: without FedADMM's per-round report request")
    parser.add_argument("--idle", action="store_true",
                        help="CPU of an idle deployment's processes, by kind (above)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.idle:
        idle(sizes)
        return
    if args.client_cpu:
        client_cpu()
        return
    if args.goal:
        goal(args.goal, sizes, args.wait, node_process=not args.process_per_message,
             report=not args.no_report)
        return
    if args.deploy:
        deploy(sizes, args.rounds, node_process=not args.process_per_message)
        return
    import ray
    from fedmodel.runtime.flower_executor import FlowerExecutor
    from fedmodel.runtime.program import compile_programs
    from fedmodel.runtime.ray_executor import RayExecutor

    rows = {n: {} for n in sizes}
    problems = {n: model(n) for n in sizes}
    for n in sizes:
        rows[n]["serial"] = run(problems[n], SerialExecutor(), args.rounds)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    for n in sizes:
        ex = RayExecutor(persistent=True, start_timeout=1800)
        start = time.perf_counter()
        ex.start(compile_programs(problems[n]))
        rows[n]["ray_start"] = time.perf_counter() - start
        rows[n]["ray"] = run(problems[n], ex, args.rounds)
        ex.shutdown()
    ray.shutdown()
    for n in sizes:
        ex = FlowerExecutor(timeout=600, start_timeout=1800, persistent=True)
        start = time.perf_counter()
        ex.start(compile_programs(problems[n]))
        rows[n]["flower_start"] = time.perf_counter() - start
        rows[n]["flower"] = run(problems[n], ex, args.rounds)
        ex.secure_sum = True
        rows[n]["secagg"] = run(problems[n], ex, args.rounds)
        # SecAgg+ proper: each client shares its keys with ~n/5 neighbours instead of all
        ex.secure_sum = {"num_shares": SPARSE}
        rows[n]["secagg_sparse"] = run(problems[n], ex, args.rounds)
        ex.shutdown()

    print(f"FedAvg, d = {D}, 10 rows per client, {args.rounds} rounds; medians over the rounds")
    print(f"SecAgg+: num_shares 1.0 (every client shares its keys with all) and {SPARSE}")
    print("| n | serial ms/round | Ray ms/round | Flower ms/round | SecAgg+ ms/round (all / "
          f"{SPARSE}) | Ray / serial | Flower / serial | Flower / Ray | SecAgg+ / Flower (all / "
          f"{SPARSE}) | start Ray / Flower s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        r = rows[n]
        s, ra, fl, sa, sp = (r[k]["s"] for k in ("serial", "ray", "flower", "secagg", "secagg_sparse"))
        print(f"| {n} | {1e3 * s:.2f} | {1e3 * ra:.1f} | {1e3 * fl:.1f} | {1e3 * sa:.0f} / {1e3 * sp:.0f} | "
              f"{ra / s:.0f} | {fl / s:.0f} | {fl / ra:.1f} | {sa / fl:.1f} / {sp / fl:.1f} | "
              f"{r['ray_start']:.1f} / {r['flower_start']:.1f} |")
    print()
    print("Per round: ledger floats (both ways) vs FedAvg's theoretical 2·n·d; Flower's round "
          "trips and bytes on the wire (down / up)")
    print("| n | executor | ledger floats | theoretical 2nd | round trips | bytes down | bytes up | "
          "bytes / (8·2nd) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in sizes:
        for name in ("serial", "ray", "flower", "secagg", "secagg_sparse"):
            r = rows[n][name]
            wire = r["down"] + r["up"]
            label = {"secagg": "Flower + SecAgg+ (all)", "secagg_sparse": f"Flower + SecAgg+ ({SPARSE})",
                     "flower": "Flower"}.get(name, name)
            print(f"| {n} | {label} | {r['floats']:.0f} | {2 * n * D} | "
                  f"{r['trips']:.0f} | {r['down']:.0f} | {r['up']:.0f} | "
                  f"{(wire / (16 * n * D)) if wire else float('nan'):.1f} |")


if __name__ == "__main__":
    main()
