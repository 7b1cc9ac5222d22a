"""Sets whose radius, bounds or offset are Parameters (issue 25, items 3–4): projected with the
Parameter's present value, read at each projection, so a re-solve after `p.value = …` answers
the new model without a rebuild; checked against CVXPY (and closed forms) before and after."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.compiler.intersections import merge_sets
from fedmodel.compiler.sets import simple_set
from fedmodel.errors import FedModelError

BACKENDS = ["proxal", "dald", "fedadmm", "dp-admm"]
V = np.array([3.0, 4.0, 0.0])


def _ball_problem(r):
    """Least squares over 3 clients whose unconstrained answer (‖·‖ ≈ 3.7) lies outside the
    server's ball ‖w‖ ≤ r for r = 2 and 3: the ball is active at both values."""
    rng = np.random.default_rng(0)
    prob, w = fm.Problem(), fm.Variable(3, name="w")
    for i in range(3):
        X = rng.normal(size=(10, 3))
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(X @ w - X @ np.array([3.0, -2.0, 1.0]) - 0.1 * rng.normal(size=10)) / 10)
    prob.server.subject_to(fm.norm2(w) <= r)
    return prob, w


def _halfspace_problem(b):
    """Issue 25 item 4: ridge + 0.1‖w − 1‖² on 3 clients × 10 rows, each with sum(w) <= b."""
    rng = np.random.default_rng(1)
    prob, w = fm.Problem(), fm.Variable(3, name="w")
    for i in range(3):
        X = rng.normal(size=(10, 3))
        y = X @ np.array([1.0, 2.0, -1.0]) + 0.1 * rng.normal(size=10)
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(X @ w - y) / 10 + 0.1 * fm.sum_squares(w - np.ones(3)))
        c.subject_to(fm.sum(w) <= b)
    return prob, w


def _resolves(prob, w, parameter, values, backend):
    for value in values:
        parameter.value = value
        ref, res = prob.solve("cvxpy"), prob.solve(backend)
        assert res.status == "converged", (backend, value, res.status)
        assert np.max(np.abs(res.value(w) - ref.value(w))) < 1e-4, (backend, value)
        assert fm.verify(res, ref).ok
    return ref


@pytest.mark.integration    # 0.3–2 s per backend on 2 shared cores
@pytest.mark.parametrize("backend", BACKENDS)
def test_ball_radius_parameter_resolves(backend):
    r = fm.Parameter(name="r", value=2.0, nonneg=True)
    prob, w = _ball_problem(r)
    ref = _resolves(prob, w, r, [2.0, 3.0], backend)
    assert np.linalg.norm(ref.value(w)) == pytest.approx(3.0, rel=1e-5)   # the ball is active


@pytest.mark.integration
@pytest.mark.parametrize("backend", BACKENDS)
def test_client_halfspace_parameter_resolves(backend):
    b = fm.Parameter(name="b", value=0.5)
    prob, w = _halfspace_problem(b)
    ref = _resolves(prob, w, b, [0.5, 1.5, 0.5], backend)
    assert float(np.sum(ref.value(w))) == pytest.approx(0.5, abs=1e-6)    # the halfspace is active


@pytest.mark.parametrize("make, before, after", [
    (lambda w, r: fm.norm2(w) <= r, [1.2, 1.6, 0.0], [1.8, 2.4, 0.0]),
    (lambda w, r: fm.sum_squares(w) <= r ** 2, [1.2, 1.6, 0.0], [1.8, 2.4, 0.0]),
    (lambda w, r: fm.norm2(w) <= 2 * r - 2, [1.2, 1.6, 0.0], [2.4, 3.2, 0.0]),
    (lambda w, r: fm.norm1(w) <= r, [0.5, 1.5, 0.0], [1.0, 2.0, 0.0]),
    (lambda w, r: fm.norm_inf(w) <= r, [2.0, 2.0, 0.0], [3.0, 3.0, 0.0]),
    (lambda w, r: w <= r, [2.0, 2.0, 0.0], [3.0, 3.0, 0.0]),
    (lambda w, r: fm.sum(w) <= r, np.array([3, 4, 0]) - 5 / 3, np.array([3, 4, 0]) - 4 / 3),
    (lambda w, r: fm.sum(w) == r, np.array([3, 4, 0]) - 5 / 3, np.array([3, 4, 0]) - 4 / 3),
])
def test_projection_reads_the_present_value(make, before, after):
    """The set's prox is the projection (closed form) at r = 2, then at r = 3 without a rebuild."""
    w, r = fm.Variable(3, name="w"), fm.Parameter(name="r", value=2.0)
    term = simple_set(make(w, r), affine=True)
    assert term is not None
    np.testing.assert_allclose(term.prox(V, 1.0), before, atol=1e-12)
    r.value = 3.0
    np.testing.assert_allclose(term.prox(V, 1.0), after, atol=1e-12)


@pytest.mark.integration    # CVXPY's import: ~2 s
def test_parametric_intersection_is_the_projection():
    """A ball and a halfspace, both on Parameters, merged: Dykstra at the present values equals
    CVXPY's projection onto the intersection, and its normal-cone residual there is 0."""
    cp = pytest.importorskip("cvxpy")
    w, r = fm.Variable(3, name="w"), fm.Parameter(name="r", value=2.0)
    [term] = merge_sets([simple_set(fm.norm2(w) <= r), simple_set(fm.sum(w) <= r, affine=True)])
    for value in (2.0, 3.0):
        r.value = value
        x = cp.Variable(3)
        cp.Problem(cp.Minimize(cp.sum_squares(x - V)), [cp.norm(x, 2) <= value, cp.sum(x) <= value]).solve()
        found = term.prox(V, 1.0)
        np.testing.assert_allclose(found, x.value, atol=1e-5)
        assert np.max(np.abs(term.remainder(found, found - V))) < 1e-8


def test_negative_radius_is_a_model_error():
    r = fm.Parameter(name="r", value=-1.0)
    prob, w = _ball_problem(r)
    for backend in ("fedadmm", "dald"):
        with pytest.raises(FedModelError, match="radius"):
            prob.solve(backend)
    w2 = fm.Variable(3, name="w")
    r.value = 1.0
    term = simple_set(fm.norm2(w2) <= r)
    r.value = -0.5                       # changed after compiling: refused where it is read
    with pytest.raises(FedModelError, match="radius"):
        term.prox(V, 1.0)


def test_bounds_that_cross_after_a_change_are_infeasible():
    """w >= l, w <= 1 with l a Parameter: solves at l = 0 (closed form: the clipped least-squares
    answer), and at l = 2 the bounds leave no point — "infeasible" before the run (a
    FedModelError when compiled), not a point clipped in turn onto one bound (which would
    violate the other)."""
    rng = np.random.default_rng(0)
    prob, w, l = fm.Problem(), fm.Variable(2, name="w"), fm.Parameter(name="l", value=0.0)
    X = rng.normal(size=(10, 2))
    prob.add_client("c0").minimize(fm.sum_squares(X @ w - X @ np.array([3.0, -2.0])) / 10)
    prob.server.subject_to(w >= l)
    prob.server.subject_to(w <= 1)
    l.value = 2.0
    with pytest.warns(RuntimeWarning, match="no common point"):
        assert prob.solve("fedadmm").status == "infeasible"
