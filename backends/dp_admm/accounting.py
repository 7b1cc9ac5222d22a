"""Privacy accounting of DP-IADMM (per client; each round releases one z_p, ε̄-DP for ObjP/ObjT
— Theorems 1, 3 — and (ε̄, δ̄)-DP for OutP), over the rounds actually run, for a schedule
ε_1..ε_T:
  basic      ε = Σ_t ε_t,  δ = Σ_t δ_t
  advanced   ε = √(2 ln(1/δ') Σ_t ε_t²) + Σ_t ε_t (e^{ε_t} − 1),  δ = Σ_t δ_t + δ'
             (Dwork, Rothblum & Vadhan 2010; Dwork & Roth, Thm 3.20 for equal ε_t).
  rdp, pld   ε at the requested δ of the rounds composed as DP events (Laplace for ObjP/ObjT,
             Gaussian for OutP) by Google's dp-accounting: its Rényi-DP and privacy-loss-
             distribution accountants. `rounds_within` is the budget: the most rounds whose PLD ε
             stays within a total ε.
"""
from __future__ import annotations

import math

import dp_accounting
import numpy as np
from dp_accounting import pld, rdp


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


# ---- Google's dp-accounting: each round's release as a DP event -------------------------------
# ObjP/ObjT release a post-processing of the gradient plus Laplace noise of scale Δ̄/ε_t (11a):
# a Laplace mechanism whose noise_multiplier (scale / L1 sensitivity) is 1/ε_t. OutP adds
# N(0, σ²) to z with σ = Δ₂·√(2 ln(1.25/δ̄))/ε̄ (spec 2.6, Huang et al.'s Theorem 4 calibration,
# Δ₂ = 2(c1/I_p)/(ρ + 1/η̂)): a Gaussian mechanism with noise_multiplier σ/Δ₂ = √(2 ln(1.25/δ̄))/ε̄,
# the same in every round. Every client takes part in every round, so no subsampling applies.

def round_event(mechanism: str, epsilon: float, delta: float = 0.0,
                shares: tuple[float, ...] = (1.0,)) -> dp_accounting.DpEvent:
    """One round's release at ε_t = `epsilon` (> 0, finite): "laplace" (ObjP/ObjT; with
    `shares`, several Laplace releases at ε_t·s each, e.g. the gradient and the local constraints'
    values, `constrained`) or "gaussian" (OutP, calibrated to (ε_t, `delta`) by the classic
    Gaussian mechanism)."""
    if mechanism == "laplace":
        events = [dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / (epsilon * s)) for s in shares]
        return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)
    if mechanism == "gaussian":
        return dp_accounting.GaussianDpEvent(
            noise_multiplier=math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon)
    raise ValueError(f"unknown mechanism {mechanism!r}")


def schedule_event(mechanism: str, epsilons, delta: float = 0.0) -> dp_accounting.DpEvent:
    """The rounds of a schedule ε_1..ε_T composed, runs of equal ε_t as one self-composed event
    (so a constant 20000-round schedule is a single event)."""
    runs: list[list] = []
    for eps in np.asarray(epsilons, float).ravel():
        if runs and runs[-1][0] == eps:
            runs[-1][1] += 1
        else:
            runs.append([float(eps), 1])
    events = [dp_accounting.SelfComposedDpEvent(round_event(mechanism, eps, delta), count)
              for eps, count in runs]
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def _pld_interval(event: dp_accounting.DpEvent) -> float:
    """The PLD grid: 1/100 of the smallest per-round loss scale (ε_t for Laplace, whose loss lies
    in [−ε_t, ε_t]; 1/noise_multiplier for Gaussian; q times that for a Poisson-sampled round). The
    library's fixed 1e-4 makes a 20000-round ε̄ = 1 schedule take 30 s; this grid takes 0.2 s and
    moves ε by < 1e-5 relative."""
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return min(_pld_interval(e) for e in event.events)
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        # a sampled round's loss is about q times its mechanism's: the unscaled grid overstated
        # ε by 0.2 % (q = 0.05, σ = 1.2, T = 1000) to 8 % (q = 0.01, σ = 3, T = 10⁴)
        return event.sampling_probability * _pld_interval(event.event)
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return _pld_interval(event.event)
    return 1e-2 / event.noise_multiplier


def pld_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    """ε at `delta` of `event` from the privacy-loss-distribution accountant (pessimistic grid:
    an upper bound)."""
    accountant = pld.PLDAccountant(value_discretization_interval=_pld_interval(event))
    return float(accountant.compose(event).get_epsilon(delta))


def rdp_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    """ε at `delta` of `event` from the Rényi-DP accountant (the library's orders)."""
    return float(rdp.RdpAccountant().compose(event).get_epsilon(delta))


def accountant_bounds(mechanism: str, epsilon: float, rounds: int, delta: float,
                      round_delta: float = 0.0,
                      shares: tuple[float, ...] = (1.0,)) -> dict[str, tuple[float, float]]:
    """{"rdp": (ε, δ), "pld": (ε, δ)} of `rounds` rounds at ε_t = `epsilon` (OutP: calibrated to
    δ̄ = `round_delta`), ε at the total δ = `delta`; no release is (0, 0), ε̄ = ∞ is (∞, δ)."""
    if rounds == 0:
        return {"rdp": (0.0, 0.0), "pld": (0.0, 0.0)}
    if math.isinf(epsilon):
        return {"rdp": (math.inf, delta), "pld": (math.inf, delta)}
    event = dp_accounting.SelfComposedDpEvent(round_event(mechanism, epsilon, round_delta, shares),
                                              rounds)
    return {"rdp": (rdp_epsilon(event, delta), delta), "pld": (pld_epsilon(event, delta), delta)}


def privacy_report(mechanism: str, epsilon: float, rounds: int, delta: float, round_delta: float,
                   shares: tuple[float, ...], formal: bool, bounds: dict | None = None) -> dict:
    """`info["privacy"]` less the composition bounds: the accountants' ε at `delta` (`accountant_bounds`),
    the per-round guarantee and its `shares`, and whether it is formal (`formal`: the run's
    sensitivity holds over all neighbours; a run with no release or ε̄ = ∞ never is)."""
    if bounds is None:
        bounds = accountant_bounds(mechanism, epsilon, rounds, delta, round_delta, shares)
    return bounds | {
        "per_round": (epsilon, round_delta), "rounds": rounds, "round_shares": shares,
        "formal": bool(formal and math.isfinite(epsilon) and rounds > 0),
        "composition_delta": delta,
        "note": "per client; formal only with sensitivity='clip' or a data-independent bound "
                "(ObjP/ObjT) or outp_std='sigma' with valid constants (OutP)"}


def rounds_within(mechanism: str, epsilon: float, budget: float, delta: float, limit: int,
                  round_delta: float = 0.0, shares: tuple[float, ...] = (1.0,)) -> int:
    """The most rounds T ≤ `limit` (≥ 1) at ε_t = `epsilon` (finite) whose PLD ε at `delta` is ≤
    `budget`. ε(T) grows smoothly with T, so the bracket low ≤ T < high shrinks by regula falsi
    with the Illinois safeguard: a few PLD evaluations where bisection takes log2(limit)."""
    one = round_event(mechanism, epsilon, round_delta, shares)

    def spent(rounds: int) -> float:
        return pld_epsilon(dp_accounting.SelfComposedDpEvent(one, rounds), delta)

    low, high, e_low, e_high = 0, limit, 0.0, spent(limit)      # e_low ≤ budget < e_high
    if e_high <= budget:
        return limit
    kept = 0                    # +1 / −1: the last step moved low / high
    while high - low > 1:
        guess = low + (high - low) * (budget - e_low) / (e_high - e_low)
        middle = min(max(round(guess), low + 1), high - 1)
        value = spent(middle)
        if value <= budget:
            low, e_low = middle, value
            if kept == 1:       # high is stale twice: halve its excess (Illinois)
                e_high = budget + (e_high - budget) / 2
            kept = 1
        else:
            high, e_high = middle, value
            if kept == -1:
                e_low = budget - (budget - e_low) / 2
            kept = -1
    return low


def calibrated_epsilon(budget: float, delta: float, rounds: int,
                       shares: tuple[float, ...] = (1.0,)) -> float:
    """The largest ε̄ per round (to 0.1 % relative) whose `rounds` Laplace rounds (`shares`) have a
    PLD ε at `delta` ≤ `budget`: noise calibrated to a total budget. Bisection on log ε̄ between
    budget/rounds (always within: PLD ≤ basic composition) and budget (one round spends ε̄)."""
    def spent(eps: float) -> float:
        return pld_epsilon(dp_accounting.SelfComposedDpEvent(
            round_event("laplace", eps, 0.0, shares), rounds), delta)

    low, high = budget / rounds, budget
    if spent(high) <= budget:
        return high
    while high / low > 1.001:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if spent(middle) <= budget else (low, middle)
    return low


# ---- the subsampled Gaussian mechanism (`sampled.SampledGaussianObjective`) --------------------
# Each round a client sums the clipped gradient terms (L2 norm ≤ C each) of a Poisson sample of
# its records (rate q) and adds N(0, (σC)²) to the sum: adding or removing one record moves the
# sum by at most C in L2, so a round is the sampled Gaussian mechanism of DP-SGD (Abadi et al.
# 2016), a `PoissonSampledDpEvent(q, GaussianDpEvent(σ))`; T rounds are its T-fold composition
# (add/remove neighbours, the relation Poisson subsampling amplifies).

def sampled_gaussian_event(noise_multiplier: float, rate: float, rounds: int,
                           counts: int = 0) -> dp_accounting.DpEvent:
    """`rounds` rounds of the sampled Gaussian mechanism (noise σ = `noise_multiplier`, Poisson
    sampling rate q = `rate`; q = 1 is the plain Gaussian mechanism), composed with `counts`
    releases of a count that one record moves by at most 1, each with N(0, σ²) noise and no
    sampling (the clipped-record count, `sampled.clipped_fraction`)."""
    one = dp_accounting.GaussianDpEvent(noise_multiplier)
    if rate < 1.0:
        one = dp_accounting.PoissonSampledDpEvent(rate, one)
    event = dp_accounting.SelfComposedDpEvent(one, rounds)
    if counts:
        event = dp_accounting.ComposedDpEvent([event, dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(noise_multiplier), counts)])
    return event


def sampled_gaussian_epsilons(noise_multiplier: float, rate: float, rounds: int, delta: float,
                              counts: int = 0) -> dict[str, tuple[float, float]]:
    """{"rdp": (ε, δ), "pld": (ε, δ)} of `rounds` sampled Gaussian rounds and `counts` count
    releases (`sampled_gaussian_event`) at `delta`."""
    if rounds == 0 and not counts:
        return {"rdp": (0.0, 0.0), "pld": (0.0, 0.0)}
    event = sampled_gaussian_event(noise_multiplier, rate, rounds, counts)
    return {"rdp": (rdp_epsilon(event, delta), delta), "pld": (pld_epsilon(event, delta), delta)}


def calibrated_noise(budget: float, delta: float, rounds: int, rate: float, counts: int = 0) -> float:
    """The smallest noise multiplier σ (to 0.1 % relative) whose `rounds` sampled Gaussian rounds
    at rate q and `counts` count releases have a PLD ε at `delta` ≤ `budget` (the noise
    `epsilon_total` asks for). Bisection on log σ; the bracket is widened until it holds the answer."""
    def spent(sigma: float) -> float:
        return pld_epsilon(sampled_gaussian_event(sigma, rate, rounds, counts), delta)

    low, high = 0.5, 2.0
    while spent(high) > budget:
        low, high = high, 4.0 * high
    while spent(low) <= budget and low > 1e-3:
        low, high = low / 4.0, low
    while high / low > 1.001:
        middle = math.sqrt(low * high)
        low, high = (low, middle) if spent(middle) <= budget else (middle, high)
    return high


class RunAccounting:
    """The accounting of a DP-IADMM run, per client, from the backend's options (`epsilon`,
    `variant`, `delta`, `composition_delta`, `epsilon_total`, `max_rounds`)."""

    def privacy(self, rounds: int) -> dict:
        """`composition` of `rounds` rounds at (ε̄, 0) (ObjP/ObjT) or (ε̄, δ̄) (OutP), per client."""
        eps, dlt = self.epsilon, self._round_delta()
        if rounds == 0:
            return composed(0.0, 0.0, 0.0, 0.0, self.composition_delta)
        # with the clipped records' count (a Gaussian release at σ, unsampled: its own ε)
        counts = self.clip_counts
        terms = [(rounds, eps)] + ([(counts, self.count_epsilon)] if counts else [])
        return composed(sum(k * e for k, e in terms), sum(k * e * e for k, e in terms),
                        sum(k * e * (math.expm1(e) if e < 700.0 else math.inf) for k, e in terms),
                        rounds * dlt + counts * self.composition_delta, self.composition_delta)

    def accountant(self, rounds: int, shares: tuple[float, ...] = (1.0,)) -> dict[str, tuple[float, float]]:
        """The RDP and PLD accountants' ε at composition_delta after `rounds` rounds (`shares`:
        a round's releases)."""
        if self.sampled:     # (with the clipped-record count where it was released)
            return sampled_gaussian_epsilons(self.noise_multiplier, self.sample_rate, rounds,
                                             self.composition_delta, self.clip_counts)
        return accountant_bounds(self._mechanism(), self.epsilon, rounds, self.composition_delta,
                                 self._round_delta(), shares)

    def budget_rounds(self, shares: tuple[float, ...] = (1.0,)) -> int:
        """The rounds a run may release: max_rounds, or fewer where they would take the PLD ε (at
        δ = composition_delta) past `epsilon_total` (`shares`: a round's releases)."""
        if self.epsilon_total is None or self.sampled:    # (sampled: σ spends it in max_rounds)
            return self.max_rounds
        return rounds_within(self._mechanism(), self.epsilon, self.epsilon_total,
                             self.composition_delta, self.max_rounds, self.delta, shares)

    def _mechanism(self) -> str:
        return "sampled_gaussian" if self.sampled else "gaussian" if self.variant == "outP" else "laplace"

    def _round_delta(self) -> float:
        """δ̄ of a round's (ε̄, δ̄): OutP's calibration δ; the sampled Gaussian round's ε̄ is its
        PLD ε at composition_delta (`sampled_gaussian_epsilons`); a Laplace round's is pure."""
        if self.sampled and math.isfinite(self.epsilon):
            return self.composition_delta
        return self.delta if self.variant == "outP" and math.isfinite(self.epsilon) else 0.0
