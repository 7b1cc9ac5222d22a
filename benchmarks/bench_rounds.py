"""Round trips to a verified point for every backend's defaults (issue 27, item 1).

Each backend runs as `prob.solve(name)` with no options (its defaults; DP-ADMM's default is
non-private) on a suite of models at n clients, and each run reports:

- round trips: `res.info["communication"]["round_trips"]`, the ledger's count of server →
  clients → server exchanges of every kind that is not local (`Ledger.exchange`,
  fedmodel/runtime/ledger.py), with the backend's own iteration counts beside it (ProxAL:
  outer and inner ADMM iterations) and its own round count (`res.ledger.rounds`: the count a
  backend sets, which leaves out set-up and per-iteration extras: records made before the
  ledger counted round trips have only that one, marked † in the table);
- messages and floats per client: the ledger's totals (server→clients plus clients→server)
  divided by n (bytes = 8 × floats), and the largest client's floats each way;
- whether the answer verifies: `fm.verify(res, reference).ok` at its default 1e-3, against
  one CVXPY solve per model (the reference, timed: "CVXPY s"); a default run that does not
  verify is reported NO, never tuned;
- wall seconds of `prob.solve` (compilation included: what a user waits for).

A backend that refuses a model (a FedModelError: constraints it cannot take, say) is listed
as refused with the reason's first words. Each run gets `--timeout` wall seconds (SIGALRM):
"timeout" when it runs out. The suite (synthetic models: 20 rows a client, d = 10; real data:
the rows split over the clients):

- ridge:          mean squared error + λ‖w‖², λ = 0.1;
- logistic:       mean logistic loss (labels drawn from a logistic model);
- logistic-ball:  the same with a client ball ‖w‖₂ ≤ 1 and a server ridge (λ/2)‖w‖², λ = 0.01;
- lasso:          mean squared error / 2 + λ‖w‖₁ (λ = 0.05, written per client);
- np-monks1:      Neyman-Pearson (paper 1 eq. 30) on monks-1 one-hot (556 × 17), threshold 0.2;
- np-adult:       the same on adult (121-UCI, 32,561 × 14);
- mnist-ball:     MNIST 3 vs 7 (the first `--mnist-rows` rows, d = 784), mean logistic loss,
                  a client ball ‖w‖₂ ≤ 5 and a server ridge 1e-3‖w‖² (bench_large_d's model).

A model CVXPY finds infeasible at a split (NP: some client's class-1 loss cannot reach 0.2)
is listed as such and not run; where CVXPY's reference does not finish within the timeout,
the runs are listed "?" (not verified: `fm.verify` would start another CVXPY solve). Results are appended as JSON lines to `--out` (one per run), and
the markdown table is printed from that file, so subsets can be rerun and merged:

    nice -n 19 python benchmarks/bench_rounds.py --out rounds.jsonl
    nice -n 19 python benchmarks/bench_rounds.py --out rounds.jsonl --models ridge --n 5 \
        --backends proxal fedadmm
    python benchmarks/bench_rounds.py --out rounds.jsonl --table     # print the table only

BLAS is limited to one thread (the machine is shared; see benchmarks/common.py).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before numpy: a shared machine's cores

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Iterable  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fedmodel as fm  # noqa: E402
from benchmarks import bench_defaults  # noqa: E402
from benchmarks.common import machine_info  # noqa: E402

ROWS_PER_CLIENT, DIM = 20, 10
BACKENDS = ("proxal", "cproxal", "dald", "fedadmm", "fedprox", "fedavg", "dp-admm")
# beside the defaults, on request (--backends): ProxAL with the Newton inner solver, ProxAL with
# Algorithm 2 (its default inner "auto" takes Newton steps where they fit: the record's "inner"
# says which ran), and `backend="auto"` (what `prob.solve()` picks: its choice in the record's "auto")
OPTIONS = {"proxal-newton": lambda: _proxal("newton"), "proxal-admm": lambda: _proxal("admm"),
           "auto": lambda: "auto"}


def _proxal(inner: str):
    from backends.proxal import ProxAL
    return ProxAL(inner=inner)
CLIENTS = (5, 40, 200)


# ---- models ----------------------------------------------------------------------------------
def _synthetic(n: int, seed: int, scale: float = 1.0):
    """n clients' (A_i, b_i) of a linear model, 20 rows each, d = 10, heterogeneous clients."""
    rng = np.random.default_rng(seed)
    w_true = scale * rng.standard_normal(DIM)
    parts = []
    for _ in range(n):
        A = rng.standard_normal((ROWS_PER_CLIENT, DIM)) + 0.3 * rng.standard_normal(DIM)
        parts.append((A, A @ w_true))
    return rng, parts


def ridge(n: int, lam: float = 0.1):
    """Mean squared error over all rows + λ‖w‖² (each client holds its share of both)."""
    rng, parts = _synthetic(n, seed=0)
    prob, w = fm.Problem(name="ridge"), fm.Variable(DIM, name="w")
    for i, (A, b) in enumerate(parts):
        c = prob.add_client(f"c{i}")
        y = b + 0.1 * rng.standard_normal(len(b))
        c.minimize(fm.sum_squares(c.data(A, name="A") @ w - c.data(y, name="b"))
                   / (n * ROWS_PER_CLIENT) + lam / n * fm.sum_squares(w))
    return prob, w


def _logistic_parts(n: int, scale: float):
    """Z_i = −y_i·X_i with labels drawn from a logistic model (loss = mean logistic(Z w))."""
    rng, parts = _synthetic(n, seed=2, scale=scale)
    out = []
    for X, margin in parts:
        y = np.where(rng.random(len(margin)) < 1 / (1 + np.exp(-margin)), 1.0, -1.0)
        out.append(-y[:, None] * X)
    return out


def logistic(n: int):
    """Mean logistic loss over all rows."""
    prob, w = fm.Problem(name="logistic"), fm.Variable(DIM, name="w")
    for i, Z in enumerate(_logistic_parts(n, scale=0.5)):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(Z, name="Z") @ w)) / n)
    return prob, w


def logistic_ball(n: int, radius: float = 1.0, lam: float = 0.01):
    """Mean logistic loss, client balls ‖w‖₂ ≤ 1 (active: the labels' model has ‖w‖ ≈ 6) and a
    server ridge (λ/2)‖w‖² (issue 27's 839-round-trip case at n = 40)."""
    prob, w = fm.Problem(name="logistic-ball"), fm.Variable(DIM, name="w")
    for i, Z in enumerate(_logistic_parts(n, scale=2.0)):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(Z, name="Z") @ w)) / n)
        c.subject_to(fm.norm2(w) <= radius)
    prob.server.minimize(0.5 * lam * fm.sum_squares(w))
    return prob, w


def lasso(n: int, lam: float = 0.05):
    """Mean squared error / 2 + λ‖w‖₁ written per client (`loss + λ/n · norm1(w)`); sparse
    truth (bench_defaults' lasso at this suite's size)."""
    return bench_defaults.lasso(n=n, m=ROWS_PER_CLIENT, d=DIM, lam=lam)


def _neyman_pearson(dataset: str) -> Callable:
    def build(n: int):
        """Neyman-Pearson on `dataset` (the ProxAL Table 1 reproduction's data and split)."""
        from fedmodel.reproductions import proxal_table1
        X, y = proxal_table1.load(dataset)
        prob, w, _ = proxal_table1.build(X, y, n)
        return prob, w
    build.__doc__ = f"Neyman-Pearson on {dataset} (the ProxAL Table 1 reproduction's loader)."
    return build


MNIST_ROWS = 2000


def mnist_ball(n: int, radius: float = 5.0, ridge_weight: float = 1e-3):
    """MNIST 3 vs 7, the first MNIST_ROWS rows split over n clients (d = 784), mean logistic
    loss, a client ball ‖w‖₂ ≤ 5 and a server ridge (bench_large_d's mnist model)."""
    from fedmodel.datasets import load_mnist37
    data = load_mnist37()
    X, y = data.X[:MNIST_ROWS], np.where(data.y[:MNIST_ROWS] > 0, 1.0, -1.0)
    w = fm.Variable(X.shape[1], name="w")
    prob = fm.Problem("mnist-ball")
    for i, part in enumerate(np.array_split(np.arange(len(y)), n)):
        c = prob.add_client(f"c{i}")
        c.minimize(len(part) / len(y) * fm.mean(fm.logistic(-y[part] * (c.data(X[part], name="X") @ w))))
        c.subject_to(fm.norm2(w) <= radius)
    prob.server.minimize(ridge_weight * fm.sum_squares(w))
    return prob, w


MODELS: dict[str, Callable] = {
    "ridge": ridge, "logistic": logistic, "logistic-ball": logistic_ball, "lasso": lasso,
    "np-monks1": _neyman_pearson("monks-1"), "np-adult": _neyman_pearson("adult-a"),
    "mnist-ball": mnist_ball,
}

# Round counts the papers report (../shared/spec/), by backend: what they ran, not a target.
PAPERS: dict[str, str] = {
    "proxal": "ProxAL (fl_constraints.md): NP Table 1 reports no round counts (authors' code "
              "caps K = 100 outer × T = 300 ADMM); LCQP log (Table 4): 11 outer iterations, "
              "≈ 590 ADMM iterations in total (the spec's faithful prototype), i.e. ≈ 600 round trips",
    "cproxal": "cProx-AL (fl_constraints.md): centralized, no communication; LCQP log 3–13 outer",
    "dald": "DALD (dald.md): fixed budgets of 1,000 / 3,000 inner iterations (Tables I, II), "
            "one round trip each",
    "fedadmm": "FedADMM-InSa (fedadmm_insa.md): K = 100 rounds (linear regression) / 200 "
               "(MNIST), 10 of 100 clients a round",
    "fedprox": "FedProx (DALD's Table II column): 1,000 / 3,000 rounds",
    "fedavg": "— (no paper table in ../shared/spec)",
    "dp-admm": "DP-IADMM (dp_iadmm.md): T = 2·10⁴ rounds (MNIST, FEMNIST), 10⁶ for Remark 3",
}


# ---- running ---------------------------------------------------------------------------------
class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def _reason(exc: BaseException, words: int = 14) -> str:
    """The first words of an error message, on one line (a table cell)."""
    text = " ".join(str(exc).split())
    cut = text.split(" ")[:words]
    return " ".join(cut) + (" …" if len(text.split(" ")) > words else "")


def timed_solve(prob, backend: str, timeout: float):
    """(result or None, wall seconds, CPU seconds, outcome): outcome "ok", "timeout",
    "refused: …" or "error: …". The run is stopped by SIGALRM after `timeout` wall seconds."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    start, cpu = time.perf_counter(), time.process_time()
    try:
        # (armed inside the try: a tiny timeout fired before it escaped as an error)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # statuses are in the table
            result = prob.solve(OPTIONS[backend]() if backend in OPTIONS else backend)
        outcome = "ok"
    except _Timeout:
        result, outcome = None, "timeout"
    except fm.FedModelError as exc:
        result, outcome = None, f"refused: {_reason(exc)}"
    except Exception as exc:                        # noqa: BLE001 — recorded in the table
        result, outcome = None, f"error: {type(exc).__name__}: {_reason(exc)}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return result, time.perf_counter() - start, time.process_time() - cpu, outcome


def ledger_row(result, n: int) -> dict:
    """Round trips and per-client traffic of a Result (`info["communication"]`, the ledger's;
    None entries: no communication, as CVXPY's)."""
    com = result.info.get("communication")
    if com is None:
        return {"round_trips": None, "rounds": None, "messages_per_client": None,
                "floats_per_client": None}
    per = com["floats_per_client"]
    return {"round_trips": int(com["round_trips"]), "trips_by_kind": dict(com["by_kind"]),
            "rounds": int(result.ledger.rounds),
            "messages_per_client": (com["messages"]["down"] + com["messages"]["up"]) / n,
            "floats_per_client": (com["floats"]["down"] + com["floats"]["up"]) / n,
            "floats_max": {"down": per["down"]["max"], "up": per["up"]["max"]}}


def warm_up(backends: Iterable[str]) -> None:
    """Solve a 2-client ridge once with CVXPY and each backend, untimed: the first solve of a
    process pays imports and code generation that no later row should carry."""
    prob, _ = ridge(2)
    for backend in ("cvxpy", *backends):
        timed_solve(prob, backend, 120.0)


def run_case(model: str, n: int, backends: Iterable[str], timeout: float,
             out: Path | None = None) -> list[dict]:
    """Every backend's default run on one model at n clients: one record per backend, each
    appended to `out` (JSON lines) as soon as it is made (a stopped benchmark keeps them)."""
    base = {"model": model, "n": n}
    try:
        prob, _ = MODELS[model](n)
    except fm.FedModelError as exc:                  # e.g. more clients than rows of a class
        records = [{**base, "backend": "*", "outcome": f"model not built: {_reason(exc)}"}]
        _append(out, records)
        return records
    reference, cvxpy_wall, cvxpy_cpu, ref_outcome = timed_solve(prob, "cvxpy", timeout)
    base["cvxpy_s"], base["cvxpy_cpu_s"] = cvxpy_wall, cvxpy_cpu
    if reference is None or reference.status != "converged":
        status = ref_outcome if reference is None else \
            f"{reference.status} ({reference.info.get('cvxpy_status', '')})"
        if reference is not None and "infeasible" in status:
            records = [{**base, "backend": "*", "outcome": f"model infeasible (CVXPY: {status})"}]
            _append(out, records)
            return records
        reference = None     # not verified: fm.verify would start another, untimed, CVXPY solve
        base["reference"] = status
    records = []
    for backend in backends:
        print(f"# {model} n={n} {backend} …", file=sys.stderr, flush=True)
        result, wall, cpu, outcome = timed_solve(prob, backend, timeout)
        record = {**base, "backend": backend, "outcome": outcome, "wall_s": wall, "cpu_s": cpu}
        if result is not None:
            verified, failed = None, [f"no CVXPY reference: {base.get('reference')}"]
            if reference is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    report = fm.verify(result, reference)
                verified, failed = bool(report.ok), list(report.failed)
                record.update(distance=float(report.solution_distance),
                              gap=float(report.objective_gap), notes=list(report.notes))
            if "inner" in result.info:      # (ProxAL's inner solver: "newton" or "admm")
                record["inner"] = result.info["inner"]["name"]
            if "auto" in result.info:
                record["auto"] = {"backend": result.info["auto"]["backend"],
                                  "settings": {k: repr(v) for k, v in result.info["auto"]["settings"].items()}}
            record.update(status=result.status, iterations=dict(result.iterations),
                          verified=verified, failed=failed, **ledger_row(result, n))
        records.append(record)
        _append(out, [record])
    return records


def _append(out: Path | None, records: list[dict]) -> None:
    if out is not None:
        with out.open("a") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)


# ---- the table -------------------------------------------------------------------------------
def _rounds_cell(r: dict) -> str:
    if r.get("outcome") != "ok":
        return "—"
    if r["backend"] == "cproxal":
        return "0 (centralized)"
    # (a record made before the ledger counted round trips has the backend's own count only)
    rounds, dagger = (r["round_trips"], "") if "round_trips" in r else (r["rounds"], "†")
    mark = "**" if rounds is not None and rounds > 100 else ""
    return f"{mark}{rounds}{dagger}{mark}"


def _iterations_cell(r: dict) -> str:
    its = r.get("iterations") or {}
    if "outer" in its and "inner" in its and r["backend"] != "dald":
        return f"{its['outer']} outer × {its['inner']} inner" + (f" ({r['inner']})" if "inner" in r else "")
    return ", ".join(f"{v} {k}" for k, v in its.items())


def table(records: list[dict]) -> str:
    """Markdown: one row per (model, n, backend), the last record of each kept."""
    latest: dict[tuple, dict] = {}
    for r in records:
        latest[(r["model"], r["n"], r["backend"])] = r
    order = {name: i for i, name in enumerate(MODELS)}
    border = {name: i for i, name in enumerate(("*",) + BACKENDS + tuple(OPTIONS))}
    keys = sorted(latest, key=lambda k: (order.get(k[0], 99), k[1], border.get(k[2], 99)))
    lines = ["| model | n | backend | round trips | verified (1e-3) | iterations | "
             "messages / client | floats / client (KiB) | CPU / wall s | CVXPY CPU / wall s |",
             "|---|---:|---|---:|---|---|---:|---:|---:|---:|"]
    for key in keys:
        r = latest[key]
        cvx = f"{r['cvxpy_cpu_s']:.2f} / {r['cvxpy_s']:.2f}" if "cvxpy_s" in r else "—"
        if r.get("outcome") != "ok":
            wall = f"{r['cpu_s']:.1f} / {r['wall_s']:.1f}" if "wall_s" in r else "—"
            lines.append(f"| {r['model']} | {r['n']} | {r['backend']} | — | {r['outcome']} | | | | "
                         f"{wall} | {cvx} |")
            continue
        failed = ", ".join(r["failed"]) + (f"; distance {r['distance']:.1e}" if "distance" in r else "")
        verified = "yes" if r["verified"] else f"NO ({r['status']}; {failed})" \
            if r["verified"] is False else f"? ({r['status']}; {failed})"
        if r["rounds"] is None or r["backend"] == "cproxal":
            msgs = floats = "—"
        else:
            msgs = f"{r['messages_per_client']:.0f}"
            floats = f"{r['floats_per_client']:.0f} ({r['floats_per_client'] * 8 / 1024:.1f})"
        lines.append(f"| {r['model']} | {r['n']} | {r['backend']} | {_rounds_cell(r)} | {verified} | "
                     f"{_iterations_cell(r)} | {msgs} | {floats} | {r['cpu_s']:.2f} / {r['wall_s']:.2f} | "
                     f"{cvx} |")
    return "\n".join(lines)


def load(path: Path) -> list[dict]:
    """The records of a JSON-lines file (none when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> None:
    global MNIST_ROWS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--n", nargs="+", type=int, default=list(CLIENTS))
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS) + list(OPTIONS))
    parser.add_argument("--timeout", type=float, default=300.0, help="wall seconds per run")
    parser.add_argument("--mnist-rows", type=int, default=MNIST_ROWS)
    parser.add_argument("--out", type=Path, default=Path("bench_rounds.jsonl"),
                        help="JSON lines, appended to (the table is made from all of it)")
    parser.add_argument("--table", action="store_true", help="print the table of --out only")
    args = parser.parse_args(argv)
    MNIST_ROWS = args.mnist_rows
    if not args.table:
        info = machine_info()
        print(f"# {info['cpu']}, {info['cores']}, Python {info['python']}, numpy {info['numpy']}, "
              f"timeout {args.timeout:g} s", flush=True)
        warm_up(args.backends)
        for n in args.n:                 # small n first: a long run at n = 200 cannot hide them
            for model in args.models:
                run_case(model, n, args.backends, args.timeout, args.out)
    print(table(load(args.out)))


if __name__ == "__main__":
    main()
