"""ProxAL's client steps (backends/proxal_nodes.py) for a whole group of same-structure clients:
the forms the batched and JAX executors serve `proxal_admm_step` (vectorized) and
`proxal_admm_init` (client by client inside the form) with; ProxAL's other per-round requests,
`update_multipliers` and `merit`, have the runtime's generic forms (batched_procedures).

`proxal_admm_step` does, for every member at once: the certificate (22) from one group
∇P_i evaluation, the local solve (19) by `Group.solve_newton` (methods "exact" and "newton":
batched ∇P_i and ∇²P_i — numpy's per-client Hessian plans, or one vmap of jax.hessian on
`executor="jax"` — with `solvers.newton`'s rules taken per client with masks, each client's
chord Hessian kept in its program as the serial solve keeps it and factored once per change:
fedmodel/runtime/batched_newton.py), the multiplier step (20), ũ_i (21) and adaptive ρ_i,
vectorized; Anderson's per-client histories (mix, push) are handled client by client inside
the form.

Not covered (the form returns None: served client by client, same numbers): clients with prox
terms (λ‖w‖₁ on a client: method "prox"), local methods "lbfgs" (scipy's L-BFGS-B cannot be
run for many clients at once and give each client's serial iterates; "auto" picks it above 200
unknowns), "gd" and "prox", groups whose stacked Hessians would exceed
`batched_newton.MAX_HESSIAN_FLOATS` (`stack_fits`; e.g. "exact" least squares with d = 784
beyond 40 clients), and members sent different options or server iterates.
"""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.batched_group import Group, private_stack
from fedmodel.runtime.batched_newton import stack_fits
from fedmodel.runtime.batched_procedures import common_value, same_options
from fedmodel.runtime.ledger import with_forms
from . import proxal_nodes
from .anderson import extrapolate
from .proxal_nodes import _admm_init, _balance

_VECTORIZED = ("exact", "newton")      # `NodeProgram.solve_local` methods solved for a group at once


def _init_batched(group: Group, members: list[str], payloads: dict) -> dict[str, dict]:
    """`proxal_admm_init` (step 1 of Algorithm 2) for the members of a group, each by its own
    node step (`proxal_nodes._admm_init`: the serial numbers; once per ADMM run, not per step):
    the request does not say which local solver follows, and an L-BFGS-B run (served node by
    node) started from a gradient that differs in the last bits can take other steps. Served
    inside the group's form so that the group keeps its stacked state."""
    return {m: _admm_init(group.programs[group.index[m]], np.asarray(payloads[m]["w"], float),
                          payloads[m]["rho"], payloads[m].get("anderson", 0.0)) for m in members}


def _step_batched(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """`proxal_admm_step` ((22), (19)–(21), adaptive ρ_i, Anderson) for the members of a group,
    or None (not covered, see the module docstring)."""
    opts = same_options(payloads, members, ("eps", "adaptive", "solver", "restart"))
    if opts is None or group.prox:
        return None
    method = group.local_method(opts.get("solver", "auto"))
    w = common_value(payloads, members)
    mix = opts.get("mix")
    if method not in _VECTORIZED or w is None or \
            not stack_fits(len(members), group.n_x + group.n_y) or \
            (mix is not None and any(payloads[m] is not opts and
                                     not np.array_equal(payloads[m].get("mix"), mix) for m in members)):
        return None
    rows = np.array([group.index[m] for m in members])
    states = [group.programs[i].state.get("admm") for i in rows]
    if any(s is None for s in states):
        return None
    histories = [s["history"] for s in states]
    anderson = histories[0] is not None
    if any((h is not None) != anderson for h in histories) or \
            (anderson and len({len(h.outputs) for h in histories}) > 1):
        return None
    k, n_x = len(members), group.n_x
    U = np.array([s["u"] for s in states], dtype=float).reshape(k, n_x)
    Lam = np.array([s["lam"] for s in states], dtype=float).reshape(k, n_x)
    rho = np.array([float(s["rho"]) for s in states])
    if anderson:                       # Anderson: the clients' own histories (backends/anderson.py)
        if opts.get("restart", 0.0):
            for h in histories:
                h.clear()
        if mix is not None and len(mix) and len(histories[0].outputs):
            X = _mixed(histories, np.asarray(mix, float))
            U, Lam = X[:, :n_x], rho[:, None] * X[:, n_x:]
    # (19): u ≈ argmin P_i(u) + <λ, u − w> + (ρ/2)‖u − w‖², warm-started at (u_i, y_i)
    private = private_stack(group)
    Y = private[rows]
    Z, steps, _ = group.solve_newton(np.concatenate([U, Y], axis=1), rows, Lam, rho, w,
                                     float(opts["eps"]), method)
    U_new, Y_new = Z[:, :n_x], Z[:, n_x:]
    # (22) with the old λ_i, u_i and the ρ_i the server used in (18), at the private values
    # the step leaves, as the serial step (backends/proxal_nodes.py says why)
    # (the gradient-only plan, as the serial step's `NodeProgram.gradient`)
    private = private.copy()
    private[rows] = Y_new
    G = group.grad(np.broadcast_to(w, (group.n, n_x)), private)[rows, :n_x]
    eps_tilde = np.abs(G + Lam - rho[:, None] * (w - U)).max(axis=1) if n_x else np.zeros(k)
    Lam_new = Lam + rho[:, None] * (U_new - w)                                   # (20)
    products = _pushed(histories, np.concatenate([U_new, Lam_new / rho[:, None]], axis=1),
                       np.concatenate([U, Lam / rho[:, None]], axis=1)) if anderson else None
    new_rho = rho
    if opts.get("adaptive", 0.0):
        primal = np.abs(U_new - w).max(axis=1) if n_x else np.zeros(k)
        previous = np.array([s["w"] for s in states], dtype=float).reshape(k, n_x)
        dual = rho * (np.abs(w - previous).max(axis=1) if n_x else np.zeros(k))
        new_rho = np.array([_balance(r, primal=p, dual=d) for r, p, d in zip(rho.tolist(), primal.tolist(),
                                                                          dual.tolist())])
    U_tilde = U_new + Lam_new / new_rho[:, None]                                 # (21), new ρ
    w_kept, replies = w.copy(), {}
    for j, m in enumerate(members):    # each client's state and reply (row views of fresh stacks)
        program, r = group.programs[rows[j]], float(new_rho[j])
        program.y = Y_new[j]
        program.state["admm"] = {"u": U_new[j], "lam": Lam_new[j], "rho": r, "w": w_kept,
                                 "history": histories[j]}
        reply = {"eps_tilde": float(eps_tilde[j]), "steps": int(steps[j]), "u_tilde": U_tilde[j], "rho": r}
        if anderson:
            reply["products"] = products[j]
        replies[m] = reply
    return replies


def _mixed(histories: list, gamma: np.ndarray) -> np.ndarray:
    """Every client's `ClientHistory.mix(gamma)` (histories of one length) as one stack:
    `anderson.extrapolate` on the stacked outputs, the same operations row by row."""
    return extrapolate(list(np.array([h.outputs for h in histories], dtype=float).swapaxes(0, 1)), gamma)


def _pushed(histories: list, outputs: np.ndarray, states: np.ndarray) -> np.ndarray:
    """`ClientHistory.push(output_i, state_i)` of every client: its products ⟨f_i, f_ij⟩."""
    return np.array([h.push(g, x) for h, g, x in zip(histories, outputs, states)])


# ProxAL's client steps with these forms (`ProxAL.procedures`)
PROCEDURES = (with_forms(proxal_nodes._admm_init, batched=_init_batched),
              with_forms(proxal_nodes._admm_step, batched=_step_batched))
