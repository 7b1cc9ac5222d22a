"""Client-level differential privacy for FedAvg / FedProx (DP-FedAvg, McMahan et al. 2018;
issue 28, item 3): `FedAvg(step=α, epsilon_total=E, clip=S)`.

The unit of privacy is a client: the sequence of server models x̂^1..x̂^T is (E, δ)-DP with
respect to adding or removing one client's whole data. Each round the server

1. samples the clients: each independently with probability q (`sample_rate`; Poisson sampling,
   the server's own seeded generator),
2. sends x̂ to the sampled clients, which run their local update (52) and reply x_i,
3. clips each update Δ_i = x_i − x̂ to L2 norm ≤ S,
4. adds N(0, (σS)² I) to the sum and moves x̂ ← x̂ + (Σ_i clip(Δ_i) + noise)/(q·n) (a fixed
   denominator, so one client moves the sum by at most S), then applies the server's terms.

A round is the sampled Gaussian mechanism (`dp_admm.accounting.sampled_gaussian_event`), T rounds
its composition; σ is calibrated so that `max_rounds` rounds spend E (PLD at δ). Trust model:
central DP — the server sees each sampled client's update before clipping and noising it (the
noise must not be left to the clients: with secure aggregation the noise would have to be added
in a distributed way, which is not built). Clients with constraints are refused: their
multiplier steps report values (the dual residual) the accountant does not cover.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedmodel.errors import FedModelError
from .common import check_number, progress
from .dp_admm.accounting import calibrated_noise, sampled_gaussian_epsilons
from .outcome import Outcome, Status

# The rounds a client-level budget is spent in when max_rounds is not given (the noise per round
# grows like √T at a fixed total ε)
CLIENT_DP_ROUNDS = 100


@dataclass(frozen=True)
class ClientPrivacy:
    """The client-level DP settings of a FedAvg / FedProx run (checked)."""

    epsilon_total: float
    delta: float
    clip: float
    sample_rate: float
    seed: int | None

    @classmethod
    def from_options(cls, name: str, epsilon_total, delta, clip, sample_rate, seed) -> "ClientPrivacy | None":
        """The settings, or None without `epsilon_total` (then the other options must be left
        at their defaults)."""
        if epsilon_total is None:
            if clip is not None or sample_rate != 1.0:
                raise FedModelError(f"{name}: clip and sample_rate are client-level DP settings; "
                                    "give epsilon_total (the total budget) with them")
            return None
        if clip is None:
            raise FedModelError(f"{name}(epsilon_total=...) needs clip=S, the L2 norm a client's "
                                "update x_i − x̂ is clipped to (in the model's units: about the "
                                "size of a typical update; the noise's scale is σ·S)")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise FedModelError(f"{name}: seed must be a nonnegative integer or None, got {seed!r}")
        return cls(check_number(f"{name}: epsilon_total", epsilon_total, 0.0, math.inf),
                   check_number(f"{name}: delta", delta, 0.0, 1.0),
                   check_number(f"{name}: clip", clip, 0.0, math.inf),
                   check_number(f"{name}: sample_rate", sample_rate, 0.0, 1.0, closed=True), seed)


def check_model(name: str, problem) -> None:
    """Refuse what a client-level DP run cannot account for: client constraints."""
    constrained = [c.name for c in problem.clients if c.constraints]
    if constrained:
        raise FedModelError(f"{name} with client-level DP: clients {constrained} have constraints, "
                            "whose multiplier steps report values the accountant does not cover; "
                            "use DPADMM(epsilon_total=...) (record-level, constraints released with "
                            "noise) or drop the constraints")


def private_rounds(backend, privacy: ClientPrivacy, ex, xhat: np.ndarray, server_used: bool,
                   callback, verbose: bool) -> Outcome:
    """DP-FedAvg's loop (the module docstring) for a distributed-PA backend (`special_cases`):
    its local update (`dald_cc_solve`), its server step on the server's terms."""
    name, clients, d = type(backend).__name__, tuple(ex.clients), xhat.size
    rounds, n, q = backend.max_rounds, len(ex.clients), privacy.sample_rate
    sigma = calibrated_noise(privacy.epsilon_total, privacy.delta, rounds, q)
    rng = np.random.default_rng(privacy.seed)
    ex.map_stacked("dald_cc_init", clients, rows={"rho": np.array([backend._rho(c, d) for c in clients])},
                   common={"x0": xhat, "beta": backend._beta()})
    opts, history = backend._opts(), []
    watch = backend._watch()
    bar = progress(rounds, verbose, name)
    status, k = Status.MAX_ITERATIONS, 0
    while k < rounds:
        k += 1
        sampled = tuple(c for c, u in zip(clients, rng.random(n)) if u < q)
        total = rng.normal(0.0, sigma * privacy.clip, d)
        if sampled:
            X = np.asarray(ex.map_stacked("dald_cc_solve", sampled, common={"xhat": xhat, **opts})["x"], float)
            delta = X - xhat
            norms = np.linalg.norm(delta, axis=1)
            scale = np.minimum(1.0, privacy.clip / np.maximum(norms, 1e-300))
            total = total + (scale[:, None] * delta).sum(axis=0)
        new = backend._with_server_terms(ex, xhat + total / (q * n), n, xhat, server_used)
        if watch.check(k, **{"x̂ (server model)": new}):
            status = watch.report({})
            break
        record = {"iteration": k, "dual_residual": float(np.max(np.abs(new - xhat), initial=0.0)),
                  "sampled": len(sampled)}
        xhat = new
        history.append(record)
        if callback:
            callback(record)
        bar.update(record)
    bar.close()
    ex.ledger.rounds = k
    spent = sampled_gaussian_epsilons(sigma, q, k, privacy.delta)
    info = {"privacy": spent | {
        "level": "client", "formal": True, "rounds": k, "noise_multiplier": sigma, "clip": privacy.clip,
        "sample_rate": q, "epsilon_total": privacy.epsilon_total, "composition_delta": privacy.delta,
        "note": "client-level (add/remove one client), central DP: the server clips and noises "
                "the sum of the sampled clients' updates"}}
    return Outcome(status, shared=xhat, history=history, iterations={"outer": k, "inner": k}, info=info)
