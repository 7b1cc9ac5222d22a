"""Fig. 5 of Guo, Qu, Pan, Huang, "Distributed optimization: designed for federated learning":
per-client test accuracy (mean and spread over the n clients) over the first 300 iterations for
n = 100 and n = 500, λ = 1e-3, FedProx vs Fed-DALD-CC vs Fed-DALD-DC. Data, partition, model
and settings exactly as Table II (fedmodel/reproductions/dald_table2.py). The paper's figure
is described only in words ("FedProx lags in accuracy and stability"); we check that the DALD
curves end above FedProx's with a smaller spread and write the curves to a PNG.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import dald_table2 as t2
from .report import finish, save, subplots, print_subset

LAMBDA, ITERATIONS = 1e-3, 300


def curves(n: int, iterations: int = ITERATIONS, every: int = 1, engine: str = "backend",
           executor: str | None = None, exp: t2.Experiment | None = None) -> dict:
    """{method: (iterations, mean %, std %-points)} every `every` iterations; engine "backend"
    (`backends.DALD` / `FedProx`, executor "batched" when available) or "reference"."""
    executor = executor or ("batched" if t2.have_batched() else "serial")
    exp = exp or t2.experiment(n)
    out = {}
    for method in t2.METHODS:
        points: list[tuple[int, float, float]] = []

        def watch(total, X):
            if total % every == 0 or total == 1:
                acc = t2.accuracies(exp, X)
                points.append((total, 100 * float(np.mean(acc)), 100 * float(np.std(acc))))
        if engine == "backend":
            t2.run_backend(method, exp, LAMBDA, iterations, monitor=watch, executor=executor,
                           report_every=iterations)
        else:
            t2.run_reference(method, exp, LAMBDA, iterations, monitor=watch)
        k, mean, std = (np.array(v) for v in zip(*points))
        out[method] = (k, mean, std)
    return out


LABELS = {"fedprox": "FedProx", "dald-cc": "Fed-DALD-CC", "dald-dc": "Fed-DALD-DC"}


def plot(results: dict[int, dict], path: str | Path) -> Path:
    fig, axes = subplots(1, len(results), figsize=(5.2 * len(results), 3.8), squeeze=False)
    for ax, (n, data) in zip(axes[0], results.items()):
        for method, (k, mean, std) in data.items():
            line, = ax.plot(k, mean, label=LABELS[method])
            ax.fill_between(k, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        ax.set_title(f"n = {n}, λ = {LAMBDA:g}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("test accuracy of the client models (%)")
        ax.set_ylim(80, 100)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("MNIST 3 vs 7, non-IID strided split: mean ± std over clients", fontsize=10)
    return save(fig, path)


def run(full: bool = False, plot_dir=None, engine: str = "backend", executor: str | None = None) -> int:
    """full: n = 100 and 500, accuracy at every iteration; fast: n = 100, every 10th."""
    clients, every = ((100, 500), 1) if full else ((100,), 10)
    print(f"DALD paper, Fig. 5: first {ITERATIONS} iterations, λ = {LAMBDA:g}, n = {clients}; "
          f"per-client test accuracy mean (%) ± std (%-points); engine {engine}")
    if not full:
        print_subset("fig5", "n = 100, every 10th iteration", "n = 100 and 500, every iteration")
    results, ok = {}, True
    for n in clients:
        start = time.perf_counter()
        results[n] = curves(n, every=every, engine=engine, executor=executor)
        for method, (k, mean, std) in results[n].items():
            marks = [j for j, it in enumerate(k) if it in (10, 50, 100, 200, 300)]
            row = "  ".join(f"{int(k[j])}: {mean[j]:5.2f}±{std[j]:4.2f}" for j in marks)
            print(f"n={n:<4} {LABELS[method]:<12} {row}")
        final = {m: (v[1][-1], v[2][-1]) for m, v in results[n].items()}
        for method in ("dald-cc", "dald-dc"):     # the figure's message: DALD above, tighter
            ok &= final[method][0] > final["fedprox"][0] and final[method][1] < final["fedprox"][1]
        print(f"  ({time.perf_counter() - start:.0f} s)")
    if plot_dir is not None:
        print("plot:", plot(results, Path(plot_dir) / "dald_fig5.png"))
    return finish(ok)
