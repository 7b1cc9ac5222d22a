"""Fed-DALD-DC node steps (Algorithm 3): `dald_dc_init`, `dald_dc_link`, `dald_dc_receive`,
`dald_dc_solve` (20) and `dald_dc_dual` (21), and `dald_dc_sweep`, a whole Gauss–Seidel sweep of
(20) with its relays, which only a group can serve (its stacked form, `dc_batched`; elsewhere
`dc.GaussSeidelSweep` sends the sweep's solves and relays node by node). Each step runs on its
node with the node program's API only and keeps its state in `program.state["dald"]`.
"""
from __future__ import annotations

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime.ledger import MessageKind, Procedure, procedure
from . import dc_batched
from .local import SOLVE_OPTIONS, init_state, local_argmin


@procedure("dald_dc_init", {"x0": "x", "beta": "1"}, {})
def _dc_init(program, x0, beta):
    init_state(program, np.asarray(x0, float), beta, None)
    return {}


@procedure("dald_dc_link", {"neighbor": "str", "rho": "x|1", "after": "1", "x": "x"}, {})
def _dc_link(program, neighbor, rho, after, x):
    """Edge to `neighbor`; `after` = 1 when the neighbour comes later in S (C = x_self − x_nbr)."""
    program.state["dald"]["edges"][neighbor] = {
        "rho2": np.asarray(rho, float) ** 2, "sign": 1.0 if after else -1.0,
        "mu": np.zeros_like(x, dtype=float), "x": np.array(x, float)}
    return {}


@procedure("dald_dc_receive", {"neighbor": "str", "x": "x"}, {})
def _dc_receive(program, neighbor, x):
    """The newest model of `neighbor` (relayed after its solve in S)."""
    edge = program.state["dald"]["edges"][neighbor]
    edge["x"], edge["fresh"] = np.array(x, float), True
    return {}


@procedure("dald_dc_solve", dict(SOLVE_OPTIONS), {"x": "x", "steps": "1"})
def _dc_solve(program, tol, solver, step, local_steps, warm=1.0):
    """(20): argmin f_s + Σ_{j>s}[μ_sjᵀ(x_s − x_j) + ‖ρ_sj∘(x_s − x_j)‖²]
                       + Σ_{e<s}[μ_esᵀ(x_e − x_s) + ‖ρ_es∘(x_e − x_s)‖²], newest neighbour copies."""
    s = program.state["dald"]
    edges = s["edges"].values()
    if not edges:           # a one-node graph: no consensus terms, (20) is the node's own problem
        linear, weight, anchor = np.zeros_like(s["x"]), 0.0, s["x"]
    else:
        linear = sum(e["sign"] * e["mu"] for e in edges)
        weight = sum(2.0 * e["rho2"] * np.ones_like(e["x"]) for e in edges)
        anchor = sum(2.0 * e["rho2"] * e["x"] for e in edges) / weight
    x0 = s["x"] if warm else anchor
    x, steps = local_argmin(program, linear, weight, anchor, x0, tol, solver, step, local_steps)
    s["x"], s["solved"] = x, True
    return {"x": x, "steps": steps}


@procedure("dald_dc_dual", {"consensus": "1"}, {"primal": "1", "dmu": "1"}, stacked=dc_batched.dual_stacked)
def _dc_dual(program, consensus=1.0):
    """(21) on every incident edge (the edge multiplier is mirrored at both ends; both ends hold
    the same x_i, x_j after a full sweep, so the copies stay equal)."""
    s = program.state["dald"]
    primal = 0.0
    for e in s["edges"].values():
        c = e["sign"] * (s["x"] - e["x"])                   # C_ij = x_i − x_j, i before j
        primal = max(primal, float(np.max(np.abs(c), initial=0.0)))
        if consensus and s.get("solved") and e.get("fresh"):   # both ends took part (dropout)
            e["mu"] = e["mu"] + 2.0 * e["rho2"] * c
        e["fresh"] = False
    s["solved"] = False
    change = program.update_multipliers(s["x"])["dmu"] if program.constraints else 0.0
    return {"primal": primal, "dmu": change}


# The sweep's traffic is that of the solves and relays it stands for: `dc.GaussSeidelSweep` books
# them, so the kind itself is local (no ledger entry of its own).
def _dc_sweep(program, **payload):
    """Only a group serves a sweep (its stacked form); `GaussSeidelSweep` sends the solves and
    relays node by node wherever none does, never this request to one node."""
    raise FedModelError("dald_dc_sweep is served by a group's stacked form only; send "
                        "dald_dc_solve and dald_dc_receive to a single node")


SWEEP = Procedure(MessageKind("dald_dc_sweep", dict(SOLVE_OPTIONS), {"x": "x", "steps": "1"}, local=True),
                  _dc_sweep, stacked=dc_batched.sweep_stacked)

# Fed-DALD-DC's node steps (`DALD.procedures`)
PROCEDURES = (_dc_init, _dc_link, _dc_receive, _dc_solve, _dc_dual, SWEEP)
