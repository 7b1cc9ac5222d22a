"""Fed-DALD-DC's Gauss–Seidel sweep, sequential coordination sequence (the clients' order) vs the
coloured one (`DALD(order="colour")`: one parallel batch per colour class), on a ring and a random
geometric graph of n clients (least squares, d = 10, 10 rows each).

Reported per (graph, executor): the sweep's sequential steps (batches) and the seconds per inner
iteration of each order, and their ratio, measured in one run with the orders alternated. On
the serial executor a batch still runs its nodes one after another, so the gain there is the
per-request overhead; a batch is what a parallel executor (Ray, Flower, a vectorized one) runs at
once. `python -m benchmarks.bench_dc_colour [--n 10000] [--iterations 6] [--graphs ring,rgg]
[--executors batched,serial]`.
"""
from __future__ import annotations

import argparse

import networkx as nx
import numpy as np

import fedmodel as fm
from fedmodel import topologies
from fedmodel.backends import DALD


def problem(n: int, d: int = 10, rows: int = 10, seed: int = 0) -> fm.Problem:
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=f"dc-{n}")
    truth = rng.normal(size=d)
    for i in range(n):
        c = prob.add_client(f"c{i}")
        A = rng.normal(size=(rows, d))
        c.minimize(fm.sum_squares(c.data(A) @ w - c.data(A @ truth + 0.1 * rng.normal(size=rows))) / rows)
    return prob


def graphs(prob: fm.Problem, seed: int = 0) -> dict:
    n = len(prob.clients)
    radius = 1.5 * np.sqrt(np.log(n) / (np.pi * n))          # above the connectivity threshold
    G = nx.random_geometric_graph(n, radius, seed=seed)
    while not nx.is_connected(G):                             # join the components in a chain
        parts = [min(c) for c in nx.connected_components(G)]
        G.add_edges_from(zip(parts, parts[1:]))
    rgg = topologies.from_networkx(nx.relabel_nodes(G, {i: f"c{i}" for i in G}), prob)
    return {"ring": topologies.ring(prob), "rgg": rgg}


def measure(n: int, iterations: int, executors=("batched", "serial"),
            kinds=("ring", "rgg")) -> list[dict]:
    prob = problem(n)
    rows = []
    for name, G in graphs(prob).items():
        if name not in kinds:
            continue
        for executor in executors:
            out = {"graph": name, "executor": executor}
            for rep in range(2):                              # alternate the two orders
                for order in ((None, "colour") if rep == 0 else ("colour", None)):
                    algo = DALD(order=order, max_iterations=iterations, eps_primal=0.0, eps_dual=0.0,
                                report_every=10 ** 9)
                    res = prob.solve(algo, topology=G, executor=executor)
                    # one inner iteration (a sweep and the multiplier step (21)), set-up excluded
                    first, last = res.history[0], res.history[-1]
                    seconds = (last["time"] - first["time"]) / (last["inner_total"] - first["inner_total"])
                    key = "colour" if order else "sequential"
                    out[f"{key}_s"] = min(out.get(f"{key}_s", np.inf), seconds)
                    out[f"{key}_steps"] = res.info["sweep_steps"]
            out["ratio"] = out["colour_s"] / out["sequential_s"]
            rows.append(out)
            print(f"{name:<5} {executor:<8} steps {out['sequential_steps']:>6} → {out['colour_steps']:>3}   "
                  f"s/iteration {out['sequential_s']:.3f} → {out['colour_s']:.3f}   "
                  f"(colour/sequential {out['ratio']:.2f})", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--executors", default="batched,serial")
    parser.add_argument("--graphs", default="ring,rgg")
    args = parser.parse_args(argv)
    measure(args.n, args.iterations, tuple(args.executors.split(",")), tuple(args.graphs.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
