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
the gradient, their values on their own (σ split by `DPADMM._noised`)."""
from __future__ import annotations

from dataclasses import dataclass

from fedmodel.errors import FedModelError
from fedmodel.runtime.privacy import gaussian_noise, record_count, sampled_clipped_gradient


@dataclass
class SampledGaussianObjective:
    """Objective perturbation by the subsampled Gaussian mechanism (see the module docstring):
    `noise_multiplier` σ, `rate` q ∈ (0, 1], `record_bound` C/I_p (the L2 clip of a record's
    term of f'_p). A DP layer of the client's step, as `client.LaplaceObjective`: it perturbs
    the step's linear term (`objective`) and leaves its result (`output`)."""

    noise_multiplier: float
    rate: float
    record_bound: float
    perturbs = None     # (not by `client.release`: `objective` perturbs one client's term itself)

    def objective(self, program, state, z, grad, constraints=None):
        """f̃'_p: the sampled clipped gradient plus noise; with local constraints that read data
        (`constrained`: their clipped Σ_j μ_j ∇c_j and its L2 sensitivity), one release of the
        sum, its noise σ times the summed sensitivity (every record, q = 1)."""
        sensitivity, extra = self.record_bound, None
        if constraints is not None:
            extra, bound = constraints
            if bound > 0 and self.rate < 1.0:
                raise FedModelError(f"client {program.name!r}: its constraints read its records, and "
                                    "the sampled release does not sample them: use sample_rate=1")
            sensitivity += bound
        rng = state["rng"]
        sample = rng.random(record_count(program)) < self.rate if self.rate < 1.0 else None
        estimate = sampled_clipped_gradient(program, z, grad, self.record_bound, sample, self.rate)
        if extra is not None:
            estimate = estimate + extra
        std = self.noise_multiplier * sensitivity
        noise = gaussian_noise(rng, std, grad.shape)
        state["log"].add(std, noise)
        return estimate + noise / self.rate

    def output(self, state, z, sigma):
        """The step's result, unperturbed (objective perturbation only)."""
        return z
