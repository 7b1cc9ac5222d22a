"""Privacy accounting of DP-IADMM (per client; each round releases one z_p, ε̄-DP for ObjP/ObjT
— Theorems 1, 3 — and (ε̄, δ̄)-DP for OutP), over the rounds actually run, for a schedule
ε_1..ε_T:
  basic      ε = Σ_t ε_t,  δ = Σ_t δ_t
  advanced   ε = √(2 ln(1/δ') Σ_t ε_t²) + Σ_t ε_t (e^{ε_t} − 1),  δ = Σ_t δ_t + δ'
             (Dwork, Rothblum & Vadhan 2010; Dwork & Roth, Thm 3.20 for equal ε_t).
"""
from __future__ import annotations

import math

import numpy as np


def composition(epsilons, deltas=0.0, delta_prime: float = 1e-6) -> dict[str, tuple[float, float]]:
    """Cumulative privacy loss of mechanisms that are (ε_t, δ_t)-DP: basic (Σε_t, Σδ_t) and
    advanced (√(2 ln(1/δ')Σε_t²) + Σε_t(e^{ε_t} − 1), Σδ_t + δ'); `best` is the smaller ε."""
    eps = np.asarray(epsilons, float).ravel()
    dlt = np.broadcast_to(np.asarray(deltas, float), eps.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        return composed(float(eps.sum()), float(np.sum(eps ** 2)), float(np.sum(eps * np.expm1(eps))),
                         float(dlt.sum()), delta_prime)


def composed(s1: float, s2: float, s3: float, sd: float, delta_prime: float) -> dict:
    """`composition` from the running sums Σε, Σε², Σε(e^ε − 1), Σδ."""
    basic = (s1, sd)
    advanced = (math.sqrt(2.0 * math.log(1.0 / delta_prime) * s2) + s3 if math.isfinite(s1)
                else math.inf, sd + delta_prime)
    return {"basic": basic, "advanced": advanced, "best": min(basic, advanced)}
