"""The client side of DP-IADMM (backends/dp_admm): the non-private z-step and the DP layers over
it, and the procedures a client runs — `dp_admm_init` (z_p^1, the layer, the client's own noise
generator), `dp_admm_step` (line 5 of Algorithms 1–2) and the local `dp_admm_log`. Equation
numbers refer to ../shared/seeds/dp_inexact_admm.txt.

DP is a layer over the ADMM step, not a copy of it: `iadmm_step` is the non-private closed-form
z-step of (5)/(6); a mechanism perturbs its input or its output. Objective perturbation adds
<ξ̃, z> to H^t (5b), which is G^t (10) up to a constant (App. A.1), i.e. it replaces f'_p by
f'_p + ξ̃; output perturbation adds Gaussian noise to the step's result. Δ̄, the clipped
per-record gradients and the noise are computed on the client (fedmodel.runtime.privacy); only
z_p leaves it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedmodel.compiler.per_record import NotRecordSeparable
from fedmodel.errors import FedModelError
from fedmodel.runtime.ledger import procedure
from fedmodel.runtime.privacy import (NoiseLog, clipped_record_gradients, gaussian_noise,
                                      laplace_noise, node_generator, record_count,
                                      record_sensitivity)
from ..projecting import has_affine_sets, projected_multipliers
from .constrained import LocalConstraints
from .sampled import SampledGaussianObjective


def iadmm_step(z, grad, w, lam, rho, prox=0.0, radius=None, norm="inf") -> np.ndarray:
    """The IADMM z-step: argmin of H^t (5b) = <grad, z> + ρ/2‖w − z + λ/ρ‖² with the proximal
    term (1/2η)‖z − z^t‖² (5a), prox = 1/η, or (radius given) within ‖z − z^t‖ ≤ δ (6).
    Closed forms: H^t is an isotropic quadratic, so the trust region is a clip (∞-norm) or a
    radial projection (2-norm) of its minimizer."""
    if radius is None:
        return (-grad + rho * w + lam + prox * z) / (rho + prox)
    u = w + (lam - grad) / rho
    if norm == "inf":
        return np.clip(u, z - radius, z + radius)
    length = float(np.linalg.norm(u - z))
    return u if length <= radius else z + (radius / length) * (u - z)


class Identity:
    """No perturbation: the step is exactly IADMM (ε̄ = ∞)."""

    def objective(self, program, state, z, grad, constraints=None):
        """The linear term of H^t (5b) the step uses: the client's gradient f'_p(z_p^t), plus the
        constraints' part Σ_j μ_j ∇c_j of the Lagrangian's gradient (`constraints`: that vector
        and its L1 sensitivity; `constrained.LocalConstraints`), perturbed or not."""
        return grad if constraints is None else grad + constraints[0]

    def output(self, state, z, sigma):
        """The z_p^{t+1} the client keeps and sends: the step's result, perturbed or not."""
        return z


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
    for the step run with f̃'. Clipping applies to what the step uses, not only to Δ̄."""

    epsilon: float
    sensitivity: Any = "paper"           # "paper" | "replace" | "clip" | a fixed bound Δ̄
    record_bound: float | None = None    # "clip": each record's term to L1 norm ≤ C/I_p

    def objective(self, program, state, z, grad, constraints=None):
        if self.sensitivity == "clip":
            grad = clipped_record_gradients(program, z, grad, self.record_bound)
            bound = 2.0 * self.record_bound              # Δ̄ = 2C/I_p over all of D̂_p
        elif isinstance(self.sensitivity, str):          # (11b) as in (20), at z_p^t
            bound = record_sensitivity(program, z) * (2.0 if self.sensitivity == "replace" else 1.0)
        else:
            bound = float(self.sensitivity)
        if constraints is not None:          # Σ_j μ_j ∇c_j, clipped: one release of the sum
            grad, bound = grad + constraints[0], bound + constraints[1]
        xi = laplace_noise(state["rng"], bound, self.epsilon, grad.shape)         # (11a)
        state["log"].add(bound, xi)
        return grad + xi


@dataclass
class GaussianOutput(Identity):
    """Output perturbation (Huang et al.): z^{t+1} + N(0, s²I) with s = σ ("sigma") or σ²
    ("sigma2", the authors' code)."""

    std: str = "sigma"

    def scale(self, sigma: float) -> float:
        """The noise's standard deviation for the server's σ: σ, or σ² ("sigma2")."""
        return sigma if self.std == "sigma" else sigma ** 2

    def output(self, state, z, sigma):
        scale = self.scale(sigma)
        noise = gaussian_noise(state["rng"], scale, z.shape)
        state["log"].add(scale, noise)
        return z + noise


@procedure("dp_admm_init", {"z0": "x", "mechanism": "str", "epsilon": "1", "sensitivity": "str",
                            "bound": "1", "clip": "1", "std": "str", "norm": "str", "seed": "1",
                            "index": "1", "record": "1", "share": "1", "value_clip": "1",
                            "noise": "1", "noise_c": "1", "rate": "1"},
           {"records": "1", "constraint_releases": "1"})
def _client_init(program, z0, mechanism, epsilon, sensitivity="paper", bound=None, clip=None,
                 std="sigma", norm="inf", seed=None, index=0, record=0.0, share=0.0, value_clip=1.0,
                 noise=None, noise_c=None, rate=1.0):
    """z_p^1 (the client keeps its z_p; the server keeps λ_p), the DP layer, and the client's
    own generator: spawned from `seed` for reproducible simulations, or (seed=None) seeded from
    OS entropy on the client, so that no one else can replay — and subtract — its noise.
    sensitivity="clip" takes the clip norm C in `clip` (the record bound is C/I_p). Local
    constraints and prox-able terms (`constrained.LocalConstraints`): the J constraints that read
    the client's data get the fraction `share` of ε̄ (ε̄·share/J each), the gradient the rest;
    the reply's `constraint_releases` is J (None without local constraints or terms).
    mechanism="sampled_gaussian" (`sampled`): noise multipliers `noise` (the gradient) and
    `noise_c` (each constraint value), Poisson rate `rate`, the L2 clip norm C in `clip`."""
    rng, records = node_generator(seed, index), record_count(program)
    local, releases = _local_constraints(program, mechanism, epsilon, sensitivity, clip, share,
                                         value_clip, noise_c)
    epsilon = float(epsilon) * (1.0 - share if releases else 1.0)
    if mechanism == "laplace":
        record_bound = None if clip is None else float(clip) / records
        layer = LaplaceObjective(epsilon, sensitivity if bound is None else float(bound),
                                 record_bound)
        if bound is None:
            _refuse_unknown_records(program, np.asarray(z0, float), sensitivity)
    elif mechanism == "sampled_gaussian":
        layer = SampledGaussianObjective(float(noise), float(rate), float(clip) / records)
        _refuse_unknown_records(program, np.asarray(z0, float), "clip")
    else:
        layer = GaussianOutput(std) if mechanism == "gaussian" else Identity()
    program.state["dp_admm"] = {"z": np.array(z0, float), "rng": rng, "layer": layer, "norm": norm,
                                "log": NoiseLog(keep=bool(record)), "local": local}
    return {"records": float(records), "constraint_releases": None if local is None else float(releases)}


def _local_constraints(program, mechanism, epsilon, sensitivity, clip, share, value_clip, noise_c=None):
    """The client's `LocalConstraints` (None when it has neither constraints nor prox-able terms)
    and the number of values it releases per round. A private client whose constraints read its
    data needs sensitivity="clip"."""
    releases = LocalConstraints.releases(program)
    if releases is None:
        return None, 0
    local = LocalConstraints()
    if mechanism == "none" or not releases:
        return local, 0
    if mechanism == "sampled_gaussian":         # Gaussian releases (L2 clipping, add/remove)
        local.privatize(program, float(clip), float(value_clip), math.inf, float(noise_c))
        return local, releases
    if sensitivity != "clip":
        raise FedModelError(
            f"client {program.name!r} has constraints that read its data: a private run releases "
            f"them with per-record clipping, so it needs sensitivity='clip' (got {sensitivity!r})")
    local.privatize(program, float(clip), float(value_clip), float(epsilon) * share / releases)
    return local, releases


def _refuse_unknown_records(program, z0: np.ndarray, sensitivity: str) -> None:
    """Δ̄ of (20) once at z_p^1, so that a model without per-record gradients fails at once."""
    try:
        record_sensitivity(program, z0)
    except NotRecordSeparable as error:
        raise FedModelError(
            f"sensitivity={sensitivity!r} needs {error}. Pass a data-independent bound instead, "
            "e.g. DPADMM(sensitivity=glm_sensitivity_bound(...)) or a number") from None


@procedure("dp_admm_step", {"w": "x", "lam": "x", "rho": "1", "prox": "1", "radius": "1",
                            "sigma": "1", "dual_step": "1"}, {"z": "x", "multiplier_residual": "1"})
def _client_step(program, w, lam, rho, prox=0.0, radius=None, sigma=0.0, dual_step=None):
    """Line 5 of Algorithms 1–2: (8) or (9); for OutP (5a) plus output noise. With local
    constraints (ObjP): the Lagrangian's gradient, the prox of the local sets and terms after the
    step, then the multipliers' update with step `dual_step` (`constrained`)."""
    s = program.state["dp_admm"]
    z, layer, local = s["z"], s["layer"], s["local"]
    if local is None:
        g, constraints = program.merit(z)["grad"], None            # f'_p(z_p^t; D_p), (37)
    else:
        g, extra, bound = local.gradient(program, z)
        constraints = (extra, bound)
    g = layer.objective(program, s, z, g, constraints)             # f'_p + ξ̃_p^t: G^t (10)
    z_new = iadmm_step(z, g, w, lam, rho, prox, radius, s["norm"])  # (8)/(9) ≡ (5)/(6) at ξ̃
    residual = None
    if local is not None:
        z_new = local.project(program, z_new, 1.0 / (rho + prox))
        residual = local.update_multipliers(program, z_new, dual_step, s["rng"])
    s["z"] = layer.output(s, z_new, sigma)                         # OutP only
    return {"z": s["z"], "multiplier_residual": residual}


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
