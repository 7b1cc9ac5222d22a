"""A client's local constraints in DP-IADMM's private step (ObjP), on the client.

Ryu & Kim's clients are unconstrained. With local constraints the ObjP step (8) becomes

    z_p^{t+1} = argmin_{z ∈ S_p} <g̃, z> + ρ/2‖w − z + λ_p/ρ‖² + (1/2η)‖z − z_p^t‖² + h_p(z)
              = prox_{h_p + ι_{S_p}, 1/(ρ + 1/η)}( the unconstrained step (8) ),

exact because the quadratic is isotropic: simple sets S_p (bounds, norm balls) are projections and
prox-able terms h_p (λ‖z‖₁) their prox — post-processing of the private step, free of privacy
cost. Every other constraint c_j(z) ≤ 0 (or = 0) enters through the Lagrangian: the step's linear
term is g̃ = ∇f_p(z^t) + Σ_j μ_j ∇c_j(z^t) + ξ̃, and after the step the client updates
μ_j ← [μ_j + η_t ĉ_j(z^{t+1})]₊ (a projected dual ascent step, η_t = `dual_step`/√t like the
primal step η^t = a/√t) from a released value ĉ_j. The non-private default instead steps by
half the Newton step on c_j's linearization and adds the multipliers' curvature to the z-step's
weight (`LocalConstraints.curvature_steps`, `lagrangian_curvature`; `DPADMM.curvature_dual`).

Privacy (per round ε̄ = ε_g + J·ε_c, J the client's constraints that read its data):
- ξ̃ is Laplace(Δ̄/ε_g) with Δ̄ = 2C/I_f + Σ_j μ_j·2C/I_j: every record's term of ∇f_p is clipped
  to L1 norm C/I_f and of ∇c_j to C/I_j (sensitivity="clip"), and replacing one record moves each
  function's clipped gradient by at most twice its bound (a sum over the functions, valid however
  records are shared between them). μ_j is a post-processing of earlier releases, so Δ̄ may use it.
- ĉ_j = c̃_j(z^{t+1}) + Laplace(2B/(I_j ε_c)), c̃_j with every record's term of the value clipped to
  [−B/I_j, B/I_j] (B = `value_clip`): the multipliers are computed from released values only, so
  z (which depends on them) stays a post-processing of the per-round releases.
Constraints that read no data are used exactly (no noise). `accounting` composes the round's
releases as one Laplace event at ε_g and J at ε_c.

With the Gaussian mechanism (`DPADMM(epsilon_total=E)`, `sampled`) the same releases are
Gaussian under add/remove neighbours: record terms of ∇c_j clipped to L2 norm C/I_j (the
gradient's sensitivity C/I_f + Σ_j μ_j C/I_j, noise σ_g times it) and each value's record terms
to [−B/I_j, B/I_j] (sensitivity B/I_j, noise σ_c times it); the round is then a Gaussian
mechanism with 1/σ² = 1/σ_g² + J/σ_c² (Gaussians compose exactly in μ-GDP).
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from fedmodel.compiler.codegen import Plan
from fedmodel.compiler.differentiate import grad as derive
from fedmodel.compiler.per_record import NotRecordSeparable
from fedmodel.constraints import Equality
from fedmodel.errors import FedModelError
from fedmodel.expression import Data
from fedmodel.runtime.privacy import (clipped_record_gradients, clipped_record_value,
                                      gaussian_noise, laplace_noise, record_count,
                                      sampled_clipped_gradient)


def has_local_terms(client) -> bool:
    """True when `client` (a block of the problem) has constraints or nonsmooth terms."""
    return bool(client.constraints) or not all(t.is_smooth() for t in client.terms)


def check_clients(problem, variant: str) -> None:
    """Refuse clients whose step DP-IADMM cannot take: private variables, or local constraints and
    nonsmooth terms outside ObjP (whose isotropic step makes them a prox; ObjT's trust region
    and OutP's output noise do not)."""
    for c in problem.clients:
        if c.private_variables or (has_local_terms(c) and variant != "objP"):
            what = "private variables" if c.private_variables else "local constraints or a nonsmooth term"
            raise FedModelError(
                f"client {c.name!r} has {what}: DP-IADMM's client step is over the shared variables "
                f"only, and takes local constraints and prox-able terms in the ObjP step "
                f"(variant='objP', the default), not in {variant}")


class _Compiled:
    """What a client's program says about its local constraints, compiled once per program (a
    cache, never checkpointed): the constraints, their multipliers, which read data, their
    record counts, and the plans of ∇f_p, ∇c_j (∇μ_jᵀc_j for vectors) and the values c_j."""

    def __init__(self, program):
        merit = program.merit_ir
        self.constraints = list(program.constraints)
        self.multipliers = [merit.multipliers[c.name] for c in self.constraints]
        self.reads_data = [any(isinstance(leaf, Data) for leaf in c.expr.leaves()) for c in self.constraints]
        self.records = [record_count(program, c.expr) for c in self.constraints]
        self.has_prox = bool(merit.prox_terms)
        shared = program.shared.variables
        outputs = [derive(merit.objective, v) for v in shared]
        for c, mu in zip(self.constraints, self.multipliers):
            if c.expr.ndim > 1:
                raise FedModelError(f"client {program.name!r}: DPADMM handles scalar and vector "
                                    f"constraints; {c.name!r} has shape {c.expr.shape}")
            term = c.expr if c.expr.shape == () else mu @ c.expr   # μ_j read from the parameter
            outputs += [derive(term, v) for v in shared]
        self.gradients = Plan(outputs, shared)
        self.values = Plan([c.expr for c in self.constraints], shared) if self.constraints else None
        self._jacobians = None

    def jacobians(self, program, z: np.ndarray) -> list[np.ndarray]:
        """Every constraint's Jacobian ∂c_j/∂z at z, one (m_j, d) array each (a scalar
        constraint: its gradient as one row); the plan compiled on first use (the non-private
        multiplier step, `LocalConstraints.curvature_step`, is its only reader)."""
        shared = program.shared.variables
        if self._jacobians is None:
            outputs, self._rows = [], []
            for c in self.constraints:
                parts = [c.expr] if c.expr.shape == () else [c.expr[k] for k in range(c.expr.shape[0])]
                self._rows.append(len(parts))
                outputs += [derive(part, v) for part in parts for v in shared]
            self._jacobians = Plan(outputs, shared)
        rows = _chunks(self._jacobians(*program.shared.unpack(z)), len(shared))
        flat = [program.shared.pack(list(part)) for part in rows]
        out, start = [], 0
        for m in self._rows:
            out.append(np.array(flat[start:start + m], dtype=float).reshape(m, -1))
            start += m
        return out


_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _compiled(program) -> _Compiled:
    if program not in _COMPILED:
        _COMPILED[program] = _Compiled(program)
    return _COMPILED[program]


@dataclass
class LocalConstraints:
    """A client's local-constraint step (the module docstring): the Lagrangian gradient, the prox
    of the local sets and terms, the multiplier update. Plain settings kept in the client's state
    (checkpoints carry them); the multipliers live in the program's merit. Exact until `privatize`:
    then records' gradient terms are clipped to C/I_j (C = `clip`), their value terms to B/I_j
    (B = `value_clip`), and each value is released at ε_c = `epsilon_c`."""

    private: bool = False
    clip: float = 1.0
    value_clip: float = 1.0
    epsilon_c: float = math.inf
    noise_c: float | None = None        # Gaussian releases: σ_c (None: Laplace at epsilon_c)
    curvature: list | None = None       # the largest ‖∂c_j‖²_F so far (`curvature_steps`)
    hessians: list | None = None        # each constraint component's curvature (`lagrangian_curvature`)

    @staticmethod
    def releases(program) -> int | None:
        """The number J of the client's constraints that read its data, or None when it has
        neither constraints nor prox-able terms (no local step)."""
        compiled = _compiled(program)
        return sum(compiled.reads_data) if compiled.constraints or compiled.has_prox else None

    def privatize(self, program, clip: float, value_clip: float, epsilon_c: float,
                  noise_c: float | None = None) -> None:
        """Release with noise from now on: Laplace at ε_c, or Gaussian with noise multiplier
        `noise_c` (L2 clipping). Data-dependent constraints must be scalar sums of per-record
        terms (FedModelError otherwise)."""
        self.private, self.clip, self.value_clip, self.epsilon_c = True, clip, value_clip, epsilon_c
        self.noise_c = noise_c
        compiled, z = _compiled(program), np.zeros(program.n_shared)
        for c, data in zip(compiled.constraints, compiled.reads_data):
            if not data:
                continue
            try:
                if c.expr.shape != ():
                    raise NotRecordSeparable(f"it has shape {c.expr.shape}")
                clipped_record_value(program, z, 1.0, of=c.expr)
                clipped_record_gradients(program, z, np.zeros_like(z), 1.0, of=c.expr)
            except NotRecordSeparable as error:
                raise FedModelError(
                    f"client {program.name!r}: constraint {c.name!r} reads the client's data, so a "
                    f"private run releases its value and gradient with per-record clipping, which needs "
                    f"a scalar constraint whose records enter as rows of `data @ w` ({error})") from None

    def gradient(self, program, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """(∇f_p(z), Σ_j μ_j ∇c_j(z), the latter's sensitivity): once private, every record's
        term of ∇c_j clipped to C/I_j and the sensitivity Σ_j μ_j·2C/I_j (L1, replace one record;
        Gaussian releases: L2, add/remove one record, Σ_j μ_j·C/I_j)."""
        compiled, d = _compiled(program), program.n_shared
        flat = [program.shared.pack(list(part)) if len(part) else np.zeros(d) for part in
                _chunks(compiled.gradients(*program.shared.unpack(z)), len(program.shared.variables))]
        grad_f, extra, bound = flat[0], np.zeros(d), 0.0      # ∇f_p: clipped by the DP layer
        for c, mu, data, records, g in zip(compiled.constraints, compiled.multipliers,
                                           compiled.reads_data, compiled.records, flat[1:]):
            if not np.any(mu.value):
                continue
            weight = float(mu.value) if c.expr.shape == () else 1.0   # vectors: μ_j is in g
            if self.private and data and self.noise_c is not None:
                g = sampled_clipped_gradient(program, z, g, self.clip / records, None, of=c.expr)
                bound += weight * self.clip / records
            elif self.private and data:
                g = clipped_record_gradients(program, z, g, self.clip / records, of=c.expr)
                bound += weight * 2.0 * self.clip / records
            extra = extra + weight * g
        return grad_f, extra, bound

    @staticmethod
    def project(program, z: np.ndarray, step: float) -> np.ndarray:
        """prox of the client's prox-able terms and projection onto its simple sets, with step
        1/(ρ + 1/η)."""
        return program.apply_prox(z, step) if _compiled(program).has_prox else z

    def update_multipliers(self, program, z: np.ndarray, step: float | None, rng,
                           stiffness: float | None = None) -> float:
        """μ_j ← [μ_j + η_j·ĉ_j(z)]₊ (= 0: no clamp) from released values ĉ_j, η_j = `step`, or
        (`stiffness` given: the non-private default) `curvature_step`'s η_j; returns
        max_j |Δμ_j|/η_j, the projected dual gradient (0 at a KKT point's multipliers)."""
        compiled = _compiled(program)
        if not compiled.constraints:
            return 0.0
        steps = self.curvature_steps(program, z, stiffness) if stiffness is not None \
            else [step] * len(compiled.constraints)
        released = [self.private and data for data in compiled.reads_data]
        # exact values where nothing is released (the clipped ones take their own pass)
        exact = compiled.values(*program.shared.unpack(z)) if not all(released) else [None] * len(released)
        residual = 0.0
        for c, mu, noisy, records, value, eta in zip(compiled.constraints, compiled.multipliers,
                                                     released, compiled.records, exact, steps):
            if noisy:
                bound = self.value_clip / records
                value = np.asarray(clipped_record_value(program, z, bound, of=c.expr))
                value = value + (laplace_noise(rng, 2.0 * bound, self.epsilon_c, value.shape)
                                 if self.noise_c is None else gaussian_noise(rng, self.noise_c * bound, value.shape))
                if self.noise_c is not None:    # (the knob: `VALUE_NOISE_STEP`)
                    eta = step * min(1.0, VALUE_NOISE_STEP / (self.noise_c * bound))
            value = np.asarray(value, float)
            new = mu.value + eta * value
            if not isinstance(c, Equality):
                new = np.maximum(new, 0.0)
            residual = max(residual, float(np.max(np.abs(new - mu.value), initial=0.0)) / eta)
            program.set_multipliers({c.name: new})     # the node's state and its merit's μ_j
        return residual

    def curvature_steps(self, program, z: np.ndarray, stiffness: float) -> list[float]:
        """The non-private multiplier steps η_j = DUAL_SCALE·s/‖∂c_j(z)‖²_F, s = `stiffness`
        = ρ + 1/η (the z-step's weight). Why: the next z-step moves z by −Δμ_j∇c_j/s, so c_j
        moves by −Δμ_j‖∇c_j‖²/s; with η_j‖∇c_j‖²/s = θ the multiplier's step is a damped
        Newton step on c_j's linearization (θ = 1: the step that zeroes it), stable for θ < 2
        whatever the constraint's scale. A fixed η (the private runs' dual_step/√t) is stable
        only while η‖∇c_j‖² < 2s: on the bench_verdicts NP models (‖∇c_j‖² ≈ 6–10, s ≈ 60)
        η_1 = 10 grew μ_j ×2 a round and the run diverged at round 23. Data-dependent, so
        never used by a private run (its steps are public: `dual_step`). ‖∂c_j‖² is the largest
        seen so far, so η_j never grows: where c_j flattens (an infeasible model's iterates
        running off towards a least violation at infinity, NP with r = 0.05) the step at the
        current point grew ×2.5 a round with z, and the run blew up in 19 rounds."""
        sizes = [float(np.sum(J * J)) for J in _compiled(program).jacobians(program, z)]
        self.curvature = [max(s, seen) for s, seen in zip(sizes, self.curvature or sizes)]
        return [DUAL_SCALE * stiffness / max(size, CURVATURE_FLOOR) for size in self.curvature]

    def lagrangian_curvature(self, program, z: np.ndarray) -> float:
        """Σ_j |μ_j|·L̂_j: the curvature the multipliers' terms add to the client's Lagrangian
        (L̂_j: each constraint component's largest curvature, estimated once, at the first z, by
        power iteration on its gradient's differences, `common.curvature_rows`). The
        linearized z-step is stable while its weight ρ + 1/η exceeds the Lagrangian's
        curvature; ρ = 2.2·L̂_p covers f_p only (`DPADMM._linearized`), so the non-private
        default adds LAGRANGIAN_MARGIN times this as a client-side proximal weight — zero at
        a fixed point, so the answer is unchanged. Without it NP's μ_j ≈ 1–5 made the step
        unstable (bench_verdicts np 2: z grew ×1.6 every 3 rounds from round 20)."""
        from ..common import curvature_rows
        compiled = _compiled(program)
        if self.hessians is None:
            sizes = [J.shape[0] for J in compiled.jacobians(program, z)]
            rows = [(j, k) for j, m in enumerate(sizes) for k in range(m)]

            def gradient(Z: np.ndarray) -> np.ndarray:
                return np.array([compiled.jacobians(program, x)[j][k] for x, (j, k) in zip(Z, rows)])
            estimate = curvature_rows(gradient, np.tile(np.asarray(z, float), (len(rows), 1))) \
                if rows else np.zeros(0)
            self.hessians, start = [], 0
            for m in sizes:
                self.hessians.append([float(e) for e in estimate[start:start + m]])
                start += m
        return float(sum(np.sum(np.abs(np.ravel(mu.value)) * np.asarray(L))
                         for mu, L in zip(compiled.multipliers, self.hessians)))


# The non-private default's proximal weight on the multipliers' curvature (`lagrangian_curvature`),
# the margin of its ρ = 2.2·L̂_p over f_p's.
LAGRANGIAN_MARGIN = 2.2
# The non-private multiplier step's fraction θ of the Newton step on a constraint's
# linearization (`LocalConstraints.curvature_steps`), and the floor of ‖∂c_j‖² (a constraint
# flat at z: its multiplier does not move z, so its step only needs to stay finite).
DUAL_SCALE = 0.5
CURVATURE_FLOOR = 1e-12


# The knob's multiplier step on a Gaussian-released value of noise s = σ_c·B/I_j (public: the
# noise, the value clip, the constraint's record count): η_t·min(1, VALUE_NOISE_STEP/s), so that
# one round's noise moves μ_j by at most VALUE_NOISE_STEP·η_t in standard deviation. μ_j is a
# running sum of noisy values, so its noise adds up over the rounds: on Neyman-Pearson on
# adult the default η_t = 10/√t let μ_j swing the model by 4 points of test error at E = 1
# (s = 0.52 at T = 300), 0.3–1 instead of 10 brought it within 1 (docs/privacy.md). Laplace
# (per-round ε̄) runs keep η_t.
VALUE_NOISE_STEP = 0.01


def local_constraints(program, mechanism: str, epsilon: float, sensitivity, clip, share: float,
                      value_clip: float, noise_c: float | None = None) -> tuple[LocalConstraints | None, int]:
    """The client's `LocalConstraints` at `dp_admm_init` (None when it has neither constraints
    nor prox-able terms) and the number of values it releases per round. A private client whose
    Laplace-released constraints read its data needs sensitivity="clip"."""
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


def _chunks(values: list, size: int) -> list[list]:
    """`values` cut into consecutive lists of `size`."""
    return [values[i:i + size] for i in range(0, len(values), size)]
