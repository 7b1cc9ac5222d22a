"""ProxAL's client side (Algorithm 2 of He, Peng, Sun, "Federated learning with convex global and
local constraints"; equation numbers: that paper): the node procedures that run on each client
with its program's API only, keeping their state (u_i, λ_i, ρ_i, Anderson history) in
`program.state["admm"]`, and the client's sample count m_i for ρ_i = a·m_i (Remark 4.2)."""
from __future__ import annotations

import numpy as np

from fedmodel.expression import Data
from fedmodel.runtime.ledger import procedure
from fedmodel.runtime.program import NodeProgram
from .anderson import MAX_MEMORY, ClientHistory


@procedure("proxal_samples", {}, {"samples": "1"}, local=True, read_only=True)
def _sample_count(program: NodeProgram) -> dict:
    """m_i of Remark 4.2: the most rows of any data the node's terms and constraints read (1
    when it reads no array). Node-local bookkeeping for the server's ρ_i = a·m_i."""
    exprs = [program.merit_ir.objective] + [c.expr for c in program.all_constraints]
    rows = [leaf.shape[0] for e in exprs for leaf in e.leaves() if isinstance(leaf, Data) and leaf.ndim >= 1]
    return {"samples": float(max(rows or [1]))}


@procedure("proxal_admm_init", {"w": "x", "rho": "1", "anderson": "1"}, {"u_tilde": "x"})
def _admm_init(program: NodeProgram, w, rho, anderson=0.0):
    """Step 1 of Algorithm 2: u⁰ = w̃⁰, λ⁰ = −∇P_i(w̃⁰), ũ⁰ = w̃⁰ − ∇P_i(w̃⁰)/ρ_i."""
    grad = program.merit(w)["grad"]
    program.state["admm"] = {"u": w.copy(), "lam": -grad, "rho": float(rho), "w": w.copy(),
                             "history": ClientHistory(int(anderson)) if anderson else None}
    return {"u_tilde": w - grad / rho}


@procedure("proxal_admm_step", {"w": "x", "eps": "1", "adaptive": "1", "solver": "str",
                                "mix": f"<={MAX_MEMORY}", "restart": "1"},
           {"u_tilde": "x", "eps_tilde": "1", "rho": "1", "steps": "1", "products": f"<={MAX_MEMORY + 1}"})
def _admm_step(program: NodeProgram, w, eps, adaptive=0.0, solver="auto", mix=None, restart=0.0):
    """One client step of Algorithm 2 at the server's w^{t+1}: certificate (22), local solve
    (19), multiplier step (20), ũ_i (21); with Anderson, first the mix the server sent."""
    s = program.state["admm"]
    u, lam, rho, history = s["u"], s["lam"], s["rho"], s["history"]
    if history is not None:            # Anderson acceleration (backends/anderson.py)
        if restart:
            history.clear()
        if mix is not None and len(mix):   # the state x_i = (u_i, λ_i/ρ_i) the server mixed ũ_i of
            x = history.mix(np.asarray(mix, float))
            u, lam = x[:u.size], rho * x[u.size:]
    # (19): u ≈ argmin P_i(u) + <λ, u − w> + (ρ/2)‖u − w‖², to ‖∇φ_i‖∞ ≤ ε_{t+1}
    out = program.solve_local(linear=lam, weight=rho, anchor=w, x0=u, tol=eps, method=solver)
    u_new = out["x"]
    # (22) with the OLD λ_i^t, u_i^t and the ρ_i^t the server used in (18), and the private
    # values y_i this step leaves (those the run reports): ∇_w ℓ_k(w, y) = ∇P_0(w) +
    # Σ_i ∇_w P_i(w, y_i) for any y_i, and (18) gives ∇P_0(w) ≈ −Σ_i (λ_i − ρ_i (w − u_i))
    # whatever they are. Read before the solve (at y_i^t), it bounded ∇_w ℓ_k at a point the
    # run does not return (equilibrated private slack: true 6.2e-4 against 2.9e-4).
    eps_tilde = float(np.max(np.abs(program.prox_remainder(   # a client's λ‖w‖₁: its ∂ counts
        w, program.gradient(w) + lam - rho * (w - u))), initial=0.0))
    lam_new = lam + rho * (u_new - w)                                  # (20)
    reply = {"eps_tilde": eps_tilde, "steps": out["steps"]}
    if history is not None:            # the iterate in the ρ it was computed with
        reply["products"] = history.push(np.concatenate([u_new, lam_new / rho]),
                                         np.concatenate([u, lam / rho]))
    if adaptive:
        rho = _balance(rho, primal=np.max(np.abs(u_new - w)), dual=rho * np.max(np.abs(w - s["w"])))
    program.state["admm"] = {"u": u_new, "lam": lam_new, "rho": rho, "w": w.copy(), "history": history}
    reply.update(u_tilde=u_new + lam_new / rho, rho=rho)                  # (21), with the new ρ
    return reply


def _balance(rho: float, primal: float, dual: float, ratio: float = 10.0, factor: float = 2.0) -> float:
    """Residual balancing (Boyd et al. §3.4.1): keep primal and dual residuals within `ratio`."""
    if primal > ratio * dual:
        return rho * factor
    if dual > ratio * primal:
        return rho / factor
    return rho
