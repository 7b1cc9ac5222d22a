"""DALD's options: their checks, the paper's setting (`PAPER_DALD`), and what a `monitor` sees."""
from __future__ import annotations

import numpy as np

from fedmodel.errors import FedModelError
from ..common import check_callable, check_choice, check_count, check_number

SOLVERS = ("auto", "exact", "gd", "newton", "prox-grad")
RULES = ("B1", "B2", "B3", "B4")
# `DALD.paper()`: the paper's exact setting. The constructor's defaults differ, for speed and
# robustness: adaptive ρ on a star (spectral penalty selection; no fixed ρ is good for every model's
# scale: ρ = 1 needs 68 iterations on a lasso but > 3000 on a logistic model where ρ = 0.1 needs
# 94), ε = 1e-6 (ε = 1e-5 stops 2e-4 away from CVXPY there), stall detection, one message per
# iteration on a star (`one_message`: Step 2 rides with the next solve) and the distance rule
# (`dist_tol`: the stop also needs the steps' contraction to put x̂ within 1e-4 of the answer).
PAPER_DALD = dict(rho=1.0, inner_rule="B4", v_max=1, eps_primal=1e-5, eps_dual=1e-5, step=1e-4,
                  local_steps=1, max_iterations=1000, stall_window=None, adaptive_rho=False,
                  one_message=False, dist_tol=None)


def check_rho(rho) -> None:
    """ρ: a positive scalar, a vector of positive entries (one per model coordinate), or a dict
    client → ρ_i (CC) / edge (u, v) → ρ_uv (DC) of those (0 only for the μ ≡ 0 special cases)."""
    values = rho.values() if isinstance(rho, dict) else [rho]
    for value in values:
        try:
            array = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            array = None
        if array is None or array.ndim > 1 or array.size == 0 or isinstance(value, (bool, str)) \
                or not np.all(np.isfinite(array)) or np.any(array < 0):
            raise FedModelError(
                f"rho must be positive and finite: a scalar, a vector with one entry per model "
                f"coordinate, or a dict client → ρ_i (star) / edge (u, v) → ρ_uv (other graphs); "
                f"got {value!r}")


def check_options(o: dict) -> None:
    """Every DALD option, checked when the backend is built (FedModelError naming the option)."""
    check_rho(o["rho"])
    check_choice("inner_rule", o["inner_rule"], RULES)
    check_choice("solver", o["solver"], SOLVERS)
    check_choice("coordination", o["coordination"], ("full", "partial"))
    check_choice("mode", o["mode"], ("auto", "cc", "dc"))
    check_count("v_max", o["v_max"])
    check_count("max_iterations", o["max_iterations"])
    check_count("local_steps", o["local_steps"])
    check_count("report_every", o["report_every"])
    if o["stall_window"] is not None:
        check_count("stall_window", o["stall_window"])
    check_number("participation", o["participation"], 0.0, 1.0, closed=True)
    if o["coordination"] == "full" and (o["participation"] < 1.0 or o["availability"] is not None):
        # (the full cycle asks every node every time: both were ignored, iterate for iterate)
        given = "participation" if o["participation"] < 1.0 else "availability"
        raise FedModelError(f"{given} applies to coordination='partial' (a node takes part in an "
                            f"inner iteration when sampled and reachable); the default 'full' "
                            f"cycle asks every node: pass coordination='partial'")
    check_number("eps_primal", o["eps_primal"], 0.0, np.inf, low_closed=True)
    check_number("eps_dual", o["eps_dual"], 0.0, np.inf, low_closed=True)
    check_number("step", o["step"], 0.0, np.inf)
    if o["beta"] is not None:
        check_number("beta (penalty of the nodes' own constraints)", o["beta"], 0.0, np.inf)
    if o["dist_tol"] is not None:
        check_number("dist_tol", o["dist_tol"], 0.0, np.inf)
    if o["local_tol"] is not None:
        check_number("local_tol", o["local_tol"], 0.0, np.inf)
    if o["seed"] is not None:
        check_count("seed", o["seed"], low=0)
    for name in ("eps_schedule", "v_max_schedule", "monitor", "availability"):
        check_callable(name, o[name])
    if o["server_host"] is not None and not isinstance(o["server_host"], str):
        raise FedModelError(f"server_host must be a client name or None, got {o['server_host']!r}")
    if o["order"] not in (None, "colour") and (isinstance(o["order"], str) or
                                               not all(isinstance(n, str) for n in o["order"])):
        raise FedModelError(f"order must be a sequence of node names, 'colour' or None, "
                            f"got {o['order']!r}")
    if o["x0"] is not None:
        try:
            x0 = np.asarray(o["x0"], dtype=float)
        except (TypeError, ValueError):
            x0 = np.array(np.nan)
        if not np.all(np.isfinite(x0)):
            raise FedModelError(f"x0 must be finite numbers (a scalar or the shared variables, "
                                f"flattened), got {o['x0']!r}")


class ClientModels(dict):
    """{client: x_i} (rows of one (n, d) array, which `array` holds in client order) — what a
    DALD `monitor` receives. Read-only: the rows may be the nodes' own state (batched executor)."""

    def __init__(self, names, array):
        array = array.view()
        array.flags.writeable = False
        super().__init__(zip(names, array))
        self.array = array
