"""Verdicts on random small models (issue 25: a status that lies is the worst defect).

Random small models of the shapes users write, each solved with every backend's defaults
(`prob.solve(name)`: ProxAL, FedADMM, DALD, DP-ADMM — its default is non-private —, FedProx)
and judged against CVXPY (`fm.verify`'s reference; CVXPY's own status is the truth about
feasibility):

- np:        Neyman-Pearson logistic (class-0 loss, each client's class-1 loss ≤ r), a server
             ridge; r from barely feasible (0.002 above the least worst-client class-1 loss,
             found by CVXPY) to slack; n ∈ {3, 5, 10}, 10-60 rows a client, d 5-20, clients
             with shifted features;
- ls-ball:   least squares, each client a ball ‖w‖₂ ≤ R_i, a server ridge;
- logit-ball: logistic loss, client balls, a server ridge;
- lasso-box: lasso written per client, each client a box |w| ≤ b_i;
- np-barely: NP with r = 0.002 above the least worst-client class-1 loss (large multipliers:
             where an "infeasible" verdict would be premature);
- infeasible: NP with r below the least worst-client loss, or client balls around centres
             farther apart than their radii.

Each run is classified:
- OK: "converged" and verified (rtol 1e-3), or "infeasible" where CVXPY says infeasible;
- UNSOLVED: an honest status without a claim (max_iterations, stalled, budget_exhausted);
- WRONG: "converged" where verify says NO or CVXPY says infeasible, or "infeasible" /
  "diverged" / "unbounded" where CVXPY solves the model;
- REFUSED (a FedModelError before the run), TIMEOUT, ERROR (anything else raised).

    nice -n 10 python benchmarks/bench_verdicts.py --out verdicts.jsonl [--seeds 0-29]
        [--backends proxal fedadmm] [--timeout 60]     # CPU seconds a run
    python benchmarks/bench_verdicts.py --out verdicts.jsonl --table

Records are appended as JSON lines (one per run) as soon as they are made; the table is
printed from the file. BLAS is limited to one thread (the machine is shared).
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
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fedmodel as fm  # noqa: E402
from benchmarks.bench_rounds import OPTIONS, _reason, ledger_row  # noqa: E402

BACKENDS = ("proxal", "fedadmm", "dald", "dp-admm", "fedprox")
KINDS = ("np", "ls-ball", "logit-ball", "lasso-box", "infeasible", "np-barely")
HONEST = ("max_iterations", "stalled", "budget_exhausted")
CLAIMS_NO_ANSWER = ("infeasible", "diverged", "unbounded")


# ---- models ----------------------------------------------------------------------------------
def _shape(rng: np.random.Generator) -> tuple[int, int, list[int]]:
    """n clients, d features, rows per client (heterogeneous sizes)."""
    n = int(rng.choice([3, 5, 10]))
    d = int(rng.integers(5, 21))
    return n, d, [int(m) for m in rng.integers(10, 61, size=n)]


def _features(rng: np.random.Generator, m: int, d: int) -> np.ndarray:
    """A client's rows: standard normal features shifted and scaled per client (heterogeneous)."""
    return rng.standard_normal((m, d)) * rng.uniform(0.5, 1.5) + 0.5 * rng.standard_normal(d)


def _np_data(rng: np.random.Generator, n: int, d: int, rows: list[int]):
    """Per client (class-0 rows, class-1 rows): labels from a noisy linear score, ≈ 30 % class 1,
    at least 2 rows of each class per client. The noise is as large as the signal (std √d), so
    the classes overlap and the least worst-client class-1 loss is above 0 even where a client
    has fewer class-1 rows than features (with noise 1 it was 0 — separable — on most draws)."""
    truth = rng.standard_normal(d)
    parts = []
    for m in rows:
        X = _features(rng, m, d)
        score = X @ truth + np.sqrt(d) * rng.standard_normal(m)
        ones = score > np.quantile(score, 0.7)
        ones[np.argsort(score)[-2:]] = True
        ones[np.argsort(score)[:2]] = False
        parts.append((X[~ones], X[ones]))
    return parts


def least_worst_class1_loss(parts) -> float:
    """min_w max_i (client i's mean class-1 logistic loss), by CVXPY: the NP model with
    threshold r is feasible iff this is ≤ r (0 when class 1 is separable: not attained)."""
    import cvxpy as cp
    v, t = cp.Variable(parts[0][0].shape[1]), cp.Variable()
    losses = [cp.sum(cp.logistic(-(X1 @ v))) / len(X1) for _, X1 in parts]
    cp.Problem(cp.Minimize(t), [loss <= t for loss in losses]).solve(solver="CLARABEL")
    return max(float(t.value), 0.0)


def neyman_pearson(rng: np.random.Generator, margin: float | None = None, infeasible: bool = False):
    """NP logistic with per-client class-1 constraints and a server ridge; threshold r = least
    worst-client loss + `margin` (drawn from barely feasible to slack when None), or below it
    (`infeasible`)."""
    n, d, rows = _shape(rng)
    parts = _np_data(rng, n, d, rows)
    floor = least_worst_class1_loss(parts)
    if infeasible:
        if floor < 0.02:           # separable class 1: every r > 0 is feasible; redraw the labels
            return None
        r = floor * float(rng.uniform(0.6, 0.95))
    else:
        margin = float(rng.choice([0.002, 0.01, 0.03, 0.1, 0.3])) if margin is None else margin
        r = floor + margin
    lam = float(10 ** rng.uniform(-4, -2))
    prob, w = np_problem(parts, r, lam)
    return prob, w, {"n": n, "d": d, "rows": rows, "r": r, "floor": floor, "ridge": lam}


def np_problem(parts, r: float, ridge: float):
    """(problem, w): the NP model on per-client (class-0 rows, class-1 rows) `parts` — the mean
    class-0 logistic loss, each client's class-1 loss ≤ r (named np[c<i>]), a server ridge."""
    n, d = len(parts), parts[0][0].shape[1]
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name="np")
    for i, (X0, X1) in enumerate(parts):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(X0, name="X0") @ w)) / n)
        c.subject_to((fm.mean(fm.logistic(-(c.data(X1, name="X1") @ w))) <= r).named(f"np[c{i}]"))
    prob.server.minimize(ridge * fm.sum_squares(w))
    return prob, w


def _balls(rng: np.random.Generator, kind: str, infeasible: bool = False):
    """Least squares or logistic loss with a client ball each and a server ridge. The radii
    cut the unconstrained fit (the truth has norm ≈ 2√d); `infeasible`: the balls are centred
    far apart (‖w − c_i‖₂ ≤ R_i with ‖c_i − c_j‖ > R_i + R_j)."""
    n, d, rows = _shape(rng)
    truth = 2.0 * rng.standard_normal(d)
    lam = float(10 ** rng.uniform(-4, -2))
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=kind)
    total = sum(rows)
    radii = []
    for i, m in enumerate(rows):
        c = prob.add_client(f"c{i}")
        X = _features(rng, m, d)
        if kind == "ls-ball":
            b = X @ truth + 0.3 * rng.standard_normal(m)
            c.minimize(fm.sum_squares(c.data(X, name="A") @ w - c.data(b, name="b")) / total)
        else:
            y = np.where(rng.random(m) < 1 / (1 + np.exp(-X @ truth)), 1.0, -1.0)
            c.minimize(fm.sum(fm.logistic(c.data(-y[:, None] * X, name="Z") @ w)) / total)
        radius = float(rng.uniform(0.3, 1.5)) * np.linalg.norm(truth)
        radii.append(radius)
        if infeasible:
            centre = np.zeros(d)
            centre[i % d] = (i + 1) * 3.0 * np.linalg.norm(truth) * 2
            c.subject_to(fm.norm2(w - centre) <= radius)
        else:
            c.subject_to(fm.norm2(w) <= radius)
    prob.server.minimize(lam * fm.sum_squares(w))
    return prob, w, {"n": n, "d": d, "rows": rows, "radii": radii, "ridge": lam}


def lasso_box(rng: np.random.Generator):
    """Lasso written per client (`loss + λ/n·norm1(w)`), each client a box |w_j| ≤ b_i that
    cuts the sparse truth (b_i from 0.3 to 1.5 × its largest entry)."""
    n, d, rows = _shape(rng)
    truth = np.where(rng.random(d) < 0.4, 2.0 * rng.standard_normal(d), 0.0)
    lam = float(10 ** rng.uniform(-2.5, -1))
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name="lasso-box")
    total = sum(rows)
    boxes = []
    for i, m in enumerate(rows):
        c = prob.add_client(f"c{i}")
        X = _features(rng, m, d)
        b = X @ truth + 0.1 * rng.standard_normal(m)
        c.minimize(fm.sum_squares(c.data(X, name="A") @ w - c.data(b, name="b")) / (2 * total)
                   + lam / n * fm.norm1(w))
        box = float(rng.uniform(0.3, 1.5)) * max(float(np.max(np.abs(truth))), 0.5)
        boxes.append(box)
        c.subject_to(w <= box, w >= -box)
    return prob, w, {"n": n, "d": d, "rows": rows, "boxes": boxes, "lasso": lam}


def random_model(kind: str, seed: int):
    """(problem, shared variable, description) of a `kind` model drawn with `seed` (KINDS)."""
    rng = np.random.default_rng([KINDS.index(kind), seed])
    if kind == "np":
        return neyman_pearson(rng)
    if kind == "np-barely":
        return neyman_pearson(rng, margin=0.002)
    if kind in ("ls-ball", "logit-ball"):
        return _balls(rng, kind)
    if kind == "lasso-box":
        return lasso_box(rng)
    if kind == "infeasible":
        for _ in range(10):
            if seed % 2 == 0:
                built = neyman_pearson(rng, infeasible=True)
            else:
                built = _balls(rng, "ls-ball", infeasible=True)
            if built is not None:
                return built
    raise ValueError(f"no model of kind {kind!r} for seed {seed}")


# ---- running ---------------------------------------------------------------------------------
class _OutOfTime(Exception):
    pass


def _out_of_time(signum, frame):
    raise _OutOfTime


def cpu_limited_solve(prob, backend: str, limit: float):
    """(result or None, wall seconds, outcome "ok" / "timeout" / "refused: …" / "error: …"):
    `prob.solve(backend)` stopped after `limit` CPU seconds of this process (SIGPROF, not wall
    time: on the shared machine a loaded minute is not a run's fault)."""
    previous = signal.signal(signal.SIGPROF, _out_of_time)
    start = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_PROF, limit)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # statuses are in the records
            result, outcome = prob.solve(OPTIONS[backend]() if backend in OPTIONS else backend), "ok"
    except _OutOfTime:
        result, outcome = None, "timeout"
    except fm.FedModelError as exc:
        result, outcome = None, f"refused: {_reason(exc)}"
    except Exception as exc:                        # noqa: BLE001 — recorded
        result, outcome = None, f"error: {type(exc).__name__}: {_reason(exc)}"
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    return result, time.perf_counter() - start, outcome


# ---- verdicts --------------------------------------------------------------------------------
def classify(status: str | None, outcome: str, truth: str, verified: bool | None) -> str:
    """OK / UNSOLVED / WRONG / REFUSED / TIMEOUT / ERROR of one run (module docstring); `truth`
    is CVXPY's status ("converged", "infeasible", ...)."""
    if outcome != "ok":
        return outcome.split(":")[0].upper()
    if truth == "converged":
        if status == "converged":
            return "OK" if verified else "WRONG"
        return "WRONG" if status in CLAIMS_NO_ANSWER else "UNSOLVED"
    if truth == "infeasible":
        if status == "converged":
            return "WRONG"
        return "OK" if status == "infeasible" else "UNSOLVED"
    return "OK" if status == truth else "UNSOLVED"


def run_model(kind: str, seed: int, backends, timeout: float, out: Path | None = None) -> list[dict]:
    """Every backend's default run on one random model, judged against CVXPY; one record each."""
    prob, w, desc = random_model(kind, seed)
    reference, cvxpy_wall, ref_outcome = cpu_limited_solve(prob, "cvxpy", timeout)
    truth = reference.status if reference is not None else ref_outcome
    base = {"kind": kind, "seed": seed, **desc, "cvxpy": truth, "cvxpy_s": cvxpy_wall,
            "cvxpy_status": reference.info.get("cvxpy_status") if reference is not None else None}
    records = []
    for backend in backends:
        print(f"# {kind} seed={seed} {backend} …", file=sys.stderr, flush=True)
        result, wall, outcome = cpu_limited_solve(prob, backend, timeout)
        record = {**base, "backend": backend, "outcome": outcome, "wall_s": wall}
        verified = None
        if result is not None:
            record.update(status=str(result.status), iterations=dict(result.iterations),
                          round_trips=ledger_row(result, desc["n"])["round_trips"],
                          message=next((str(result.info[k]) for k in ("infeasible", "stalled",
                                        "unbounded", "diverged", "warning") if k in result.info), None))
            if reference is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    report = fm.verify(result, reference)
                verified = bool(report.ok)
                record.update(verified=verified, failed=list(report.failed),
                              distance=float(report.solution_distance), gap=float(report.objective_gap))
        record["verdict"] = classify(record.get("status"), outcome, truth, verified)
        records.append(record)
        if out is not None:
            with out.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
        print(f"  {record['verdict']:8} {record.get('status')} d={record.get('distance', float('nan')):.2g} "
              f"trips={record.get('round_trips')}", file=sys.stderr, flush=True)
    return records


def table(records: list[dict]) -> str:
    """Markdown: the verdict counts per backend, then every run that is not OK/UNSOLVED."""
    latest = {(r["kind"], r["seed"], r["backend"]): r for r in records}
    backends = sorted({k[2] for k in latest}, key=lambda b: (BACKENDS + (b,)).index(b))
    verdicts = ("OK", "UNSOLVED", "WRONG", "REFUSED", "TIMEOUT", "ERROR")
    lines = ["| backend | runs | " + " | ".join(verdicts) + " | median round trips (OK) |",
             "|---|---:|" + "---:|" * len(verdicts) + "---:|"]
    for backend in backends:
        rows = [r for k, r in latest.items() if k[2] == backend]
        count = Counter(r["verdict"] for r in rows)
        trips = [r["round_trips"] for r in rows if r["verdict"] == "OK" and r.get("round_trips")]
        lines.append(f"| {backend} | {len(rows)} | " + " | ".join(str(count[v]) for v in verdicts)
                     + f" | {int(np.median(trips)) if trips else '—'} |")
    odd = [r for r in latest.values() if r["verdict"] not in ("OK",)]
    if odd:
        lines += ["", "| model | seed | n | d | backend | CVXPY | status | verdict | distance | round trips |",
                  "|---|---:|---:|---:|---|---|---|---|---:|---:|"]
        for r in sorted(odd, key=lambda r: (r["verdict"] != "WRONG", r["backend"], r["kind"], r["seed"])):
            lines.append(f"| {r['kind']} | {r['seed']} | {r['n']} | {r['d']} | {r['backend']} | {r['cvxpy']} "
                         f"| {r.get('status', r['outcome'][:40])} | {r['verdict']} "
                         f"| {r.get('distance', float('nan')):.2g} | {r.get('round_trips')} |")
    return "\n".join(lines)


def _seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("verdicts.jsonl"))
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 1,4,7")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument("--timeout", type=float, default=60.0, help="CPU seconds a run")
    parser.add_argument("--table", action="store_true", help="print the table of --out only")
    args = parser.parse_args(argv)
    if not args.table:
        for seed in _seeds(args.seeds):
            for kind in args.kinds:
                run_model(kind, seed, args.backends, args.timeout, args.out)
    print(table([json.loads(line) for line in args.out.read_text().splitlines()]))


if __name__ == "__main__":
    main()
