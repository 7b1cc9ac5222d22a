"""`fm.verify` and the KKT certificate where a scale is missing (issue 25, item 2):

- a coupled constraint decoupled with slacks and nearly inactive at the optimum (μ ≈ 1e-11):
  the slacks' stationarity μ − μ_i was measured against the multipliers' own size, and CVXPY's
  right answer read 2.3e-3 "not stationary";
- an optimum at w* = 0 where f* = 0 (a homogeneous least squares, −log(1 + w) + w): every
  measure was relative to 0 — gap 1.0, distance 1.0 for an exact answer, "not a solution" for
  CVXPY's — now relative to the variable's natural length (from the constraints' constants or
  the curvature) and the gradients' size over it;
- a nonconvex model at a maximum (every backend stops at w = 0 of −‖w‖² on the unit ball): the
  KKT certificate holds there; verify now checks the Lagrangian's curvature too."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from test_split import central_model, solve_reference

RTOL = 1e-3


def hand_made(prob: fm.Problem, point, multipliers=None) -> fm.Result:
    """A "converged" Result at `point` (the first variable), as a backend would return it."""
    w = prob.variables()[0]
    w.value = np.asarray(point, dtype=float)
    return fm.Result(status="converged", values={w.uid: np.asarray(point, dtype=float)},
                     objective=float(prob.objective.value), max_violation=0.0, backend="hand",
                     multipliers=multipliers or {}, problem=prob)


# ---- slacks of a nearly inactive coupled constraint -------------------------------------
def test_a_nearly_inactive_split_constraint_is_stationary_and_wrong_multipliers_are_not():
    prob, w, arrays, S, reference, cw = central_model(1, n_clients=3)
    solve_reference(reference)
    res = prob.solve("cvxpy")
    np.testing.assert_allclose(res.value(w), cw.value, atol=1e-6)     # the right answer
    assert float(res.multipliers["energy"]) < 1e-8                      # nearly inactive
    assert res.certificate.relative_stationarity <= 1e-6               # was 2.3e-3 (a slack)
    # a multiplier that is not rounding is still charged to the slack that carries it
    multipliers = dict(res.multipliers)
    multipliers["energy[k1]"] = np.asarray(1e-3)
    wrong = prob.kkt_certificate(res.values, multipliers)
    assert wrong.relative_stationarity > 0.5 and wrong.worst["stationarity"] == "energy_slack_k1"


def test_an_active_split_constraint_still_flags_a_one_percent_multiplier_error():
    prob, *_ = central_model(0, n_clients=2)
    res = prob.solve("cvxpy")
    assert res.certificate.relative_stationarity <= 1e-6
    multipliers = dict(res.multipliers)
    multipliers["energy[k1]"] = 1.01 * multipliers["energy[k1]"]        # μ ≈ 0.24
    assert prob.kkt_certificate(res.values, multipliers).relative_stationarity > 2 * RTOL


# ---- an optimum at 0 with a zero objective ----------------------------------------------
def homogeneous(scale: float = 1.0) -> fm.Problem:
    """Σ_i ‖X_i w‖², one client with w ≥ −1: w* = 0 (XᵀX is positive definite), f* = 0."""
    rng = np.random.default_rng(0)
    w = fm.Variable(3, name="w")
    prob = fm.Problem(name="homogeneous")
    for i in range(3):
        client = prob.add_client(f"c{i}")
        client.minimize(fm.sum_squares(client.data(scale * rng.normal(size=(10, 3)), name="X") @ w))
        if i == 0:
            client.subject_to((w >= -1).named("floor"))
    return prob


def test_cvxpy_and_an_exact_zero_verify_where_the_objective_is_zero():
    prob = homogeneous()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)        # no "not a solution" warning
        reference = prob.solve("cvxpy")
    assert np.max(np.abs(reference.values_by_label()["w"])) < 1e-9
    assert reference.certificate.relative_stationarity <= 1e-6        # was 0.79
    report = fm.verify(hand_made(prob, np.zeros(3)), reference)
    assert report.ok, str(report)                                      # gap and distance were 1.0
    assert report.objective_gap <= 1e-12 and report.solution_distance <= 1e-6


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
def test_a_point_off_a_zero_optimum_is_flagged_in_any_units(scale):
    prob = homogeneous(scale)
    reference = prob.solve("cvxpy")
    exact = fm.verify(hand_made(prob, np.zeros(3)), reference)
    assert exact.ok, str(exact)
    rng = np.random.default_rng(1)
    for _ in range(3):    # 1e-2 of the length w ≥ −1 gives w, in a random direction
        moved = 1e-2 * rng.uniform(-1, 1, size=3)
        report = fm.verify(hand_made(prob, moved), reference)
        assert not report.ok
        assert {"solution distance", "KKT stationarity"} <= set(report.failed), str(report)
        cert = report.kkt
        assert cert.relative_stationarity > 10 * RTOL


def log_barrier() -> fm.Problem:
    """Σ_i −Σ log(1 + w) + Σ w: w* = 0, f* = 0, and no constraint to give w a length."""
    w = fm.Variable(3, name="w")
    prob = fm.Problem(name="log-barrier")
    for i in range(3):
        prob.add_client(f"c{i}").minimize(-fm.sum(fm.log(w + 1)) + fm.sum(w))
    return prob


def test_an_exact_zero_of_a_log_model_verifies_against_cvxpys_inexact_one():
    prob = log_barrier()
    reference = prob.solve("cvxpy")
    assert 1e-8 < np.max(np.abs(reference.values_by_label()["w"])) < 1e-4   # exp cones: ~3.5e-6
    assert reference.certificate.lengths[prob.variables()[0].uid] == pytest.approx(2.0, rel=1e-3)
    report = fm.verify(hand_made(prob, np.zeros(3)), reference)
    assert report.ok, str(report)                    # distance was 1.0 (3.5e-6 against 3.5e-6)
    assert "within the reference's own uncertainty" in str(report)
    for point in (np.full(3, 1e-2), np.array([2e-3, -1e-3, 0.0])):
        wrong = fm.verify(hand_made(prob, point), reference)
        assert not wrong.ok and "solution distance" in wrong.failed, str(wrong)


# ---- nonconvex models: second order ------------------------------------------------------
def concave_on_the_ball(d: int = 2) -> fm.Problem:
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name="concave")
    client = prob.add_client("c0")
    client.minimize(-fm.sum_squares(w))
    client.subject_to((fm.norm2(w) <= 1).named("ball"))
    return prob


def test_a_maximum_that_a_backend_stops_at_is_stalled_and_not_ok():
    prob = concave_on_the_ball()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve("proxal")
        report = fm.verify(res)
    # ProxAL's stop test passes at w = 0; finish_result's second-order check ends it "stalled"
    assert res.status == "stalled" and "saddle" in res.info
    assert np.max(np.abs(res.values_by_label()["w"])) < 1e-9
    assert res.certificate.relative_stationarity <= RTOL      # first order cannot tell
    assert not report.ok and "second order" in report.failed
    assert report.measures["second order"] == pytest.approx(1.0, rel=1e-4)   # ∇²ℒ = −2I
    assert "a saddle or maximum, not a minimum" in str(report)
    with warnings.catch_warnings():   # on the sphere the ball's curvature cancels: minima
        warnings.simplefilter("ignore")
        edge = fm.verify(hand_made(prob, [0.6, 0.8], {"ball": np.asarray(2.0)}))
    assert edge.ok and edge.measures["second order"] <= 1e-6, str(edge)


def test_a_maximum_in_more_dimensions_than_directions_is_flagged():
    prob = concave_on_the_ball(40)          # 40 > DIRECTIONS: random combinations of coordinates
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fm.verify(hand_made(prob, np.zeros(40)))
    assert report.failed == ["second order"]
    assert report.measures["second order"] == pytest.approx(1.0, rel=1e-4)


def test_a_saddle_is_flagged_and_a_ring_of_minima_is_not():
    w = fm.Variable(2, name="w")
    saddle = fm.Problem(name="saddle")
    saddle.add_client("c0").minimize(fm.square(w[0]) - 3 * fm.square(w[1]) + fm.sum_squares(w - 1))
    point = np.array([0.5, -0.5])       # ∇ = (2w0 + 2(w0 − 1), −6w1 + 2(w1 − 1)) = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fm.verify(hand_made(saddle, point))
    assert report.kkt.relative_stationarity <= 1e-12
    assert not report.ok and report.failed == ["second order"]
    # ∇²f = diag(4, −4): the least curvature −4 over the pieces' sizes 2 + 6 + 2
    assert report.measures["second order"] == pytest.approx(0.4, rel=1e-4)
    assert "a saddle or maximum" in str(report)
    # min √(‖w‖² + 1) s.t. ‖w‖² ≥ 1: every point of the unit circle is a minimum (μ = 1/(2√2)),
    # the Lagrangian's curvature is 0 along the circle: not a descent direction
    v = fm.Variable(2, name="v")
    ring = fm.Problem(name="ring")
    client = ring.add_client("c0")
    client.minimize(fm.sqrt(fm.sum_squares(v) + 1))
    client.subject_to((fm.sum_squares(v) >= 1).named("outside"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = fm.verify(hand_made(ring, [0.6, 0.8], {"outside": np.asarray(1 / (2 * np.sqrt(2)))}))
    assert report.ok, str(report)
    assert report.measures["second order"] <= 1e-6


def test_a_convex_model_has_no_second_order_measure():
    prob = homogeneous()
    report = fm.verify(prob.solve("cvxpy"))
    assert report.ok and "second order" not in report.measures
    assert "second order" not in str(report)


# ---- what the natural lengths must not excuse ---------------------------------------------
def _least_squares(constant: float = 0.0, bound: float | None = None):
    rng = np.random.default_rng(0)
    A, b = rng.normal(size=(10, 3)), 1e-3 * rng.normal(size=10)
    w = fm.Variable(3, name="w")
    prob = fm.Problem(name="small-answer")
    client = prob.add_client("c0")
    client.minimize(constant + fm.sum_squares(client.data(A) @ w - client.data(b)))
    if bound is not None:
        client.subject_to((w <= bound).named("big_m"))
    return prob, np.linalg.lstsq(A, b, rcond=None)[0]      # ‖w*‖ ≈ 6e-4


def test_a_loose_bound_does_not_make_a_wrong_point_near_zero_look_like_rounding():
    prob, optimum = _least_squares(bound=1e6)       # the bound's length 1e6, w*'s 6e-4
    assert 1e-4 < np.max(np.abs(optimum)) < 1e-3
    reference = prob.solve("cvxpy")
    np.testing.assert_allclose(reference.values_by_label()["w"], optimum, rtol=1e-4, atol=1e-9)
    for wrong in (np.zeros(3), 0.5 * optimum):
        report = fm.verify(hand_made(prob, wrong), reference)
        assert {"solution distance", "KKT stationarity"} <= set(report.failed), str(report)


def test_a_constant_term_gives_no_length():
    """1e9 + ‖Aw − b‖²: the constant made the natural length 1.7e11 and w = 0 passed the
    distance (the stationarity still caught it)."""
    prob, optimum = _least_squares(constant=1e9)
    reference = prob.solve("cvxpy")
    report = fm.verify(hand_made(prob, np.zeros(3)), reference)
    assert {"solution distance", "KKT stationarity"} <= set(report.failed), str(report)
    assert reference.certificate.lengths[prob.variables()[0].uid] < 1.0


def test_a_zero_optimum_from_another_build_is_measured_on_its_length():
    """The reference's lengths are keyed by its own variables: a reference solved on another
    build of the model (matched by label) had no length, and the exact 0 read distance 1."""
    reference = homogeneous().solve("cvxpy")
    prob = homogeneous()
    report = fm.verify(hand_made(prob, np.zeros(3)), reference)
    assert report.ok and report.solution_distance <= 1e-6, str(report)
    wrong = fm.verify(hand_made(prob, np.full(3, 1e-3)), reference)
    assert not wrong.ok and wrong.solution_distance > 100, str(wrong)
