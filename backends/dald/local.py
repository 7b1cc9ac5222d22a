"""The node side shared by Fed-DALD-CC and Fed-DALD-DC: the solver layer a node runs for its
local problem ((13) / (20)), its state (`program.state["dald"]`), and `dald_state` (what the
coordinator reads back at the end: μ_i, or the edge multipliers μ_e).
"""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.ledger import procedure
from fedmodel.runtime.program import NodeProgram
from .cc_batched import state_batched, state_stacked

# the solver layer's options, in the requests of (13) and (20)
SOLVE_OPTIONS = {"tol": "1", "solver": "str", "step": "1", "local_steps": "1", "warm": "1"}


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


def local_argmin(program: NodeProgram, linear: np.ndarray | float, weight: np.ndarray | float,
                 anchor: np.ndarray, x0: np.ndarray, tol: float | None, solver: str, step: float,
                 local_steps: float) -> tuple[np.ndarray, int]:
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


def init_state(program: NodeProgram, x0: np.ndarray, beta: float, rho2: np.ndarray | None) -> None:
    """A node's DALD state at x⁰: penalty β for its own constraints; ρ_i∘ρ_i (CC) or None (DC)."""
    program.configure(float(beta), 0.0, x0)
    program.state["dald"] = {"x": np.array(x0, float), "rho2": rho2, "edges": {}, "mu": np.zeros_like(x0)}


@procedure("dald_state", {}, {"mu": "opaque"}, local=True, read_only=True, batched=state_batched,
           stacked=state_stacked)
def _state(program):
    """μ_i (CC), or {neighbour: μ_e} (DC)."""
    s = program.state.get("dald", {})
    mu = {k: e["mu"].copy() for k, e in s.get("edges", {}).items()} if s.get("edges") else s.get("mu")
    return {"mu": mu}

