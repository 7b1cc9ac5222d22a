"""Three ways `fm.verify` misread a user's model (found by trying data as people have it):

- a reference solved on another build of the same model (the model written in a function and
  built twice) has other variable objects: the distance read `inf` and the note blamed a face of
  solutions. It is matched by label now; a reference of another model is a clear error.
- logistic loss on separable data in large units saturates: the gradients at the origin exceed
  those near the optimum by ~10⁷, and the stationarity floor (the gradients at 0) let a point
  50 % from the optimum read as stationary to 1e-5 — CVXPY-Clarabel's own answer there is that
  point. The floor is now the curvature at x along x where that is smaller.
- a lasso whose answer is w = 0, returned by CVXPY as 1e-13 entries: the subgradient test read
  those entries' signs (they were not small next to the point, all of it rounding) and scored
  the right answer 0.68 "not stationary"; entries within 1e-6 of the variable's natural length
  are now at the kink."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize, special

import fedmodel as fm
from fedmodel.errors import FedModelError

SIZES = (1, 3, 50, 400)          # heterogeneous clients, 454 rows
RIDGE = 1e-3


def _data(scale: float, d: int = 8):
    rng = np.random.default_rng(0)
    w_true = rng.standard_normal(d)
    parts = []
    for i, m in enumerate(SIZES):
        A = rng.standard_normal((m, d)) * scale * (1 + 3 * i)
        y = np.sign(A @ w_true + 0.5 * rng.standard_normal(m))
        parts.append((A, y))
    return parts


def separable_logistic(scale: float) -> fm.Problem:
    """Each client also keeps ‖w‖₂ ≤ 10, inactive at the optimum (‖w*‖ ≈ 0.05 at 1e3): with it
    Clarabel says "optimal" in seconds; without it the chain ends in SCS after ~100 s."""
    w = fm.Variable(8, name="w")
    prob = fm.Problem(name="saturated")
    for i, (A, y) in enumerate(_data(scale)):
        client = prob.add_client(f"c{i}")
        client.minimize(fm.sum(fm.logistic(-fm.multiply(y, client.data(A, name="A") @ w))) / sum(SIZES))
        client.subject_to(fm.norm2(w) <= 10.0)
    prob.server.minimize(RIDGE * fm.sum_squares(w))
    return prob


def _optimum(scale: float) -> np.ndarray:
    """An independent answer: BFGS to a gradient of 1e-12 on the same function in numpy."""
    parts = _data(scale)

    def f(w):
        return sum(np.logaddexp(0, -y * (A @ w)).sum() for A, y in parts) / sum(SIZES) + RIDGE * w @ w

    def g(w):
        return sum(-(A.T @ (y * special.expit(-y * (A @ w))))
                   for A, y in parts) / sum(SIZES) + 2 * RIDGE * w
    found = optimize.minimize(f, np.zeros(8), jac=g, method="BFGS",
                              options=dict(gtol=1e-13, maxiter=10_000))
    assert np.max(np.abs(g(found.x))) < 1e-9 and np.linalg.norm(found.x) < 10.0   # the balls inactive
    return found.x


def _stationarity(prob: fm.Problem, point: np.ndarray) -> float:
    w = prob.variables()[0]
    return prob.kkt_certificate({w.uid: point}, {}).relative_stationarity


@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_a_point_off_the_optimum_is_not_stationary_in_any_units(scale):
    prob, optimum = separable_logistic(scale), _optimum(scale)
    assert _stationarity(prob, optimum) <= 1e-6
    for move in (0.5, 0.9, 1.1):     # 10 % and 50 % off, along the ray (where saturation hides it)
        assert _stationarity(prob, move * optimum) > 1e-3, move
    # (the gradients-at-0 floor scored 0.5 × the optimum at 1e3 as 2e-5: "stationary")


def test_verify_flags_the_inaccurate_reference_and_the_point_it_would_pass():
    prob = separable_logistic(1e3)
    w = prob.variables()[0]
    optimum = _optimum(1e3)
    reference = prob.solve("cvxpy")
    report = fm.verify(reference)          # against a fresh CVXPY solve: same point, KKT decides
    far = np.max(np.abs(reference.value(w) - optimum)) / np.max(np.abs(optimum))
    if far > 1e-3:                         # Clarabel's exp cones at this scale: ~0.5 off
        assert not report.ok and "KKT stationarity" in report.failed
    else:                                  # a solver that gets it right must pass
        assert report.ok


def least_squares() -> fm.Problem:
    rng = np.random.default_rng(1)
    w = fm.Variable(3, name="w")
    prob = fm.Problem(name="least-squares")
    for i in range(3):
        A = rng.normal(size=(20, 3))
        prob.add_client(f"c{i}").minimize(fm.sum_squares(A @ w - A @ np.array([1.0, -2.0, 0.5])))
    return prob


def test_a_reference_from_another_build_of_the_same_model_is_matched_by_name():
    res = least_squares().solve("fedadmm")
    report = fm.verify(res, least_squares().solve("cvxpy"))
    assert report.ok and report.solution_distance <= 1e-3     # was inf, "a face of solutions"
    assert report.where["solution distance"] == "w"


def test_a_reference_of_another_model_is_refused_by_name():
    res = separable_logistic(1.0).solve("cvxpy")
    v = fm.Variable(3, name="v")
    other = fm.Problem(name="other")
    other.add_client("c0").minimize(fm.sum_squares(v - 1.0))
    with pytest.raises(FedModelError, match="'w'.*no counterpart"):
        fm.verify(res, other.solve("cvxpy"))


@pytest.mark.parametrize("name, biased, says", [("fedavg", True, "client drift"),
                                                ("cvxpy", False, "tolerances are absolute"),
                                                ("proxal", False, "tighten its tolerance")])
def test_a_stationarity_warning_names_the_cause_that_fits_the_backend(name, biased, says):
    # it used to blame client drift whatever the backend, CVXPY's solvers included
    from fedmodel.backends.base import _warn_not_stationary
    from fedmodel.backends.outcome import Outcome, Status
    outcome = Outcome(Status.CONVERGED, biased_fixed_point=biased)
    with pytest.warns(RuntimeWarning, match="not a solution of the model"):
        _warn_not_stationary(name, outcome, 0.5)
    assert says in outcome.info["not_stationary"]


def test_a_lasso_at_zero_returned_as_rounding_is_stationary():
    rng = np.random.default_rng(3)
    w = fm.Variable(5, name="w")
    prob = fm.Problem(name="lasso-at-zero")
    for i in range(3):
        A = rng.normal(size=(10, 5))
        client = prob.add_client(f"c{i}")
        client.minimize(fm.sum_squares(A @ w - 0.1 * rng.normal(size=10)))
        client.minimize(30.0 * fm.norm1(w))          # λ beyond ‖Aᵀb‖∞: w* = 0
    rounding = 1e-13 * rng.normal(size=5)
    assert _stationarity(prob, rounding) <= 1e-9      # was 0.68
    assert _stationarity(prob, np.array([0.05, 0, 0, 0, 0])) > 1e-3   # off the kink: flagged
    assert fm.verify(prob.solve("cvxpy")).ok
