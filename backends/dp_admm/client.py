"""The client side of DP-IADMM (backends/dp_admm): the non-private z-step and the DP layers over
it, and the procedures a client runs — `dp_admm_init` (z_p^1, the layer, the client's own noise
generator), `dp_admm_step` (line 5 of Algorithms 1–2) and the local bookkeeping
(`dp_admm_set_multipliers`, `dp_admm_releases`, `dp_admm_log`). Equation numbers refer to
../shared/seeds/dp_inexact_admm.txt.

DP is a layer over the ADMM step, not a copy of it: `iadmm_step` is the non-private closed-form
z-step of (5)/(6); a mechanism perturbs its input or its output. Objective perturbation adds
<ξ̃, z> to H^t (5b), which is G^t (10) up to a constant (App. A.1), i.e. it replaces f'_p by
f'_p + ξ̃; output perturbation adds Gaussian noise to the step's result. Δ̄, the clipped
per-record gradients and the noise are computed on the client (fedmodel.runtime.privacy); only
z_p leaves it.

`dp_admm_step` is written once, over rows of clients (`fedmodel.runtime.client_step`): on the
serial, Ray and Flower executors it runs on one client (`NodeRows`: the program's own gradient
plan and per-record terms), on the batched and JAX executors on a group of same-structure
clients, for requests per node (`map`) or as one group request (`map_stacked`, `_step_stacked`).
Vectorized over the rows: ∇f_p (one `Group.grad`: numpy's batched plans, or one vmap on
executor="jax"), the per-record terms of sensitivity "clip" / "paper" / "replace" (one
evaluation, `runtime.batched_records`), the closed-form z-steps (8)/(9)/(5a) as array arithmetic
(a 2-norm trust region row by row), the prox of local sets and terms (`Group.apply_prox`). Row
by row: the noise (`release`: each client's own generator, in the order and shapes of one
client's step, so a seeded run draws the same numbers on every executor), and for clients with
constraints c_j(z) ≤ 0 their Lagrangian gradient and multipliers' step (`constrained`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.compiler.per_record import NotRecordSeparable
from fedmodel.errors import FedModelError
from fedmodel.runtime.batched_group import Group, in_group_order, private_stack, read_only
from fedmodel.runtime.batched_records import group_record_gradients
from fedmodel.runtime.client_step import client_step
from fedmodel.runtime.messages import procedure
from fedmodel.runtime.privacy import (NoiseLog, gaussian_noise, laplace_noise, node_generator,
                                      record_count, record_sensitivity)
from ..common import _curvature_at
from ..projecting import has_affine_sets, projected_multipliers
from .constrained import LAGRANGIAN_MARGIN, LocalConstraints, _compiled, local_constraints
from .sampled import SampledGaussianObjective, noise_ratio, shrinkage

_SLOT = "dp_admm.z"          # the group's stack of the rows' z_p


def iadmm_step(z, grad, w, lam, rho, prox=0.0, radius=None, norm="inf") -> np.ndarray:
    """The IADMM z-step: argmin of H^t (5b) = <grad, z> + ρ/2‖w − z + λ/ρ‖² with the proximal
    term (1/2η)‖z − z^t‖² (5a), prox = 1/η, or (radius given) within ‖z − z^t‖ ≤ δ (6).
    Closed forms: H^t is an isotropic quadratic, so the trust region is a clip (∞-norm) or a
    radial projection (2-norm) of its minimizer. Elementwise: z, grad, w, λ may be (n, d) stacks
    of rows with ρ, 1/η as (n, 1) columns (not with the 2-norm region: one row at a time)."""
    if radius is None:
        return (-grad + rho * w + lam + prox * z) / (rho + prox)
    u = w + (lam - grad) / rho
    if norm == "inf":
        return np.clip(u, z - radius, z + radius)
    length = float(np.linalg.norm(u - z))
    return u if length <= radius else z + (radius / length) * (u - z)


class Identity:
    """No perturbation: the step is exactly IADMM (ε̄ = ∞). `perturbs`: where a layer's noise,
    drawn row by row by `release`, enters the step ("objective": the linear term of H^t;
    "output": z_p^{t+1}; None). A layer may instead perturb one client's linear term itself,
    `objective(program, state, z, grad, constraints)` (`sampled.SampledGaussianObjective`)."""

    perturbs: str | None = None


@dataclass
class LaplaceObjective(Identity):
    """Objective perturbation (10)–(11): ξ̃ with i.i.d. Laplace(0, Δ̄_p^t/ε̄) entries is added
    to the linear term, so the step solves (8)/(9).

    sensitivity="clip" (`record_bound` = C/I_p): the step uses the clipped gradient
    f̃'_p(z; D) = Σ_i clip(t_i) + r'(z), where t_i = a_i ⊗ u_i is record i's term of f'_p
    (fedmodel.compiler.per_record: records enter only through rows of `A @ w`, r' is the
    record-free rest) and clip(t) = t·min(1, (C/I_p)/‖t‖₁). A neighbour D' ∈ D̂_p (11c) replaces
    one record i* (I_p unchanged), so every other term and r' cancel in (11b):
        ‖f̃'_p(z; D) − f̃'_p(z; D')‖₁ = ‖clip(t_i*) − clip(t'_i*)‖₁ ≤ 2C/I_p =: Δ̄
    for every z and every pair D, D' — a data-independent Δ̄, so Theorems 1 and 3 (whose proof,
    Prop. 2, needs only that the noise of D and D' differs by f̃'(D') − f̃'(D)) hold formally
    for the step run with f̃'. Clipping applies to what the step uses, not only to Δ̄
    (`_objective`). "paper": Δ̄ of (20) at z_p^t; "replace": twice that; a number: Δ̄ itself."""

    epsilon: float
    sensitivity: Any = "paper"           # "paper" | "replace" | "clip" | a fixed bound Δ̄
    record_bound: float | None = None    # "clip": each record's term to L1 norm ≤ C/I_p
    perturbs = "objective"

    def mode(self) -> str:
        """How Δ̄ is obtained: "clip", "paper", "replace" or "bound" (a number)."""
        return self.sensitivity if isinstance(self.sensitivity, str) else "bound"

    def draw(self, rng: np.random.Generator, scale: float, shape: tuple[int, ...]) -> np.ndarray:
        """ξ̃ ~ Laplace(0, Δ̄/ε̄) i.i.d. (11a), Δ̄ = `scale`."""
        return laplace_noise(rng, scale, self.epsilon, shape)


@dataclass
class GaussianOutput(Identity):
    """Output perturbation (Huang et al.): z^{t+1} + N(0, s²I) with s = σ ("sigma") or σ²
    ("sigma2", the authors' code)."""

    std: str = "sigma"
    perturbs = "output"

    def scale(self, sigma: float) -> float:
        """The noise's standard deviation for the server's σ: σ, or σ² ("sigma2")."""
        return sigma if self.std == "sigma" else sigma ** 2

    def draw(self, rng: np.random.Generator, scale: float, shape: tuple[int, ...]) -> np.ndarray:
        """N(0, s²) i.i.d., s = `scale`."""
        return gaussian_noise(rng, scale, shape)


def release(states: list[dict], layers: list, clean: np.ndarray, scales: list[float]) -> np.ndarray:
    """The mechanism: the noisy release of the rows' clean terms `clean` (k, d) — the linear term
    of H^t (ObjP/ObjT) or z_p^{t+1} (OutP). Row p's noise is drawn by its layer (`draw`) at
    `scales[p]` (Δ̄_p, or OutP's standard deviation) from client p's own generator, rows in
    order and each a (d,) draw, as one client's step draws it; every draw is logged in the
    client's `NoiseLog`. The one place noise enters the step: another mechanism replaces it."""
    d = clean.shape[1]
    noise = np.array([layer.draw(s["rng"], scale, (d,)) for s, layer, scale in zip(states, layers, scales)],
                     dtype=float).reshape(clean.shape)
    NoiseLog.add_rows([s["log"] for s in states], scales, noise)
    return clean + noise


@procedure("dp_admm_init", {"z0": "x", "mechanism": "str", "epsilon": "1", "sensitivity": "str",
                            "bound": "1", "clip": "1", "std": "str", "norm": "str", "seed": "1",
                            "index": "1", "record": "1", "share": "1", "value_clip": "1",
                            "noise": "1", "noise_c": "1", "rate": "1", "curvature": "1", "shrink": "1"},
           {"records": "1", "constraint_releases": "1", "L": "1"})
def _client_init(program, z0, mechanism, epsilon, sensitivity="paper", bound=None, clip=None,
                 std="sigma", norm="inf", seed=None, index=0, record=0.0, share=0.0, value_clip=1.0,
                 noise=None, noise_c=None, rate=1.0, curvature=None, shrink=0.0):
    """z_p^1 (the client keeps its z_p; the server keeps λ_p), the DP layer, and the client's
    own generator: spawned from `seed` for reproducible simulations, or (seed=None) seeded from
    OS entropy on the client, so that no one else can replay — and subtract — its noise.
    sensitivity="clip" takes the clip norm C in `clip` (the record bound is C/I_p). Local
    constraints and prox-able terms (`constrained.LocalConstraints`): the J constraints that read
    the client's data get the fraction `share` of ε̄ (ε̄·share/J each), the gradient the rest;
    the reply's `constraint_releases` is J (None without local constraints or terms).
    mechanism="sampled_gaussian" (`sampled`): noise multipliers `noise` (the gradient) and `noise_c`
    (each constraint value), Poisson rate `rate`, L2 clip C in `clip`, `shrink`: ω_p (`sampled`).
    `curvature` (non-private runs): also L̂_p at z0, as "local_curvature" with that many steps
    would answer (the server's ρ floor, asked here: no round trip of its own; `setup`)."""
    rng, records = node_generator(seed, index), record_count(program)
    local, releases = local_constraints(program, mechanism, epsilon, sensitivity, clip, share,
                                        value_clip, noise_c)
    epsilon = float(epsilon) * (1.0 - share if releases else 1.0)
    if mechanism == "laplace":
        record_bound = None if clip is None else float(clip) / records
        layer = LaplaceObjective(epsilon, sensitivity if bound is None else float(bound),
                                 record_bound)
        if bound is None:
            _refuse_unknown_records(program, np.asarray(z0, float), sensitivity)
    elif mechanism == "sampled_gaussian":
        weight = shrinkage(noise_ratio(float(noise), np.size(z0), float(rate), records)) if shrink else 1.0
        layer = SampledGaussianObjective(float(noise), float(rate), float(clip) / records, float(weight))
        _refuse_unknown_records(program, np.asarray(z0, float), "clip")
    else:
        layer = GaussianOutput(std) if mechanism == "gaussian" else Identity()
    program.state["dp_admm"] = {"z": np.array(z0, float), "rng": rng, "layer": layer, "norm": norm,
                                "log": NoiseLog(keep=bool(record)), "local": local}
    return {"records": float(records), "constraint_releases": None if local is None else float(releases),
            "L": _curvature_at(program, z0, curvature)["L"] if curvature else None}


def _refuse_unknown_records(program, z0: np.ndarray, sensitivity: str) -> None:
    """Δ̄ of (20) once at z_p^1, so that a model without per-record gradients fails at once."""
    try:
        record_sensitivity(program, z0)
    except NotRecordSeparable as error:
        raise FedModelError(
            f"sensitivity={sensitivity!r} needs {error}. Pass a data-independent bound instead, "
            "e.g. DPADMM(sensitivity=glm_sensitivity_bound(...)) or a number") from None


@dataclass(frozen=True)
class _Rows:
    """What a step needs of its rows' states (`_rows`): the states, their layers, one layer type
    and Δ̄ mode, one trust norm, whether the clients have a local step (`LocalConstraints`:
    sets, prox-able terms, constraints) and which rows have constraints in their Lagrangian."""

    states: list
    layers: list
    kind: type
    mode: str | None
    norm: str
    local: bool
    lagrangian: np.ndarray      # (n,) bool


def _rows(group: Group) -> _Rows | None:
    """The rows' states as the step reads them, kept with the group's checks (`Group.checked`;
    a group of one checks every time), or None for a group whose members differ in layer, Δ̄
    mode, trust norm or local step (then each is served by itself). Asked before any stack of
    the request is built."""
    return group.checked("dp_admm_step", lambda: _read_rows(group))


def _read_rows(group: Group) -> _Rows | None:
    """`_rows`, read from the members' states (a missing state is refused)."""
    states = [p.state.get("dp_admm") for p in group.programs]
    missing = [name for name, s in zip(group.names, states) if s is None]
    if missing:
        raise FedModelError(f"dp_admm_step sent to clients {missing} before dp_admm_init: the "
                            "server initializes every client before its first round")
    layers = [s["layer"] for s in states]
    kind, norm, local = type(layers[0]), states[0]["norm"], states[0]["local"] is not None
    mode = layers[0].mode() if kind is LaplaceObjective else None
    if any(type(layer) is not kind or (mode is not None and layer.mode() != mode) for layer in layers) or \
            any(s["norm"] != norm or (s["local"] is not None) != local for s in states):
        return None
    lagrangian = np.array([local and bool(_compiled(p).constraints) for p in group.programs])
    return _Rows(states, layers, kind, mode, norm, local, lagrangian)


def _step_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`_step` for a group request to every client of the group (common w, ρ, radius, dual
    step; λ_p as a block; 1/η and σ common or blocks), or None (split into per-node requests)."""
    if not in_group_order(rows, group.n) or "lam" not in blocks or not {"w", "rho"} <= set(common) or \
            set(blocks) - {"lam", "prox", "sigma"}:
        return None
    rows = _rows(group)
    if rows is None:
        return None

    def column(key: str) -> np.ndarray:
        return blocks[key] if key in blocks else np.full(group.n, float(common.get(key, 0.0)))
    out = _step_rows(group, rows, np.asarray(common["w"], float), blocks["lam"], column("rho"),
                     column("prox"), common.get("radius"), column("sigma"),
                     [common.get("dual_step")] * group.n)
    if out is None:
        return None
    reply = {"z": read_only(out[0])}
    if out[1][0] is not None:           # clients with a local step (per node: a float each)
        reply["multiplier_residual"] = np.array(out[1], dtype=float)
    return reply


@client_step("dp_admm_step", {"w": "x", "lam": "x", "rho": "1", "prox": "1", "radius": "1",
                              "sigma": "1", "dual_step": "1"}, {"z": "x", "multiplier_residual": "1"},
             stacked=_step_stacked)
def _step(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """Line 5 of Algorithms 1–2 for the rows `members` (per-node payloads): (8) or (9); for OutP
    (5a) plus output noise. With local constraints (ObjP): the Lagrangian's gradient, the prox of
    the local sets and terms after the step, then the multipliers' update with step `dual_step`
    (`constrained`; 0: the non-private curvature step, `LocalConstraints.curvature_steps`). None (each member served by itself) for part of a group, members sent
    different trust radii, or a group `_rows` does not take."""
    if members != group.names:
        return None
    request = [payloads[m] for m in members]
    radius, rows = request[0].get("radius"), _rows(group)
    if any(r.get("radius") != radius for r in request) or rows is None:
        return None
    n, d = group.n, group.n_x
    W = _stack([r["w"] for r in request], n, d) if any(r["w"] is not request[0]["w"] for r in request) \
        else np.asarray(request[0]["w"], float)
    column = lambda key: np.array([float(r.get(key, 0.0)) for r in request])     # noqa: E731
    out = _step_rows(group, rows, W, _stack([r["lam"] for r in request], n, d), column("rho"),
                     column("prox"), radius, column("sigma"), [r.get("dual_step") for r in request])
    if out is None:
        return None
    view, residual = read_only(out[0]), out[1]
    return {m: {"z": view[i], "multiplier_residual": residual[i]} for i, m in enumerate(members)}


def _step_rows(group: Group, rows: _Rows, W: np.ndarray, lam: np.ndarray, rho: np.ndarray,
               prox: np.ndarray, radius: float | None, sigma: np.ndarray,
               dual_step: list) -> tuple[np.ndarray, list] | None:
    """Every row's step: (the new stack of z_p, published as their state; per row the
    multipliers' residual, None without a local step), or None (a group whose per-record terms
    are not known alike: nothing drawn or written). W: one w or an (n, d) stack; λ_p an (n, d)
    stack; ρ, 1/η, σ and the dual step one entry per row."""
    per_record = rows.mode in ("clip", "paper", "replace")
    records = group_record_gradients(group) if per_record else None   # one client: its own
    if per_record and records is None:
        return None
    Z = group.gather("z", rows.states, group.n_x, _SLOT)
    G = _objective(group, rows, records, Z)                        # f'_p + ξ̃_p^t: G^t (10)
    curvature = [eta == 0.0 and constrained for eta, constrained in zip(dual_step, rows.lagrangian)]
    weight = rho + prox     # the multipliers' curvature steps read the step's weight without ...
    if any(curvature):      # ... the non-private default's proximal weight on their curvature:
        # with it, η_j ∝ μ_j and an infeasible model's μ_j grew geometrically (NP, r = 0.05:
        # ×1.7 a round, non-finite by round 60)
        prox = prox + LAGRANGIAN_MARGIN * np.array(
            [s["local"].lagrangian_curvature(p, z) if on else 0.0
             for s, p, z, on in zip(rows.states, group.programs, Z, curvature)])
    Z_new = _iadmm_steps(Z, G, W, lam, rho, prox, radius, rows.norm)  # (8)/(9) ≡ (5)/(6) at ξ̃
    residual = [None] * group.n
    if rows.local:     # `LocalConstraints.project`: the prox of the sets and terms, step 1/(ρ + 1/η)
        step = 1.0 / (rho + prox)
        if np.all(step == step[0]):
            Z_new = group.apply_prox(Z_new, float(step[0]))
        else:
            Z_new = np.array([p.apply_prox(z, t) for p, z, t in zip(group.programs, Z_new, step)])
        # dual step 0: the non-private default's step from each constraint's curvature
        residual = [s["local"].update_multipliers(p, z, eta or None, s["rng"], None if eta else t)
                    if constrained else 0.0 for s, p, z, eta, t, constrained in
                    zip(rows.states, group.programs, Z_new, dual_step, weight, rows.lagrangian)]
    if rows.kind.perturbs == "output":                             # OutP only
        scales = [layer.scale(s) for layer, s in zip(rows.layers, sigma.tolist())]
        Z_new = release(rows.states, rows.layers, Z_new, scales)
    group.publish("z", Z_new, rows.states, _SLOT)
    return Z_new, residual


def _objective(group: Group, rows: _Rows, records: Any, Z: np.ndarray) -> np.ndarray:
    """The linear term of H^t (5b) the step uses, row by row: f'_p(z_p^t; D_p) (37), plus for
    clients with constraints Σ_j μ_j ∇c_j (`LocalConstraints.gradient`: clipped once private,
    its sensitivity adding to Δ̄: one release of the sum), perturbed by the layer. Laplace
    (11a): every record's term of f'_p clipped to C/I_p under sensitivity "clip" (Δ̄ = 2C/I_p;
    `LaplaceObjective`), Δ̄ of (20) under "paper" / "replace" (`records`: the rows' per-record
    terms), then `release`. A layer with its own `objective(program, state, z, grad,
    constraints)` (`sampled.SampledGaussianObjective`) perturbs each row's term itself."""
    n, n_x = group.n, group.n_x
    lagrangian, extra = rows.lagrangian, None
    G = np.empty((n, n_x)) if lagrangian.all() else group.grad(Z, private_stack(group))[:, :n_x]
    if lagrangian.any():        # ∇f_p and Σ_j μ_j ∇c_j from the client's Lagrangian plan
        G, extra, extra_bound = np.array(G), np.zeros((n, n_x)), np.zeros(n)
        for i in np.flatnonzero(lagrangian):
            G[i], extra[i], extra_bound[i] = rows.states[i]["local"].gradient(group.programs[i], Z[i])
    if hasattr(rows.kind, "objective"):
        return np.array([layer.objective(p, s, z, g, None if extra is None else (extra[i], extra_bound[i]))
                         for i, (layer, p, s, z, g) in
                         enumerate(zip(rows.layers, group.programs, rows.states, Z, G))]).reshape(n, n_x)
    bounds = None
    if rows.mode == "clip":
        record_bound = np.array([layer.record_bound for layer in rows.layers], dtype=float)
        correction, clipped = records.clipping_correction(Z, record_bound)
        G = G.copy() if extra is None else G        # (G may be the group's cached value)
        G[clipped] += correction[clipped]
        bounds = [2.0 * layer.record_bound for layer in rows.layers]
    elif rows.mode in ("paper", "replace"):         # (20) at z_p^t
        factor = 2.0 if rows.mode == "replace" else 1.0
        bounds = [float(b) * factor for b in records.max_l1(Z)]
    elif rows.mode == "bound":
        bounds = [float(layer.sensitivity) for layer in rows.layers]
    if extra is not None:
        G = G + extra
        bounds = None if bounds is None else [b + float(e) for b, e in zip(bounds, extra_bound)]
    return release(rows.states, rows.layers, G, bounds) if rows.kind.perturbs == "objective" else G


def _iadmm_steps(Z: np.ndarray, G: np.ndarray, W: np.ndarray, lam: np.ndarray, rho: np.ndarray,
                 prox: np.ndarray, radius: float | None, norm: str) -> np.ndarray:
    """`iadmm_step` for every row: on the stacks where it is elementwise (no trust region, or the
    ∞-norm one), row by row for the 2-norm trust region (a radial projection per row)."""
    if radius is None or norm == "inf":
        return iadmm_step(Z, G, W, lam, rho[:, None], prox[:, None], radius, norm)
    W = np.broadcast_to(W, Z.shape)
    return np.array([iadmm_step(z, g, w, l, r, 0.0, radius, norm)
                     for z, g, w, l, r in zip(Z, G, W, lam, rho)]).reshape(Z.shape)


def _stack(values: list, n: int, d: int) -> np.ndarray:
    """(n, d) stack of model-sized payload fields (each a (d,) array or broadcast to it)."""
    if all(np.shape(v) == (d,) for v in values):
        return np.array(values, dtype=float).reshape(n, d)
    return np.array([np.broadcast_to(np.asarray(v, float), (d,)) for v in values]).reshape(n, d)


@procedure("dp_admm_set_multipliers", {"lam": "x"}, {"multipliers": "opaque"}, local=True,
           read_only=True)
def _client_set_multipliers(program, lam):
    """The multipliers of the client's projected affine constraints at z_p (non-private runs
    only): at a fixed point of the step (8) (z_p^{t+1} = z_p^t = w) its optimality reads
    0 ∈ ∇L_p(z_p) − λ_p + N_C(z_p), ∇L_p the gradient of f_p and its Lagrangian terms, so the
    normal element is λ_p − ∇L_p(z_p). Driver bookkeeping, served locally."""
    s = program.state.get("dp_admm")
    if not s or not has_affine_sets(program):
        return {"multipliers": {}}
    z = s["z"]
    gradient = program.merit(z)["grad"] if s["local"] is None else sum(s["local"].gradient(program, z)[:2])
    return {"multipliers": projected_multipliers(program, z, np.asarray(lam, float) - gradient)}


@procedure("dp_admm_releases", {}, {"releases": "1"}, local=True, read_only=True)
def _client_releases(program):
    """How many constraint values the client would release per round (`LocalConstraints.releases`;
    0 without local constraints): what the server needs to calibrate ε̄ to a budget."""
    return {"releases": float(LocalConstraints.releases(program) or 0)}


@procedure("dp_admm_log", {}, {"log": "opaque"}, local=True, read_only=True)
def _client_log(program):
    """The client's noise log (`runtime.privacy.NoiseLog.report`), served locally: the
    harness's metrics and debugging, never part of the algorithm's traffic."""
    log = program.state.get("dp_admm", {}).get("log") or NoiseLog()
    return {"log": log.report()}


# DP-ADMM's client steps but `dp_admm_init` (`setup.PROCEDURES` has them all, for `DPADMM.procedures`)
PROCEDURES = (_step, _client_set_multipliers, _client_releases, _client_log)
