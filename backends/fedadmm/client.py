"""FedADMM's client side (Song, Wang, Zuazua, arXiv 2402.13989, Algorithms 1 and 3; equation numbers:
that paper): the client steps after the set-up (`client_setup`), each written once over rows of
clients (`fedmodel.runtime.client_step`: a group of one on the serial, Ray and Flower executors, a
whole group on the batched and JAX ones), state in `program.state["fedadmm"]` — the local update of
u_i (2.9) to the inexactness criterion (3.7) or by the node's solver (2.8a), the multiplier step
(2.8b), the message w_i, InSa's β_i (3.14)–(3.15) — and the model check of what a client may hold
(simple sets, λ‖w‖₁).

What is vectorized, and how (`_Round`): every local step is one ∇P_i evaluation for the rows
still stepping (`Group.grad`: the program's own plan on one node, numpy's batched plans or one
vmap on a group; when at most a quarter of the rows still step, each by its own plan: a group
evaluation computes every client); prox / projection clients take the prox of each row by its
program (`NodeProgram.apply_prox`: the serial numbers); the node's solver (Newton, exact,
L-BFGS, prox) is `Group.solve_local` (one batched Newton solve of a stack that fits, otherwise
each client's own solver). Clients that meet their criterion stop stepping (masks); each keeps
its own α_i, β_i, η_i, σ_i, L̂_i; a step the safeguard rejects halves that client's η_i. Norms
are taken row by row as `np.linalg.norm` takes them (`common._row_norms`), so a group of one
computes the serial numbers bit for bit.

Between rounds a group keeps what the rounds change as stacks (`_Clients`: β_i, η_i, L̂_i, the
last round's diagnostics; u_i and λ_i as row views published with `Group.publish`) and writes
them into the clients' `program.state["fedadmm"]` when the executor syncs them (at once on one
node). A group whose members hold different options (or are sent different z) is served member
by member, by the same step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime.batched_group import Group, in_group_order, private_stack
from fedmodel.runtime.batched_procedures import common_value
from fedmodel.runtime.client_step import client_step
from ..common import _row_norms
from .bookkeeping import _penalty, _refusal, _set_multipliers
from .client_setup import _init
from .insa import round_end, sigma_bound

# the options a group's clients must share to step together (every client's state, as
# `fedadmm_init` set it)
_SAME = ("inexact", "reference", "safe", "solver", "start", "local_steps", "adaptive", "sigma",
         "sigma_factor", "c", "mu", "tau", "penalty_rule", "beta_min", "beta_max", "auto_lr")
_shared_options = itemgetter(*_SAME)
_LAST = ("steps", "bound", "residual", "beta", "primal", "dual")


# ---- the round ----------------------------------------------------------------------------------
@dataclass
class _Clients:
    """A group's FedADMM clients between rounds: their state dicts, the options they share
    (`opts`: the first dict) and, one entry per client, what the rounds change. `last`: the
    diagnostics of each client's last finite round (`state["last"]`; a row per `_LAST` entry),
    `ran`: which clients have one from these rounds, `dirty`: whose dicts are behind."""
    states: list[dict]
    opts: dict
    alpha: np.ndarray
    beta: np.ndarray
    lr: np.ndarray
    curvature: np.ndarray | None
    last: np.ndarray
    ran: np.ndarray
    dirty: np.ndarray

    def write_back(self) -> None:
        """The scalars into the dicts of the clients that ran since the last write-back
        (`Group.on_sync`: when the executor syncs; on one node at once)."""
        inexact = self.opts["inexact"]
        for i in np.flatnonzero(self.dirty):
            s = self.states[i]
            s["beta"], s["lr"] = float(self.beta[i]), float(self.lr[i])
            if self.curvature is not None:
                s["curvature"] = float(self.curvature[i])
            if self.ran[i]:
                last = dict(zip(_LAST, self.last[:, i].tolist()))
                last["steps"] = int(last["steps"])
                if not inexact:
                    last["bound"] = last["residual"] = None
                s["last"] = last
        self.dirty[:] = False


def _clients(group: Group) -> _Clients | None:
    """The group's `_Clients` (None when its clients hold different options: served one by
    one), built once until a client's state changes outside the rounds (`Group.checked`)."""
    def validate():
        states = [p.state.get("fedadmm") for p in group.programs]
        missing = [name for name, s in zip(group.names, states) if s is None]
        if missing:
            raise FedModelError(f"FedADMM: client(s) {missing} have no FedADMM state; a run sends "
                                "'fedadmm_init' before its first 'fedadmm_round'")
        first = states[0]
        if len(states) > 1:
            same = _shared_options(first)
            if any(_shared_options(s) != same for s in states):
                return None
        column = lambda key: np.array([float(s[key]) for s in states])     # noqa: E731
        return _Clients(states, first, column("alpha"), column("beta"), column("lr"),
                        column("curvature") if first["auto_lr"] else None,
                        np.zeros((len(_LAST), group.n)), np.zeros(group.n, dtype=bool),
                        np.zeros(group.n, dtype=bool))
    return group.checked("fedadmm", validate)


def _round_rows(group: Group, rows: np.ndarray, z: np.ndarray) -> dict | None:
    """One round of the clients `rows` at z (`_Round`); replies stacked, or None."""
    clients = _clients(group)
    if clients is None:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return _Round(group, clients, rows, np.asarray(z, float)).run()


def _round_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`fedadmm_round` as a group request (one z for all), or None."""
    if blocks or "z" not in common:
        return None
    return _round_rows(group, rows, common["z"])


@client_step("fedadmm_round", {"z": "x"}, {"w": "x", "beta": "1", "steps": "1", "drift": "1"},
             stacked=_round_stacked)
def _round(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """One client update of Algorithm 1 / 3 at the received z^k for the members; replies w_i
    and β_i^k. A diverging local run (lr too large) replies NaN; the server stops with status
    "diverged". None (served member by member) when the members were sent different z."""
    z = common_value(payloads, members, "z")
    out = None if z is None else _round_rows(group, np.array([group.index[m] for m in members]), z)
    if out is None:
        return None
    return {m: {"w": out["w"][j], "beta": float(out["beta"][j]), "steps": int(out["steps"][j]),
                "drift": float(out["drift"][j])} for j, m in enumerate(members)}


class _Round:
    """One round of the clients `rows` of a group at z: arrays with one row per client (X the
    local points (u, y), E the residuals e_i (3.6), P their proximal points)."""

    def __init__(self, group: Group, clients: _Clients, rows: np.ndarray, z: np.ndarray):
        self.group, self.C, self.rows, self.z = group, clients, rows, z
        n = group.n_x
        self.everyone = len(rows) == group.n and (group.n == 1 or in_group_order(rows, group.n))
        U_all = group.gather("u", clients.states, n, slot="fedadmm_u")
        LAM_all = group.gather("lam", clients.states, n, slot="fedadmm_lam")
        self.U, self.lam = (U_all, LAM_all) if self.everyone else (U_all[rows], LAM_all[rows])
        self.beta, self.alpha = clients.beta[rows], clients.alpha[rows]
        self.lr = clients.lr[rows]                   # (halved in place by the safeguard)
        private = private_stack(group)
        self.Y = private if self.everyone else private[rows]
        self.full: tuple[np.ndarray, np.ndarray] | None = None      # (`gradients`)
        self.prox = bool(group.prox)                 # sets C_i and/or λ‖w‖₁: proximal steps

    # -- e_i (3.6) ------------------------------------------------------------------------------
    def gradients(self, X: np.ndarray, sub: np.ndarray | None) -> np.ndarray:
        """∇P_i at X of the rows `rows[sub]` (sub None: all)."""
        group, n = self.group, self.group.n_x
        rows = self.rows if sub is None else self.rows[sub]
        if 4 * len(rows) <= len(self.rows):      # few clients still stepping: each by its own
            return np.array([group.programs[r].value_grad(x[:n], x[n:])[1]   # plan (a group
                             for r, x in zip(rows, X)]).reshape(len(rows), -1)   # step computes all)
        if self.everyone and sub is None:
            return group.grad(X[:, :n], X[:, n:])
        if self.full is None:       # the group's other rows stay at one valid point for the round
            self.full = np.broadcast_to(self.z, (group.n, n)).copy(), private_stack(group)
        full_x, full_y = self.full
        full_x[rows], full_y[rows] = X[:, :n], X[:, n:]
        return group.grad(full_x, full_y)[rows]

    def residual(self, X: np.ndarray, sub: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """(e_i, its proximal point) at X = (u, y) of the rows `rows[sub]`: e_i = ∇f̃_i(u, y)
        − λ_i^k + β_i^k (u − z^k) (3.6) (zero padding for y). A client with local sets C_i
        (u ∈ C_i, projected) or λ‖w‖₁: the proximal-gradient mapping (x − prox(x − η e))/η
        instead, which is e inside C_i away from its boundary and 0 exactly at the constrained
        minimizer, so the criterion (3.7) and the step keep their meaning; the proximal point
        itself is then the next local step (x − η·e would only round-trip to it, and a second
        prox of it would soft-threshold twice)."""
        n = self.group.n_x
        alpha, lr, lam, beta = (self.alpha, self.lr, self.lam, self.beta) if sub is None else \
            (self.alpha[sub], self.lr[sub], self.lam[sub], self.beta[sub])
        G = self.gradients(X, sub) / alpha[:, None]
        G[:, :n] += -lam + beta[:, None] * (X[:, :n] - self.z)
        if not self.prox:
            return G, None
        P = X - lr[:, None] * G
        rows = self.rows if sub is None else self.rows[sub]
        for j, (r, t) in enumerate(zip(rows, lr / alpha)):      # each row by its program's prox
            P[j] = self.group.programs[r].apply_prox(P[j], t)
        return (X - P) / lr[:, None], P

    # -- the local run --------------------------------------------------------------------------
    def run(self) -> dict:
        s0, n = self.C.opts, self.group.n_x
        k, cap = len(self.rows), int(s0["local_steps"])
        # û := z^k (Algorithms 1, 3) or u_i^k (`local_start="u"`); private variables: their last value
        X = np.concatenate([np.broadcast_to(self.z, (k, n)) if s0["start"] == "z" else self.U, self.Y], axis=1)
        E, P = self.residual(X)
        norm_e = _row_norms(E)
        steps, bound = np.zeros(k, dtype=int), None
        if s0["inexact"]:
            sigma = s0["sigma"] if s0["sigma"] is not None else \
                s0["sigma_factor"] * sigma_bound(self.beta, s0["c"])                  # (3.9)/(3.18)
            ref = norm_e if s0["reference"] == "z" else \
                _row_norms(self.residual(np.concatenate([self.U, self.Y], axis=1))[0])   # (3.7): u_i^k
            bound = sigma * ref                                                       # Remark 3.4: z^k
        solver, solved = s0["solver"], None
        if solver == "gd-auto":
            # E gradient steps multiply the error along L_β's flattest direction (curvature β_i
            # where f̃_i is flat) by (1 − η_iβ_i)^E ≈ exp(−Eη_iβ_i): when that is not even 1/e
            # (Eη_iβ_i < 1, i.e. (L̂_i + β_i)/β_i > E) they leave it nearly where it was and the
            # consensus creeps (MNIST, InSa's β_i → 2e-3: ‖Δz‖ ~ 1/k); those clients take the
            # node's solver this round
            slow = cap * self.lr * self.beta < 1.0
            solver, solved = ("auto", None) if slow.all() else ("gd", np.flatnonzero(slow))
        if solver != "gd" or solved is not None and solved.size:
            # the node's solver: to the criterion, or exact ADMM (2.8a) (‖e‖₂ ≤ √N‖e‖∞)
            tol = bound / math.sqrt(X.shape[1]) if s0["inexact"] else 1e-10
            if solved is None:
                X, steps = self.solve(X, tol, cap, method=solver)
                E, P = self.residual(X)
                norm_e = _row_norms(E)
            else:
                X[solved], steps[solved] = self.solve(X[solved], np.broadcast_to(tol, (k,))[solved], cap,
                                                      "auto", solved)
                E[solved], P_sub = self.residual(X[solved], solved)
                if P_sub is not None:
                    P[solved] = P_sub
                norm_e[solved] = _row_norms(E[solved])
        if s0["inexact"] or solver == "gd":
            # (2.9): test, then step (spec §2.3); the residual is the step; E fixed steps
            # without the criterion (not for the rows just solved exactly)
            X, E, P, norm_e = self.steps(X, E, P, norm_e, steps, bound, cap,
                                         None if s0["inexact"] else solved)
        return self.close(X, steps, bound, norm_e)

    def solve(self, X: np.ndarray, tol, cap: int, method: str,
              sub: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """argmin_u L_{β_i}(u, λ_i, z) by the node's own solver `method` (Newton / exact /
        L-BFGS / "auto"; prox for proximal clients: Newton etc. do not project) to ‖e‖∞ ≤ tol,
        from α_i·L = P_i(u, y) − α_iλ_iᵀu + (α_iβ_i/2)‖u − z‖² (+ const), for the rows
        `rows[sub]` (None: all): (X, steps)."""
        alpha, lam, beta, rows = (self.alpha, self.lam, self.beta, self.rows) if sub is None else \
            (self.alpha[sub], self.lam[sub], self.beta[sub], self.rows[sub])
        Z, steps, _ = self.group.solve_local(X, rows, -alpha[:, None] * lam, alpha * beta, self.z,
                                             alpha * tol, "prox" if self.prox else method, cap)
        return Z, steps

    def steps(self, X, E, P, norm_e, steps: np.ndarray, bound, cap: int, skip: np.ndarray | None = None):
        """Local steps x − η e (2.9) (the proximal point for proximal clients) of every row
        (but the rows `skip`) until its criterion holds (`bound`; None: E = `cap` steps) or
        `cap`. Safeguard
        (`safe`): for a convex L-smooth L_β, gradient descent with η ≤ 2/(L̃+β) never increases
        ‖e‖ (co-coercivity), so a step that does proves η too large: it is rejected and η_i
        halved for this and later rounds (the paper has no such test; a too-large η makes the
        local run, and then the whole run, diverge). `steps` counts in place."""
        safe, k = self.C.opts["safe"], len(X)
        stepping = np.ones(k, dtype=bool)
        if skip is not None:
            stepping[skip] = False
        if bound is not None:
            # e at rounding level (z already at the solution: bound ~ 1e-17) meets the criterion:
            # steps on noise only "increase" it, and the safeguard then halved η for good (the
            # ℓ1 median at data ×10^k: 8× the unit run's local steps; branch geomed)
            n = self.group.n_x
            floor = 8 * np.finfo(float).eps * (_row_norms(X[:, :n]) / self.lr + _row_norms(self.lam)
                                               + self.beta * float(np.linalg.norm(self.z)))
            bound = np.maximum(bound, floor)
        while True:
            active = steps < cap if bound is None else (norm_e > bound) & (steps < cap)
            active &= stepping
            count = int(np.count_nonzero(active))
            if not count:
                return X, E, P, norm_e
            # many rows stepping: every row steps (one group evaluation computes them all; the
            # inactive rows' steps are not taken); few: only those, each by its own plan
            sub = None if 4 * count > k else np.flatnonzero(active)
            pick = (lambda a: a) if sub is None else (lambda a: a[sub])     # noqa: E731
            X_new = pick(P) if self.prox else pick(X) - pick(self.lr)[:, None] * pick(E)
            E_new, P_new = self.residual(X_new, sub)
            norm_new = _row_norms(E_new)
            stepped = active if sub is None else np.ones(count, dtype=bool)
            ok = norm_new <= pick(norm_e) * (1 + 1e-9) + 1e-300 if safe else stepped
            accept = stepped & ok
            if sub is None and accept.all():
                X, E, P, norm_e = X_new, E_new, P_new, norm_new
            else:
                where = accept if sub is None else sub[accept]
                X[where], E[where], norm_e[where] = X_new[accept], E_new[accept], norm_new[accept]
                if self.prox:
                    P[where] = P_new[accept]
                bad = stepped & ~ok
                if bad.any():
                    self.halve(np.flatnonzero(bad) if sub is None else sub[bad], X, E, P, norm_e)
            steps += active

    def halve(self, bad: np.ndarray, X, E, P, norm_e) -> None:
        """A step the safeguard rejects, for the rows `bad`: (η/2, L̂) with L̂ raised so that the
        automatic step keeps η = 1/(L̂ + β); a proximal client's mapping depends on η (a smooth
        client's does not), so its residual at its point is taken again."""
        C, rows = self.C, self.rows[bad]
        self.lr[bad] *= 0.5
        if C.curvature is not None:
            C.curvature[rows] = np.maximum(C.curvature[rows], 1.0 / self.lr[bad] - self.beta[bad])
        if self.prox:
            E[bad], P[bad] = self.residual(X[bad], bad)
            norm_e[bad] = _row_norms(E[bad])

    # -- the end of the round -------------------------------------------------------------------
    def close(self, X: np.ndarray, steps: np.ndarray, bound, norm_e: np.ndarray) -> dict:
        """The end of the round at the local solutions X (`round_end`): the state into `C` and
        the group's stacks (a client whose X is not finite keeps its state and replies NaN),
        the replies stacked."""
        group, C, rows, n = self.group, self.C, self.rows, self.group.n_x
        U, lam, beta, lr = self.U, self.lam, self.beta, self.lr
        finite = np.all(np.isfinite(X), axis=1)
        U_new = np.ascontiguousarray(X[:, :n])
        end = round_end(C.opts, U_new, U, lam, beta, self.z, lr, None if C.curvature is None else C.curvature[rows])
        new_beta, new_lr, lam_new, w, drift = end.beta, end.lr, end.lam, end.w, end.drift
        if not finite.all():
            keep = ~finite
            U_new[keep], lam_new[keep], w[keep], drift[keep] = U[keep], lam[keep], np.nan, np.inf
            new_beta, new_lr = np.where(finite, new_beta, beta), np.where(finite, new_lr, lr)
        if not self.everyone:
            U_new, lam_new = _scatter(group, "fedadmm_u", rows, U_new), _scatter(group, "fedadmm_lam", rows, lam_new)
        group.publish("u", U_new, C.states, slot="fedadmm_u")
        group.publish("lam", lam_new, C.states, slot="fedadmm_lam")
        C.beta[rows], C.lr[rows] = new_beta, new_lr
        done = rows[finite]
        residual = norm_e if C.opts["inexact"] else None
        for j, value in enumerate((steps, bound, residual, beta, end.primal, end.dual)):
            if value is not None:
                C.last[j, done] = value[finite]
        C.ran[done] = True
        C.dirty[rows] = True
        if group.n_y:
            for j in np.flatnonzero(finite):
                group.programs[rows[j]].y = X[j, n:].copy()
        group.on_sync("fedadmm", C.write_back)
        return {"w": w, "beta": beta, "steps": steps.astype(float), "drift": drift}


def _scatter(group: Group, slot: str, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The stack under `slot` with `values` in its `rows` (a new array: the old one's rows are
    the clients' published state)."""
    out = group.stack(slot).copy()
    out[rows] = values
    return out


# FedADMM's client steps (`FedADMM.procedures`)
PROCEDURES = (_init, _round, _penalty, _set_multipliers, _refusal)
