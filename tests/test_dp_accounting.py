"""DP-ADMM's accounting on Google's dp-accounting (backends/dp_admm/accounting.py): the library's
ε against closed forms (Gaussian RDP and its RDP→(ε, δ) conversion, the exact privacy profiles
of the Gaussian and Laplace mechanisms), grouped schedules, PLD never looser than advanced
composition on the paper's schedules, and the budget search."""
import math

import dp_accounting
import pytest
from scipy import optimize, stats

from fedmodel.backends.dp_admm import PAPER_DPADMM
from fedmodel.backends.dp_admm.accounting import (accountant_bounds, composition, pld_epsilon, rdp_epsilon,
                                         round_event, rounds_within, schedule_event)

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
