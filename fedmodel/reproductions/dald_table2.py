"""Table II of Guo, Qu, Pan, Huang, "Distributed optimization: designed for federated learning"
(Experiment 2, Sec. VI-B; ../shared/spec/dald.md §4.2): non-IID MNIST 3 vs 7, L1-regularized
logistic regression, FedProx vs Fed-DALD-CC (star) vs Fed-DALD-DC (chain 1 − 2 − … − n).

    client i:  f_i(x_i) = (1/N) Σ_j ln(1 + exp(−b_ij a_ijᵀ x_i)) + λ‖x_i‖₁,   N = Σ_i N_i

Data: the 12,396 MNIST training 3s and 7s (mnist37_train.npz), raw 0–255 pixels (with [0, 1]
pixels the L1 threshold λα would swamp the (1/N)-scaled steps at large n and FedProx could not
reach the paper's 74 % at n = 1000, λ = 1e-2), b = +1 for 7, −1 for 3 (the sign convention does
not change any accuracy: the model has no intercept and the L1 term is symmetric), no intercept.
Partition: the paper's strided non-IID split read literally (R1, `partitioners.strided_split`):
even clients X3[i::n] ∪ X7[i::4n] (4:1), odd clients the reverse (1:4) — ≈ 5/8 of the samples.
Accuracy: each client's model x_i on the MNIST test set's 3s and 7s (2,038 images; prediction
7 iff a ᵀx_i > 0); mean (%) and population std (‱ = 0.01 %-points) over the n clients.
Settings (paper): ρ = 1, μ¹ = 0, x⁰ = 0, B4 with v_max = 1, one BCPG step (64) per node with
α = 1e-4 warm-started at the node's previous iterate, ε_pri = ε_dual = 1e-5, caps 1000 and 3000
(both read from one run of 3000). FedProx: Fed-DALD-CC with μ ≡ 0 (Sec. V-B2), the same local
step, warm-started at the client's own previous x_i (`FedProx(warm_start=True)`), proximal
weight 2ρ² = 2, run to the cap (its only test, ‖Δx̂‖∞ ≤ 1e-5, would stop it at iteration 1
for n = 1000, where one step moves x̂ by α·(N_i/N)·‖∇‖ ≈ 1e-5; the paper's 1000 and 3000 columns
differ, so its runs did not stop early).

Engines: "backend" (the default, grid included) runs `backends.DALD` / `backends.FedProx`
through an executor (`executor=`, "batched" when available: Fed-DALD-CC / FedProx as group
requests, Fed-DALD-DC sweeps as one batched gradient plus the sequential neighbour terms);
"reference" is an independent vectorized numpy implementation of the same updates (spec §4.2;
all clients' loss gradients in one block-diagonal sparse product). tests/test_dald_reproductions.py
checks that both agree iterate by iterate. The full grid runs its (n, λ) cells in two processes
on a machine with two or more cores (`jobs=`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .report import finish, print_subset

CLIENTS = (10, 50, 100, 200, 500, 1000)
LAMBDAS = (0.0, 1e-4, 1e-3, 1e-2)
METHODS = ("fedprox", "dald-cc", "dald-dc")
CHECKPOINTS = (1000, 3000)
STEP, EPS = 1e-4, 1e-5
FAST = dict(clients=(10, 50), lambdas=(1e-3,), checkpoints=(100, 300))

# Paper, Table II: (n, λ) → {method: (mean 1000, std 1000, mean 3000, std 3000)}; std in ‱
_ROWS = """
10 0 97.43 27.11 97.42 31.35 97.44 15.66 97.95 5.87 98.80 2.14 99.04 1.50
10 1e-4 97.42 27.21 97.41 32.28 97.43 15.71 97.95 5.96 98.80 2.14 99.03 1.82
10 1e-3 97.41 28.23 97.40 32.12 97.42 15.61 97.94 6.55 98.78 2.23 99.01 1.65
10 1e-2 97.23 26.88 97.16 28.65 97.31 17.01 97.79 10.13 98.57 2.77 98.64 1.69
50 0 95.81 93.98 95.87 93.95 98.08 4.69 98.15 1.81 98.40 6.26 98.73 2.51
50 1e-4 95.81 93.62 95.86 94.01 98.07 4.83 98.15 1.96 98.40 6.18 98.73 2.48
50 1e-3 95.75 94.89 95.74 96.03 98.02 4.79 98.10 2.16 98.37 5.67 98.67 1.91
50 1e-2 95.12 101.87 94.97 107.57 97.51 13.66 97.69 2.34 97.80 9.71 97.90 3.16
100 0 94.60 141.70 94.72 139.52 98.04 3.29 98.13 2.22 98.05 6.52 98.49 6.35
100 1e-4 94.59 141.79 94.69 139.88 98.03 3.29 98.12 2.17 98.04 6.54 98.48 6.18
100 1e-3 94.45 143.76 94.44 143.74 97.96 3.24 98.04 1.78 97.99 6.57 98.38 5.37
100 1e-2 93.34 149.71 93.15 153.74 97.21 5.89 97.26 2.46 97.23 8.34 97.29 4.16
200 0 92.92 247.31 93.32 234.14 97.90 3.89 98.15 2.42 97.75 9.35 98.24 5.87
200 1e-4 92.89 248.07 93.25 235.36 97.89 3.94 98.13 2.65 97.75 9.48 98.23 5.84
200 1e-3 92.65 251.73 92.79 242.19 97.79 4.49 98.00 2.55 97.66 10.07 98.07 7.96
200 1e-2 90.42 289.08 90.20 295.19 96.78 5.74 96.72 2.62 96.71 9.66 96.74 4.67
500 0 88.58 490.55 90.71 389.28 97.54 7.01 97.99 2.58 97.32 15.59 97.86 9.85
500 1e-4 88.49 494.32 90.45 401.05 97.52 7.16 97.96 2.36 97.30 15.68 97.84 9.78
500 1e-3 87.82 519.60 88.92 467.79 97.32 7.43 97.67 3.33 97.14 15.83 97.55 11.22
500 1e-2 81.56 700.42 82.40 680.71 96.10 6.72 96.02 2.16 95.96 22.54 95.96 13.49
1000 0 86.68 616.80 91.96 367.89 97.29 7.16 97.81 3.07 97.00 18.80 97.53 13.89
1000 1e-4 86.67 621.43 91.17 384.79 97.26 7.22 97.76 2.94 96.98 18.82 97.49 13.76
1000 1e-3 85.31 649.78 88.21 507.81 97.01 7.44 97.26 3.51 96.86 19.59 97.08 10.93
1000 1e-2 74.46 879.23 76.85 845.36 95.54 10.65 95.49 3.06 95.24 52.64 95.29 35.06
"""
PAPER: dict[tuple[int, float], dict[str, tuple[float, ...]]] = {}
for _line in _ROWS.strip().splitlines():
    _v = _line.split()
    _nums = [float(t) for t in _v[2:]]
    PAPER[(int(_v[0]), float(_v[1]))] = {m: tuple(_nums[4 * k:4 * k + 4]) for k, m in enumerate(METHODS)}


@dataclass
class Experiment:
    """The client data (b_ij·a_ij rows per client), N, and the evaluation set."""

    parts: list[np.ndarray]
    N: int
    X_test: np.ndarray
    b_test: np.ndarray


def experiment(n: int, root=None) -> Experiment:
    from fedmodel.datasets import load_mnist, load_mnist37
    from fedmodel.partitioners import strided_split
    train = load_mnist37(scale=False, root=root)
    b = np.where(train.y == 1, 1.0, -1.0)                   # y = 1 for digit 7
    parts = [b[rows, None] * train.X[rows] for rows in strided_split(train.y, n)]
    test = load_mnist("test", scale=False, root=root)
    keep = np.isin(test.y, (3, 7))
    return Experiment(parts, int(sum(len(p) for p in parts)), test.X[keep],
                      np.where(test.y[keep] == 7, 1.0, -1.0))


def accuracies(exp: Experiment, models: np.ndarray) -> np.ndarray:
    """Per-model test accuracy (fraction); `models` is (clients, 784)."""
    margins = exp.X_test @ np.atleast_2d(models).T          # (tests, clients)
    return np.mean(np.where(margins > 0, 1.0, -1.0) == exp.b_test[:, None], axis=0)


def summary(acc: np.ndarray) -> tuple[float, float]:
    """Mean in % and population std in ‱ (per ten-thousand) of per-client accuracies."""
    return 100.0 * float(np.mean(acc)), 1e4 * float(np.std(acc))


# ---- engine 1: the fedmodel backends ---------------------------------------------------------
def build_problem(exp: Experiment, lam: float):
    import fedmodel as fm
    w = fm.Variable(exp.parts[0].shape[1], name="x")
    prob = fm.Problem(name="dald-table2")
    for i, M in enumerate(exp.parts):
        client = prob.add_client(f"c{i}")
        client.minimize(fm.sum(fm.logistic(-(client.data(M, name="M") @ w))) / exp.N)
        if lam:
            client.minimize(lam * fm.norm1(w))               # Π_i = λ‖x_i‖₁, prox-able
    return prob, w


def run_backend(method: str, exp: Experiment, lam: float, iterations: int,
                checkpoints=(), monitor=None, executor="serial", report_every: int = 1) -> dict[int, np.ndarray]:
    """Client models (clients × 784, in client order) at each checkpoint; `monitor(total, X)`
    is called after every iteration with the stacked client models. `report_every`: the
    history's objective every k-th iteration only (the table needs the models, not the
    objective, which costs one more pass over the data)."""
    from fedmodel import topologies
    from fedmodel.backends.dald import DALD
    from fedmodel.backends.special_cases import FedProx
    prob, _ = build_problem(exp, lam)
    names = [c.name for c in prob.clients]
    wanted, snaps = set(checkpoints), {}

    def watch(total, x):
        if total in wanted or monitor:
            X = x.array if getattr(x, "array", None) is not None and list(x) == names else \
                np.stack([x[c] for c in names])
            if total in wanted:
                snaps[total] = X.copy()
            if monitor:
                monitor(total, X)
    if method == "fedprox":
        algo = FedProx(mu=2.0, step=STEP, local_steps=1, max_rounds=iterations, tol=0.0, warm_start=True)
        topology = topologies.star(prob)
    else:
        algo = DALD.paper(eps_primal=EPS, eps_dual=EPS, solver="prox-grad", step=STEP,
                          local_steps=1, max_iterations=iterations)
        topology = topologies.star(prob) if method == "dald-cc" else topologies.path(prob)
    algo.monitor = watch
    algo.report_every = report_every
    res = prob.solve(algo, topology=topology, executor=executor,
                     scaling=False)   # the paper's model as written (docs/scaling.md)
    final = np.stack([res.info["client_values"][c] for c in names])
    return {t: snaps.get(t, final) for t in checkpoints} | {"stopped": res.history[-1]["inner_total"]}


# ---- engine 2: independent vectorized numpy implementation (spec §4.2) ------------------------
def _soft(z: np.ndarray, t: float) -> np.ndarray:
    """Soft-thresholding S_t (64), in place (the grid is memory-bound at n = 1000)."""
    if t > 0:
        a = np.abs(z)
        a -= t
        np.maximum(a, 0.0, out=a)
        np.copysign(a, z, out=z)
    return z


def run_reference(method: str, exp: Experiment, lam: float, iterations: int,
                  checkpoints=(), monitor=None) -> dict:
    """The paper's updates written out for all clients at once (v_max = 1, W = 1, ρ = 1):
    CC/FedProx x_i ← S_{λα}(x_i − α[∇ℓ_i(x_i) − μ_i + 2(x_i − x̂)]); x̂ = mean x_i (Σμ_i = 0);
    μ_i += 2(x̂ − x_i) (FedProx: μ ≡ 0). DC chain in order 1..n:
    x_i ← S_{λα}(x_i − α[∇ℓ_i(x_i) + μ_{i,i+1} + 2(x_i − x_{i+1}^old) − μ_{i−1,i} − 2(x_{i−1}^new − x_i)]),
    μ_{i,i+1} += 2(x_i − x_{i+1}). Stop as the backend: ‖C‖∞ ≤ ε and ‖D‖∞ ≤ ε (FedProx: the cap)."""
    import scipy.sparse as sp
    n, d = len(exp.parts), exp.parts[0].shape[1]
    B = sp.block_diag([sp.csr_matrix(M) for M in exp.parts], format="csr")   # one product for
    BT = B.T.tocsr()                                         # all clients (MNIST ≈ 19 % nonzero)
    alpha, t = STEP, lam * STEP
    X = np.zeros((n, d))
    mu = np.zeros((n, d)) if method == "dald-cc" else np.zeros((max(n - 1, 0), d))
    xhat = np.zeros(d)
    wanted, snaps, total = set(checkpoints), {}, 0
    for total in range(1, iterations + 1):
        s = 1.0 / (1.0 + np.exp(B @ X.ravel()))             # σ(−m), m = b aᵀx
        G = -(BT @ s).reshape(n, d) / exp.N                   # ∇ℓ_i(x_i)
        if method in ("fedprox", "dald-cc"):
            Z = X - xhat                                      # in place: ∇ = G − μ + 2(X − x̂)
            Z *= 2.0
            Z += G
            if method == "dald-cc":
                Z -= mu
            Z *= -alpha
            Z += X
            X = _soft(Z, t)
            new = X.mean(axis=0)
            dual = float(np.max(np.abs(new - xhat)))
            xhat = new
            primal = max(float(np.max(X - xhat)), float(np.max(xhat - X)))
            if method == "dald-cc":
                mu -= 2.0 * (X - xhat)
            done = method == "dald-cc" and dual <= EPS and primal <= EPS   # FedProx: to the cap
        else:
            old = X.copy()
            C = X - alpha * G
            C[:-1] -= alpha * (mu + 2.0 * (old[:-1] - old[1:]))
            C[1:] += alpha * (mu - 2.0 * old[1:])             # −α(−μ_{i−1,i} − 2(x_{i−1}^new − x_i))
            X[0] = _soft(C[0], t)
            for i in range(1, n):                             # Gauss–Seidel: x_{i−1} is new
                X[i] = _soft(C[i] + 2.0 * alpha * X[i - 1], t)
            mu += 2.0 * (X[:-1] - X[1:])
            dual = float(np.max(np.abs(X[1:] - old[1:]), initial=0.0))
            primal = float(np.max(np.abs(X[:-1] - X[1:]), initial=0.0))
            done = dual <= EPS and primal <= EPS
        if total in wanted:
            snaps[total] = X.copy()
        if monitor:
            monitor(total, X)
        if done:
            break
    return {c: snaps.get(c, X.copy()) for c in checkpoints} | {"stopped": total}


def have_batched() -> bool:
    try:
        import fedmodel.runtime.batched  # noqa: F401
    except ImportError:
        return False
    return True


def cell(n: int, lam: float, checkpoints=CHECKPOINTS, engine: str = "reference",
         executor="serial", root=None, exp: Experiment | None = None) -> dict:
    """Every method's (mean %, std ‱) at each checkpoint for one (n, λ), and timings."""
    exp = exp or experiment(n, root)
    out = {}
    for method in METHODS:
        start = time.perf_counter()
        if engine == "backend":
            snaps = run_backend(method, exp, lam, max(checkpoints), checkpoints, executor=executor,
                                report_every=max(checkpoints))
        else:
            snaps = run_reference(method, exp, lam, max(checkpoints), checkpoints)
        out[method] = {c: summary(accuracies(exp, snaps[c])) for c in checkpoints}
        out[method]["stopped"] = snaps["stopped"]
        out[method]["seconds"] = time.perf_counter() - start
    return out


def print_cell(n: int, lam: float, result: dict, checkpoints) -> None:
    paper = PAPER.get((n, lam))
    for method in METHODS:
        ours = "  ".join(f"{c:>4}: {result[method][c][0]:6.2f} {result[method][c][1]:7.2f}"
                         for c in checkpoints)
        ref = ""
        if paper and tuple(checkpoints) == CHECKPOINTS:
            p = paper[method]
            ref = f" | paper 1000: {p[0]:6.2f} {p[1]:7.2f}  3000: {p[2]:6.2f} {p[3]:7.2f}"
        print(f"{n:>5} {lam:>7.0e} {method:<8} {ours}{ref}  (stop {result[method]['stopped']}, "
              f"{result[method]['seconds']:.1f} s)")


_EXPERIMENTS: dict = {}


def _cell_job(n: int, lam: float, checkpoints, engine: str, executor: str) -> tuple:
    """One (n, λ) cell in a worker process (the client data loaded once per n and process)."""
    if n not in _EXPERIMENTS:
        _EXPERIMENTS.clear()
        _EXPERIMENTS[n] = experiment(n)
    start = time.perf_counter()
    result = cell(n, lam, checkpoints, engine, executor, exp=_EXPERIMENTS[n])
    return n, lam, result, time.perf_counter() - start


def run(full: bool = False, engine: str | None = None, executor: str | None = None,
        clients=None, lambdas=None, checkpoints=None, jobs: int | None = None) -> int:
    """The grid (full) or a fast subset, on the backends (`backends.DALD` / `FedProx`, executor
    "batched" when available; engine="reference" for the numpy reference engine). `jobs`
    processes run the (n, λ) cells in parallel, largest n first (default: 2 for the full grid on
    a machine with ≥ 2 cores, else 1); results are printed in grid order."""
    import os
    engine = engine or "backend"
    executor = executor or ("batched" if have_batched() else "serial")
    clients = clients or (CLIENTS if full else FAST["clients"])
    lambdas = lambdas or (LAMBDAS if full else FAST["lambdas"])
    checkpoints = tuple(checkpoints or (CHECKPOINTS if full else FAST["checkpoints"]))
    jobs = int(jobs or (min(2, os.cpu_count() or 1) if full else 1))
    print("DALD paper, Table II: MNIST 3 vs 7, L1 logistic, non-IID strided split (R1), raw pixels, "
          f"α = {STEP}, ρ = 1, B4 v_max = 1, ε = {EPS}; per-client test accuracy mean (%) and "
          f"std (‱); engine {engine}" + (f" (executor {executor})" if engine == "backend" else "")
          + f", {jobs} process{'es' if jobs > 1 else ''}")
    if not full:
        print_subset("tableII", f"n ∈ {set(clients)}, λ ∈ {set(lambdas)}, "
                     f"{' and '.join(map(str, checkpoints))} iterations",
                     f"the {len(CLIENTS) * len(LAMBDAS)} (n, λ) cells, "
                     f"{' and '.join(map(str, CHECKPOINTS))} iterations")
    print(f"{'n':>5} {'λ':>7} {'method':<8} iterations: mean std")
    ok, start = True, time.perf_counter()
    cells = [(n, lam) for n in clients for lam in lambdas]
    results: dict = {}
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        import multiprocessing
        largest_first = sorted(cells, key=lambda c: -c[0])
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_cell_job, n, lam, checkpoints, engine, executor) for n, lam in largest_first]
            for future in futures:
                n, lam, result, seconds = future.result()
                results[(n, lam)] = (result, seconds)
                print(f"# cell n={n}, λ={lam:g} done: {seconds:.0f} s (at {time.perf_counter() - start:.0f} s)",
                      flush=True)
    for n, lam in cells:
        if (n, lam) in results:
            result, seconds = results[(n, lam)]
        else:
            _, _, result, seconds = _cell_job(n, lam, checkpoints, engine, executor)
        print_cell(n, lam, result, checkpoints)
        print(f"      cell (n={n}, λ={lam:g}): {seconds:.0f} s", flush=True)
        last = checkpoints[-1]
        # the paper's claims checked: DALD-CC/-DC above FedProx for n ≥ 50, DALD spread small
        if n >= 50:
            ok &= min(result["dald-cc"][last][0], result["dald-dc"][last][0]) >= result["fedprox"][last][0]
        ok &= min(result["dald-cc"][last][0], result["dald-dc"][last][0]) >= 90.0
    print(f"total {time.perf_counter() - start:.0f} s wall")
    print("Notes: the partition (R1 uses ≈5/8 of the data), pixel scaling, N, the evaluation set and "
          "the FedProx local solver are not given in the paper (docs/REPRODUCTION.md); the paper's "
          "text quotes FedProx n=1000, λ=1e-3, 3000 iterations as 87.21 % where its table says 88.21.")
    return finish(ok)
