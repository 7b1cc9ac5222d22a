"""Code generation (`fm.Plan`): one evaluation plan for several outputs computes every shared
subexpression once, folds constants at compile time, reads Parameter values at call time (no
recompilation), and returns exactly what direct evaluation returns."""
from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

import fedmodel as fm

RNG = np.random.default_rng(3)


def steps_named(plan: fm.Plan, display: str) -> list[str]:
    return [line for line in plan.describe().splitlines() if f"= {display}(" in line]


def test_logistic_value_and_gradient_compute_X_at_w_once():
    X = RNG.standard_normal((50, 4))
    w = fm.Variable(4, name="w")
    f = fm.mean(fm.logistic(X @ w))
    plan = fm.Plan([f, fm.grad(f, w)], [w])
    # X @ w once (the forward product), Xᵀ @ (...) once (the gradient): two matmuls in all,
    # and exactly one of them reads the input w (slot s0)
    matmuls = steps_named(plan, "matmul")
    assert len(matmuls) == 2, plan.describe()
    assert len([m for m in matmuls if re.search(r"\bs0\b", m)]) == 1
    assert len(steps_named(plan, "logistic")) == 1 and len(steps_named(plan, "sigmoid")) == 1
    assert plan.n_steps == 6, plan.describe()   # matmul, logistic, mean, sigmoid, scale, matmul
    # the generated source agrees: one call with the input v0 as an argument
    assert len(re.findall(r"\bv0\b", plan.source)) == 2   # the signature and one use
    # Xᵀ is folded at compile time: no transpose step runs at call time
    assert not steps_named(plan, "transpose")


def test_constraint_and_objective_on_the_same_array_share_the_product():
    """`X @ w` written twice (two Constant leaves around one numpy array) is computed once."""
    X = RNG.standard_normal((30, 3))
    w = fm.Variable(3, name="w")
    f = fm.mean(fm.logistic(X @ w))
    c = fm.mean(fm.logistic(-(X @ w))) - 0.2
    plan = fm.Plan([f, fm.grad(f, w), c, fm.grad(c, w)], [w])
    forward = [m for m in steps_named(plan, "matmul") if re.search(r"\bs0\b", m)]
    assert len(forward) == 1, plan.describe()
    w0 = RNG.standard_normal(3)
    w.value = w0
    for out, expr in zip(plan(w0), [f, fm.grad(f, w), c, fm.grad(c, w)]):
        np.testing.assert_allclose(out, expr.value, rtol=1e-14)


def test_structurally_equal_subexpressions_are_shared():
    w = fm.Variable(3, name="w")
    A = fm.Data(RNG.standard_normal((5, 3)), owner="c0", name="A")
    # the same expression built twice from the same leaves: one step each
    f = fm.sum(fm.exp(A @ w)) + fm.sum_squares(fm.exp(A @ w))
    plan = fm.Plan([f], [w])
    assert len(steps_named(plan, "matmul")) == 1
    assert len(steps_named(plan, "exp")) == 1


def test_al_merit_value_and_gradient_share_the_constraint_value():
    X = RNG.standard_normal((40, 3))
    w = fm.Variable(3, name="w")
    mu, beta = fm.Parameter(name="mu", value=0.5), fm.Parameter(name="beta", value=10.0)
    c = fm.mean(fm.logistic(-(X @ w))) - 0.2
    term = (1 / (2 * beta)) * (fm.square(fm.pos(mu + beta * c)) - fm.square(mu))
    plan = fm.Plan([term, fm.grad(term, w)], [w])
    assert len(steps_named(plan, "logistic")) == 1    # c(w) once, for the value and the gradient
    assert len(steps_named(plan, "pos")) == 1
    assert len([m for m in steps_named(plan, "matmul") if re.search(r"\bs0\b", m)]) == 1


def test_parameters_change_between_calls_without_recompiling():
    X = RNG.standard_normal((20, 3))
    w = fm.Variable(3, name="w")
    mu = fm.Parameter(name="mu", value=0.5)
    center = fm.Parameter(3, name="center", value=np.zeros(3))
    rho = fm.Parameter(name="rho", value=1.0)
    f = fm.mean(fm.logistic(X @ w)) + mu * fm.sum(w) + rho / 2 * fm.sum_squares(w - center)
    g = fm.grad(f, w)
    plan = fm.Plan([f, g], [w])
    run, source = plan._run, plan.source
    w0 = RNG.standard_normal(3)
    for mu_value, rho_value in [(0.5, 1.0), (-2.0, 3.0), (0.0, 0.25)]:
        mu.value, rho.value = mu_value, rho_value
        center.value = RNG.standard_normal(3)
        value, gradient = plan(w0)
        z = X @ w0
        expected = (np.logaddexp(0, z).mean() + mu_value * w0.sum()
                    + rho_value / 2 * np.sum((w0 - center.value) ** 2))
        expected_gradient = (X.T @ (1 / (1 + np.exp(-z))) / 20 + mu_value
                             + rho_value * (w0 - center.value))
        assert value == pytest.approx(expected, rel=1e-13)
        np.testing.assert_allclose(gradient, expected_gradient, rtol=1e-12)
    assert plan._run is run and plan.source == source     # never regenerated


def test_quad_form_with_a_parameter_matrix_follows_the_parameter():
    """Nothing is baked in from a Parameter's value at build time: not the gradient's
    matrix, not the curvature."""
    x = fm.Variable(2, name="x")
    P = fm.Parameter((2, 2), name="P", value=np.eye(2))
    f = fm.quad_form(x, P)
    plan = fm.Plan([f, fm.grad(f, x)], [x])
    x0 = np.array([1.0, 2.0])
    for value in (np.eye(2), np.array([[3.0, 1.0], [0.0, 2.0]]), -np.eye(2)):
        P.value = value
        f_value, g_value = plan(x0)
        assert f_value == pytest.approx(x0 @ value @ x0)
        np.testing.assert_allclose(g_value, (value + value.T) @ x0)
    assert not f.is_dcp() and not fm.to_cvxpy(f).is_dcp()   # P's sign may change: unknown


def test_parameter_without_value_is_reported_by_name():
    w = fm.Variable(2, name="w")
    lam = fm.Parameter(name="lam")
    plan = fm.Plan([lam * fm.sum_squares(w)], [w])
    with pytest.raises(fm.FedModelError, match="lam"):
        plan(np.ones(2))
    lam.value = 3.0
    assert plan(np.ones(2))[0] == pytest.approx(6.0)


def _random_outputs():
    w = fm.Variable(3, name="w")
    W = fm.Variable((3, 2), name="W")
    A = RNG.standard_normal((4, 3))
    p = fm.Parameter(2, name="p", value=np.array([0.5, -1.0]))
    outputs = [
        fm.sum_squares(A @ w - 1) + fm.log_sum_exp(W.T @ w),
        fm.logistic(A @ W) @ p,
        fm.huber(W, 0.5),
        w[[0, 2]] * fm.exp(W[0, :]),
        fm.mean(fm.square(W), axis=0) - p,
        fm.norm2(w) + fm.norm1(W) + fm.norm_inf(A @ w),
        fm.quad_form(w, np.eye(3) * 2),
        fm.maximum(A @ w, 0.1),
        W.T,
        w,                                           # an input as an output
        fm.Constant(np.arange(3.0)),                 # a constant as an output
    ]
    f = outputs[0] + fm.sum(outputs[1])
    outputs += [fm.grad(f, w), fm.grad(f, W)]
    return w, W, outputs


def test_plan_results_equal_direct_evaluation():
    w, W, outputs = _random_outputs()
    plan = fm.Plan(outputs, [w, W])
    for _ in range(3):
        w0, W0 = RNG.standard_normal(3), RNG.standard_normal((3, 2))
        results = plan(w0, W0)
        w.value, W.value = w0, W0
        assert len(results) == len(outputs)
        for out, expr in zip(results, outputs):
            assert np.shape(out) == expr.shape
            np.testing.assert_allclose(out, expr.value, rtol=1e-14, atol=1e-15, err_msg=str(expr))


def test_each_output_alone_gives_the_same_numbers():
    w, W, outputs = _random_outputs()
    w0, W0 = RNG.standard_normal(3), RNG.standard_normal((3, 2))
    together = fm.Plan(outputs, [w, W])(w0, W0)
    for out, expr in zip(together, outputs):
        alone = fm.Plan([expr], [w, W])(w0, W0)[0]
        np.testing.assert_array_equal(out, alone)


def test_returned_constants_are_copies():
    """A caller updating a result in place must not change what the plan returns next time."""
    w = fm.Variable(3, name="w")
    c = np.array([1.0, 2.0, 3.0])
    plan = fm.Plan([fm.grad(c @ w, w)], [w])
    g = plan(np.zeros(3))[0]
    np.testing.assert_array_equal(g, c)
    g *= 10
    np.testing.assert_array_equal(plan(np.zeros(3))[0], c)
    np.testing.assert_array_equal(c, [1.0, 2.0, 3.0])


def test_constant_subtrees_are_folded():
    w = fm.Variable(3, name="w")
    A = RNG.standard_normal((3, 3))
    f = fm.sum(fm.exp(A.T @ A) @ w) + fm.sum(fm.log(np.arange(1.0, 4.0)))
    plan = fm.Plan([f], [w])
    assert not steps_named(plan, "exp") and not steps_named(plan, "log")
    assert not steps_named(plan, "transpose")
    w0 = RNG.standard_normal(3)
    w.value = w0
    assert plan(w0)[0] == pytest.approx(f.value, rel=1e-13)


def test_plan_checks_its_inputs():
    w, v = fm.Variable(2, name="w"), fm.Variable(2, name="v")
    with pytest.raises(fm.FedModelError, match="v"):
        fm.Plan([fm.sum(w + v)], [w])
    plan = fm.Plan([fm.sum(w)], [w])
    with pytest.raises(fm.FedModelError, match="1 value"):
        plan(np.ones(2), np.ones(2))


def test_plan_pickles_and_keeps_working():
    X = RNG.standard_normal((10, 3))
    w = fm.Variable(3, name="w")
    f = fm.mean(fm.logistic(X @ w))
    plan = fm.Plan([f, fm.grad(f, w)], [w])
    clone = pickle.loads(pickle.dumps(plan))
    w0 = RNG.standard_normal(3)
    for a, b in zip(plan(w0), clone(w0)):
        np.testing.assert_array_equal(a, b)


def test_value_property_uses_the_same_numbers():
    """`expr.value` (direct evaluation) and a plan agree bit for bit on a long chain."""
    x = fm.Variable(4, name="x")
    e = x
    for i in range(30):
        e = fm.logistic(0.9 * e + 0.01 * i) - 0.3
    f = fm.sum(e)
    x0 = RNG.standard_normal(4)
    x.value = x0
    assert fm.Plan([f], [x])(x0)[0] == f.value


def test_plans_of_the_same_structure_compile_once_and_keep_their_own_data():
    """Two clients' plans differ only in their data: one compiled source, separate constants."""
    from fedmodel.compiler import codegen
    w = fm.Variable(3, name="w")
    A1, A2 = np.arange(6.0).reshape(2, 3), -np.ones((2, 3))
    p1 = codegen.Plan([fm.sum_squares(A1 @ w)], [w])
    p2 = codegen.Plan([fm.sum_squares(A2 @ w)], [w])
    assert p1.source == p2.source and codegen._COMPILED[p1.source] is not None
    x = np.array([1.0, -1.0, 2.0])
    assert p1(x)[0] == pytest.approx(np.sum((A1 @ x) ** 2))
    assert p2(x)[0] == pytest.approx(np.sum((A2 @ x) ** 2))
