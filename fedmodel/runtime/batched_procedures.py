"""The runtime's generic batched forms and the building blocks of every batched form.

A batched form serves one request kind for a whole `batched_group.Group` (see
`messages.procedure`); the runtime knows no algorithm, so it has only the generic forms of
`report` (objective of unconstrained clients), `solve_local` with method "gd", `merit` and
`update_multipliers` (`GENERIC`, which the batched executor installs). The building blocks (`local_steps`, `request_rows`, `same_options`, `common_value`,
`gradients_at`) serve the backends' own forms, which live
beside their node steps. The elementwise work of a step is done by compiled kernels
(`kernels`), one pass over the stacks each.
"""
from __future__ import annotations

import numpy as np

from . import kernels
from .batched_group import Group, private_stack
from .messages import CORE, with_forms

CORE_BY_NAME = {procedure.name: procedure for procedure in CORE}



def same_options(payloads: dict, members: list[str], keys: tuple[str, ...]) -> dict | None:
    """The members' common options, or None when they differ (then: serial path)."""
    first = payloads[members[0]]
    want = tuple(first.get(k) for k in keys)
    for name in members[1:]:
        p = payloads[name]
        if tuple(p.get(k) for k in keys) != want:
            return None
    return first


def request_rows(group: Group, members: list[str], payloads: dict, key: str, default: np.ndarray) -> np.ndarray:
    """(n, d) stack of a model-sized request field; non-members get their `default` row."""
    return member_rows(group, members, [payloads[m][key] for m in members], default)


def member_rows(group: Group, members: list[str], values: list, default: np.ndarray) -> np.ndarray:
    """(n, d) stack with row `values[k]` (broadcast to d) for `members[k]`; non-members get
    their `default` row. One value object for every client: a broadcast view, not a copy."""
    if len(members) == group.n and all(v is values[0] for v in values):
        return np.broadcast_to(np.asarray(values[0], float), default.shape)
    out = default.copy()
    for m, v in zip(members, values):
        out[group.index[m]] = v
    return out


def _add_shared(G: np.ndarray, n_x: int, extra: np.ndarray) -> np.ndarray:
    """G with `extra` (a fresh array) added to its shared columns, as a new array (G may be a
    cached value)."""
    if G.shape[1] == n_x:
        extra += G
        return extra
    out = G.copy()
    out[:, :n_x] += extra
    return out


def local_steps(group: Group, Z: np.ndarray, linear, weight, anchor, step: float, steps: int,
                prox: bool, subtract_linear: bool = False) -> np.ndarray:
    """W steps z ← z − α(∇P_i(z) + linear + weight∘(x − anchor)) for every client, followed by
    the prox step when `prox` (proximal-gradient steps; solvers.gradient_descent without it).
    `subtract_linear`: `linear` holds −linear (e.g. −μ_i, without a pass to negate it).
    Each step is one compiled pass over the stacks (`kernels.prox_grad_step`), the serial
    operations in the same order; when λ‖w‖₁ is the only prox term it is applied in that pass,
    otherwise every prox term after it (`Group.apply_prox`).
    Z is not written (it may be the clients' published state); the result is a fresh array.
    A group that runs the whole loop itself (`fused_local_steps`: the JAX executor's) does."""
    fused = getattr(group, "fused_local_steps", None)
    if fused is not None:
        out = fused(Z, linear, weight, anchor, step, steps, prox, subtract_linear)
        if out is not None:
            return out
    n_x = group.n_x
    threshold, cols, prox_after = group.kernel_prox(step, prox)
    for _ in range(steps):
        G = group.grad(Z[:, :n_x], Z[:, n_x:])
        Z = kernels.prox_grad_step(Z, G, weight, anchor, linear, -1.0 if subtract_linear else 1.0,
                                   step, n_x, threshold, cols)
        if prox_after:
            Z = group.apply_prox(Z, step)
    return Z


def _report_block(group: Group, X: np.ndarray, common: np.ndarray | None = None) -> np.ndarray | None:
    """`NodeProgram.report` objectives for clients without constraints: f_i(x, y) + prox-able
    terms; `common`: the one model every row of X holds (its λ‖x‖₁ is computed once)."""
    if group.constrained or any(weights is None for _, weights, _ in group.prox):
        return None
    values = group.objective(np.asarray(X), private_stack(group))
    for cols, weights, k in group.prox:
        norm = np.abs(X[:, cols]).sum(axis=1) if common is None else np.abs(common[cols]).sum()
        values = values + weights * norm
    return values


def _report(group: Group, members: list[str], payloads: dict):
    values = _report_block(group, request_rows(group, members, payloads, "x", np.zeros((group.n, group.n_x))))
    if values is None:
        return None
    return {m: {"objective": float(values[group.index[m]]), "violation": 0.0} for m in members}


def _report_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict):
    if "x" in blocks:
        X = np.zeros((group.n, group.n_x))
        X[rows] = blocks["x"]
    elif "x" in common:
        X = np.broadcast_to(np.asarray(common["x"], float), (group.n, group.n_x))
    else:
        return None
    values = _report_block(group, X, None if "x" in blocks else np.asarray(common["x"], float))
    if values is None:
        return None
    return {"objective": values[rows], "violation": np.zeros(len(rows))}


def _solve_local(group: Group, members: list[str], payloads: dict):
    """`NodeProgram.solve_local` with method "gd" (FedAvg-style local work) for a whole group."""
    opts = same_options(payloads, members, ("method", "max_steps", "lr", "tol"))
    if opts is None or opts.get("method") != "gd" or group.prox:
        return None
    n, n_x = group.n, group.n_x
    zeros = np.zeros((n, n_x))

    def optional_rows(key: str) -> np.ndarray:      # an absent (None) linear or anchor is 0
        return member_rows(group, members, [0.0 if payloads[m].get(key) is None else payloads[m][key]
                                            for m in members], zeros)

    linear, anchor = optional_rows("linear"), optional_rows("anchor")
    weight = request_rows(group, members, payloads, "weight", zeros)
    x0 = request_rows(group, members, payloads, "x0", zeros)
    Y = private_stack(group)
    steps = int(opts["max_steps"])
    Z = local_steps(group, np.concatenate([x0, Y], axis=1), linear, weight, anchor,
                     float(opts["lr"]), steps, prox=False)
    G = group.grad(Z[:, :n_x], Z[:, n_x:])   # the serial solver reports ‖∇‖∞ at the end
    G = _add_shared(G, n_x, linear + weight * (Z[:, :n_x] - anchor))
    replies = {}
    for m in members:
        i = group.index[m]
        group.programs[i].y = Z[i, n_x:].copy()
        replies[m] = {"x": Z[i, :n_x].copy(), "steps": steps,
                      "grad_norm": float(np.max(np.abs(G[i]), initial=0.0))}
    return replies


def common_value(payloads: dict, members: list[str], key: str = "w") -> np.ndarray | None:
    """The one value of request field `key` every member was sent, e.g. the server's iterate
    (None when they differ)."""
    first = payloads[members[0]][key]
    w = np.asarray(first, float)
    for m in members[1:]:
        other = payloads[m][key]
        if other is not first and not np.array_equal(np.asarray(other, float), w):
            return None
    return w


def gradients_at(group: Group, rows: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P_i and ∇ₓP_i of the clients `rows` at (w, y_i): one group evaluation."""
    X = np.broadcast_to(w, (group.n, group.n_x))
    values, G = group.value_grad(X, private_stack(group))
    return values[rows], G[rows, :group.n_x]


def _update_multipliers_batched(group: Group, members: list[str], payloads: dict) -> dict[str, dict]:
    """`NodeProgram.update_multipliers` for the members: each program's own
    multiplier step (its multipliers are its Parameters), served inside the group's form so
    that a round keeps the group's stacked state (no hand-over to the per-node path)."""
    return {m: group.programs[group.index[m]].update_multipliers(np.asarray(payloads[m]["x"], float))
            for m in members}


def _merit_batched(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """`NodeProgram.merit` (P_i and ∇ₓP_i at (x, y_i)) of the members by one group
    evaluation when every member was sent the same x."""
    w = common_value(payloads, members, "x")
    if w is None:
        return None
    rows = np.array([group.index[m] for m in members])
    values, G = gradients_at(group, rows, w)
    return {m: {"value": float(values[j]), "grad": G[j].copy()} for j, m in enumerate(members)}


# The generic forms of the runtime's own requests, installed by the batched executor.
GENERIC = tuple(with_forms(core, **forms) for core, forms in (
    (CORE_BY_NAME["report"], {"batched": _report, "stacked": _report_stacked}),
    (CORE_BY_NAME["solve_local"], {"batched": _solve_local}),
    (CORE_BY_NAME["update_multipliers"], {"batched": _update_multipliers_batched}),
    (CORE_BY_NAME["merit"], {"batched": _merit_batched})))
