"""Fed-DALD-CC client steps for a whole group on the batched executor: the vectorized forms
of `cc_nodes`'s `dald_cc_solve` (13) (solver layers "gd" and "prox-grad"), `dald_cc_dual` (15)
and `dald_state`, for per-node payloads (`map`) and group requests (`map_stacked`); FedProx and
FedAvg run through them too. The clients' x_i, μ_i, ρ_i∘ρ_i stay in their
`program.state["dald"]` as row views of the group's stacks (`Group.gather` / `Group.publish`).
"""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.batched_group import Group, in_group_order, private_stack, read_only
from fedmodel.runtime.batched_procedures import local_steps, request_rows, same_options
from . import kernels

_SOLVE_OPTS = ("tol", "solver", "step", "local_steps", "warm")


def _cc_states(group: Group) -> list[dict] | None:
    """The clients' Fed-DALD-CC states (None unless every client ran `dald_cc_init`), checked
    once until a client is next served node by node (or handed to another executor)."""
    def validate():
        states = [p.state.get("dald") for p in group.programs]
        return None if any(s is None or s.get("rho2") is None for s in states) else states
    return group.checked("cc", validate)


def _star_states(group: Group) -> list[dict] | None:
    """`_cc_states` when no client holds DC edge multipliers (μ_i is then one row per client),
    else None; checked once until a client is next served node by node (not per report)."""
    def validate():
        states = _cc_states(group)
        return None if states is None or any(s.get("edges") for s in states) else states
    return group.checked("cc_star", validate)


def _cc_stacks(group: Group):
    """(states, x_i, μ_i, ρ_i∘ρ_i stacks) of the group's DALD-CC clients, or None (not covered)."""
    states = _cc_states(group)
    if states is None:
        return None
    # ρ_i∘ρ_i changes only node by node (`dald_cc_rescale`, which voids the group's checks):
    # its stack is kept with the checks instead of re-verifying n row objects per request
    rho2 = group.checked("cc_rho2", lambda: group.gather("rho2", states, group.n_x))
    return states, group.gather("x", states, group.n_x), group.gather("mu", states, group.n_x), rho2


def _cc_solve_block(group: Group, rows: np.ndarray, xhat: np.ndarray, opts: dict) -> np.ndarray | None:
    """`cc_nodes._cc_solve` (13) with the "gd" / "prox-grad" solver layers for the group's clients
    `rows` (indices); `xhat` is one model for all or an (n_group, d) stack. Returns the new
    (n_group, d) stack of x_i (clients outside `rows` keep theirs), published as their state."""
    if opts["solver"] not in ("gd", "prox-grad"):
        return None
    stacks = _cc_stacks(group)
    if stacks is None:
        return None
    states, X, MU, RHO2 = stacks
    n_x = group.n_x
    XHAT = np.broadcast_to(np.asarray(xhat, float), X.shape) if np.ndim(xhat) == 1 else xhat
    x0 = X if opts.get("warm", 1.0) else XHAT
    if group.n_y:              # re-center the private variables' proximal term (local_argmin)
        for i in rows:
            p = group.programs[i]
            p.configure(float(p.merit_ir.beta.value), 0.0, x0[i])
    Z = np.concatenate([x0, private_stack(group)], axis=1) if group.n_y else x0
    prox = opts["solver"] == "prox-grad" or bool(group.prox)
    Z = local_steps(group, Z, MU, group.twice("rho2", RHO2), XHAT, float(opts["step"]),
                     int(opts["local_steps"]), prox, subtract_linear=True)
    if len(rows) == group.n:
        new_x = np.ascontiguousarray(Z[:, :n_x])
    else:                       # clients that did not take part keep their x_i
        new_x = X.copy()
        new_x[rows] = Z[rows, :n_x]
    group.publish("x", new_x, states)
    if group.n_y:
        for i in rows:
            group.programs[i].y = Z[i, n_x:].copy()
    return new_x


def solve_batched(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """`dald_cc_solve` (13) for the members of a group (per-node payloads), or None."""
    opts = same_options(payloads, members, _SOLVE_OPTS)
    states = _cc_states(group)
    if opts is None or states is None:
        return None
    rows = np.array([group.index[m] for m in members], dtype=np.intp)
    X = group.gather("x", states, group.n_x)
    new_x = _cc_solve_block(group, rows, request_rows(group, members, payloads, "xhat", X), opts)
    if new_x is None:
        return None
    steps = int(opts["local_steps"])
    return {m: {"x": new_x[group.index[m]], "steps": steps} for m in members}


def solve_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`dald_cc_solve` (13) as a group request (one x̂ for all, or a block of them), or None."""
    if not all(k in common for k in ("xhat", "solver", "step", "local_steps")) or \
            set(blocks) - {"xhat"} or ("xhat" in blocks) == ("xhat" in common):
        return None
    xhat = common.get("xhat")
    if "xhat" in blocks:
        states = _cc_states(group)
        if states is None:
            return None
        xhat = group.gather("x", states, group.n_x).copy()
        xhat[rows] = blocks["xhat"]
    new_x = _cc_solve_block(group, rows, xhat, common)
    if new_x is None:
        return None
    return {"x": read_only(new_x) if in_group_order(rows, group.n) else new_x[rows],
            "steps": np.full(len(rows), float(int(common["local_steps"])))}


def _cc_dual_block(group: Group, rows: np.ndarray, xhat, consensus: float) -> np.ndarray | None:
    """`cc_nodes._cc_dual` (15): μ_i += 2ρ_i∘ρ_i∘(x̂ − x_i) for the group's clients `rows`; a
    node's own constraint multipliers (Step 2) are updated client by client. Returns dmu per row."""
    stacks = _cc_stacks(group)
    if stacks is None:
        return None
    states, X, MU, RHO2 = stacks
    if consensus:
        step = kernels.consensus_dual(MU, X, xhat, group.twice("rho2", RHO2))   # one pass
        if len(rows) == group.n:
            new = step
        else:
            new = MU.copy()
            new[rows] = step[rows]
        group.publish("mu", new, states)
    dmu = np.zeros(len(rows))
    if group.constrained:
        for k, i in enumerate(rows):
            p = group.programs[i]
            dmu[k] = p.update_multipliers(X[i])["dmu"] if p.constraints else 0.0
    return dmu


def dual_batched(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """`dald_cc_dual` (15) for the members of a group (per-node payloads), or None."""
    opts = same_options(payloads, members, ("consensus",))
    states = _cc_states(group)
    if opts is None or states is None:
        return None
    consensus = opts.get("consensus", 1.0)
    xhat = request_rows(group, members, payloads, "xhat", group.gather("x", states, group.n_x)) if consensus else None
    dmu = _cc_dual_block(group, np.array([group.index[m] for m in members], dtype=np.intp), xhat, consensus)
    return {m: {"dmu": float(v)} for m, v in zip(members, dmu)}


def dual_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`dald_cc_dual` (15) as a group request (one x̂ for all), or None."""
    if blocks or (common.get("consensus", 1.0) and "xhat" not in common):
        return None
    dmu = _cc_dual_block(group, rows, common.get("xhat"), common.get("consensus", 1.0))
    return None if dmu is None else {"dmu": dmu}


def state_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """μ_i of Fed-DALD-CC clients as the group's (n, d) stack (rows of the request)."""
    if blocks or common or _star_states(group) is None:
        return None
    states = _cc_states(group)
    MU = group.gather("mu", states, group.n_x)
    return {"mu": read_only(MU) if in_group_order(rows, group.n) else MU[rows]}


def state_batched(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """`local._state` for Fed-DALD-CC clients (μ_i, the array the client holds), without a
    procedure call per client; DC nodes (edge multipliers) take the serial path."""
    states = [group.programs[group.index[m]].state.get("dald") for m in members]
    if any(s is None or s.get("edges") for s in states):
        return None
    return {m: {"mu": s.get("mu")} for m, s in zip(members, states)}

