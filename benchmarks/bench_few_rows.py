"""Many sparse features, few rows a client (issue 25 item 3): every default backend vs CVXPY.

The models of newuser2's reproducer (docs/BENCHMARKS.md, "Issue 25 — fedmodel as a new user,
round 2", item 4), built here so the measurement can be rerun from the repository:

- ridge:  d = 2,000, 4 clients × 50 CSR rows (density 0.01, seeds 10–13), each
          `sum_squares(X_i w − y_i)/200`, server 1e-3‖w‖² (closed-form answer beside);
- lasso:  the same with 1e-3‖w‖₁ added on the server (the reproducer's `sparse_lasso`: its
          server keeps the ridge's term, so the model is an elastic net);
- a9a:    LIBSVM a9a CSR (400 rows drawn with seed 8, 123 columns), 4 clients' mean logistic
          loss, server 1e-3‖w‖² (needs FEDMODEL_DATA).

Each backend runs `prob.solve(name)` with its defaults under a wall limit (SIGALRM); a row
reports the wall seconds, status, iterations and `fm.verify(res, cvxpy).ok` as JSON:

    nice -n 10 python benchmarks/bench_few_rows.py --models ridge lasso a9a --limit 150
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before numpy: a shared machine's cores

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

import fedmodel as fm  # noqa: E402

BACKENDS = ["auto", "proxal", "dald", "fedadmm", "fedavg", "dp-admm"]


def sparse_model(server: str):
    rng = np.random.default_rng(7)
    d = 2000
    truth = np.zeros(d)
    truth[rng.choice(d, 20, replace=False)] = rng.normal(size=20)
    w, prob = fm.Variable(d, name="w"), fm.Problem()
    for i in range(4):
        X = sp.random(50, d, density=0.01, random_state=10 + i, format="csr")
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(X) @ w - c.data(X @ truth + 0.01 * rng.normal(size=50))) / 200)
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    if server == "l1":
        prob.server.minimize(1e-3 * fm.norm1(w))       # (added to the ridge term)
    return prob


def a9a_model():
    from fedmodel.datasets import load_a9a
    data = load_a9a(sparse=True)
    idx = np.random.default_rng(8).permutation(len(data.y))[:400]
    X, y = data.X[idx], data.y[idx]
    w, prob = fm.Variable(X.shape[1], name="w"), fm.Problem()
    for i, part in enumerate(np.array_split(np.random.default_rng(0).permutation(400), 4)):
        A = X[part].multiply(-(2.0 * y[part] - 1)[:, None]).tocsr()
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(A, name="A") @ w)))
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    return prob


MODELS = {"ridge": lambda: sparse_model("ridge"), "lasso": lambda: sparse_model("l1"), "a9a": a9a_model}


class _Late(Exception):
    pass


def _late(*_):
    raise _Late


def run(model: str, backends: list[str], limit: int) -> None:
    signal.signal(signal.SIGALRM, _late)
    start = time.perf_counter()
    reference = MODELS[model]().solve("cvxpy")
    print(json.dumps(dict(model=model, backend="cvxpy", status=reference.status,
                          seconds=round(time.perf_counter() - start, 2))), flush=True)
    for name in backends:
        prob, row = MODELS[model](), dict(model=model, backend=name)
        start = time.perf_counter()
        signal.alarm(limit)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # statuses are in the rows
                res = prob.solve(name)
            signal.alarm(0)
            row.update(seconds=round(time.perf_counter() - start, 2), status=res.status,
                       iterations=res.iterations, verified=bool(fm.verify(res, reference).ok))
        except _Late:
            row.update(seconds=limit, status=f"over {limit} s")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--backends", nargs="+", default=BACKENDS)
    parser.add_argument("--limit", type=int, default=150, help="wall seconds per run")
    args = parser.parse_args()
    for m in args.models:
        run(m, args.backends, args.limit)
