"""Executors compared (issue 6, item 5): per-round overhead of Ray vs serial vs batched, and the
communication per round from the ledger vs each algorithm's theoretical minimum.

1. Per-round time. FedAvg (1 local GD step, tol = 0 so every round runs) on least squares,
   d = 5, 10 rows per client, n clients, R rounds. Time per round = median of the differences
   of the rounds' time stamps (`history[k]["time"]`), so start-up (compilation, actor start)
   is excluded and a slow spell on the shared machine moves few samples; the Ray executor's
   cold start (actors + data + compilation) is reported on its own. The ratios to the serial
   executor are what to read; all runs happen in this one process, one after the other.
2. Floats per round per client, each way, divided by the model size d, from the ledger of a
   serial run (the Ray executor books the same ledger, checked in tests/test_ray.py), for
   ProxAL, DALD-CC and FedProx on a constrained (ProxAL, DALD) or plain (FedProx) model.
   Theoretical minimum: one model vector each way per client per round (ratio 1.0).

    python benchmarks/bench_executors.py [--sizes 10,100,1000] [--ray-max 100] [--rounds 15]

Ray runs on a local cluster (`ray.init(num_cpus=2)`, loopback). Sizes above --ray-max are not
run on Ray (one worker process per client: ~100 MB of memory and ~1 s of start-up each).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fedmodel as fm  # noqa: E402
from fedmodel.backends import DALD, FedAvg, FedProx, ProxAL  # noqa: E402

D, ROWS = 5, 10


def model(n: int, constrained: bool = False, seed: int = 0, d: int = D):
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=f"ls-{n}")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        A, b = c.data(rng.normal(size=(ROWS, d)), name="A"), c.data(rng.normal(size=ROWS), name="b")
        c.minimize(0.5 * fm.sum_squares(A @ w - b) / n)
        if constrained:
            c.subject_to(fm.sum(w) <= 0.3)
    if constrained:
        prob.server.subject_to(fm.norm2(w) <= 0.6)
    return prob


def per_round(prob, executor, rounds: int) -> float:
    """Median seconds between consecutive FedAvg rounds (time stamps of the history)."""
    backend = FedAvg(step=0.1, local_steps=1, max_rounds=rounds, tol=0.0)
    out = backend.run(prob, executor=executor)
    assert out["iterations"]["rounds"] == rounds, out["iterations"]
    return float(np.median(np.diff([record["time"] for record in out["history"]])))


def overhead_table(sizes, ray_max: int, rounds: int) -> list[dict]:
    have_batched = importlib.util.find_spec("fedmodel.runtime.batched") is not None
    have_ray = importlib.util.find_spec("ray") is not None
    rows = []
    if have_ray:
        import ray
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    for n in sizes:
        prob = model(n)
        row = {"n": n, "serial": per_round(prob, "serial", rounds)}
        row["batched"] = per_round(prob, "batched", rounds) if have_batched else None
        row["ray"] = row["ray_start"] = None
        if have_ray and n <= ray_max:
            from fedmodel.runtime.program import compile_programs
            from fedmodel.runtime.ray_executor import RayExecutor
            ex = RayExecutor(persistent=True, start_timeout=1800)
            start = time.perf_counter()
            ex.start(compile_programs(prob))
            row["ray_start"] = time.perf_counter() - start
            row["ray"] = per_round(prob, ex, rounds)
            ex.shutdown()
        rows.append(row)
        print(_overhead_line(row), flush=True)
    if have_ray:
        ray.shutdown()
    return rows


def _ms(x):
    return "—" if x is None else f"{1e3 * x:.2f}"


def _ratio(a, b):
    return "—" if a is None or b is None else f"{a / b:.2f}"


def _overhead_line(row) -> str:
    return (f"| {row['n']} | {_ms(row['serial'])} | {_ms(row['batched'])} | {_ms(row['ray'])} | "
            f"{_ratio(row['batched'], row['serial'])} | {_ratio(row['ray'], row['serial'])} | "
            f"{'—' if row['ray_start'] is None else round(row['ray_start'], 1)} |")


def communication_table(n: int = 10, d: int = 50) -> list[dict]:
    """Floats per client per round, each way, in units of the model size d, and the floats of
    one message of each kind (k·d + scalars)."""
    cases = {
        "proxal": (ProxAL(beta=10.0, rho=1.0, max_outer=5, max_inner=50), True),
        "dald-cc": (DALD(rho=1.0, max_iterations=50), True),
        "fedprox": (FedProx(mu=1.0, step=0.1, local_steps=1, max_rounds=50, tol=0.0), False),
    }
    rows = []
    for name, (backend, constrained) in cases.items():
        prob = model(n, constrained=constrained, d=d)
        out = backend.run(prob, executor="serial")
        ledger = out["ledger"]
        down, up = ledger.total("down"), ledger.total("up")
        rounds = ledger.rounds
        row = {"backend": name, "rounds": rounds,
               "down": down["floats"] / (rounds * n * d), "up": up["floats"] / (rounds * n * d),
               "down_msgs": down["messages"] / (rounds * n), "up_msgs": up["messages"] / (rounds * n),
               "bytes_per_round": 8 * (down["floats"] + up["floats"]) / rounds,
               "per_kind": _per_kind(ledger)}
        rows.append(row)
        print(f"| {name} | {rounds} | {row['down']:.2f} | {row['up']:.2f} | {row['down_msgs']:.2f} | "
              f"{row['up_msgs']:.2f} | {row['bytes_per_round']:.0f} | {2 * 8 * n * d} |", flush=True)
    for row in rows:
        print(f"  {row['backend']}: floats per message by kind (down / up): " +
              "; ".join(f"{k} {a:g} / {b:g} ×{m}" for k, (a, b, m) in row["per_kind"].items()))
    return rows


def _per_kind(ledger) -> dict:
    """kind -> (floats per request, floats per reply, requests) over networked messages."""
    out = {}
    for (sender, receiver, kind), count in ledger.messages.items():
        if sender == "server":
            up = sum(f for (s, r, k), f in ledger.floats.items() if k == kind and r == "server")
            ups = sum(m for (s, r, k), m in ledger.messages.items() if k == kind and r == "server")
            down = sum(f for (s, r, k), f in ledger.floats.items() if k == kind and s == "server")
            downs = sum(m for (s, r, k), m in ledger.messages.items() if k == kind and s == "server")
            out[kind] = (down / downs, up / max(ups, 1), downs)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--ray-max", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"FedAvg, d = {D}, {ROWS} rows per client; time per round = median over {args.rounds} "
          "rounds; Ray: local cluster, 2 CPUs")
    print("| n | serial ms/round | batched ms/round | Ray ms/round | batched/serial | Ray/serial | "
          "Ray start s |")
    print("|---|---|---|---|---|---|---|")
    overhead_table(sizes, args.ray_max, args.rounds)
    print()
    print("n = 10 clients, d = 50; floats per client per round in units of d (minimum 1.0 each way)")
    print("| backend | rounds | down (×d) | up (×d) | down msgs | up msgs | bytes/round | minimum "
          "bytes/round |")
    print("|---|---|---|---|---|---|---|---|")
    communication_table()


if __name__ == "__main__":
    main()
