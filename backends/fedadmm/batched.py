"""FedADMM's client round (`client._round`: the local update (2.9) to the inexactness criterion
(3.7) or for E fixed steps, the multiplier step (2.8b), InSa's β_i (3.14)–(3.15)) for a whole
group of same-structure clients: the vectorized form the batched and JAX executors serve
`fedadmm_round` with. Every local step is one batched ∇P_i evaluation for the group
(`Group.value_grad`: numpy's batched plans, or one vmap on `executor="jax"`); clients that
meet their criterion early stop stepping (masks), each keeps its own β_i, η_i, σ_i, and a step
the safeguard rejects halves that client's η_i, exactly as the per-client loop does.

Covered: smooth clients (no prox terms or sets), local_solver "gd", options equal across the
group (β_i, η_i, α_i may differ). Anything else returns None: served client by client.
"""
from __future__ import annotations


import numpy as np

from fedmodel.runtime.batched_group import Group, private_stack
from fedmodel.runtime.batched_procedures import common_value
from fedmodel.runtime.ledger import MESSAGES, register
from .client import _gd_step, finish_round
from .insa import sigma_bound

_SAME = ("inexact", "reference", "safe", "solver", "start", "local_steps", "adaptive")


def _round_batched(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """`fedadmm_round` for the members of a group, or None (not covered)."""
    states = [group.programs[group.index[m]].state.get("fedadmm") for m in members]
    if group.prox or any(s is None for s in states):
        return None
    first = states[0]
    if first["solver"] != "gd" or any(tuple(s[k] for k in _SAME) != tuple(first[k] for k in _SAME)
                                      for s in states):
        return None
    z = common_value(payloads, members, "z")
    if z is None:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return _update(group, members, states, z)


def _update(group: Group, members: list[str], states: list[dict], z: np.ndarray) -> dict[str, dict]:
    n, k = group.n_x, len(members)
    rows = np.array([group.index[m] for m in members])
    beta = np.array([s["beta"] for s in states])
    alpha = np.array([s["alpha"] for s in states])
    lr = np.array([float(s["lr"]) for s in states])
    lam = np.array([s["lam"] for s in states], dtype=float).reshape(k, n)
    U = np.array([s["u"] for s in states], dtype=float).reshape(k, n)
    Y = private_stack(group)[rows]

    def residual(X: np.ndarray) -> np.ndarray:
        """e_i (3.6) of every member at X = (u, y): ∇f̃_i − λ_i + β_i(u − z)."""
        full = np.broadcast_to(z, (group.n, n)).copy()      # non-members: any valid point
        full[rows] = X[:, :n]
        full_y = private_stack(group)
        full_y[rows] = X[:, n:]
        G = group.grad(full, full_y)[rows] / alpha[:, None]
        G[:, :n] += -lam + beta[:, None] * (X[:, :n] - z)
        return G

    def norms(E: np.ndarray) -> np.ndarray:
        return np.array([float(np.linalg.norm(e)) for e in E])

    start = np.broadcast_to(z, (k, n)) if states[0]["start"] == "z" else U
    X = np.concatenate([start, Y], axis=1)
    E = residual(X)
    steps = np.zeros(k, dtype=int)
    cap, s0 = int(states[0]["local_steps"]), states[0]
    bound = None
    if s0["inexact"]:
        sigma = np.array([s["sigma"] if s["sigma"] is not None else
                          s["sigma_factor"] * sigma_bound(b, s["c"]) for s, b in zip(states, beta)])
        ref = norms(E) if s0["reference"] == "z" else norms(residual(np.concatenate([U, Y], axis=1)))
        bound = sigma * ref
    norm_e = norms(E)
    for _ in range(cap):
        active = steps < cap if bound is None else (norm_e > bound) & (steps < cap)
        if not active.any():
            break
        if 4 * active.sum() <= k:    # few clients still stepping: each on its own (a group
            for i in np.flatnonzero(active):   # step would compute every client's gradient)
                _finish(group.programs[rows[i]], states[i], i, X, E, norm_e, steps, lr,
                        None if bound is None else bound[i], cap, z)
            break
        X_new = X - lr[:, None] * E
        E_new = residual(X_new)
        norm_new = norms(E_new)
        accept = active.copy()
        if s0["safe"]:      # `client._gd_step`'s safeguard, client by client
            bad = active & ~(norm_new <= norm_e * (1 + 1e-9) + 1e-300)
            for i in np.flatnonzero(bad):
                s = states[i]
                lr[i] *= 0.5
                s["lr"] = float(lr[i])
                if s["curvature"] is not None:
                    s["curvature"] = max(s["curvature"], 1.0 / lr[i] - s["beta"])
            accept &= ~bad
        X[accept], E[accept], norm_e[accept] = X_new[accept], E_new[accept], norm_new[accept]
        steps += active
    return {m: finish_round(group.programs[rows[i]], s, X[i], z, int(steps[i]),
                            None if bound is None else float(bound[i]),
                            float(np.linalg.norm(E[i])) if s["inexact"] else None)
            for i, (m, s) in enumerate(zip(members, states))}


def _finish(program, s: dict, i: int, X: np.ndarray, E: np.ndarray, norm_e: np.ndarray,
            steps: np.ndarray, lr: np.ndarray, bound: float | None, cap: int, z: np.ndarray) -> None:
    """Client i's remaining local steps on its own program (`client._gd_step`, the per-client
    loop's step and safeguard), written into row i of the group's arrays."""
    x, e, norm = X[i].copy(), E[i].copy(), norm_e[i]
    while (bound is None or norm > bound) and steps[i] < cap:
        x, e = _gd_step(program, s, x, e, z)
        norm = float(np.linalg.norm(e))
        steps[i] += 1
    X[i], E[i], norm_e[i], lr[i] = x, e, norm, s["lr"]


register(MESSAGES["fedadmm_round"], batched=_round_batched)
