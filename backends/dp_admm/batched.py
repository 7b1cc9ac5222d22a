"""DP-IADMM's client step (`client._client_step`, line 5 of Algorithms 1–2) for a whole group of
same-structure clients: the vectorized form the batched and JAX executors serve `dp_admm_step`
with. One round is one group evaluation of ∇f_p (`Group.value_grad`: numpy's batched plans, or
one vmap on `executor="jax"`), for sensitivity "clip" / "paper" / "replace" one batched
evaluation of every client's per-record terms (`runtime.batched_records`), the closed-form
z-steps (8)/(9)/(5a) as array arithmetic, and the noise drawn client by client from each
client's own generator, in the order and shapes of the per-client step, and logged in its
`NoiseLog` — so a seeded run draws exactly the serial run's noise.

Covered: clients without local constraints, or whose only local constraints are simple sets
(bounds, norm balls) and prox-able terms (λ‖w‖₁), applied as the group's prox after the step
(`constrained.LocalConstraints.project`; no multipliers, nothing released); every layer (none,
ObjP/ObjT Laplace with any sensitivity, OutP Gaussian); requests to the whole group, per-node
(`map`) or as one group request (`map_stacked`: no per-node payloads or replies). Anything
else (constraints c_j(z) ≤ 0 with multipliers) returns None: served client by client.
"""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.batched_group import Group, in_group_order, read_only
from fedmodel.runtime.batched_records import group_record_gradients
from fedmodel.runtime.ledger import with_forms
from fedmodel.runtime.privacy import NoiseLog, gaussian_noise, laplace_noise
from . import client
from .client import GaussianOutput, Identity, LaplaceObjective, iadmm_step
from .constrained import _compiled

_SLOT = "dp_admm.z"


def _step_batched(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """`dp_admm_step` for every client of a group (per-node payloads), or None (not covered)."""
    if members != group.names or _coverage(group) is None:
        return None
    request = [payloads[m] for m in members]
    radius = request[0].get("radius")
    if any(r.get("radius") != radius for r in request):
        return None
    n, d = group.n, group.n_x
    W = _rows([r["w"] for r in request], n, d) if any(r["w"] is not request[0]["w"] for r in request) \
        else np.asarray(request[0]["w"], float)
    column = lambda key: np.array([float(r.get(key, 0.0)) for r in request])     # noqa: E731
    out = _step_rows(group, W, _rows([r["lam"] for r in request], n, d), column("rho"),
                     column("prox"), radius, column("sigma"))
    if out is None:
        return None
    view, local = read_only(out[0]), out[1]
    residual = 0.0 if local else None           # no constraints: no multipliers to move
    return {m: {"z": view[i], "multiplier_residual": residual} for i, m in enumerate(members)}


def _step_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`dp_admm_step` as a group request to every client of the group (common w, ρ, radius;
    λ_p as a block; 1/η and σ common or blocks), or None (not covered)."""
    if not in_group_order(rows, group.n) or "lam" not in blocks or not {"w", "rho"} <= set(common) or \
            set(blocks) - {"lam", "prox", "sigma"}:
        return None
    def column(key: str) -> np.ndarray:
        return blocks[key] if key in blocks else np.full(group.n, float(common.get(key, 0.0)))
    out = _step_rows(group, np.asarray(common["w"], float), blocks["lam"], column("rho"),
                     column("prox"), common.get("radius"), column("sigma"))
    if out is None:
        return None
    reply = {"z": read_only(out[0])}
    if out[1]:                                  # the per-node replies' 0.0 (simple sets only)
        reply["multiplier_residual"] = np.zeros(group.n)
    return reply


def _coverage(group: Group) -> tuple | None:
    """`_covered`'s answer, kept with the group's checks, or None when the step is not vectorized
    (private variables too): asked before any stack of the request is built."""
    return None if group.n_y else group.checked("dp_admm_step", lambda: _covered(group))


def _step_rows(group: Group, W: np.ndarray, lam: np.ndarray, rho: np.ndarray, prox: np.ndarray,
               radius: float | None, sigma: np.ndarray) -> tuple[np.ndarray, bool] | None:
    """Every member's step: (the new stack of z_p, published as their state; whether they have
    simple local sets), or None (not covered). W: one w or an (n, d) stack; λ_p an (n, d)
    stack; ρ, 1/η and σ one entry per member."""
    covered = _coverage(group)
    if covered is None:
        return None
    states, layers, kind, mode, norm, local = covered
    n, d = group.n, group.n_x
    Z = group.gather("z", states, d, _SLOT)
    G = group.grad(Z, np.zeros((n, 0)))          # f'_p(z_p^t; D_p), (37)
    if kind is LaplaceObjective:
        G = _objective_perturbation(group, states, layers, mode, Z, G)
        if G is None:
            return None
    Z_new = _iadmm_steps(Z, G, W, lam, rho, prox, radius, norm)     # (8)/(9) ≡ (5)/(6) at ξ̃
    if local:       # `LocalConstraints.project`: the prox of the sets and terms, step 1/(ρ + 1/η)
        step = 1.0 / (rho + prox)
        if np.all(step == step[0]):
            Z_new = group.apply_prox(Z_new, float(step[0]))
        else:
            Z_new = np.array([p.apply_prox(z, t) for p, z, t in zip(group.programs, Z_new, step)])
    if kind is GaussianOutput:                                      # OutP only
        scales = [layer.scale(s) for layer, s in zip(layers, sigma.tolist())]
        noise = np.array([gaussian_noise(s["rng"], scale, (d,)) for s, scale in zip(states, scales)],
                         dtype=float).reshape(n, d)
        NoiseLog.add_rows([s["log"] for s in states], scales, noise)
        Z_new = Z_new + noise
    group.publish("z", Z_new, states, _SLOT)
    return Z_new, local


def _covered(group: Group) -> tuple | None:
    """(states, layers, layer type, Δ̄ mode, trust norm, local) when every member's step is
    covered: no local constraints other than simple sets and prox-able terms (`local`: every
    member has those; they are a prox after the step), one layer type and Δ̄ mode, one trust
    norm; else None. Checked once until a member is served node by node (`Group.checked`)."""
    states = [p.state.get("dp_admm") for p in group.programs]
    if any(s is None for s in states):
        return None
    local = states[0]["local"] is not None
    if any((s["local"] is not None) != local for s in states) or \
            (local and any(_compiled(p).constraints or not _compiled(p).has_prox for p in group.programs)):
        return None
    layers = [s["layer"] for s in states]
    kind, norm = type(layers[0]), states[0]["norm"]
    if kind not in (Identity, LaplaceObjective, GaussianOutput) or \
            any(type(layer) is not kind for layer in layers) or any(s["norm"] != norm for s in states):
        return None
    mode = _mode(layers[0]) if kind is LaplaceObjective else None
    if mode is not None and any(_mode(layer) != mode for layer in layers):
        return None
    return states, layers, kind, mode, norm, local


def _rows(values: list, n: int, d: int) -> np.ndarray:
    """(n, d) stack of model-sized payload fields (each a (d,) array or broadcast to it)."""
    if all(np.shape(v) == (d,) for v in values):
        return np.array(values, dtype=float).reshape(n, d)
    return np.array([np.broadcast_to(np.asarray(v, float), (d,)) for v in values]).reshape(n, d)


def _mode(layer: LaplaceObjective) -> str:
    """How the layer's Δ̄ is obtained: "clip", "paper", "replace" or "bound" (a number)."""
    return layer.sensitivity if isinstance(layer.sensitivity, str) else "bound"


def _objective_perturbation(group: Group, states: list[dict], layers: list, mode: str,
                            Z: np.ndarray, G: np.ndarray) -> np.ndarray | None:
    """`LaplaceObjective.objective` for every client: the clipped gradient (sensitivity "clip")
    or Δ̄ of (20) at z_p^t, then ξ̃_p ~ Laplace(Δ̄_p/ε̄) from each client's generator (11a)."""
    if mode == "clip":
        records = group_record_gradients(group)
        if records is None:
            return None
        record_bound = np.array([layer.record_bound for layer in layers], dtype=float)
        correction, clipped = records.clipping_correction(Z, record_bound)
        G = G.copy()
        G[clipped] += correction[clipped]
        bounds = [2.0 * layer.record_bound for layer in layers]     # Δ̄ = 2C/I_p
    elif mode in ("paper", "replace"):
        records = group_record_gradients(group)
        if records is None:
            return None
        factor = 2.0 if mode == "replace" else 1.0
        bounds = [float(b) * factor for b in records.max_l1(Z)]
    else:
        bounds = [float(layer.sensitivity) for layer in layers]
    d = G.shape[1]
    xi = np.array([laplace_noise(s["rng"], bound, layer.epsilon, (d,))
                   for s, layer, bound in zip(states, layers, bounds)], dtype=float).reshape(G.shape)
    NoiseLog.add_rows([s["log"] for s in states], bounds, xi)
    return G + xi


def _iadmm_steps(Z: np.ndarray, G: np.ndarray, W: np.ndarray, lam: np.ndarray, rho: np.ndarray,
                 prox: np.ndarray, radius: float | None, norm: str) -> np.ndarray:
    """`client.iadmm_step` for every row: on the stacks where it is elementwise (no trust region,
    or the ∞-norm one), row by row for the 2-norm trust region (a radial projection per row)."""
    if radius is None or norm == "inf":     # elementwise: the step itself, on the stacks
        return iadmm_step(Z, G, W, lam, rho[:, None], prox[:, None], radius, norm)
    W = np.broadcast_to(W, Z.shape)
    return np.array([iadmm_step(z, g, w, l, r, 0.0, radius, norm)
                     for z, g, w, l, r in zip(Z, G, W, lam, rho)])


# DP-ADMM's client step with these forms (`DPADMM.procedures`)
PROCEDURES = (with_forms(client._client_step, batched=_step_batched, stacked=_step_stacked),)
