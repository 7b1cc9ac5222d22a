"""Helpers shared by backends: topology checks, collecting results, progress display, option
checks, the node-side curvature estimate (procedure "local_curvature") and the node-local
bookkeeping requests "shared_values" and "node_terms" (answered by a node for the driver, no
network traffic), so that backends never read a node program themselves."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

import numpy as np

from fedmodel import topologies
from fedmodel.errors import FedModelError
from fedmodel.expression import Constant
from fedmodel.runtime.batched_group import in_group_order, private_stack
from fedmodel.runtime.batched_procedures import common_value, same_options
from fedmodel.runtime.messages import procedure


def require_star(problem, topology, backend: str):
    """Backends with a server need a star-like topology with a server node (docs/api.md §3).
    None is the default star: its clients are checked, but no graph is built (these backends
    never walk it, and a graph costs networkx's import, ~0.2 s of a cold solve); None is
    returned."""
    if topology is None:
        topologies.require_clients(problem, "star")
        return None
    topologies.validate(topology, problem, need_server=True)
    return topology


def gather_values(executor, problem, shared_flat: np.ndarray) -> tuple[dict, dict]:
    """Solution values by variable uid and multipliers by constraint name, collected from the
    nodes through local reporting messages."""
    values = dict(executor.call("server", "shared_values", x=shared_flat)["values"])
    multipliers: dict[str, Any] = {}
    # one request each: 2 round trips (clients the run has lost, `Executor.lost`, are not asked)
    everyone = {node: {} for node in executor.nodes if node not in executor.lost}
    for reply in executor.map("private_values", everyone).values():
        values.update(reply["values"])
    for reply in executor.map("multipliers", everyone).values():
        multipliers.update(reply["multipliers"])
    return values, multipliers


@procedure("shared_values", {"x": "x"}, {"values": "opaque"}, local=True, read_only=True)
def _shared_values(program, x) -> dict:
    """The flat shared vector x as values by variable uid, in the node's layout."""
    layout = program.shared
    return {"values": dict(zip([v.uid for v in layout.variables], layout.unpack(x)))}


@procedure("node_terms", {}, {"prox_terms": "1", "constraints": "1", "objective": "1"}, local=True,
           read_only=True)
def _node_terms(program) -> dict:
    """What the node's merit holds, as counts: prox-able terms and projected sets
    ("prox_terms"), constraints in its augmented Lagrangian ("constraints"), and 1 when its
    smooth objective is not the constant 0 ("objective"). A backend asks it to decide which
    steps a node needs (e.g. whether a server step is a plain average)."""
    merit = program.merit_ir
    zero = isinstance(merit.objective, Constant) and not np.any(merit.objective.value)
    return {"prox_terms": float(len(merit.prox_terms)), "constraints": float(len(program.constraints)),
            "objective": float(not zero)}


# The executor of the run in progress (`running`), read by its progress bar for the running
# round-trip count: the bar is made inside each backend's loop, which need not pass it along.
_RUNNING: ContextVar = ContextVar("fedmodel_running_executor", default=None)


@contextmanager
def running(ex) -> Iterator[Any]:
    """While the block runs, `ex` is the run's executor for the progress bars made in it (a
    nested run, e.g. ProxAL's inner FedADMM, sees its own; the outer one's comes back after)."""
    token = _RUNNING.set(ex)
    try:
        yield ex
    finally:
        _RUNNING.reset(token)


class _Silent:
    def update(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


class _Bar:
    def __init__(self, total: int, label: str, terminal: bool = True):
        from tqdm import tqdm
        # a terminal: a live bar, cleared at the end; a notebook, a log file or a pipe: the line
        # every 10 s and the last one kept (the run's end state stays in the log)
        self.bar = tqdm(total=total, desc=label, leave=not terminal, file=sys.stderr,
                        mininterval=0.1 if terminal else 10.0)
        self.executor = _RUNNING.get()

    def update(self, record: dict) -> None:
        fields = {"obj": f"{_number(record.get('objective')):.4g}",
                  "viol": f"{_number(record.get('violation')):.1e}"}
        if self.executor is not None:       # the ledger as it stands (a resumed run: its loaded one)
            fields["trips"] = str(self.executor.ledger.round_trips)
        for key, label in _REPORTED:        # whichever of these this backend reports
            if record.get(key) is not None:
                fields[label] = f"{_number(record[key]):.1e}"
        self.bar.set_postfix(fields, refresh=False)
        # position from the record (inner steps, rounds or outer iterations) when it has one, so
        # that a resumed run continues where it stopped; else one step per record
        position = next((record[k] for k in ("inner_total", "round", "iteration")
                         if isinstance(record.get(k), (int, np.integer))), None)
        self.bar.update(1 if position is None else max(int(position) - self.bar.n, 0))

    def close(self) -> None:
        self.bar.close()


# residuals, and the privacy spent so far (DP-ADMM: advanced composition, cheap per round; the
# RDP/PLD accountants' ε is computed once at the end, see docs/privacy.md)
_REPORTED = (("primal_residual", "pri"), ("dual_residual", "dual"), ("primal_change", "Δx"),
             ("multiplier_change", "Δμ"), ("certificate", "cert"), ("epsilon_advanced", "ε"))


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def stacked_report(ex, clients, x: np.ndarray, with_server: bool,
                   reports: dict | None = None) -> tuple[float, float]:
    """(objective, violation) of the model at x: the clients' "report" as one group request
    (`map_stacked`; `reports`: their stacked replies already got, e.g. as a `Rider` of another
    request), plus the server's when `with_server` (a server without terms or constraints
    reports 0, 0, so the caller may skip it)."""
    if reports is None:
        reports = ex.map_stacked("report", clients, common={"x": x})
    objective = float(np.sum(reports["objective"]))
    violation = float(np.max(reports["violation"], initial=0.0))
    if with_server:
        server = ex.call("server", "report", x=x)
        objective, violation = objective + server["objective"], max(violation, server["violation"])
    return objective, violation


def complete_record(record: dict, report: tuple[float, float], callback, bar) -> None:
    """A history record whose report came later (it rode on the next round's request, a
    `Rider`): its objective and violation filled in from `report`, then handed to the callback
    and the progress bar, as a record completed in its own round is."""
    record["objective"], record["violation"] = report
    if callback:
        callback(record)
    bar.update(record)


def progress(total: int, verbose: bool, label: str):
    """A tqdm bar with objective, violation, the round trips so far (the run's ledger, see
    `running`) and what else the backend reports (primal / dual residuals, changes,
    certificate, privacy spent) when `verbose` (`_Bar`: live on a terminal, a line every 10 s
    elsewhere, as CVXPY's verbose output reaches notebooks and logs); else silent."""
    return _Bar(total, label, sys.stderr.isatty()) if verbose else _Silent()


# ---- option validation (backends check their options when they are built) --------------------
def check_number(label: str, value, low: float, high: float, closed: bool = False,
                 low_closed: bool = False) -> float:
    """`value` as a float between low and high (ends included when `low_closed` / `closed`), else
    a FedModelError saying which option, which interval and what was given."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok and (low < value or (low_closed and value == low)) and (value < high or (closed and value == high)):
        return float(value)
    interval = f"{'[' if low_closed else '('}{low:g}, {high:g}{']' if closed else ')'}"
    raise FedModelError(f"{label} must be a number in {interval}, got {value!r}")


def check_count(label: str, value, low: int = 1) -> int:
    """`value` as an int ≥ `low` (bools and floats refused), else a FedModelError."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= low:
        return int(value)
    raise FedModelError(f"{label} must be an integer ≥ {low}, got {value!r}")


def check_choice(label: str, value, choices: tuple) -> Any:
    """`value` if it is one of `choices`, else a FedModelError listing them."""
    if isinstance(value, str) and value in choices:
        return value
    raise FedModelError(f"{label} must be one of {choices}, got {value!r}")


def check_callable(label: str, value) -> Any:
    """`value` if it is None or callable, else a FedModelError."""
    if value is None or callable(value):
        return value
    raise FedModelError(f"{label} must be a callable or None, got {value!r}")


# ---- the clients' curvature (automatic steps of FedADMM, FedProx, FedAvg; DP-ADMM's ρ floor) ----
def curvature_rows(gradient: Callable[[np.ndarray], np.ndarray], X: np.ndarray, scale=1.0,
                   iterations: int = 8) -> np.ndarray:
    """An estimate of the largest curvature of each row's objective / `scale` near its point X[i]
    (X: (k, N); `gradient(Z)`: the k objectives' gradients at the rows of Z, (k, N); `scale`: a
    number or (k,)): power iteration on gradient differences, row by row (exact for quadratics,
    from below; the callers' safeguards correct an underestimate). A row stops at its first
    non-finite or zero size and keeps its estimate (0 if it had none). Costs `iterations` + 1
    calls of `gradient`, each on every row (rows that stopped are evaluated and ignored)."""
    scale = np.asarray(scale, float).reshape(-1, 1) if np.ndim(scale) else scale
    G0 = gradient(X) / scale
    V = np.tile(np.cos(np.arange(1, X.shape[1] + 1)), (len(X), 1))   # deterministic, no zero coordinate
    # a step relative to the point's size (fmax: a NaN coordinate gives h = 1e-4, as max(1, nan))
    h = (1e-4 * np.fmax(1.0, np.max(np.abs(X), axis=1, initial=0.0)))[:, None]
    estimate, going = np.zeros(len(X)), np.ones(len(X), dtype=bool)
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(iterations):
            V = V / _row_norms(V)[:, None]
            HV = (gradient(X + h * V) / scale - G0) / h
            size = _row_norms(HV)
            going &= np.isfinite(size) & (size != 0.0)
            if not going.any():
                break
            estimate[going], V[going] = size[going], HV[going]
    return estimate


def _row_norms(V: np.ndarray) -> np.ndarray:
    """‖V[i]‖₂ per row, each bitwise `np.linalg.norm(V[i])` (√ of BLAS's dot, which a stacked
    matmul of vectors calls row by row; `norm(V, axis=1)` sums in another order): a norm's
    last bit moves x + h·v by an ulp of x, which the difference quotient divides by h."""
    return np.sqrt((V[:, None, :] @ V[:, :, None]).ravel())


def local_curvature(program, x: np.ndarray, scale: float = 1.0, iterations: int = 8) -> float:
    """`curvature_rows` for one node program at x = (shared, private): its own gradients, one
    row (the serial path; a group of clients takes `group_curvature`)."""
    n = program.n_shared

    def gradient(Z: np.ndarray) -> np.ndarray:
        return program.value_grad(Z[0, :n], Z[0, n:])[1][None]
    return float(curvature_rows(gradient, np.asarray(x, float)[None], scale, iterations)[0])


def group_curvature(group, rows: np.ndarray, z: np.ndarray, scale=1.0, iterations: int = 8) -> np.ndarray:
    """`curvature_rows` for the clients `rows` of a batched executor's group
    (`runtime.batched_group.Group`) at (z, each one's private values): every gradient is one
    group evaluation (`Group.grad`; clients outside `rows` are evaluated at the first row's
    point and ignored). Each client's estimate is its `local_curvature`'s up to the rounding of
    the group's gradients (not bitwise: a difference of gradients divides it by h ≈ 1e-4)."""
    n, everyone = group.n_x, in_group_order(rows, group.n)
    X = np.concatenate([np.broadcast_to(np.asarray(z, float), (len(rows), n)),
                        private_stack(group)[rows]], axis=1)
    full = None if everyone else np.repeat(X[:1], group.n, axis=0)

    def gradient(Z: np.ndarray) -> np.ndarray:
        if everyone:
            return group.grad(Z[:, :n], Z[:, n:])
        full[rows] = Z
        return group.grad(full[:, :n], full[:, n:])[rows]
    return curvature_rows(gradient, X, scale, iterations)


def _curvature_stacked(group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """"local_curvature" as a group request (one z for all; `Executor.map_stacked`), or None."""
    if blocks or "z" not in common:
        return None
    return {"L": group_curvature(group, rows, common["z"], iterations=int(common.get("iterations", 8)))}


def _curvature_batched(group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """"local_curvature" for the members of a group sent per-node payloads (`Executor.map`, or a
    group request to clients of several structures) with one z and one count, or None."""
    z, same = common_value(payloads, members, "z"), same_options(payloads, members, ("iterations",))
    if z is None or same is None:
        return None
    rows = np.array([group.index[m] for m in members], dtype=np.intp)
    L = group_curvature(group, rows, z, iterations=int(same.get("iterations", 8)))
    return {m: {"L": float(value)} for m, value in zip(members, L)}


@procedure("local_curvature", {"z": "x", "iterations": "1"}, {"L": "1"}, batched=_curvature_batched,
           stacked=_curvature_stacked)
def _curvature_at(program, z, iterations=8):
    """L̂_i near (z, the client's private values), estimated on the client: FedProx/FedAvg's
    automatic step and DP-ADMM's ρ floor ask every client for it through the executor (one
    group request: the batched and JAX executors serve it by `group_curvature`)."""
    x = np.concatenate([np.asarray(z, float), program.y])
    return {"L": local_curvature(program, x, iterations=int(iterations))}


# The node steps every run may send: gathering the values (`gather_values`, by the framework
# in `Backend.run`), what a node holds, and the curvature estimate several backends share
FRAMEWORK = (_shared_values, _node_terms, _curvature_at)


def user_metric(scales: np.ndarray | None, w: np.ndarray, sizes: list[int] | None = None) -> float:
    """min over the variables v of ‖D_v w_v‖∞ / (max D_v · ‖w‖∞) ≤ 1, D the column scales of the
    shared entries (`Backend.user_scales`; 1 without them), `sizes` the variables' entry counts in
    the order the shared vector packs them (`variable_sizes`; None: one variable): how much
    smaller a run's distances must be for one to hold in the user's units, for every variable,
    as fm.verify reads it (‖D_v e_v‖∞ relative to ‖D_v w_v‖∞, variable by variable), where a
    distance test (ProxAL's, DALD's `dist_tol`) reads ‖e‖₂ relative to ‖w‖₂ in the run's
    (‖D_v e_v‖∞ ≤ max D_v ‖e‖₂). Raw power-plant data with an intercept (D 0.09 … 92): 1.6e-5
    from the answer in the run's units was 3e-3 in the user's, and ProxAL said "converged" (DALD
    1.2e-3). Slopes w ~1e-3 beside an intercept b ~1e4 (two variables, 1.5e-4 : 1 in the run's
    units): read on the stacked vector, b decided alone and both said "converged" with w 1.4e-3
    (ProxAL) and 3.9e-2 (DALD) off. A variable below ZERO of ‖w‖∞ (run's units) is read as that
    much: an optimum at 0 would ask for an exact answer (fm.verify too measures one against a
    floor, its ZERO_LENGTH of the variable's natural length)."""
    w = np.abs(np.asarray(w, dtype=float).ravel())
    largest = float(np.max(w, initial=0.0))
    if not largest > 0:
        return 1.0
    D = np.ones(w.size) if scales is None or np.size(scales) != w.size else np.asarray(scales, dtype=float).ravel()
    ends = np.cumsum(sizes) if sizes and sum(sizes) == w.size else [w.size]
    metric = 1.0
    for start, end in zip([0, *ends[:-1]], ends):
        top = float(np.max(D[start:end], initial=0.0))
        if top > 0:
            size = max(float(np.max(D[start:end] * w[start:end])) / top, ZERO * largest)
            metric = min(metric, size / largest)
    return metric


ZERO = 1e-4     # (`user_metric`) a variable this small beside the largest entry reads as this much


def variable_sizes(problem) -> list[int]:
    """The shared variables' entry counts, in the order the shared vector packs them (the
    node programs' shared `Layout`, `ScaledModel.shared_scales`): `user_metric`'s variables."""
    return [int(v.size) for v in problem.shared_variables()]
