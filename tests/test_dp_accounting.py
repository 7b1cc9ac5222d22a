"""DP-ADMM's accounting on Google's dp-accounting (backends/dp_admm/accounting.py): the library's
ε against closed forms (Gaussian RDP and its RDP→(ε, δ) conversion, the exact privacy profiles
of the Gaussian and Laplace mechanisms), grouped schedules, PLD never looser than advanced
composition on the paper's schedules, and the budget search; the Poisson-subsampled Gaussian
rounds of `epsilon_total` (RDP and PLD, composed over rounds) against their closed forms and the
library's own composition."""
import math

import dp_accounting
import pytest
import numpy as np
from scipy import optimize, special, stats

from fedmodel.backends.dp_admm import PAPER_DPADMM
from fedmodel.backends.dp_admm.accounting import (accountant_bounds, composition, pld_epsilon, rdp_epsilon,
                                         round_event, rounds_within, sampled_gaussian_epsilons,
                                         sampled_gaussian_event, schedule_event)

PAPER_EPSILONS = (0.05, 0.1, 0.5, 1.0)        # ε̄ per round of the paper's MNIST experiments


@pytest.mark.parametrize("sigma, rounds, order", [(1.0, 1, 8.0), (4.0, 100, 32.0), (20.0, 20000, 3.0)])
def test_gaussian_rdp_matches_the_closed_form(sigma, rounds, order):
    # T Gaussian releases of noise multiplier σ: RDP of order α is Tα/(2σ²); the library turns it
    # into ε = rdp + ln(1 − 1/α) − ln(δα)/(α − 1) (Canonne, Kamath & Steinke 2020, Prop. 12)
    delta = 1e-6
    accountant = dp_accounting.rdp.RdpAccountant(orders=[order])
    accountant.compose(dp_accounting.GaussianDpEvent(sigma), rounds)
    rdp = rounds * order / (2 * sigma ** 2)
    expected = rdp + math.log1p(-1 / order) - math.log(delta * order) / (order - 1)
    assert accountant.get_epsilon(delta) == pytest.approx(max(expected, 0.0), rel=1e-12)


def _gaussian_epsilon(mu, delta):
    """Exact ε at δ of a Gaussian mechanism with μ = Δ/σ (Balle & Wang 2018):
    δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)."""
    def profile(eps):
        return stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps + stats.norm.logcdf(-mu / 2 - eps / mu))
    return optimize.brentq(lambda eps: profile(eps) - delta, 0.0, mu * mu / 2 + 10 * mu + 10, xtol=1e-14)


@pytest.mark.parametrize("epsilon, rounds", [(0.5, 1), (0.1, 100), (1.0, 2000)])
def test_pld_of_outp_rounds_matches_the_exact_gaussian_profile(epsilon, rounds):
    # T releases of noise multiplier z compose to one Gaussian of μ = √T/z; the PLD bound is
    # pessimistic and tight
    delta = 1e-6
    z = math.sqrt(2 * math.log(1.25 / 1e-6)) / epsilon            # OutP's calibration, δ̄ = 1e-6
    assert round_event("gaussian", epsilon, 1e-6) == dp_accounting.GaussianDpEvent(z)
    exact = _gaussian_epsilon(math.sqrt(rounds) / z, delta)
    bound = accountant_bounds("gaussian", epsilon, rounds, delta, 1e-6)["pld"]
    assert bound[1] == delta and exact <= bound[0] <= exact * (1 + 1e-3) + 1e-6


@pytest.mark.parametrize("epsilon", PAPER_EPSILONS)
def test_pld_of_one_laplace_release_is_its_exact_profile(epsilon):
    # Laplace of scale Δ/ε̄: δ(ε) = 1 − e^{(ε − ε̄)/2} for 0 ≤ ε ≤ ε̄, i.e. ε(δ) = ε̄ + 2 ln(1 − δ)
    assert round_event("laplace", epsilon) == dp_accounting.LaplaceDpEvent(1 / epsilon)
    for delta in (1e-6, 1e-3):                   # the PLD grid is pessimistic: above, and close
        exact = epsilon + 2 * math.log1p(-delta)
        assert exact - 1e-12 <= pld_epsilon(round_event("laplace", epsilon), delta) <= exact * (1 + 1e-5)


def test_a_varying_schedule_is_grouped_into_runs_of_equal_epsilon():
    schedule = [0.5] * 3 + [1.0] * 2 + [0.5]
    event = schedule_event("laplace", schedule)
    assert event == dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(2.0), 3),
        dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1.0), 2),
        dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(2.0), 1)])
    one_by_one = dp_accounting.ComposedDpEvent([round_event("laplace", e) for e in schedule])
    assert rdp_epsilon(event, 1e-6) == pytest.approx(rdp_epsilon(one_by_one, 1e-6), rel=1e-12)
    assert schedule_event("laplace", [0.1] * 20000) == dp_accounting.SelfComposedDpEvent(
        dp_accounting.LaplaceDpEvent(10.0), 20000)


@pytest.mark.parametrize("epsilon", PAPER_EPSILONS)
@pytest.mark.parametrize("rounds", [1, 10, 100, 1000, pytest.param(PAPER_DPADMM["max_rounds"], marks=pytest.mark.integration)])
def test_pld_is_never_looser_than_advanced_composition_on_the_paper_schedules(epsilon, rounds):
    delta = 1e-6
    objective = composition([epsilon] * rounds, 0.0, delta)
    bounds = accountant_bounds("laplace", epsilon, rounds, delta)      # ObjT/ObjP, δ = δ'
    assert bounds["pld"][0] <= min(objective["advanced"][0], objective["basic"][0]) * (1 + 1e-9)
    output = composition([epsilon] * rounds, 1e-6, delta)             # OutP: δ = Tδ̄ + δ' > δ'
    assert accountant_bounds("gaussian", epsilon, rounds, delta, 1e-6)["pld"][0] <= output["advanced"][0]


def test_no_release_and_no_noise():
    assert accountant_bounds("laplace", 0.5, 0, 1e-6) == {"rdp": (0.0, 0.0), "pld": (0.0, 0.0)}
    assert accountant_bounds("laplace", math.inf, 3, 1e-6)["pld"] == (math.inf, 1e-6)


@pytest.mark.parametrize("mechanism, epsilon, budget", [("laplace", 0.05, 5.0), ("laplace", 1.0, 3.0),
                                                        ("gaussian", 0.5, 4.0), ("laplace", 0.5, 0.1)])
def test_rounds_within_a_budget_is_the_largest_affordable(mechanism, epsilon, budget):
    rounds = rounds_within(mechanism, epsilon, budget, 1e-6, 20000, 1e-6)
    spent = lambda t: accountant_bounds(mechanism, epsilon, t, 1e-6, 1e-6)["pld"][0]
    assert spent(rounds) <= budget < spent(rounds + 1)
    assert rounds == 0 or rounds_within(mechanism, epsilon, budget, 1e-6, rounds, 1e-6) == rounds
    assert rounds_within(mechanism, epsilon, 1e9, 1e-6, 50, 1e-6) == 50         # the limit binds


def test_progress_bar_shows_the_privacy_spent():
    from fedmodel.backends.common import _Bar     # what `progress` shows when stderr is a terminal
    bar = _Bar(3, "DP-ADMM")
    bar.update({"objective": 1.0, "violation": 0.0, "round": 1, "epsilon_advanced": 0.5})
    assert "ε=5.0e-01" in bar.bar.postfix
    bar.close()


# ---- the Poisson-subsampled Gaussian rounds of `epsilon_total` (accounting.sampled_gaussian_*) ----
# Each test would fail if the rounds were accounted unsampled (as GaussianDpEvent(σ)): at the rates
# used the unsampled ε is at least 1.3 times the sampled one (1.5–3.5 for one round).

def _sampled_gaussian_rdp(rate, sigma, order):
    """RDP of integer order α of one Poisson-sampled Gaussian round (add/remove, sensitivity 1):
    ln(Σ_k C(α,k)(1−q)^{α−k} q^k e^{(k²−k)/(2σ²)})/(α − 1) (Mironov, Talwar & Zhang 2019, §3.3)."""
    k = np.arange(order + 1)
    terms = (np.log(special.comb(order, k)) + (order - k) * math.log1p(-rate) + k * math.log(rate)
             + (k * k - k) / (2 * sigma ** 2))
    return float(special.logsumexp(terms)) / (order - 1)


@pytest.mark.parametrize("rate, sigma, rounds, order", [(0.1, 1.0, 1, 8), (0.2, 5.0, 300, 32),
                                                        (0.5, 2.0, 50, 3), (0.05, 0.9, 1000, 12)])
def test_sampled_gaussian_rdp_composes_as_the_closed_form(rate, sigma, rounds, order):
    # T rounds: T times one round's RDP at each order, converted as in
    # test_gaussian_rdp_matches_the_closed_form
    delta = 1e-6
    accountant = dp_accounting.rdp.RdpAccountant(orders=[float(order)])
    accountant.compose(sampled_gaussian_event(sigma, rate, rounds))
    rdp = rounds * _sampled_gaussian_rdp(rate, sigma, order)
    expected = rdp + math.log1p(-1 / order) - math.log(delta * order) / (order - 1)
    assert accountant.get_epsilon(delta) == pytest.approx(max(expected, 0.0), rel=1e-9)
    assert rdp < 0.7 * rounds * order / (2 * sigma ** 2)           # unsampled: Tα/(2σ²)
    # the run's report (the library's orders) is no looser than this one order
    assert sampled_gaussian_epsilons(sigma, rate, rounds, delta)["rdp"][0] <= expected * (1 + 1e-12)


def _sampled_gaussian_delta(rate, sigma, eps):
    """The exact δ(ε) of one Poisson-sampled Gaussian round under add/remove (sensitivity 1):
    the larger hockey-stick divergence between P = (1−q)N(0, σ²) + qN(1, σ²) and Q = N(0, σ²),
    in either order. Their likelihood ratio (1 − q) + q·e^{(2x−1)/(2σ²)} is monotone in x, so
    each divergence is a difference of normal tails at the point where the ratio crosses e^{±ε}."""
    e = math.exp(eps)
    x = sigma ** 2 * math.log((e - (1 - rate)) / rate) + 0.5               # P/Q > e^ε for x > x*
    remove = ((1 - rate) * stats.norm.sf(x / sigma) + rate * stats.norm.sf((x - 1) / sigma)
              - e * stats.norm.sf(x / sigma))
    if math.exp(-eps) <= 1 - rate:                                         # Q/P ≤ 1/(1 − q) < e^ε
        return remove
    x = sigma ** 2 * math.log((math.exp(-eps) - (1 - rate)) / rate) + 0.5  # Q/P > e^ε for x < x'
    add = stats.norm.cdf(x / sigma) - e * ((1 - rate) * stats.norm.cdf(x / sigma)
                                           + rate * stats.norm.cdf((x - 1) / sigma))
    return max(remove, add)


@pytest.mark.parametrize("rate, sigma", [(0.2, 1.0), (0.05, 0.8), (0.5, 3.0), (0.01, 0.6)])
def test_pld_of_one_sampled_gaussian_round_is_its_exact_profile(rate, sigma):
    delta = 1e-6
    exact = optimize.brentq(lambda eps: _sampled_gaussian_delta(rate, sigma, eps) - delta, 1e-9, 50.0,
                            xtol=1e-14)
    ours = pld_epsilon(sampled_gaussian_event(sigma, rate, 1), delta)
    assert exact - 1e-12 <= ours <= exact * (1 + 1e-4)                    # pessimistic and tight
    assert pld_epsilon(sampled_gaussian_event(sigma, 1.0, 1), delta) > 1.5 * ours   # unsampled


@pytest.mark.parametrize("rate, sigma, rounds", [(0.2, 2.0, 300), (0.05, 1.2, 1000), (0.5, 11.3, 300),
                                               pytest.param(0.01, 0.8, 2000, marks=pytest.mark.integration)])
def test_pld_of_sampled_gaussian_rounds_is_the_librarys_composition(rate, sigma, rounds):
    # our grid (q/(100σ)) against dp-accounting's default PLD accountant (grid 1e-4) on the same
    # T-fold composition: both pessimistic, within 1e-4 (a grid of 1/(100σ), blind to q, was
    # 2.3e-3 above at q = 0.05 and 2.8e-2 at q = 0.01); RDP is never tighter
    delta = 1e-6
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), rounds)
    assert sampled_gaussian_event(sigma, rate, rounds) == event
    library = dp_accounting.pld.PLDAccountant().compose(event).get_epsilon(delta)
    ours = sampled_gaussian_epsilons(sigma, rate, rounds, delta)
    assert ours["pld"] == (pytest.approx(library, rel=1e-4), delta)
    assert ours["rdp"][0] >= ours["pld"][0]
    assert pld_epsilon(sampled_gaussian_event(sigma, 1.0, rounds), delta) > 1.3 * ours["pld"][0]
