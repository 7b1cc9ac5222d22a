"""Helpers shared by backends: topology checks, collecting results, progress display, option
checks, the node-side curvature estimate (procedure "local_curvature") and the node-local
bookkeeping requests "shared_values" and "node_terms" (answered by a node for the driver, no
network traffic), so that backends never read a node program themselves."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

import topologies
from fedmodel.errors import FedModelError
from fedmodel.expression import Constant
from fedmodel.runtime.ledger import procedure


def require_star(problem, topology, backend: str):
    """Backends with a server need a star-like topology with a server node (docs/api.md §3)."""
    if topology is None:
        return topologies.star(problem)
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


class _Silent:
    def update(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


class _Bar:
    def __init__(self, total: int, label: str):
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc=label, leave=False, file=sys.stderr)

    def update(self, record: dict) -> None:
        fields = {"obj": f"{_number(record.get('objective')):.4g}",
                  "viol": f"{_number(record.get('violation')):.1e}"}
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


def stacked_report(ex, clients, x: np.ndarray, with_server: bool) -> tuple[float, float]:
    """(objective, violation) of the model at x: the clients' "report" as one group request
    (`map_stacked`), plus the server's when `with_server` (a server without terms or
    constraints reports 0, 0, so the caller may skip it)."""
    reports = ex.map_stacked("report", clients, common={"x": x})
    objective = float(np.sum(reports["objective"]))
    violation = float(np.max(reports["violation"], initial=0.0))
    if with_server:
        server = ex.call("server", "report", x=x)
        objective, violation = objective + server["objective"], max(violation, server["violation"])
    return objective, violation


def progress(total: int, verbose: bool, label: str):
    """A tqdm bar with objective, violation and what else the backend reports (primal / dual
    residuals, changes, certificate, privacy spent) when `verbose` and stderr is a terminal;
    else silent."""
    return _Bar(total, label) if verbose and sys.stderr.isatty() else _Silent()


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
def local_curvature(program, x: np.ndarray, scale: float = 1.0, iterations: int = 8) -> float:
    """An estimate of the largest curvature of the node's objective / `scale` near x = (shared,
    private): power iteration on gradient differences (exact for quadratics, from below; the
    callers' safeguards correct an underestimate). Costs `iterations` + 1 gradients."""
    n = program.n_shared
    g0 = program.value_grad(x[:n], x[n:])[1] / scale
    v = np.cos(np.arange(1, x.size + 1))                   # deterministic, no zero coordinate
    estimate = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(iterations):
            v = v / np.linalg.norm(v)
            h = 1e-4 * max(1.0, float(np.max(np.abs(x), initial=0.0)))
            y = x + h * v
            hv = (program.value_grad(y[:n], y[n:])[1] / scale - g0) / h
            size = float(np.linalg.norm(hv))
            if not np.isfinite(size) or size == 0.0:
                break
            estimate, v = size, hv
    return estimate


@procedure("local_curvature", {"z": "x", "iterations": "1"}, {"L": "1"})
def _curvature_at(program, z, iterations=8):
    """L̂_i near (z, the client's private values), estimated on the client: FedProx/FedAvg's
    automatic step and DP-ADMM's ρ floor ask every client for it through the executor."""
    x = np.concatenate([np.asarray(z, float), program.y])
    return {"L": local_curvature(program, x, iterations=int(iterations))}
