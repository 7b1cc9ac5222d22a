"""One tiny client under DP-ADMM's one knob (issue 25 item 4): `DPADMM(epsilon_total=E)`
weights client p's noisy release by ω_p = 1/(1 + ν_p²), ν_p = σ_g·√d/(q·I_p)
(`backends/dp_admm/sampled.py`), and its ρ reads the RMS of ω_p·ν_p (each ≤ 1/2) instead of
the smallest client's ν. Checked: the weight is the worst-case MSE minimizer it is derived as; the run's
weights and ρ against the closed form; every client's guarantee — the tiny one's included — is
the reported ε (its noise drawn at σ_g times its own sensitivity, composed independently by
dp-accounting); the warning naming the tiny client; and (integration) the accuracy case on a
synthetic stand-in of a9a's (five clients, then one more of a single record): without the
weights the tiny client's noise set ρ ×190 for everyone and the test error went from 26.7 % to
48 %. Data are synthetic."""
import logging
import math
import warnings

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld
from scipy.optimize import minimize_scalar

import fedmodel as fm
from fedmodel.backends.dp_admm import DPADMM
from fedmodel.backends.dp_admm.sampled import noise_ratio, shrinkage

logging.getLogger("absl").setLevel(logging.ERROR)     # RDP orders that do not converge: excluded

D, M = 10, 400


def _data(sizes, seed=0):
    """Logistic data, ‖x‖ ≈ 1, labels from a noisy linear score; a 4,000-row test set."""
    rng = np.random.default_rng(seed)
    truth = 2.0 * rng.normal(size=D)

    def draw(m):
        X = rng.normal(size=(m, D)) / np.sqrt(D)
        return X, np.where(rng.random(m) < 1.0 / (1.0 + np.exp(-X @ truth)), 1.0, -1.0)
    return [draw(m) for m in sizes], draw(4000)


def _model(parts):
    """Each client's mean logistic loss / P (the API example's form), a server ridge."""
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i, (X, y) in enumerate(parts):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(-y[:, None] * X, name="M") @ w)) / len(parts))
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    return prob, w


def _solve(prob, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prob.solve(DPADMM(delta=1e-5, seed=0, **options))


@pytest.mark.parametrize("ratio", [0.023, 0.4, 1.0, 2.9, 116.0])
def test_the_weight_minimizes_the_worst_case_error(ratio):
    """ω = 1/(1 + ν²) minimizes (1 − ω)²C² + ω²ν²C² (a release of norm ≤ C, noise ν·C), and
    its noise ω·ν never exceeds 1/2 clip norms."""
    best = minimize_scalar(lambda w: (1.0 - w) ** 2 + w ** 2 * ratio ** 2, bounds=(0.0, 1.0),
                           method="bounded", options={"xatol": 1e-12}).x
    assert float(shrinkage(ratio)) == pytest.approx(best, abs=1e-8)
    assert float(shrinkage(ratio)) == pytest.approx(1.0 / (1.0 + ratio ** 2), rel=1e-15)
    assert float(shrinkage(ratio)) * ratio <= 0.5 + 1e-15


def test_the_runs_weights_and_penalty_follow_the_closed_form():
    """info["privacy"]["shrinkage"] is 1/(1 + ν_p²) with ν_p = σ_g·√d/(q·I_p) per client, and ρ
    = C²(0.5 + 10·√(mean_p (ω_p ν_p)²)); shrink=False keeps the rule before, the smallest
    client's ν."""
    parts, _ = _data((60, 60, 1))
    prob, _ = _model(parts)
    clip = 2.0
    res = _solve(prob, epsilon_total=8.0, max_rounds=5, clip=clip)
    sigma = res.info["privacy"]["gradient_noise"]
    ratio = np.array([sigma * math.sqrt(D) / m for m in (60, 60, 1)])
    weights = 1.0 / (1.0 + ratio ** 2)
    assert list(res.info["privacy"]["shrinkage"].values()) == pytest.approx(weights, rel=1e-12)
    rms = np.sqrt(np.mean((weights * ratio) ** 2))
    assert res.info["rho"] == pytest.approx(clip ** 2 * (0.5 + 10.0 * rms), rel=1e-12)
    # (q < 1: the noise on the estimate is σ_g/q)
    np.testing.assert_allclose(noise_ratio(sigma, D, 0.5, [60, 1]), 2.0 * ratio[1:], rtol=1e-15)
    full = _solve(prob, epsilon_total=8.0, max_rounds=5, shrink=False)
    smallest = full.info["privacy"]["gradient_noise"] * math.sqrt(D) / 1.0
    assert full.info["rho"] == pytest.approx(0.5 + 10.0 * smallest, rel=1e-12)
    assert set(full.info["privacy"]["shrinkage"].values()) == {1.0}


def test_every_client_gets_the_reported_guarantee():
    """The tiny client (1 record) and the others: each round's noise is N(0, (σ_g·C/I_p)²), σ_g
    times the client's own sensitivity C/I_p (the weights act after the release); T such rounds
    compose, by dp-accounting's own PLD accountant, to the ε the run reports, for every client
    (their noise multipliers, std / sensitivity, are all σ_g)."""
    parts, _ = _data((60, 60, 1))
    prob, _ = _model(parts)
    rounds, budget = 20, 3.0
    res = _solve(prob, epsilon_total=budget, max_rounds=rounds, record_noise=True)
    privacy = res.info["privacy"]
    reported = privacy["pld"][0]
    assert budget * 0.99 <= reported <= budget
    event = dp_accounting.ComposedDpEvent([     # (and the clipped records' count, once at σ)
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(privacy["gradient_noise"]), rounds),
        dp_accounting.GaussianDpEvent(privacy["noise_multiplier"])])
    independent = pld.PLDAccountant().compose(event).get_epsilon(1e-5)
    assert independent == pytest.approx(reported, rel=2e-3)
    for client, records in zip(("c0", "c1", "c2"), (60, 60, 1)):
        scales = np.asarray(res.info["sensitivity"][client])      # the std of each round's noise
        assert len(scales) == rounds
        multipliers = scales / (1.0 / records)                    # std / sensitivity (C = 1)
        np.testing.assert_allclose(multipliers, privacy["gradient_noise"], rtol=1e-12)
        drawn = np.concatenate(res.info["noise"][client])
        assert np.std(drawn) == pytest.approx(scales[0], rel=0.2)    # 200 draws


def test_the_tiny_client_is_named_with_the_alternatives():
    parts, _ = _data((60, 60, 1))
    prob, _ = _model(parts)
    with pytest.warns(UserWarning, match=r"c2 \(1 records: ω = .*shrink=False"):
        prob.solve(DPADMM(epsilon_total=8.0, delta=1e-5, seed=0, max_rounds=3))
    with pytest.raises(fm.FedModelError, match="shrink"):
        DPADMM(epsilon_total=8.0, shrink="yes")


@pytest.mark.integration
def test_one_tiny_client_does_not_ruin_the_model():
    """Five clients of 400 records, E = 8 (100 rounds): test error 26.7 % (non-private 26.2 %);
    the same plus one client of 1 record: 25.8 % (without the weights: 48 %, ρ = 190 for all)."""
    errors = {}
    for sizes in ((M,) * 5, (M,) * 5 + (1,)):
        parts, (X, y) = _data(sizes)
        prob, w = _model(parts)
        res = _solve(prob, epsilon_total=8.0, max_rounds=100)
        assert res.status == "max_iterations"                      # honest: never "converged"
        errors[len(sizes)] = float(np.mean(np.sign(X @ res.value(w)) != y))
    assert errors[5] < 0.30
    assert errors[6] <= errors[5] + 0.02
