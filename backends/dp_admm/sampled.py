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

import warnings

from fedmodel.errors import FedModelError
from fedmodel.runtime.messages import procedure
from fedmodel.runtime.privacy import clipped_records, gaussian_noise, record_count, sampled_clipped_gradient

# a run whose released fraction of clipped records at its point (pooled over the clients) is above
# this is warned about: 40 % clipped held wine least squares 3.7 relative off at ε 1000 (the fixed
# point of the clipped gradients), so the bias shows well below half; the built-in NP model at
# ε 8 reads 0.09 (its count's noise σ√P/N ≈ 0.07: 0.1 would warn on its noise)
MOSTLY_CLIPPED = 0.2


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


# ---- the clipped records' count (honest15): released once, at the run's point -----------------
# Clipping biases the run towards the clipped-gradient point: with every record clipped (wine
# least squares, y = quality 3..9 as shipped, C = 1) more budget gave a WORSE answer (ε 1 / 3 / 8 /
# 1000: 2.39 / 3.05 / 3.31 / 3.68 relative off) with no warning. How many records are clipped is
# data-dependent, so it is released with N(0, σ²) noise (one record moves it by at most 1) from
# the client's own generator, at the rounds' σ, and spent from the budget: `calibrated_noise`
# and the accountant compose it (`accounting.sampled_gaussian_event`'s `counts`).

@procedure("dp_admm_clipped", {"x": "x", "noise": "1", "clip": "1"}, {"count": "1", "records": "1"})
def _clipped(program, x, noise, clip):
    """The number of the client's records whose gradient term at the server's point x (public) is
    clipped (L2 norm above C/I_p, as the rounds clip it), plus N(0, `noise`²)."""
    records = record_count(program)
    count = clipped_records(program, np.asarray(x, float), float(clip) / records)
    return {"count": float(count + gaussian_noise(program.state["dp_admm"]["rng"], float(noise), ())),
            "records": float(records)}


def clipped_fraction(backend, ex, clients, w: np.ndarray) -> dict:
    """{client: the released fraction of its records clipped at w} (`_clipped`, one round trip),
    with a warning where the pooled fraction is above MOSTLY_CLIPPED: the run tends to the clipped-gradient
    point, which more budget does not move towards the model's optimum."""
    replies = ex.map("dp_admm_clipped", {c: {"x": w, "noise": backend.noise_multiplier, "clip": backend.clip}
                                         for c in clients})
    fractions = {c: float(np.clip(r["count"] / r["records"], 0.0, 1.0)) for c, r in replies.items()}
    # pooled over the clients (its noise σ·√P over all records, not σ over one client's)
    mean = float(np.clip(sum(r["count"] for r in replies.values()) /
                         max(sum(r["records"] for r in replies.values()), 1.0), 0.0, 1.0))
    if mean > MOSTLY_CLIPPED:
        warnings.warn(
            f"dp-admm: {mean:.0%} of the records' gradients are clipped at the returned point "
            f"(clip C = {backend.clip:g}, a noisy count released privately and included in the "
            "reported ε; info['privacy']['clipped']): the run tends to the clipped-gradient point, "
            "not the model's optimum, and more budget does not remove that bias. Give clip= in the "
            "loss's units (about a typical record's gradient norm ‖∇ℓ(w; x_i)‖₂, e.g. with the "
            "target y in its own units, |x·w − y|·‖x‖), or rescale the data", RuntimeWarning, stacklevel=6)
    return fractions
