"""FedADMM's client side (Song, Wang, Zuazua, arXiv 2402.13989, Algorithms 1 and 3; equation
numbers: that paper): the node procedures that run on each client with its program's API only,
state in `program.state["fedadmm"]` — the local update of u_i (2.9) to the inexactness criterion
(3.7) or by the node's solver (2.8a), the multiplier step (2.8b), the message w_i, InSa's β_i
(3.14)–(3.15) — and the model check of what a client may hold (simple sets, λ‖w‖₁)."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from fedmodel.runtime.ledger import procedure
from fedmodel.runtime.program import NodeProgram
from ..common import local_curvature
from ..projecting import has_affine_sets, projected_multipliers
from .insa import adapt, sigma_bound

_CONFIG = {"z": "x", "beta": "1", "alpha": "1", "lam_start": "str", "lr": "1", "local_steps": "1",
           "inexact": "1", "sigma": "1", "sigma_factor": "1", "c": "1", "reference": "str",
           "adaptive": "1", "mu": "1", "tau": "1", "penalty_rule": "str", "beta_min": "1", "beta_max": "1",
           "solver": "str", "start": "str", "safe": "1"}


@procedure("fedadmm_init", _CONFIG, {"w": "x", "beta": "1"})
def _init(program: NodeProgram, z, beta, alpha, lam_start="zero", **config):
    """u_i^0 = z^0, λ_i^0 = 0 (the authors' code) or ∇f̃_i(z^0) ("gradient", used by ProxAL's
    composition: the multiplier's value at a solution, λ_i* = ∇f̃_i(z*)); β_i^0; the automatic
    step from L̂_i (the batched form, `batched._init_stacked`, estimates a group's L̂_i at once)."""
    s = start_state(program, z, beta, alpha, lam_start, config)
    if s["auto_lr"]:
        # L̂_i of f̃_i = f_i/α_i near the start, once per run
        automatic_step(s, local_curvature(program, np.concatenate([s["u"], program.y]), s["alpha"]))
    program.state["fedadmm"] = s
    return {"w": s["beta"] * s["u"] - s["lam"], "beta": s["beta"]}   # the server's first cache entry


def start_state(program: NodeProgram, z, beta, alpha, lam_start: str, config: dict) -> dict:
    """The client's FedADMM state at the start of a run, without its automatic step (L̂_i: the
    caller's `automatic_step`). β = None keeps the β_i of a previous run (composition)."""
    z = np.asarray(z, float)
    old = program.state.get("fedadmm")
    if beta is None:
        beta = old["beta"] if old else 1.0
    lam = np.zeros_like(z)
    if lam_start == "gradient":
        lam = program.value_grad(z, program.y)[1][:program.n_shared] / alpha
    return {"u": z.copy(), "lam": lam, "beta": float(beta), "alpha": float(alpha), **config, "last": {},
            "auto_lr": config.get("lr") is None, "curvature": None}


def automatic_step(s: dict, curvature: float) -> None:
    """η_i = 1/(L̂_i + β_i) from the client's curvature estimate L̂_i."""
    s["curvature"] = float(curvature)
    s["lr"] = 1.0 / (s["curvature"] + s["beta"])


def _residual(program: NodeProgram, s: dict, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """e_i^k at x = (u, y) (3.6): ∇f̃_i(u, y) − λ_i^k + β_i^k (u − z^k) (zero padding for y).
    A client with local sets C_i (u ∈ C_i, projected): the projected-gradient mapping
    (x − Π_C(x − η e))/η instead, which is e inside C_i away from its boundary and 0 exactly at
    the constrained minimizer, so the criterion (3.7) and the step x − η·e keep their meaning."""
    n = program.n_shared
    g = program.value_grad(x[:n], x[n:])[1] / s["alpha"]
    g[:n] += -s["lam"] + s["beta"] * (x[:n] - z)
    if _projects(program):
        # the proximal point itself is the next local step (`_gd_step`): x − η·e would only
        # round-trip to it, and a second prox of it would soft-threshold twice
        s["prox_point"] = program.apply_prox(x - s["lr"] * g, s["lr"] / s["alpha"])
        g = (x - s["prox_point"]) / s["lr"]
    return g


def _projects(program: NodeProgram) -> bool:
    """Whether the client's local solves are proximal: over sets C_i (simple constraints on the
    shared variables compiled as projections: `compile_programs(client_sets=True)`) and/or with
    a λ‖w‖₁ term (its prox, soft-thresholding, in place of the projection)."""
    return bool(program.merit_ir.prox_terms)


@procedure("fedadmm_beta", {}, {"beta": "1", "lr": "1"}, local=True, read_only=True)
def _penalty(program: NodeProgram):
    """The client's current β_i and step η_i (None before its first round): reporting, and
    ProxAL's composition carrying β_i from one subproblem to the next."""
    s = program.state.get("fedadmm", {})
    return {"beta": s.get("beta"), "lr": s.get("lr")}


@procedure("fedadmm_set_multipliers", {}, {"multipliers": "opaque"}, local=True, read_only=True)
def _set_multipliers(program: NodeProgram) -> dict:
    """The multipliers of the client's projected affine constraints at its last local point u_i:
    the local step's optimality 0 ∈ ∇f̃_i(u) − λ_i + N_C(u) (λ_i after (2.8b)) gives the normal
    element α_i λ_i − ∇f_i(u) in the model's units (f_i = α_i f̃_i). Driver bookkeeping (the
    result's multipliers), served locally."""
    s = program.state.get("fedadmm")
    if not s or not has_affine_sets(program):
        return {"multipliers": {}}
    gradient = program.value_grad(s["u"], program.y)[1][:program.n_shared]
    return {"multipliers": projected_multipliers(program, s["u"], s["alpha"] * s["lam"] - gradient)}


@procedure("fedadmm_round", {"z": "x"}, {"w": "x", "beta": "1", "steps": "1", "drift": "1"})
def _round(program: NodeProgram, z):
    """One client update of Algorithm 1 / 3 at the received z^k; replies w_i and β_i^k.
    A diverging local run (lr too large) replies NaN; the server stops with status "diverged"."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _client_update(program, program.state["fedadmm"], np.asarray(z, float))


def _solve(program: NodeProgram, s: dict, x: np.ndarray, z: np.ndarray, tol: float, cap: int):
    """argmin_u L_{β_i}(u, λ_i, z) by the node's own solver (Newton / exact / L-BFGS) to
    ‖e‖∞ ≤ tol, from α_i·L = P_i(u, y) − α_iλ_iᵀu + (α_iβ_i/2)‖u − z‖² (+ const); ‖e‖₂ ≤ √N‖e‖∞."""
    n, alpha = program.n_shared, s["alpha"]
    program.y = x[n:].copy()
    method = "prox" if _projects(program) else s["solver"]     # Newton etc. do not project
    out = program.solve_local(linear=-alpha * s["lam"], weight=alpha * s["beta"], anchor=z, x0=x[:n],
                              tol=alpha * tol, method=method, max_steps=cap)
    x = np.concatenate([out["x"], program.y])
    return x, _residual(program, s, x, z), int(out["steps"])


def halved_step(lr, curvature, beta):
    """The reaction to a step the safeguard rejects (scalars or arrays): (η/2, L̂) with L̂ raised
    so that the automatic step keeps η = 1/(L̂ + β) (None when η is not automatic)."""
    lr = lr * 0.5
    return lr, None if curvature is None else np.maximum(curvature, 1.0 / lr - beta)


def _gd_step(program: NodeProgram, s: dict, x: np.ndarray, e: np.ndarray, z: np.ndarray):
    """One local step x − η e (2.9). Safeguard (`safe`): for a convex L-smooth L_β, gradient
    descent with η ≤ 2/(L̃+β) never increases ‖e‖ (co-coercivity), so a step that does proves η
    too large: it is rejected and η_i halved for this and later rounds (the paper has no such
    test; a too-large η makes the local run, and then the whole run, diverge)."""
    # the proximal point prox(x − η∇) that `_residual` computed with e at this x: feasible to
    # the last bit (a set), exact zeros (λ‖w‖₁)
    x_new = s["prox_point"] if _projects(program) else x - s["lr"] * e
    e_new = _residual(program, s, x_new, z)
    if s["safe"]:
        norm, norm_new = float(np.linalg.norm(e)), float(np.linalg.norm(e_new))
        if not (norm_new <= norm * (1 + 1e-9) + 1e-300):
            s["lr"], curvature = halved_step(s["lr"], s["curvature"], s["beta"])
            if curvature is not None:
                s["curvature"] = float(curvature)
            # the projected mapping depends on η (for a smooth client it does not)
            return x, (_residual(program, s, x, z) if _projects(program) else e)
    return x_new, e_new


def _client_update(program: NodeProgram, s: dict, z: np.ndarray) -> dict:
    z = np.asarray(z, float)
    beta, cap = s["beta"], int(s["local_steps"])
    # û := z^k (Algorithms 1, 3) or u_i^k (`local_start="u"`); private variables: their last value
    x = np.concatenate([z if s["start"] == "z" else s["u"], program.y])
    e = _residual(program, s, x, z)
    steps, bound = 0, None
    if s["inexact"]:
        sigma = s["sigma"] if s["sigma"] is not None else \
            s["sigma_factor"] * sigma_bound(beta, s["c"])                        # (3.9)/(3.18)
        if s["reference"] == "z":                                                # Remark 3.4
            ref = float(np.linalg.norm(e))
        else:                                                                    # (3.7): u_i^k
            ref = float(np.linalg.norm(_residual(program, s, np.concatenate([s["u"], program.y]), z)))
            if _projects(program):       # the next step needs x's proximal point, not u's
                e = _residual(program, s, x, z)
        bound = sigma * ref
        if s["solver"] != "gd":
            x, e, steps = _solve(program, s, x, z, bound / math.sqrt(x.size), cap)
        while float(np.linalg.norm(e)) > bound and steps < cap:   # test, then step (spec §2.3)
            x, e = _gd_step(program, s, x, e, z)                  # (2.9): the residual is the step
            steps += 1
    elif s["solver"] != "gd":                                     # exact ADMM (2.8a)
        x, e, steps = _solve(program, s, x, z, 1e-10, cap)
    else:
        for _ in range(cap):                                      # E steps of (2.9)
            x, e = _gd_step(program, s, x, e, z)
            steps += 1
    return finish_round(program, s, x, z, steps, bound, float(np.linalg.norm(e)) if s["inexact"] else None)


class RoundEnd(NamedTuple):
    """What `round_end` computes, for one client (floats, (n,) arrays) or a group's (stacks)."""
    lam: np.ndarray         # λ_i^{k+1} (2.8b)
    w: np.ndarray           # the message β_i^k u_i^{k+1} − λ_i^{k+1}
    primal: Any             # ‖u_i^{k+1} − u_i^k‖ (3.14a)
    dual: Any               # ‖u_i^{k+1} − z^k‖ (3.14b)
    drift: Any              # ‖u_i^{k+1} − z^k‖∞
    beta: Any               # β_i^{k+1} (3.15; β_i^k without adaptation)
    lr: Any                 # η_i for the next round


def round_end(s: dict, u, u_old, lam, beta, z: np.ndarray, lr, curvature) -> RoundEnd:
    """The end of a round at the local solutions u (one client: u (n,), β a float; a group's
    clients: u (k, n), β (k,)): the multiplier step (2.8b), the message, the residuals (3.14)
    and InSa's β, η (`insa.adapt`) with the options of `s`. The per-client round and the
    batched one (`batched._update`) share it; it writes no state."""
    b = np.asarray(beta, float)[..., None]
    lam = lam - b * (u - z)                                                      # (2.8b)
    primal = np.linalg.norm(u - u_old, axis=-1)                                  # (3.14a)
    dual = np.linalg.norm(u - z, axis=-1)                                        # (3.14b)
    drift = np.max(np.abs(u - z), axis=-1, initial=0.0)
    new_beta, new_lr = adapt(s, beta, primal, dual, float(np.max(np.abs(z), initial=1.0)), lr,
                             curvature) if s["adaptive"] else (beta, lr)
    return RoundEnd(lam, b * u - lam, primal, dual, drift, new_beta, new_lr)


def finish_round(program: NodeProgram, s: dict, x: np.ndarray, z: np.ndarray, steps: int,
                 bound: float | None, residual: float | None) -> dict:
    """The end of a client round at its local solution x = (u, y) (`round_end`): the state and
    the reply (NaN when x is not finite)."""
    n, beta = program.n_shared, s["beta"]
    if not np.all(np.isfinite(x)):
        return {"w": np.full(n, np.nan), "beta": beta, "steps": steps, "drift": math.inf}
    u = x[:n].copy()
    program.y = x[n:].copy()
    end = round_end(s, u, s["u"], s["lam"], beta, z, s["lr"], s["curvature"])
    s["last"] = {"steps": steps, "bound": bound, "residual": residual, "beta": beta,
                 "primal": float(end.primal), "dual": float(end.dual)}
    s["beta"], s["lr"], s["u"], s["lam"] = float(end.beta), float(end.lr), u, end.lam
    return {"w": end.w, "beta": beta, "steps": steps, "drift": float(end.drift)}


@procedure("fedadmm_refusal", {}, {"refusal": "str"}, local=True, read_only=True)
def _refusal(program: NodeProgram) -> dict:
    """Why FedADMM cannot run with this node as it is (None: it can). Its constraints must be
    simple sets on the shared variables — balls, bounds, halfspaces, affine subspaces with
    constant coefficients, and intersections of them (`backends.projecting`) —, projected in
    the clients' local solves and the server's z-step; what the compiler could not make a
    projection is refused. Node-local bookkeeping, asked before the first round."""
    if not program.constraints:
        return {"refusal": None}
    names = [c.name for c in program.constraints]
    supported = ("norm balls, bounds, halfspaces a @ w <= b and hyperplanes a @ w == b with "
                 "constant a, b, on shared variables")
    if program.role == "server":
        return {"refusal": (
            f"FedADMM's server step handles only constraints it can project on ({supported}); "
            f"the server has {names}. Use backends.ProxAL(inner=backends.FedADMM(...)) or "
            "backends.ProxAL")}
    return {"refusal": (
        f"FedADMM handles client constraints only as projections ({supported}); client "
        f"{program.name!r} has {names}. Use backends.ProxAL(inner=backends.FedADMM(...)) "
        "(constraints by a proximal AL, FedADMM on its subproblems) or backends.ProxAL / DALD")}
