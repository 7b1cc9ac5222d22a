"""FedADMM's client round (`client._round`: the local update (2.9) to the inexactness criterion
(3.7) or for E fixed steps, the multiplier step (2.8b), InSa's β_i (3.14)–(3.15)) for a whole
group of same-structure clients: the vectorized forms the batched and JAX executors serve
`fedadmm_round` with — per-node payloads (partial participation) and the group request of a
round with every client (`map_stacked`, common z). Every local step is one batched ∇P_i
evaluation for the group (`Group.grad`: numpy's batched plans, or one vmap on
`executor="jax"`); clients that meet their criterion early stop stepping (masks), each keeps its
own β_i, η_i, σ_i, and a step the safeguard rejects halves that client's η_i, exactly as the
per-client loop does.

Between rounds the group keeps what the rounds change as stacks (`_Clients`: β_i, η_i, L̂_i,
the last round's diagnostics; u_i and λ_i as row views published with `Group.publish`) and
writes them into the clients' `program.state["fedadmm"]` when the executor syncs them (before a
node is served on its own, a hand-over, `close`): a round touches no per-client dict.

Covered: smooth clients (no prox terms or sets), local_solver "gd", options equal across the
group (β_i, η_i, α_i may differ). Anything else returns None: served client by client.

The set-up `fedadmm_init` is one group request too (`_init_stacked`, any client and options):
each client's start state as `client._init` writes it, the automatic steps' L̂_i by one group
gradient per power-iteration step (`common.group_curvature`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmodel.runtime.batched_group import Group, in_group_order, private_stack
from fedmodel.runtime.batched_procedures import common_value
from fedmodel.runtime.ledger import with_forms
from . import client
from ..common import group_curvature
from .client import _gd_step, automatic_step, halved_step, round_end, start_state
from .insa import sigma_bound

# the options a group's clients must share (every client's state, as `client._init` set it)
_SAME = ("inexact", "reference", "safe", "solver", "start", "local_steps", "adaptive", "sigma",
         "sigma_factor", "c", "mu", "tau", "penalty_rule", "beta_min", "beta_max", "auto_lr")
_LAST = ("steps", "bound", "residual", "beta", "primal", "dual")


@dataclass
class _Clients:
    """A group's FedADMM clients between rounds: their state dicts, the options they share
    (`opts`: the first dict) and, one entry per client, what the rounds change. `last`: the
    diagnostics of each client's last finite round (`client.finish_round`'s `state["last"]`),
    `ran`: which clients have one from the batched rounds, `dirty`: whose dicts are behind."""
    states: list[dict]
    opts: dict
    alpha: np.ndarray
    beta: np.ndarray
    lr: np.ndarray
    curvature: np.ndarray | None
    last: dict[str, np.ndarray]
    ran: np.ndarray
    dirty: np.ndarray

    def write_back(self) -> None:
        """The scalars into the dicts of the clients that ran since the last write-back
        (`Group.on_sync`: when the executor syncs)."""
        inexact = self.opts["inexact"]
        for i in np.flatnonzero(self.dirty):
            s = self.states[i]
            s["beta"], s["lr"] = float(self.beta[i]), float(self.lr[i])
            if self.curvature is not None:
                s["curvature"] = float(self.curvature[i])
            if self.ran[i]:
                last = {k: float(self.last[k][i]) for k in _LAST}
                last["steps"] = int(last["steps"])
                if not inexact:
                    last["bound"] = last["residual"] = None
                s["last"] = last
        self.dirty[:] = False


def _clients(group: Group) -> _Clients | None:
    """The group's `_Clients` (None when a state is missing or the round is not covered),
    built once until a client is next served node by node (`Group.checked`)."""
    def validate():
        states = [p.state.get("fedadmm") for p in group.programs]
        if group.prox or any(s is None for s in states):
            return None
        first = states[0]
        same = tuple(first[k] for k in _SAME)
        if first["solver"] != "gd" or any(tuple(s[k] for k in _SAME) != same for s in states):
            return None
        column = lambda key: np.array([float(s[key]) for s in states])     # noqa: E731
        return _Clients(states, first, column("alpha"), column("beta"), column("lr"),
                        column("curvature") if first["auto_lr"] else None,
                        {k: np.zeros(group.n) for k in _LAST}, np.zeros(group.n, dtype=bool),
                        np.zeros(group.n, dtype=bool))
    return group.checked("fedadmm", validate)


def _round_batched(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """`fedadmm_round` for the members of a group (per-node payloads, one z), or None."""
    z = common_value(payloads, members, "z")
    out = None if z is None else _round_rows(group, np.array([group.index[m] for m in members]), z)
    if out is None:
        return None
    return {m: {"w": out["w"][i], "beta": float(out["beta"][i]), "steps": int(out["steps"][i]),
                "drift": float(out["drift"][i])} for i, m in enumerate(members)}


def _round_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`fedadmm_round` as a group request (one z for all), or None."""
    if blocks or "z" not in common:
        return None
    return _round_rows(group, rows, np.asarray(common["z"], float))


def _round_rows(group: Group, rows: np.ndarray, z: np.ndarray) -> dict | None:
    clients = _clients(group)
    if clients is None:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return _update(group, clients, rows, z)


def _update(group: Group, C: _Clients, rows: np.ndarray, z: np.ndarray) -> dict:
    """One round of the clients `rows`; their new state into `C` and the group's stacks.
    Replies stacked (one row per entry of `rows`)."""
    n, k, s0 = group.n_x, len(rows), C.opts
    everyone = in_group_order(rows, group.n)
    U_all = group.gather("u", C.states, n, slot="fedadmm_u")
    LAM_all = group.gather("lam", C.states, n, slot="fedadmm_lam")
    U, lam = (U_all, LAM_all) if everyone else (U_all[rows], LAM_all[rows])
    beta, alpha, lr = C.beta[rows], C.alpha[rows], C.lr[rows]
    private = private_stack(group)
    Y = private if everyone else private[rows]
    if not everyone:            # non-members stay at one valid point for the whole round
        full, full_y = np.broadcast_to(z, (group.n, n)).copy(), private

    def residual(X: np.ndarray) -> np.ndarray:
        """e_i (3.6) of every client of `rows` at X = (u, y): ∇f̃_i − λ_i + β_i(u − z)."""
        if everyone:
            G = group.grad(X[:, :n], X[:, n:])
        else:
            full[rows], full_y[rows] = X[:, :n], X[:, n:]
            G = group.grad(full, full_y)
        G = (G if everyone else G[rows]) / alpha[:, None]
        G[:, :n] += -lam + beta[:, None] * (X[:, :n] - z)
        return G

    X = np.concatenate([np.broadcast_to(z, (k, n)) if s0["start"] == "z" else U, Y], axis=1)
    E = residual(X)
    steps = np.zeros(k, dtype=int)
    cap, bound = int(s0["local_steps"]), None
    norm_e = np.linalg.norm(E, axis=1)
    if s0["inexact"]:
        sigma = s0["sigma"] if s0["sigma"] is not None else s0["sigma_factor"] * sigma_bound(beta, s0["c"])
        ref = norm_e if s0["reference"] == "z" else \
            np.linalg.norm(residual(np.concatenate([U, Y], axis=1)), axis=1)
        bound = sigma * ref
    for _ in range(cap):
        active = steps < cap if bound is None else (norm_e > bound) & (steps < cap)
        if not active.any():
            break
        if 4 * active.sum() <= k:    # few clients still stepping: each on its own (a group
            for i in np.flatnonzero(active):   # step would compute every client's gradient)
                _finish(group.programs[rows[i]], C, rows[i], i, X, E, norm_e, steps, lr,
                        None if bound is None else bound[i], cap, z, lam[i])
            break
        X_new = X - lr[:, None] * E
        E_new = residual(X_new)
        norm_new = np.linalg.norm(E_new, axis=1)
        accept = active.copy()
        if s0["safe"]:      # `client._gd_step`'s safeguard, client by client
            bad = active & ~(norm_new <= norm_e * (1 + 1e-9) + 1e-300)
            if bad.any():
                _halve(C, rows[bad], lr, bad, beta)
            accept &= ~bad
        X[accept], E[accept], norm_e[accept] = X_new[accept], E_new[accept], norm_new[accept]
        steps += active
    return _close(group, C, rows, everyone, z, X, U, lam, beta, lr, steps, bound, norm_e)


def _halve(C: _Clients, where: np.ndarray, lr: np.ndarray, bad: np.ndarray, beta: np.ndarray) -> None:
    """`client.halved_step` (a rejected step) for the clients `where` (rows of `lr` / `beta`:
    `bad`)."""
    lr[bad], curvature = halved_step(lr[bad], None if C.curvature is None else C.curvature[where], beta[bad])
    if curvature is not None:
        C.curvature[where] = curvature


def _close(group: Group, C: _Clients, rows: np.ndarray, everyone: bool, z: np.ndarray, X: np.ndarray,
           U: np.ndarray, lam: np.ndarray, beta: np.ndarray, lr: np.ndarray, steps: np.ndarray,
           bound: np.ndarray | None, norm_e: np.ndarray) -> dict:
    """`client.finish_round` for the clients `rows` at their local solutions X: `round_end`'s
    state into `C` and the group's stacks (a client whose X is not finite keeps its state and
    replies NaN), the reply stacked."""
    n = group.n_x
    finite = np.all(np.isfinite(X), axis=1)
    U_new = np.ascontiguousarray(X[:, :n])
    end = round_end(C.opts, U_new, U, lam, beta, z, lr, None if C.curvature is None else C.curvature[rows])
    new_beta, new_lr, lam_new, w, drift = end.beta, end.lr, end.lam, end.w, end.drift
    if not finite.all():
        keep = ~finite
        U_new[keep], lam_new[keep], w[keep], drift[keep] = U[keep], lam[keep], np.nan, np.inf
        new_beta, new_lr = np.where(finite, new_beta, beta), np.where(finite, new_lr, lr)
    if not everyone:
        U_new, lam_new = _scatter(group, "fedadmm_u", rows, U_new), _scatter(group, "fedadmm_lam", rows, lam_new)
    group.publish("u", U_new, C.states, slot="fedadmm_u")
    group.publish("lam", lam_new, C.states, slot="fedadmm_lam")
    C.beta[rows], C.lr[rows] = new_beta, new_lr
    done = rows[finite]
    for key, value in zip(_LAST, (steps, bound, norm_e, beta, end.primal, end.dual)):
        if value is not None:
            C.last[key][done] = value[finite]
    C.ran[done] = True
    C.dirty[rows] = True
    if group.n_y:
        for i in np.flatnonzero(finite):
            group.programs[rows[i]].y = X[i, n:].copy()
    group.on_sync("fedadmm", C.write_back)
    return {"w": w, "beta": beta, "steps": steps.astype(float), "drift": drift}


def _scatter(group: Group, slot: str, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The stack under `slot` with `values` in its `rows` (a new array: the old one's rows are
    the clients' published state)."""
    out = group.stack(slot).copy()
    out[rows] = values
    return out


def _finish(program, C: _Clients, row: int, i: int, X: np.ndarray, E: np.ndarray, norm_e: np.ndarray,
            steps: np.ndarray, lr: np.ndarray, bound: float | None, cap: int, z: np.ndarray,
            lam: np.ndarray) -> None:
    """Client i's (group row `row`) remaining local steps on its own program (`client._gd_step`,
    the per-client loop's step and safeguard, on a state dict with its current values),
    written into row i of the round's arrays and its η_i, L̂_i into `C`."""
    s = {**C.opts, "alpha": C.alpha[row], "beta": C.beta[row], "lam": lam, "lr": lr[i],
         "curvature": None if C.curvature is None else C.curvature[row]}
    x, e, norm = X[i].copy(), E[i].copy(), norm_e[i]
    while (bound is None or norm > bound) and steps[i] < cap:
        x, e = _gd_step(program, s, x, e, z)
        norm = float(np.linalg.norm(e))
        steps[i] += 1
    X[i], E[i], norm_e[i], lr[i] = x, e, norm, s["lr"]
    if C.curvature is not None:
        C.curvature[row] = s["curvature"]


def _init_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`fedadmm_init` as a group request (common z and options, α_i as a block or common), or
    None: each client's start state (`client.start_state`) and, for the automatic step, the
    group's L̂_i at once (`common.group_curvature`: one group gradient per power-iteration step
    instead of 9 per client)."""
    if set(blocks) - {"alpha"} or "z" not in common:
        return None
    z = np.asarray(common["z"], float)
    alpha = blocks["alpha"] if "alpha" in blocks else np.full(len(rows), common["alpha"])
    config = {k: v for k, v in common.items() if k not in ("z", "beta", "alpha", "lam_start")}
    group.sync()                # β = None keeps each client's β_i: read from its state
    states = [start_state(group.programs[r], z, common.get("beta"), a, common.get("lam_start", "zero"), config)
              for r, a in zip(rows, alpha)]
    if states[0]["auto_lr"]:
        for s, curvature in zip(states, group_curvature(group, rows, z, alpha)):
            automatic_step(s, curvature)
    for r, s in zip(rows, states):
        group.programs[r].state["fedadmm"] = s
    group.forget()              # new state dicts: the rounds' check of them (`_clients`) is void
    beta = np.array([s["beta"] for s in states])
    return {"w": beta[:, None] * z - np.array([s["lam"] for s in states]).reshape(len(rows), -1),
            "beta": beta}


# FedADMM's client steps with these forms (`FedADMM.procedures`)
PROCEDURES = (with_forms(client._round, batched=_round_batched, stacked=_round_stacked),
              with_forms(client._init, stacked=_init_stacked))
