"""A server ball on raw airfoil columns (issue 25 item 1, branch ellball): inactive (‖w‖ ≤ 1e6,
‖w*‖ = 111) and active (r = ‖w*‖/2), least squares + ridge, under ProxAL, cProx-AL, DALD and
FedADMM with their defaults. The reference is independent of fedmodel: the ridge's normal
equations (inactive ball) and, active, w(ν) = (H + νI)⁻¹g with ‖w(ν)‖ = r (ν found by brentq
on H's eigendecomposition), CVXPY's answer (prob.solve("cvxpy")) beside it.

    nice -n 10 python benchmarks/bench_ball_units.py
    nice -n 10 python benchmarks/bench_ball_units.py --sweep 0-9
    nice -n 10 python benchmarks/bench_ball_units.py --sweep 0-3 --logistic

`--sweep`: random least squares on columns in units 10^U(−3, 3) (5 clients of 20 rows, d = 6,
a ridge on the server) with a ball ‖w‖₂ ≤ R on the server (even seeds) or on every client
(odd), R = ‖w*‖/2 (active) or 2‖w*‖ (inactive), w* the
answer without the ball (CVXPY); each backend's default run classified as bench_verdicts does
(OK: converged and fm.verify against CVXPY at 1e-3; UNSOLVED: an honest status; WRONG:
"converged" and not verified, or a claim CVXPY contradicts). `--logistic`: the same columns
with a logistic loss (labels drawn from the model's probabilities, written
`-c.data(y[:, None] * X) @ w`) and a row without any ball: before branch logunits every backend
ran that one to its cap (the column scales did not read −(yX), a Neg node).
"""
from __future__ import annotations

import os
import sys
import warnings

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from scipy.optimize import brentq  # noqa: E402

import fedmodel as fm  # noqa: E402

DATA = os.environ.get("FEDMODEL_DATA", "/work/shared/data")


def airfoil_parts():
    A = np.loadtxt(os.path.join(DATA, "regression", "airfoil_self_noise.tsv"))
    X, y = A[:, :5], A[:, 5]
    return [(X[X[:, 3] == v], y[X[:, 3] == v]) for v in np.unique(X[:, 3])]


def build(parts, radius):
    """Least squares over the clients (mean over all rows) + 1e-2‖w‖² on the server, and the
    server ball ‖w‖₂ ≤ radius (None: no ball)."""
    n = sum(len(y) for _, y in parts)
    w = fm.Variable(6, name="w")
    prob = fm.Problem()
    for X, y in parts:
        c = prob.add_client()
        A = c.data(np.hstack([X, np.ones((len(X), 1))]), name="X")
        c.minimize(fm.sum_squares(A @ w - c.data(y, name="y")) / n)
    prob.server.minimize(1e-2 * fm.sum_squares(w))
    if radius is not None:
        prob.server.subject_to(fm.norm2(w) <= radius)
    return prob, w


def reference(parts, radius):
    """(the exact answer, the ball's multiplier μ = ν·radius): the normal equations H w = g
    (μ = 0), or on the ball's boundary (H + νI) w = g with ‖w‖ = radius (ν ≥ 0, by brentq on
    the eigendecomposition of H; ∇f = Hw − g = −μ w/‖w‖)."""
    n = sum(len(y) for _, y in parts)
    H, g = 2e-2 * np.eye(6), np.zeros(6)
    for X, y in parts:
        A = np.hstack([X, np.ones((len(X), 1))])
        H += 2 / n * A.T @ A
        g += 2 / n * A.T @ y
    free = np.linalg.solve(H, g)
    if radius is None or np.linalg.norm(free) <= radius:
        return free, 0.0
    lam, V = np.linalg.eigh(H)
    h = V.T @ g
    size = lambda nu: float(np.linalg.norm(h / (lam + nu))) - radius  # noqa: E731
    hi = 1.0
    while size(hi) > 0:
        hi *= 2
    nu = brentq(size, 0.0, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)
    return V @ (h / (lam + nu)), nu * radius


def random_model(seed: int, radius_factor: float | None, logistic: bool = False,
                 unit_scaled: bool = False):
    """(problem, w) of the `--sweep` (see the module docstring); radius_factor None: no ball,
    else R = radius_factor (the caller's ‖w*‖ times the factor). `unit_scaled`: the same draws
    at units = 1, the twin (its answer is units∘w)."""
    rng = np.random.default_rng(seed)
    d, units = 6, 10.0 ** rng.uniform(-3, 3, 6)
    units = np.ones(d) if unit_scaled else units
    truth = rng.normal(size=d) / units
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    for i in range(5):
        X = rng.normal(size=(20, d)) * units * (1 + 0.3 * i)
        c = prob.add_client(f"c{i}")
        if logistic:
            y = np.where(rng.random(20) < 1 / (1 + np.exp(-X @ truth)), 1.0, -1.0)
            c.minimize(fm.mean(fm.logistic(-c.data(y[:, None] * X) @ w)) / 5)
        else:
            y = X @ truth + 0.1 * rng.normal(size=20)
            c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)) / 100)
        if radius_factor is not None and seed % 2:
            c.subject_to(fm.norm2(w) <= radius_factor)
    prob.server.minimize(1e-3 * fm.sum_squares(units * w))
    if radius_factor is not None and not seed % 2:
        prob.server.subject_to(fm.norm2(w) <= radius_factor)
    return prob, w


def sweep(seeds: list[int], logistic: bool = False) -> None:
    from collections import Counter
    counts: dict[str, Counter] = {}
    print("| seed | ball | backend | verdict | status | round trips | distance |")
    print("|---|---|---|---|---|---:|---:|")
    for seed in seeds:
        free, w = random_model(seed, None, logistic)
        norm = float(np.linalg.norm(free.solve("cvxpy").value(w)))
        for label, factor in ((("none", None),) if logistic else ()) + \
                (("active", 0.5), ("inactive", 2.0)):
            prob, w = random_model(seed, None if factor is None else factor * norm, logistic)
            ref = prob.solve("cvxpy")
            for backend in ("proxal", "cproxal", "dald", "fedadmm"):
                res = prob.solve(backend)
                report = fm.verify(res, ref)
                honest = res.status in ("max_iterations", "stalled", "budget_exhausted")
                verdict = "OK" if res.status == "converged" and report.ok else \
                    "UNSOLVED" if honest else "WRONG"
                counts.setdefault(backend, Counter())[verdict] += 1
                trips = (res.info.get("communication") or {}).get("round_trips", "—")
                off = np.max(np.abs(res.value(w) - ref.value(w))) / np.max(np.abs(ref.value(w)))
                print(f"| {seed} | {label} | {backend} | {verdict} | {res.status} | {trips} | {off:.1e} |")
                sys.stdout.flush()
    for backend, found in counts.items():
        print(f"{backend}: " + ", ".join(f"{k} {v}" for k, v in sorted(found.items())))


def main() -> None:
    warnings.simplefilter("ignore")
    if len(sys.argv) > 2 and sys.argv[1] == "--sweep":
        low, _, high = sys.argv[2].partition("-")
        return sweep(list(range(int(low), int(high or low) + 1)), "--logistic" in sys.argv)
    parts = airfoil_parts()
    norm = float(np.linalg.norm(reference(parts, None)[0]))
    print(f"|w*| = {norm:.6g}")
    print("| ball | backend | status | iterations | round trips | max|w − w*|/max|w*| | verify "
          "| ball μ (exact) |")
    print("|---|---|---|---|---:|---:|---|---|")
    for label, radius in (("inactive 1e6", 1e6), ("active |w*|/2", 0.5 * norm)):
        exact, mu = reference(parts, radius)
        for backend in ("cvxpy", "proxal", "cproxal", "dald", "fedadmm"):
            prob, w = build(parts, radius)
            res = prob.solve(backend)
            off = np.max(np.abs(res.value(w) - exact)) / np.max(np.abs(exact))
            trips = (res.info.get("communication") or {}).get("round_trips", "—")
            got = res.multipliers.get("server.con0")
            got = "—" if got is None else f"{float(np.ravel(got)[0]):.6g}"
            print(f"| {label} | {backend} | {res.status} | {res.iterations} | {trips} | "
                  f"{off:.2e} | {fm.verify(res).ok} | {got} ({mu:.6g}) |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
