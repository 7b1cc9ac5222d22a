"""Models as users write them (issue 25, "fedmodel as a new user", items 9, 10, 12, and the
paramset leftovers): a shifted norm `norm2(w - a)` as a client term (a geometric median), a log
barrier that is not finite at the start w = 0, a label column y of shape (m, 1) in `X @ w - y`,
and norm balls of radius 0. Independent answers: CVXPY, closed forms (the ℓ1 median is the
coordinate-wise median; -Σ log wⱼ + Σ wⱼ is least at w = 1; a ball of radius 0 is {0}) and
Weiszfeld's iteration for the geometric median."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.compiler.canonical import classify_objective
from fedmodel.compiler.projection import Ball, project_l1_ball
from fedmodel.expression import BroadcastWarning
from fedmodel.runtime.program import compile_programs

ANCHORS = np.array([[0.0, 0.0], [4.0, 0.5], [1.0, 3.0]])    # a triangle: the median is inside


def _weiszfeld(points: np.ndarray, steps: int = 5000) -> np.ndarray:
    """The geometric median argmin Σᵢ ‖w − aᵢ‖₂ by Weiszfeld's fixed point (inside the hull)."""
    w = points.mean(axis=0)
    for _ in range(steps):
        inverse = 1.0 / np.linalg.norm(points - w, axis=1)
        w = (points * inverse[:, None]).sum(axis=0) / inverse.sum()
    return w


def _median_problem(atom, as_data: bool = False):
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    for a in ANCHORS:
        c = prob.add_client()
        c.minimize(atom(w - (c.data(a, name="a") if as_data else a)))
    return prob, w


# ---- item 12: shifted norms have the shifted prox --------------------------------------------
def test_a_shifted_norm_is_a_prox_term_with_the_shifted_prox():
    """λ‖2w − b‖₂ = 2λ‖w − b/2‖₂: its prox is b/2 + block soft-thresholding of v − b/2 at 2tλ
    (was "neither a gradient nor a prox")."""
    w = fm.Variable(3, name="w")
    b, lam, t = np.array([1.0, -2.0, 4.0]), 0.7, 0.9
    found = classify_objective([lam * fm.norm2(2 * w - b)])
    assert not found.unsupported and not found.smooth and len(found.prox) == 1
    term = found.prox[0]
    v = np.array([3.0, 1.0, -1.0])
    d = v - b / 2
    expected = b / 2 + max(0.0, 1 - 2 * t * lam / np.linalg.norm(d)) * d
    np.testing.assert_allclose(term.prox(v, t), expected, rtol=1e-12)
    assert term.value(v) == pytest.approx(lam * np.linalg.norm(2 * v - b))
    shifted1 = classify_objective([fm.norm1(w + 1.0)]).prox[0]      # ‖w − (−1)‖₁
    np.testing.assert_allclose(shifted1.prox(np.array([0.5, -1.2, -3.0]), 1.0), [-0.5, -1.0, -2.0])


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["proxal", "dald", "fedadmm"])
@pytest.mark.parametrize("as_data", [False, True])
def test_geometric_median_over_three_clients(backend, as_data):
    """Σᵢ ‖w − aᵢ‖₂, one anchor a client (a SmoothnessError on ProxAL, DALD and FedADMM before)."""
    prob, w = _median_problem(fm.norm2, as_data)
    ref = prob.solve("cvxpy")
    median = _weiszfeld(ANCHORS)
    np.testing.assert_allclose(ref.value(w), median, atol=1e-4)
    res = prob.solve(backend)
    assert res.status == "converged"
    np.testing.assert_allclose(res.value(w), median, atol=1e-4)
    assert res.objective == pytest.approx(np.linalg.norm(ANCHORS - median, axis=1).sum(), rel=1e-6)
    assert fm.verify(res, ref).ok


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["proxal", "dald", "fedadmm"])
def test_l1_median_over_three_clients(backend):
    """Σᵢ ‖w − aᵢ‖₁ is least at the coordinate-wise median (a kink of every coordinate: the
    certificate reads a point within 1e-5 of it as on it)."""
    prob, w = _median_problem(fm.norm1)
    res = prob.solve(backend)
    assert res.status == "converged"
    np.testing.assert_allclose(res.value(w), np.median(ANCHORS, axis=0), atol=1e-4)
    assert fm.verify(res, prob.solve("cvxpy")).ok


def _least_squares(truth, rows: int, seed: int, extra=None):
    """Σᵢ ‖Xᵢ w − Xᵢ·truth‖² / rows (+ extra(w) in each client) over 3 clients' own data."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    for _ in range(3):
        X = rng.normal(size=(rows, 3))
        c = prob.add_client()
        loss = fm.sum_squares(c.data(X, name="X") @ w - c.data(X @ np.asarray(truth), name="y")) / rows
        c.minimize(loss if extra is None else loss + extra(w))
    return prob, w


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["proxal", "dald", "fedadmm"])
def test_a_group_lasso_term_in_each_client(backend):
    """Least squares + 0.3‖w‖₂ in every client: the ‖·‖₂ term by its prox (was "neither a
    gradient nor a prox"); CVXPY is the reference (the group shrinks, not to 0)."""
    prob, w = _least_squares([0.3, -0.2, 0.1], rows=12, seed=3, extra=lambda w: 0.3 * fm.norm2(w))
    ref = prob.solve("cvxpy")
    res = prob.solve(backend)
    assert res.status == "converged" and 0 < np.linalg.norm(ref.value(w)) < 0.3
    np.testing.assert_allclose(res.value(w), ref.value(w), atol=1e-4)
    assert fm.verify(res, ref).ok


@pytest.mark.parametrize("atom", [fm.norm2, fm.norm1], ids=["norm2", "norm1"])
def test_a_lone_shifted_norm_is_solved_locally_by_its_prox_in_one_step(atom):
    """ProxAL's local subproblem of a median client, linearᵀx + (ρ/2)‖x − x̄‖² + (ω/2)‖x − c‖²
    + ‖x − a‖, is least at prox_{‖· − a‖/(ρ+ω)}(m), m = (ρx̄ + ωc − linear)/(ρ+ω): a shifted
    block soft-threshold, or soft-threshold per entry (entry 2 lands on its kink a₂). One step,
    the closed form's answer (FISTA, from L = ρ, finding ω by backtracking: 38 steps each)."""
    prob, _ = _median_problem(atom, as_data=True)
    program = compile_programs(prob)["c1"]
    a, c, omega = ANCHORS[1], np.array([3.0, 0.5]), 3.0
    program.configure(beta=1.0, prox_weight=omega, center=c)
    linear, rho, center = np.array([0.3, -0.2]), 2.0, np.array([1.0, 0.6])
    out = program.solve_local(linear=linear, weight=rho, anchor=center, x0=np.zeros(2), tol=1e-10)
    total = rho + omega
    v = (rho * center + omega * c - linear) / total - a
    if atom is fm.norm2:
        expected = a + max(0.0, 1 - 1 / (total * np.linalg.norm(v))) * v
    else:
        expected = a + np.sign(v) * np.maximum(np.abs(v) - 1 / total, 0.0)
        assert expected[1] == a[1]
    assert out["steps"] == 1
    np.testing.assert_allclose(out["x"], expected, rtol=1e-12, atol=1e-15)


def test_two_shifted_norms_on_one_client_are_refused_by_name():
    """Their proxes in turn are not the prox of the sum: refused, not solved wrongly."""
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    prob.add_client().minimize(fm.norm2(w - ANCHORS[0]) + fm.norm2(w - ANCHORS[1]))
    with pytest.raises(fm.SmoothnessError, match="its own client"):
        prob.solve("proxal")


def test_cvxpy_answer_of_a_median_on_an_anchor_verifies():
    """The geometric median at a vertex (the others pull in opposite directions): CVXPY's answer
    is exact and the certificate's kink reads it so (the norms on one variable add up)."""
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    for a in ([1.0, 1.0], [4.0, 1.0], [-2.0, 1.2]):
        prob.add_client().minimize(fm.norm2(w - np.array(a)))
    ref = prob.solve("cvxpy")
    np.testing.assert_allclose(ref.value(w), [1.0, 1.0], atol=1e-6)
    assert fm.verify(ref, ref).ok


# ---- item 10: the start point ----------------------------------------------------------------
def _barrier():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    prob.add_client().minimize(-fm.sum(fm.log(w)) + fm.sum(w))
    return prob, w


@pytest.mark.parametrize("backend", ["proxal", "dald", "fedavg"])
def test_a_start_outside_the_domain_is_refused_before_the_run(backend):
    """log(w) at w = 0: the error names the term and says to set w.value (was "diverged")."""
    prob, _ = _barrier()
    with pytest.raises(fm.FedModelError, match=r"log\(w\).*not finite at the start.*w\.value"):
        prob.solve(backend)


@pytest.mark.parametrize("backend", ["proxal", "fedadmm", "dald"])
def test_the_run_starts_from_the_value_the_user_set(backend):
    """w.value = [0.5, 0.5] is the start: -Σ log wⱼ + Σ wⱼ is least at w = 1, f* = 2."""
    prob, w = _barrier()
    w.value = [0.5, 0.5]
    res = prob.solve(backend)
    assert res.status == "converged"
    np.testing.assert_allclose(res.value(w), [1.0, 1.0], atol=1e-5)
    assert res.objective == pytest.approx(2.0, abs=1e-9)
    again = prob.solve(backend)          # from the user's start again, not from the last answer
    assert again.status == "converged" and again.iterations == res.iterations
    w.value = None                       # the start withdrawn: from 0 again, refused
    with pytest.raises(fm.FedModelError, match="not finite at the start"):
        prob.solve(backend)


def test_cvxpy_needs_no_start():
    prob, w = _barrier()
    np.testing.assert_allclose(prob.solve("cvxpy").value(w), [1.0, 1.0], atol=1e-4)


# ---- item 9: a column against a vector ----------------------------------------------------------
def test_a_label_column_against_a_vector_warns_at_the_users_line():
    X = np.arange(12.0).reshape(4, 3)
    y = np.ones((4, 1))
    w = fm.Variable(3, name="w")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        residual = X @ w - y
        flipped = y - X @ w
        constraint = X @ w <= y
        product = fm.multiply(X @ w, y)
        fine = X @ w - y.ravel()
    crossing = [c for c in caught if issubclass(c.category, BroadcastWarning)]
    assert len(crossing) == 4                          # one each, none from fedmodel's own work
    assert all(c.filename == __file__ for c in crossing)
    assert "(4, 4)" in str(crossing[0].message) and "y.ravel()" in str(crossing[0].message)
    assert residual.shape == flipped.shape == constraint.shape == product.shape == (4, 4)
    assert fine.shape == (4,)
    w.value = np.array([1.0, 0.0, -1.0])
    np.testing.assert_allclose(residual.value, (X @ w.value) - y)    # numpy's (and CVXPY's) meaning


# ---- paramset leftovers: a ball of radius 0 -------------------------------------------------------
def test_projections_on_a_ball_of_radius_zero():
    np.testing.assert_array_equal(project_l1_ball(np.array([1.0, -2.0]), 0.0), [0.0, 0.0])
    np.testing.assert_array_equal(Ball(0.0).tangent(np.zeros(2), np.array([1.0, 2.0])), [0.0, 0.0])


def _ridge(make_ball):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(10, 3))
    y = X @ np.array([1.0, -2.0, 0.5])
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    for _ in range(2):
        prob.add_client().minimize(fm.sum_squares(X @ w - y))
    prob.server.subject_to(make_ball(w))
    return prob, w


@pytest.mark.parametrize("ball", [lambda w: fm.norm2(w) <= 0, lambda w: fm.norm1(w) <= 0,
                                  lambda w: fm.sum_squares(w) <= 0],
                         ids=["norm2", "norm1", "sum_squares"])
def test_a_ball_of_radius_zero_is_the_point_zero(ball):
    """Projected to {0} (was a SmoothnessError, or a crash for sum_squares(w) <= 0)."""
    prob, w = _ridge(ball)
    res = prob.solve("fedadmm")
    assert res.status == "converged"
    np.testing.assert_allclose(res.value(w), 0.0, atol=1e-9)
    np.testing.assert_allclose(prob.solve("cvxpy").value(w), 0.0, atol=1e-4)


def test_a_parameter_radius_may_be_zero_and_change():
    r = fm.Parameter(value=0.0, nonneg=True, name="r")
    prob, w = _ridge(lambda w: fm.norm2(w) <= r)
    np.testing.assert_allclose(prob.solve("fedadmm").value(w), 0.0, atol=1e-9)
    r.value = 0.5
    res, ref = prob.solve("fedadmm"), prob.solve("cvxpy")
    assert np.linalg.norm(res.value(w)) == pytest.approx(0.5, rel=1e-6)
    np.testing.assert_allclose(res.value(w), ref.value(w), atol=1e-4)


def test_a_shifted_norm_of_radius_zero_is_an_equality():
    """‖w − 1‖₂ ≤ 0 is w = 1 (was "no projection or smooth equivalent")."""
    prob, w = _ridge(lambda w: fm.norm2(w - 1.0) <= 0)
    res = prob.solve("proxal")
    assert res.status == "converged"
    np.testing.assert_allclose(res.value(w), 1.0, atol=1e-5)


@pytest.mark.integration
def test_a_parameter_multiplying_the_variable_in_a_halfspace_is_projected():
    """`a @ w <= b` with `a` a Parameter: FedADMM projects on it at a's present value and a new
    value needs no rebuild (was refused: "with constant a"); CVXPY is the reference, and its
    multiplier too."""
    prob, w = _least_squares([1.0, -2.0, 0.5], rows=10, seed=0)
    a = fm.Parameter(3, value=np.array([1.0, -1.0, 0.0]), name="a")
    prob.server.subject_to(a @ w <= 0.5)
    for value in ([1.0, -1.0, 0.0], [0.0, -1.0, 2.0]):       # both active: w* moves with a
        a.value = np.array(value)
        res, ref = prob.solve("fedadmm"), prob.solve("cvxpy")
        assert res.status == "converged"
        assert float(a.value @ res.value(w)) == pytest.approx(0.5, abs=1e-6)
        np.testing.assert_allclose(res.value(w), ref.value(w), atol=1e-4)
        assert float(res.multipliers["server.con0"]) == pytest.approx(
            float(ref.multipliers["server.con0"]), rel=1e-3)
