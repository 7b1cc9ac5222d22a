"""Derived gradients vs hand-written numpy.

For each model the harness builds the expression with fedmodel atoms, derives its gradient with
`fm.grad`, compiles value and gradient into one `fm.Plan`, and times `plan(w)` against a careful
hand-written numpy function computing the same value and gradient. It first asserts that both
return the same numbers, so the benchmark cannot silently compare different computations. The
printed ratio is the median over interleaved repetitions of time(compiled) / time(hand-written).

    python benchmarks/bench_gradient.py            # full grid, 1 to 2 minutes
    python -m benchmarks.bench_gradient            # the same
    python -m benchmarks.bench_gradient --quick    # a small subset, a few seconds
    python -m benchmarks.bench_gradient --check    # exit status 1 when a target is missed

Targets (the design goal: "a derived gradient must cost about what a careful hand-written
numpy gradient costs"): ratio ≤ 1.2 for m ≥ 10⁴ samples, ≤ 2 for m = 100 (where the plan's
per-step Python dispatch is visible next to tiny numpy calls).
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy.special import expit

if __package__ in (None, ""):   # run as a script: `python benchmarks/bench_gradient.py`
    import os
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.common import blas_threads, compare, machine_info
else:
    from .common import blas_threads, compare, machine_info

import fedmodel as fm

M_GRID = (100, 10_000, 100_000)
D_GRID = (10, 100, 784)
SOFTMAX_M = (100, 10_000)
SOFTMAX_CLASSES = 10
SOFTMAX_D = 784
AL_RHS, AL_MU, AL_BETA = 0.2, 0.5, 10.0

QUICK = {  # family -> (m, d) pairs run by --quick
    "logistic": [(100, 10), (10_000, 100)],
    "least squares": [(10_000, 100)],
    "softmax CE": [(100, SOFTMAX_D)],
    "AL logistic constraint": [(10_000, 100)],
}


def target(m: int) -> float:
    return 1.2 if m >= 10_000 else 2.0


@dataclass
class Case:
    family: str
    m: int
    d: int
    compiled: Callable[[], Any]      # returns [value, gradient]
    hand: Callable[[], Any]          # returns (value, gradient)
    steps: int                       # steps of the compiled plan
    note: str = ""


def _agree(case: Case) -> None:
    """Compiled and hand-written value and gradient must match before anything is timed."""
    value, gradient = case.compiled()
    ref_value, ref_gradient = case.hand()
    np.testing.assert_allclose(value, ref_value, rtol=1e-9, atol=1e-12,
                               err_msg=f"{case.family} m={case.m} d={case.d}: values differ")
    scale = float(np.max(np.abs(ref_gradient)))
    assert scale > 0, f"{case.family}: zero gradient, the benchmark would time a trivial case"
    np.testing.assert_allclose(gradient, ref_gradient, rtol=1e-8, atol=1e-10 * scale,
                               err_msg=f"{case.family} m={case.m} d={case.d}: gradients differ")


# ---- the models ---------------------------------------------------------------------------
def logistic_case(X: np.ndarray, w0: np.ndarray) -> Case:
    m, d = X.shape
    w = fm.Variable(d, name="w")
    f = fm.mean(fm.logistic(X @ w))
    plan = fm.Plan([f, fm.grad(f, w)], [w])

    def hand(w):
        z = X @ w
        return np.logaddexp(0, z).mean(), X.T @ expit(z) / m

    return Case("logistic", m, d, lambda: plan(w0), lambda: hand(w0), plan.n_steps)


def least_squares_case(A: np.ndarray, w0: np.ndarray, b: np.ndarray) -> Case:
    m, d = A.shape
    w = fm.Variable(d, name="w")
    f = fm.sum_squares(A @ w - b)
    plan = fm.Plan([f, fm.grad(f, w)], [w])

    def hand(w):
        r = A @ w - b
        return r @ r, 2.0 * (A.T @ r)

    return Case("least squares", m, d, lambda: plan(w0), lambda: hand(w0), plan.n_steps)


def softmax_case(X: np.ndarray, W0: np.ndarray, Y: np.ndarray) -> Case:
    """Multinomial logistic loss mean_i(lse(x_iᵀW) − y_iᵀWᵀx_i) with a d×k matrix variable."""
    m, d = X.shape
    W = fm.Variable(W0.shape, name="W")
    Z = X @ W
    f = fm.mean(fm.log_sum_exp(Z, axis=1) - fm.sum(fm.multiply(Y, Z), axis=1))
    plan = fm.Plan([f, fm.grad(f, W)], [W])

    def hand(W):
        Z = X @ W
        top = Z.max(axis=1, keepdims=True)
        E = np.exp(Z - top)
        total = E.sum(axis=1, keepdims=True)
        value = (np.log(total).sum() + top.sum() - np.vdot(Y, Z)) / m
        P = E / total
        P -= Y
        return value, X.T @ P / m

    return Case("softmax CE", m, d, lambda: plan(W0), lambda: hand(W0), plan.n_steps)


def al_case(X1: np.ndarray, w0: np.ndarray) -> Case:
    """ProxAL inequality term (1/(2β))(pos(μ + βc(w))² − μ²) of c(w) = mean(logistic(−X1 w)) − r."""
    m, d = X1.shape
    w = fm.Variable(d, name="w")
    mu = fm.Parameter(name="mu", value=AL_MU)
    beta = fm.Parameter(name="beta", value=AL_BETA)
    c = fm.mean(fm.logistic(-(X1 @ w))) - AL_RHS
    term = (1 / (2 * beta)) * (fm.square(fm.pos(mu + beta * c)) - fm.square(mu))
    plan = fm.Plan([term, fm.grad(term, w)], [w])

    def hand(w):
        z = X1 @ w
        c_value = np.logaddexp(0, -z).mean() - AL_RHS
        shifted = max(AL_MU + AL_BETA * c_value, 0.0)
        value = (shifted * shifted - AL_MU * AL_MU) / (2 * AL_BETA)
        # ∇ = pos(μ + βc)·∇c,  ∇c = −X1ᵀ expit(−z) / m
        return value, (-shifted / m) * (X1.T @ expit(-z))

    return Case("AL logistic constraint", m, d, lambda: plan(w0), lambda: hand(w0),
                plan.n_steps)


# ---- the grid -----------------------------------------------------------------------------
def cases(quick: bool, seed: int):
    """Yield the cases one (m, d) data set at a time, so at most one large X is alive."""
    families = ("logistic", "least squares", "softmax CE", "AL logistic constraint")
    for d in D_GRID:
        for m in M_GRID:
            wanted = [f for f in families if (m, d) in QUICK[f]] if quick else [
                f for f in families if f != "softmax CE" or (d == SOFTMAX_D and m in SOFTMAX_M)]
            if not wanted:
                continue
            rng = np.random.default_rng([seed, m, d])
            X = rng.standard_normal((m, d))
            w0 = rng.standard_normal(d) / np.sqrt(d)          # X @ w0 ~ N(0, 1)
            for family in wanted:
                if family == "logistic":
                    yield logistic_case(X, w0)
                elif family == "least squares":
                    b = X @ rng.standard_normal(d) / np.sqrt(d) + 0.1 * rng.standard_normal(m)
                    yield least_squares_case(X, w0, b)
                elif family == "softmax CE":
                    W0 = rng.standard_normal((d, SOFTMAX_CLASSES)) / np.sqrt(d)
                    Y = np.eye(SOFTMAX_CLASSES)[rng.integers(0, SOFTMAX_CLASSES, m)]
                    yield softmax_case(X, W0, Y)
                else:
                    yield al_case(X, w0)
            del X
            gc.collect()


def run(quick: bool = False, seed: int = 0, budget: float | None = None) -> list[dict]:
    budget = budget if budget is not None else (0.3 if quick else 2.5)
    rows = []
    print(f"{'family':<24}{'m':>8}{'d':>5}{'hand':>11}{'compiled':>11}{'ratio':>7}"
          f"{'best':>7}{'target':>7}  reps", flush=True)
    for case in cases(quick, seed):
        _agree(case)
        timing = compare({"compiled": case.compiled, "hand": case.hand}, budget=budget,
                         min_repeats=15)
        row = dict(family=case.family, m=case.m, d=case.d, steps=case.steps,
                   hand=timing.median("hand"), compiled=timing.median("compiled"),
                   ratio=timing.ratio("compiled", "hand"),
                   best=timing.best_ratio("compiled", "hand"),
                   target=target(case.m), repeats=timing.repeats, note=case.note)
        row["ok"] = row["ratio"] <= row["target"]
        rows.append(row)
        print(f"{case.family:<24}{case.m:>8}{case.d:>5}{_fmt(row['hand']):>11}"
              f"{_fmt(row['compiled']):>11}{row['ratio']:>7.2f}{row['best']:>7.2f}"
              f"{row['target']:>7.1f}  {row['repeats']}{'' if row['ok'] else '  MISSED'}"
              f"{'  (see note)' if case.note else ''}", flush=True)
    return rows


def _fmt(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def markdown(rows: list[dict]) -> str:
    lines = ["| model | m | d | hand-written | compiled | ratio (median) | ratio (best) | target |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    notes = sorted({r["note"] for r in rows if r["note"]})
    for r in rows:
        flag = "" if r["ok"] else " ✗"
        mark = "†" * (notes.index(r["note"]) + 1) if r["note"] else ""
        lines.append(f"| {r['family']}{mark} | {r['m']} | {r['d']} | {_fmt(r['hand'])} | "
                     f"{_fmt(r['compiled'])} | {r['ratio']:.2f}{flag} | {r['best']:.2f} | "
                     f"≤ {r['target']:g} |")
    lines += [""] + [f"{'†' * (i + 1)} {note}" for i, note in enumerate(notes)] if notes else []
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small subset, a few seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of timing per case (default 2.5, or 0.3 with --quick)")
    parser.add_argument("--blas-threads", type=int, default=1,
                        help="BLAS threads while timing (default 1; 0 keeps the library default)")
    parser.add_argument("--check", action="store_true",
                        help="exit with status 1 when a ratio misses its target")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    print("machine:", "; ".join(f"{k} {v}" for k, v in machine_info().items()), flush=True)
    with blas_threads(args.blas_threads or None) as note:
        print(note, flush=True)
        rows = run(args.quick, args.seed, args.budget)
    print()
    print(markdown(rows))
    missed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows)} cases, {len(missed)} over target, "
          f"{time.perf_counter() - start:.0f} s total")
    return 1 if (args.check and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
