"""The node side of DALD (backends/dald.py): the solver layer and the procedures a node runs
for Fed-DALD-CC (`dald_cc_init`, `dald_cc_solve` (13), `dald_cc_dual` (15)) and Fed-DALD-DC
(`dald_dc_init`, `dald_dc_link`, `dald_dc_receive`, `dald_dc_solve` (20), `dald_dc_dual` (21)).
Equation numbers refer to Guo, Qu, Pan, Huang, "Distributed optimization: designed for federated
learning". Each procedure runs on its node with the node program's API only and keeps its state
in `program.state["dald"]`; fedmodel/runtime/batched.py and batched_dc.py hold their
vectorized forms for groups of same-structure clients.
"""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.ledger import MessageKind, procedure, register
from fedmodel.runtime.program import NodeProgram

_OPTS = {"tol": "1", "solver": "str", "step": "1", "local_steps": "1", "warm": "1"}


# ---- solver layer (runs on the node) ----------------------------------------------------------
def _prox_grad(program, linear, weight, anchor, x0, step, steps):
    """W proximal-gradient steps (63)/(64): z ← prox_{αΠ}(z − α∇Ψ(z)) (Ψ: smooth part + AL)."""
    n_x = program.n_shared
    z = np.concatenate([x0, program.y])
    weight = np.broadcast_to(weight, (n_x,))
    for _ in range(steps):
        _, g = program.value_grad(z[:n_x], z[n_x:])
        g = g.copy()
        g[:n_x] += linear + weight * (z[:n_x] - anchor)
        z = program.apply_prox(z - step * g, step)
    program.y = z[n_x:].copy()
    return z[:n_x], steps


def local_argmin(program: NodeProgram, linear, weight, anchor, x0, tol, solver, step, local_steps):
    """x_i ≈ argmin P_i(x) + linearᵀx + ½Σ weight_j(x_j − anchor_j)² by the chosen solver layer.
    "gd" on a node with a prox-able term (λ‖w‖₁) becomes prox-gradient steps (GD would ignore it);
    "newton" on such a node uses the node's exact prox solver."""
    if tol is None or tol < 0:  # default: 1e-10 for quadratic nodes (one linear solve); 1e-8
        # otherwise — Newton's Armijo test cannot see decreases below rounding (|f|·1e-16)
        tol = 1e-10 if program.quadratic else 1e-8
    if program.n_private:      # re-center the private variables' proximal term (weight 1/β)
        program.configure(float(program.merit_ir.beta.value), 0.0, x0)
    has_prox = bool(program.merit_ir.prox_terms)
    if solver == "prox-grad" or (solver == "gd" and has_prox):
        x, steps = _prox_grad(program, linear, weight, anchor, x0, float(step), int(local_steps))
        return x, steps
    method = {"auto": "auto", "exact": "auto", "newton": "prox" if has_prox else "newton",
              "gd": "gd"}[solver]
    out = program.solve_local(linear=linear, weight=weight, anchor=anchor, x0=x0, tol=float(tol),
                              method=method, max_steps=int(local_steps) if solver == "gd" else 1000,
                              lr=float(step))
    return out["x"], out["steps"]


def _init_state(program, x0, beta, rho2):
    program.configure(float(beta), 0.0, x0)
    program.state["dald"] = {"x": np.array(x0, float), "rho2": rho2, "edges": {}, "mu": np.zeros_like(x0)}


# ---- Fed-DALD-CC client procedures ------------------------------------------------------------
@procedure("dald_cc_init", {"x0": "x", "beta": "1", "rho": "x|1"}, {})
def _cc_init(program, x0, beta, rho):
    _init_state(program, np.asarray(x0, float), beta, np.asarray(rho, float) ** 2)
    return {}


@procedure("dald_cc_solve", {"xhat": "x", **_OPTS}, {"x": "x", "steps": "1"})
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


@procedure("dald_cc_dual", {"xhat": "x", "consensus": "1"}, {"dmu": "1"})
def _cc_dual(program, xhat, consensus=1.0):
    """(15): μ_i += 2ρ_i∘ρ_i∘(x̂ − x_i); the node's own constraint multipliers likewise (Step 2)."""
    s = program.state["dald"]
    if consensus:
        s["mu"] = s["mu"] + 2.0 * s["rho2"] * (xhat - s["x"])
    change = program.update_multipliers(s["x"])["dmu"] if program.constraints else 0.0
    return {"dmu": change}


# ---- Fed-DALD-DC node procedures --------------------------------------------------------------
@procedure("dald_dc_init", {"x0": "x", "beta": "1"}, {})
def _dc_init(program, x0, beta):
    _init_state(program, np.asarray(x0, float), beta, None)
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
    edge = program.state["dald"]["edges"][neighbor]
    edge["x"], edge["fresh"] = np.array(x, float), True
    return {}


@procedure("dald_dc_solve", dict(_OPTS), {"x": "x", "steps": "1"})
def _dc_solve(program, tol, solver, step, local_steps, warm=1.0):
    """(20): argmin f_s + Σ_{j>s}[μ_sjᵀ(x_s − x_j) + ‖ρ_sj∘(x_s − x_j)‖²]
                       + Σ_{e<s}[μ_esᵀ(x_e − x_s) + ‖ρ_es∘(x_e − x_s)‖²], newest neighbour copies."""
    s = program.state["dald"]
    edges = s["edges"].values()
    linear = sum(e["sign"] * e["mu"] for e in edges)
    weight = sum(2.0 * e["rho2"] * np.ones_like(e["x"]) for e in edges)
    anchor = sum(2.0 * e["rho2"] * e["x"] for e in edges) / weight
    x0 = s["x"] if warm else anchor
    x, steps = local_argmin(program, linear, weight, anchor, x0, tol, solver, step, local_steps)
    s["x"], s["solved"] = x, True
    return {"x": x, "steps": steps}


@procedure("dald_dc_dual", {"consensus": "1"}, {"primal": "1", "dmu": "1"})
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


def _state(program):
    s = program.state.get("dald", {})
    mu = {k: e["mu"].copy() for k, e in s.get("edges", {}).items()} if s.get("edges") else s.get("mu")
    return {"mu": mu}


register(MessageKind("dald_state", {}, {"mu": "opaque"}, local=True), _state)
