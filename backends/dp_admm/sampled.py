"""The subsampled Gaussian mechanism for DP-IADMM's objective perturbation (issue 28): the
record-level DP layer that `DPADMM(epsilon_total=E)` uses. Each round a client

1. draws a Poisson sample of its records (each record independently with probability q; q = 1:
   every record),
2. clips each sampled record's gradient term to L2 norm ≤ C/I_p (C in the mean-loss scale, as
   DP-SGD's clip norm: a record's ∇ℓ_i to ≤ C),
3. adds N(0, (σ·C/I_p)² I) to the sum of the clipped terms and divides by q,

and uses f̃'_p = r'_p + (Σ_{i∈S} clip(t_i) + noise)/q in place of f'_p in the z-step (5b) (r'_p: the
record-free part of the gradient, e.g. a data-free regularizer). Adding or removing one record
moves the clipped sum by at most C/I_p in L2, so a round is the sampled Gaussian mechanism
(`accounting.sampled_gaussian_event`); the step's result, z_p^{t+1}, is a post-processing of it
and of public values (w, λ_p, z_p^t). The ε the accountant reports holds for add/remove
neighbours of a client's records, per client. Local constraints that read the client's data
(`constrained`) are released with Gaussian noise too (q = 1): their clipped Σ_j μ_j ∇c_j with
the gradient, their values on their own (σ split by `DPADMM._noised`).

Shrinkage (`DPADMM(shrink=True)`, the default; issue 25 item 4). Client p's release estimates a
record part g_p of norm ≤ C (I_p terms clipped to C/I_p) with noise of expected squared norm
ν_p²C² (`noise_ratio`); among the estimates ω·(release), the one whose mean squared error
(1 − ω)²‖g_p‖² + ω²ν_p²C² is least in the worst case ‖g_p‖ = C is ω_p = 1/(1 + ν_p²)
(`shrinkage`; the Wiener weight). These are the two terms of the paper's Theorem 2 bound —
P·U_1² from the gradients, 2PJK·U_3²/ε̄² from the noise — taken per client. The z-step uses
r'_p + ω_p·(release): a post-processing of the release with public ω_p, so every client's
guarantee is the accountant's. A client of 5,000 records under E = 8 (a9a, d = 124: ν = 0.023)
keeps ω = 0.9995; a client of one record (ν = 116) gets ω = 7e-5, and its noise, shrunk to
ω·ν ≤ 1/2 clip norms, no longer sets the knob's ρ for everyone (`DPADMM.knob_penalty`): a9a,
five clients of 5,000 rows plus one of 1 row, E = 8: 15.82 % test error (without: 23.81 %;
the five alone: 15.55 %). The bias: the noise-free fixed point weights client p's data by ω_p,
which tends to 1 as the noise vanishes; the run warns naming the clients below 0.1 (ν > 3).
Weights from a longer window, 1/(1 + ν²/m) for m = 10 or 300 rounds of averaging, kept more of
the tiny client's noise and of its ρ: 16.32 % and 23.62 % (docs/BENCHMARKS.md, riders9)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime.privacy import gaussian_noise, record_count, sampled_clipped_gradient


def noise_ratio(noise: float, d: int, rate: float, records) -> np.ndarray:
    """ν_p = σ_g·√d/(q·I_p): one round's noise on client p's release (N(0, (σ_g·C/I_p)²) in each
    of d coordinates, divided by q), in norm, relative to the clip C — the largest norm of the
    clipped record part it estimates. From public values only (σ_g, d, q, the record counts)."""
    return noise * math.sqrt(d) / (rate * np.asarray(records, dtype=float))


def shrinkage(ratio) -> np.ndarray:
    """ω_p = 1/(1 + ν_p²), the weight of client p's noisy release in its z-step (module
    docstring): 1 − ν² for a client of many records, ≈ 1/ν² for one whose noise dwarfs its clip."""
    return 1.0 / (1.0 + np.asarray(ratio, dtype=float) ** 2)


@dataclass
class SampledGaussianObjective:
    """Objective perturbation by the subsampled Gaussian mechanism (see the module docstring):
    `noise_multiplier` σ, `rate` q ∈ (0, 1], `record_bound` C/I_p (the L2 clip of a record's
    term of f'_p), `shrink` ω_p (`shrinkage`; 1: none). A DP layer of the client's step, as
    `client.LaplaceObjective`: it perturbs the step's linear term (`objective`) and leaves its
    result (`output`)."""

    noise_multiplier: float
    rate: float
    record_bound: float
    shrink: float = 1.0
    perturbs = None     # (not by `client.release`: `objective` perturbs one client's term itself)

    def objective(self, program, state, z, grad, constraints=None):
        """f̃'_p: the record-free r'_p plus ω_p times the release — the sampled clipped gradient
        plus noise; with local constraints that read data (`constrained`: their clipped
        Σ_j μ_j ∇c_j and its L2 sensitivity), one release of the sum, its noise σ times the
        summed sensitivity (every record, q = 1)."""
        sensitivity, extra = self.record_bound, None
        if constraints is not None:
            extra, bound = constraints
            if bound > 0 and self.rate < 1.0:
                raise FedModelError(f"client {program.name!r}: its constraints read its records, and "
                                    "the sampled release does not sample them: use sample_rate=1")
            sensitivity += bound
        rng = state["rng"]
        sample = rng.random(record_count(program)) < self.rate if self.rate < 1.0 else None
        # r' + ω·Σ_S clip(t_i)/q: the weights kept_i·ω/q (`sampled_clipped_gradient` divides by its rate)
        estimate = sampled_clipped_gradient(program, z, grad, self.record_bound, sample, self.rate / self.shrink)
        if extra is not None:
            estimate = estimate + self.shrink * extra
        std = self.noise_multiplier * sensitivity
        noise = gaussian_noise(rng, std, grad.shape)
        state["log"].add(std, noise)
        return estimate + self.shrink * noise / self.rate

    def output(self, state, z, sigma):
        """The step's result, unperturbed (objective perturbation only)."""
        return z
