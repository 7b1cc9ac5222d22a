"""Fed-DALD-CC client steps (Algorithm 2): `dald_cc_init`, `dald_cc_solve` (13), `dald_cc_rescale`
(adaptive ρ) and `dald_cc_dual` (15); FedProx and FedAvg run through them too.

`dald_cc_solve` and `dald_cc_dual` are each written once, over rows of clients
(`fedmodel.runtime.client_step`): on one node (serial, Ray, Flower executors) the same form runs
on a group of one evaluated by the node's own plans and solvers; on the batched and JAX
executors on a whole group, with the clients' x_i, μ_i, ρ_i∘ρ_i kept in their
`program.state["dald"]` as row views of the group's stacks (`Group.gather` / `Group.publish`).
What is vectorized: (13)'s local solve for all rows at once (`local.local_argmin`: W compiled
(proximal-)gradient passes, or one batched Newton solve), (15) as one compiled pass over the
stacks (`kernels.consensus_dual`); a node's own constraint multipliers (Step 2) client by client.
Each form's `stacked=` adapter serves the coordinator's group requests (`Executor.map_stacked`:
one x̂ for all, or a block of them) with the same code. `dald_cc_init` and `dald_cc_rescale`
write one node's state (nothing to vectorize).
"""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.batched_group import Group, in_group_order, read_only
from fedmodel.runtime.batched_procedures import common_value, request_rows, same_options
from fedmodel.runtime.client_step import client_step
from fedmodel.runtime.messages import procedure
from . import kernels
from .local import SOLVE_OPTIONS, cc_states, init_state, local_argmin, own_multipliers

# a solve request may carry the previous outer iteration's Step 2 (`dual`: (15) and the node's own
# constraint multipliers at the x̂ it brings) and the penalty rescale (`factor`) that the server
# decided after it, done before (13): one message where the paper's box has two (DALD(one_message));
# or (`own`, μ ≡ 0: FedAvg, FedProx) Step 2 after (13), the node's own constraint multipliers at
# the request's x̂ (`_own_at_xhat`)
STEP2_OPTIONS = {"dual": "1", "factor": "1", "own": "1", "penalty": "1"}
_SOLVE_OPTS = (*SOLVE_OPTIONS, *STEP2_OPTIONS, "init")
# the first solve request may carry `dald_cc_init` (`init`: β; `rho`: ρ_i, per node), x⁰ its x̂:
# the set-up done first, on the state a request of its own would have left (no round trip of its own)
INIT_FIELDS = {"init": "1", "rho": "x|1"}


@procedure("dald_cc_init", {"x0": "x", "beta": "1", "rho": "x|1"}, {})
def _cc_init(program, x0, beta, rho):
    init_state(program, np.asarray(x0, float), beta, np.asarray(rho, float) ** 2)
    return {}


@procedure("dald_cc_rescale", {"factor": "1"}, {})
def _cc_rescale(program, factor):
    """Adaptive penalty (DALD(adaptive_rho=True)): ρ_i∘ρ_i ← factor·ρ_i∘ρ_i; μ_i is unscaled, so
    it stays as it is."""
    s = program.state["dald"]
    s["rho2"] = s["rho2"] * float(factor)
    return {}


def _init_first(group: Group, rows: np.ndarray, xhat, beta, rho) -> None:
    """`dald_cc_init` for the rows `rows` at x⁰ = `xhat` (one model for all), penalty β =
    `beta`, ρ_i = row i of `rho` (in `rows` order), as `_cc_init` sets each node's state."""
    group.sync()
    for r, rho_i in zip(rows, rho):
        init_state(group.programs[r], np.asarray(xhat, float), beta, np.asarray(rho_i, float) ** 2)
    group.forget()              # new state dicts: the forms' checks of them are void


def _cc_stacks(group: Group):
    """(states, x_i, μ_i, ρ_i∘ρ_i stacks) of the group's DALD-CC clients, or None (not covered)."""
    states = cc_states(group)
    if states is None:
        return None
    # ρ_i∘ρ_i changes only node by node (`dald_cc_rescale`, which voids the group's checks):
    # its stack is kept with the checks instead of re-verifying n row objects per request
    rho2 = group.checked("cc_rho2", lambda: group.gather("rho2", states, group.n_x))
    return states, group.gather("x", states, group.n_x), group.gather("mu", states, group.n_x), rho2


def _solve_block(group: Group, rows: np.ndarray, xhat, opts: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(13): x_i = argmin f_i(x_i) + μ_iᵀ(x̂ − x_i) + ‖ρ_i∘(x̂ − x_i)‖², warm-started at x_i (or
    x̂), for the group's clients `rows` (indices); `xhat` is one model for all or an (n, d)
    stack. Returns (the new (n, d) stack of x_i — the other clients keep theirs —, published
    as their state; steps per row), or None (the clients are not Fed-DALD-CC clients)."""
    stacks = _cc_stacks(group)
    if stacks is None:
        return None
    states, X, MU, RHO2 = stacks
    XHAT = np.broadcast_to(np.asarray(xhat, float), X.shape) if np.ndim(xhat) == 1 else xhat
    x0 = X if opts.get("warm", 1.0) else XHAT
    # linear term −μ_i (passed as μ_i, subtracted: no pass to negate it), weight 2ρ_i∘ρ_i
    new_x, steps = local_argmin(group, rows, x0, MU, group.twice("rho2", RHO2), XHAT, opts.get("tol"),
                                opts["solver"], opts["step"], opts["local_steps"], subtract_linear=True,
                                residual=opts.get("residual"))
    if len(rows) < group.n and x0 is not X:     # clients that did not take part keep their x_i
        kept = np.ones(group.n, dtype=bool)
        kept[rows] = False
        new_x[kept] = X[kept]
    group.publish("x", new_x, states)
    return new_x, steps


def _step2_first(group: Group, rows: np.ndarray, xhat, opts: dict) -> tuple | None:
    """What a solve request carries before its (13), for the rows `rows`: the previous outer
    iteration's Step 2 (`opts["dual"]`: (15) and the node's own constraint multipliers at the
    request's x̂, `_dual_block`), then ρ_i∘ρ_i ← factor·ρ_i∘ρ_i (`opts["factor"]`, as
    `dald_cc_rescale`). Returns (dmu, unwind) per row, or None when it carries no Step 2."""
    dmu = _dual_block(group, rows, xhat, 1.0) if opts.get("dual") else None
    factor = float(opts.get("factor", 1.0))
    if factor != 1.0:
        states = cc_states(group)
        rho2 = group.gather("rho2", states, group.n_x)
        scaled = rho2.copy()
        scaled[rows] = rho2[rows] * factor
        group.publish("rho2", scaled, states)
        group.forget()            # the cached ρ_i∘ρ_i stack (`_cc_stacks`) is void
    penalty = float(opts.get("penalty", 1.0))
    if penalty != 1.0:            # β ← penalty·β for the node's own constraints (`penalty.PENALTY_EVERY`)
        states = cc_states(group)
        for r in rows:
            program = group.programs[r]
            program.configure(program.node_state.beta * penalty, 0.0, states[r]["x"])
        group.forget()
    return dmu


def _step2_after(group: Group, rows: np.ndarray, opts: dict, first: tuple | None, xhat) -> tuple | None:
    """What a solve request carries after its (13) (`opts["own"]`, a run without (15)): the
    node's own constraint multipliers at the request's x̂ (`_own_at_xhat`), as `dald_cc_dual`
    with consensus 0 does; (dmu, unwind) per row, else `first` (what `_step2_first` returned)."""
    return _own_at_xhat(group, rows, xhat) if opts.get("own") else first


def _own_at_xhat(group: Group, rows: np.ndarray, xhat) -> tuple[np.ndarray, np.ndarray]:
    """Step 2 without (15) (μ ≡ 0: FedAvg, FedProx, DGD): the node's own constraint multipliers
    λ_i ← [λ_i + β c_i(x̂)]₊ at the server's model x̂ (one model for all, or an (n, d) stack), not
    at the client's x_i. With one local step x_i = x̂ − α∇P_i(x̂), the fixed point is then
    Σ_i ∇f_i(x̂) + λ_iᵀ∇c_i(x̂) + ∂h(x̂) ∋ 0 with c_i(x̂) ≤ 0: the model's KKT point. Read at
    x_i, each client's constraint held at its own iterate and their average stopped off the
    answer (a client ball, 3 logistic clients: 0.38 away, "converged") or the penalty's
    curvature outgrew the step (‖w‖ = 5e4 against a 0.5 ball: "diverged")."""
    return own_multipliers(group, rows, [xhat if np.ndim(xhat) == 1 else xhat[i] for i in rows])


def _solve_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`dald_cc_solve` as a group request (one x̂ for all, or a block of them), or None."""
    if not all(k in common for k in ("xhat", "solver", "step", "local_steps")) or \
            set(blocks) - {"xhat", "rho"} or ("xhat" in blocks) == ("xhat" in common) or \
            ("init" in common) != ("rho" in blocks) or ("init" in common and "xhat" in blocks):
        return None
    if "init" in common:
        _init_first(group, rows, common["xhat"], common["init"], blocks["rho"])
    xhat = common.get("xhat")
    if "xhat" in blocks:
        states = cc_states(group)
        if states is None:
            return None
        xhat = group.gather("x", states, group.n_x).copy()
        xhat[rows] = blocks["xhat"]
    if (common.get("dual") or common.get("factor", 1.0) != 1.0 or common.get("penalty", 1.0) != 1.0) \
            and cc_states(group) is None:
        return None
    dmu = _step2_first(group, rows, xhat, common)
    out = _solve_block(group, rows, xhat, common)
    if out is None:
        return None
    new_x, steps = out
    dmu = _step2_after(group, rows, common, dmu, xhat)
    reply = {"x": read_only(new_x) if in_group_order(rows, group.n) else new_x[rows],
             "steps": steps.astype(float)}
    if dmu is not None:
        reply["dmu"], reply["unwind"] = dmu
    return reply


@client_step("dald_cc_solve", {"xhat": "x", **SOLVE_OPTIONS, **STEP2_OPTIONS, **INIT_FIELDS},
             {"x": "x", "steps": "1", "dmu": "1", "unwind": "1"}, stacked=_solve_stacked)
def _cc_solve(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """(13) for the rows `members` (per-node payloads), or None (members sent different options)."""
    opts = same_options(payloads, members, _SOLVE_OPTS)
    rows = np.array([group.index[m] for m in members], dtype=np.intp)
    if opts is not None and "init" in opts:
        xhat = common_value(payloads, members, "xhat")
        if xhat is None:
            return None
        _init_first(group, rows, xhat, opts["init"], [payloads[m]["rho"] for m in members])
    states = cc_states(group)
    if opts is None or states is None:
        return None
    X = group.gather("x", states, group.n_x)
    xhat = request_rows(group, members, payloads, "xhat", X)
    dmu = _step2_first(group, rows, xhat, opts)
    out = _solve_block(group, rows, xhat, opts)
    if out is None:
        return None
    new_x, steps = out
    dmu = _step2_after(group, rows, opts, dmu, xhat)
    replies = {m: {"x": new_x[i], "steps": int(k)} for m, i, k in zip(members, rows, steps)}
    for m, change, unwind in zip(members, *(((), ()) if dmu is None else dmu)):
        replies[m]["dmu"], replies[m]["unwind"] = float(change), float(unwind)
    return replies


def _dual_block(group: Group, rows: np.ndarray, xhat, consensus: float) -> tuple | None:
    """(15): μ_i += 2ρ_i∘ρ_i∘(x̂ − x_i) for the group's clients `rows` (one compiled pass); a
    node's own constraint multipliers (Step 2) client by client, at x_i — at x̂ without (15)
    (consensus 0: `_own_at_xhat`). Returns (dmu, unwind) per row (`local.unwinding`)."""
    stacks = _cc_stacks(group)
    if stacks is None:
        return None
    if not consensus and xhat is not None:
        return _own_at_xhat(group, rows, xhat)
    states, X, MU, RHO2 = stacks
    if consensus:
        step = kernels.consensus_dual(MU, X, xhat, group.twice("rho2", RHO2))   # one pass
        if len(rows) == group.n:
            new = step
        else:
            new = MU.copy()
            new[rows] = step[rows]
        group.publish("mu", new, states)
    return own_multipliers(group, rows, [X[i] for i in rows])


def _dual_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`dald_cc_dual` as a group request (one x̂ for all), or None."""
    if blocks or (common.get("consensus", 1.0) and "xhat" not in common):
        return None
    out = _dual_block(group, rows, common.get("xhat"), common.get("consensus", 1.0))
    return None if out is None else {"dmu": out[0], "unwind": out[1]}


@client_step("dald_cc_dual", {"xhat": "x", "consensus": "1"}, {"dmu": "1", "unwind": "1"},
             stacked=_dual_stacked)
def _cc_dual(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """(15) and the node's own constraint multipliers (Step 2) for the rows `members`."""
    opts = same_options(payloads, members, ("consensus",))
    states = cc_states(group)
    if opts is None or states is None:
        return None
    consensus = opts.get("consensus", 1.0)
    xhat = request_rows(group, members, payloads, "xhat", group.gather("x", states, group.n_x)) \
        if consensus or all("xhat" in payloads[m] for m in members) else None
    dmu, unwind = _dual_block(group, np.array([group.index[m] for m in members], dtype=np.intp), xhat,
                              consensus)
    return {m: {"dmu": float(v), "unwind": float(u)} for m, v, u in zip(members, dmu, unwind)}


# Fed-DALD-CC's client steps (`DALD.procedures`)
PROCEDURES = (_cc_init, _cc_solve, _cc_rescale, _cc_dual)
