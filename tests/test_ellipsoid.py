"""A ball on columns of different units (issue 25 item 1, branch ellball): the equilibration
gives a ball's variable column scales as a free one's, and the ball ‖D v‖₂ ≤ r in v is an
ellipsoid projected exactly (`projection.Ellipsoid`: x = y/(1 + λe²), λ the root of the secular
equation), ‖D v‖∞ ≤ r a box and ‖D v‖₁ ≤ r a weighted ℓ1 ball. Before, the ball held its
variable whole (one δ): raw airfoil columns (Hz to 2e4 beside a thickness of 3e-3) with an
inactive ball ‖w‖ ≤ 1e6 ran ProxAL, cProx-AL, DALD and FedADMM to their caps 0.66–1.0 off."""
from __future__ import annotations

import warnings

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fedmodel as fm
from fedmodel.compiler.projection import Ball, Ellipsoid, project_ellipsoid, project_l1_ball
from fedmodel.compiler.scaling import equilibrate
from fedmodel.compiler.sets import simple_set
from test_set_scaling import _least_squares

FEW = settings(max_examples=20, deadline=None)
SIZES = st.lists(st.floats(-6.0, 6.0), min_size=1, max_size=6)      # log10 of e_i


def _cvxpy_projection(y, e, r, norm=2):
    """CVXPY's projection of y onto {‖e∘x‖ ≤ r} (Clarabel, tight tolerances; min ‖x − y‖ as a
    second-order cone, better conditioned than its square)."""
    x = cp.Variable(y.size)
    cp.Problem(cp.Minimize(cp.norm(x - y, 2)), [cp.norm(cp.multiply(e, x), norm) <= r]).solve(
        solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    return x.value


def _kkt(y, e, r, x):
    """(boundary error, the normal-cone residual ‖(y − x) − λe²∘x‖ / ‖y‖ at the best λ, λ): x
    is the projection iff ‖e∘x‖ = r and y − x = λ e²∘x with λ ≥ 0 (y outside)."""
    normal = e * e * x
    lam = float((y - x) @ normal) / float(normal @ normal)
    residual = np.linalg.norm((y - x) - lam * normal) / np.linalg.norm(y)
    return abs(np.linalg.norm(e * x) / r - 1.0), residual, lam


@settings(max_examples=60, deadline=None)
@given(logs=SIZES, seed=st.integers(0, 2 ** 16), log_r=st.floats(-6.0, 0.0))
def test_the_ellipsoid_projection_meets_its_optimality_conditions(logs, seed, log_r):
    # e over 1e-6 … 1e6 and y anywhere outside: on the boundary and y − x = λe²∘x, λ > 0, to
    # rounding (the secular equation solved to machine precision)
    e = 10.0 ** np.array(logs)
    rng = np.random.default_rng(seed)
    y = rng.normal(size=e.size) * 10.0 ** rng.uniform(-3, 3, e.size) / e
    r = 0.9 * 10.0 ** log_r * np.linalg.norm(e * y)
    boundary, residual, lam = _kkt(y, e, r, project_ellipsoid(y, e, r))
    assert boundary <= 1e-14 and residual <= 1e-13 and lam > 0


def test_the_ellipsoid_projection_matches_cvxpy():
    rng = np.random.default_rng(5)
    for spread in (1.0, 2.0, 6.0):             # e over 10^±spread
        for _ in range(4):
            n = int(rng.integers(1, 7))
            e = 10.0 ** rng.uniform(-spread, spread, n)
            y = rng.normal(size=n) / e
            r = 10.0 ** rng.uniform(-2, -0.1) * np.linalg.norm(e * y)
            x, ref = project_ellipsoid(y, e, r), _cvxpy_projection(y, e, r)
            np.testing.assert_allclose(x, ref, atol=1e-6 * np.max(np.abs(y)))
            assert np.linalg.norm(e * x) <= r * (1 + 1e-15) and \
                np.linalg.norm(x - y) <= np.linalg.norm(ref - y) * (1 + 1e-9)   # no worse


@FEW
@given(logs=SIZES, seed=st.integers(0, 2 ** 16))
def test_a_point_inside_is_its_own_projection(logs, seed):
    e = 10.0 ** np.array(logs)
    y = np.random.default_rng(seed).normal(size=e.size) / e
    r = 1.5 * np.linalg.norm(e * y) + 1e-300
    assert project_ellipsoid(y, e, r) is y or np.array_equal(project_ellipsoid(y, e, r), y)


def test_equal_weights_are_the_ball_bit_for_bit():
    rng = np.random.default_rng(3)
    for c in (1.0, 1e-6, 3.7, 1e6):
        for _ in range(20):
            y, r = rng.normal(size=7) * 10.0 ** rng.uniform(-3, 3), 10.0 ** rng.uniform(-3, 3)
            np.testing.assert_array_equal(Ellipsoid(np.full(7, c), r).project(y),
                                          Ball(r / c).project(y))


def test_the_weighted_l1_projection_matches_cvxpy():
    rng = np.random.default_rng(4)
    for _ in range(20):
        n = int(rng.integers(1, 8))
        e, y = 10.0 ** rng.uniform(-3, 3, n), rng.normal(size=n) * 10.0 ** rng.uniform(-2, 2, n)
        r = 0.4 * float(e @ np.abs(y))
        x = project_l1_ball(y, r, e)
        assert float(e @ np.abs(x)) == pytest.approx(r, rel=1e-12)
        np.testing.assert_allclose(x, _cvxpy_projection(y, e, r, norm=1), atol=1e-6 * np.max(np.abs(y)))


def test_the_ellipsoid_term_reads_its_normal_cone():
    # simple_set of ‖e∘w‖ ≤ r is the ellipsoid; at the projection x of y the gradient x − y of
    # ½‖x − y‖² is in −N(x): the remainder 0; a gradient along the boundary stays whole
    w = fm.Variable(3, name="w")
    e = np.array([1e-3, 1.0, 1e3])
    term = simple_set(fm.norm2(fm.multiply(e, w)) <= 2.0)
    assert term.kind == "ellipsoid"
    y = np.array([5e3, -3.0, 1e-2])
    x = term.prox(y, 1.0)
    np.testing.assert_allclose(term.remainder(x, x - y), 0.0, atol=1e-9 * np.max(np.abs(y)))
    tangent = np.cross(e * e * x, [0.0, 0.0, 1.0])
    np.testing.assert_allclose(term.remainder(x, tangent), tangent, rtol=1e-12)
    box = simple_set(fm.norm_inf(fm.multiply(e, w)) <= 2.0)
    assert box.kind == "ballinf"
    np.testing.assert_allclose(box.box[1], 2.0 / e, rtol=1e-15)


def _columns_model(columns, radius):
    """Least squares over two clients, columns in units `columns`, a server ball ‖w‖ ≤ radius."""
    prob, w = _least_squares(columns=columns)
    prob.server.subject_to(fm.norm2(w) <= radius)
    return prob, w


def test_a_ball_on_raw_columns_is_an_ellipsoid_and_stays_round_in_one_unit():
    prob, w = _columns_model(np.array([1e-3, 1.0, 1e3]), 1e3)
    model = equilibrate(prob)
    D = model.scaling.variables[w.uid]
    assert 1e-7 < D[2] / D[0] < 1e-5                     # per-column scales, as a free variable's
    found = simple_set(model.problem.constraints[0])
    assert found.kind == "ellipsoid"
    piece = found.pieces[0]       # ‖D v‖ ≤ r: e = D / max D, radius r / max D
    np.testing.assert_allclose(piece.weights, D / D.max(), rtol=1e-15)
    assert piece.radius == pytest.approx(1e3 / D.max(), rel=1e-15)
    prob, w = _columns_model(np.ones(3), 1.0)            # one unit: the round ball, one δ
    model = equilibrate(prob)
    D = model.scaling.variables[w.uid]
    assert np.all(D == D[0]) and simple_set(model.problem.constraints[0]).kind == "ball2"


def test_the_ellipsoid_answer_and_multiplier_are_in_the_users_units():
    # an active ball on columns 1e-3 … 1e3: CVXPY on the equilibrated copy (the ellipsoid) and
    # on the model as written agree on the point and on the ball's multiplier
    units = np.array([1e-3, 1.0, 1e3])
    prob, w = _columns_model(units, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scaled, plain = prob.solve("cvxpy"), prob.solve("cvxpy", scaling=False)
    assert np.linalg.norm(plain.value(w)) == pytest.approx(1.0, rel=1e-6)     # active
    np.testing.assert_allclose(scaled.value(w), plain.value(w), atol=1e-6)
    mu = plain.multipliers["server.con0"]
    assert float(mu) > 1e-3
    np.testing.assert_allclose(scaled.multipliers["server.con0"], mu, rtol=1e-5)


# ---- the airfoil model under the federated backends -------------------------------------------
def test_a_halfspace_beside_an_active_ellipsoid_keeps_its_multiplier():
    """FedADMM projects on ‖d∘w‖ ≤ r ∩ {1ᵀw ≤ 0.3} and reads the halfspace's multiplier from
    the normal cone (`sets.affine_multipliers`): it must be CVXPY's (the ellipsoid's normal
    once overwrote the cone element being fitted: multiplier ~0, run "stalled")."""
    rng = np.random.default_rng(0)
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    for i in range(3):
        A = rng.normal(size=(12, 3))
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(A) @ w - c.data(A @ np.array([2.0, -1.0, 1.0]))))
    prob.server.subject_to(fm.norm2(fm.multiply(np.array([1.0, 3.0, 10.0]), w)) <= 5.0,
                           np.ones(3) @ w <= 0.3)
    ref = prob.solve("cvxpy", scaling=False)
    for scaling in (False, True):
        res = prob.solve("fedadmm", scaling=scaling)
        assert res.status == "converged" and fm.verify(res, ref).ok
        np.testing.assert_allclose(res.multipliers["server.con1"], ref.multipliers["server.con1"],
                                   rtol=1e-4)


@pytest.fixture(scope="module")
def airfoil():
    from benchmarks.bench_ball_units import airfoil_parts, build, reference
    parts = airfoil_parts()
    return parts, build, reference


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["proxal", "fedadmm"])
@pytest.mark.parametrize("active", [False, True])
def test_airfoil_ball_under_federated_backends(airfoil, backend, active):
    """Inactive (1e6) and active (‖w*‖/2) balls on raw airfoil columns: converged, within 1e-4
    of the exact answer (normal equations; on the boundary (H + νI)w = g, ‖w‖ = r), verified."""
    parts, build, reference = airfoil
    radius = 0.5 * float(np.linalg.norm(reference(parts, None)[0])) if active else 1e6
    exact, mu = reference(parts, radius)
    prob, w = build(parts, radius)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve(backend)
        assert res.status == "converged", (res.status, res.iterations)
        assert np.max(np.abs(res.value(w) - exact)) <= 1e-4 * np.max(np.abs(exact))
        assert fm.verify(res).ok
    got = res.multipliers.get("server.con0")      # the ball's multiplier, where reported
    if got is not None:
        assert float(np.ravel(got)[0]) == pytest.approx(mu, rel=1e-3, abs=1e-6 * max(mu, 1.0))


@pytest.mark.integration
@pytest.mark.parametrize("norm", ["norm1", "norm_inf"])
def test_airfoil_l1_and_inf_balls_are_weighted_l1_balls_and_boxes(airfoil, norm):
    """‖w‖₁ ≤ r and ‖w‖∞ ≤ r (active, half of ‖w*‖'s) on raw airfoil columns: in v a weighted ℓ1
    ball and a box; ProxAL and FedADMM converge to CVXPY's answer as written (main: max_iterations
    0.33–0.99 off)."""
    parts, build, reference = airfoil
    free = reference(parts, None)[0]
    atom = getattr(fm, norm)
    prob, w = build(parts, None)
    prob.server.subject_to(atom(w) <= 0.5 * float(np.linalg.norm(free, 1 if norm == "norm1" else np.inf)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = prob.solve("cvxpy", scaling=False)
        for backend in ("proxal", "fedadmm"):
            res = prob.solve(backend)
            assert res.status == "converged", (backend, res.status)
            off = np.max(np.abs(res.value(w) - ref.value(w))) / np.max(np.abs(ref.value(w)))
            assert off <= 1e-4, (backend, off)
            assert fm.verify(res, ref).ok
