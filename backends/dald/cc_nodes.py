"""Fed-DALD-CC client steps (Algorithm 2): `dald_cc_init`, `dald_cc_solve` (13), `dald_cc_rescale`
(adaptive ρ) and `dald_cc_dual` (15), each registered with its vectorized forms (`cc_batched`).
Each runs on its node with the node program's API only and keeps its state in
`program.state["dald"]`.
"""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.ledger import procedure
from . import cc_batched
from .local import SOLVE_OPTIONS, init_state, local_argmin


@procedure("dald_cc_init", {"x0": "x", "beta": "1", "rho": "x|1"}, {})
def _cc_init(program, x0, beta, rho):
    init_state(program, np.asarray(x0, float), beta, np.asarray(rho, float) ** 2)
    return {}


@procedure("dald_cc_solve", {"xhat": "x", **SOLVE_OPTIONS}, {"x": "x", "steps": "1"},
           batched=cc_batched.solve_batched, stacked=cc_batched.solve_stacked)
def _cc_solve(program, xhat, tol, solver, step, local_steps, warm=1.0):
    """(13): x_i = argmin f_i(x_i) + μ_iᵀ(x̂ − x_i) + ‖ρ_i∘(x̂ − x_i)‖², warm-started at x_i."""
    s = program.state["dald"]
    x0 = s["x"] if warm else xhat
    x, steps = local_argmin(program, -s["mu"], 2.0 * s["rho2"], xhat, x0, tol, solver, step, local_steps)
    s["x"] = x
    return {"x": x, "steps": steps}


@procedure("dald_cc_rescale", {"factor": "1"}, {})
def _cc_rescale(program, factor):
    """Adaptive penalty (DALD(adaptive_rho=True)): ρ_i∘ρ_i ← factor·ρ_i∘ρ_i; μ_i is unscaled, so
    it stays as it is."""
    s = program.state["dald"]
    s["rho2"] = s["rho2"] * float(factor)
    return {}


@procedure("dald_cc_dual", {"xhat": "x", "consensus": "1"}, {"dmu": "1"},
           batched=cc_batched.dual_batched, stacked=cc_batched.dual_stacked)
def _cc_dual(program, xhat, consensus=1.0):
    """(15): μ_i += 2ρ_i∘ρ_i∘(x̂ − x_i); the node's own constraint multipliers likewise (Step 2)."""
    s = program.state["dald"]
    if consensus:
        s["mu"] = s["mu"] + 2.0 * s["rho2"] * (xhat - s["x"])
    change = program.update_multipliers(s["x"])["dmu"] if program.constraints else 0.0
    return {"dmu": change}


# Fed-DALD-CC's client steps (`DALD.procedures`)
PROCEDURES = (_cc_init, _cc_solve, _cc_rescale, _cc_dual)
