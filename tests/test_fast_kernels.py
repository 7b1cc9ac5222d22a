"""The vectorized logistic / sigmoid kernels and the column-major layout of skinny data
(issue 13: the speed of default ProxAL on adult), checked against independent references."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.special

import fedmodel as fm
from fedmodel.atoms.elementwise import _logistic, _sigmoid
from fedmodel.expression import SKINNY_COLUMNS

WIDE = np.concatenate([np.linspace(-740.0, 740.0, 200_001), [0.0, -0.0, 1e-300, -1e-300]])


def test_logistic_matches_logaddexp_everywhere():
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # no overflow / invalid warnings
        value = _logistic(WIDE)
    reference = np.logaddexp(0.0, WIDE)
    np.testing.assert_allclose(value, reference, rtol=4.5e-16, atol=0)
    assert _logistic(np.array([np.inf, -np.inf])).tolist() == [np.inf, 0.0]
    assert np.isnan(_logistic(np.array([np.nan]))).all()


def test_sigmoid_matches_expit_relatively_everywhere():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = _sigmoid(WIDE)
    reference = scipy.special.expit(WIDE)
    normal = reference > 1e-300                     # below that expit flushes subnormals to 0
    np.testing.assert_allclose(value[normal], reference[normal], rtol=1e-15, atol=0)
    assert np.all(value[~normal] < 1e-300)
    assert _sigmoid(np.array([np.inf, -np.inf])).tolist() == [1.0, 0.0]
    assert np.isnan(_sigmoid(np.array([np.nan]))).all()


@pytest.mark.parametrize("x", [-3.0, 0.0, 2.5, np.float64(-40.0), np.array(1.5), 7])
def test_scalars_and_integers_match_too(x):
    assert float(_logistic(x)) == pytest.approx(float(np.logaddexp(0.0, x)), rel=1e-15)
    assert float(_sigmoid(x)) == pytest.approx(float(scipy.special.expit(x)), rel=1e-15)
    ints = np.array([-3, 0, 4])
    np.testing.assert_allclose(_logistic(ints), np.logaddexp(0.0, ints), rtol=1e-15)
    np.testing.assert_allclose(_sigmoid(ints), scipy.special.expit(ints), rtol=1e-15)


def test_kernels_do_not_modify_their_argument():
    x = np.array([-2.0, 0.5, 3.0])
    before = x.copy()
    _logistic(x), _sigmoid(x)
    assert np.array_equal(x, before)


def test_skinny_data_is_column_major_and_wide_data_is_kept():
    rng = np.random.default_rng(0)
    prob = fm.Problem()
    client = prob.add_client("c0")
    tall = rng.normal(size=(SKINNY_COLUMNS + 100, 5))
    wide = rng.normal(size=(SKINNY_COLUMNS + 100, SKINNY_COLUMNS + 1))
    short = rng.normal(size=(10, 5))
    X, W, S = (client.data(a, name=n) for a, n in ((tall, "X"), (wide, "W"), (short, "S")))
    assert X.value.flags.f_contiguous and np.array_equal(X.value, tall)
    assert W.value is wide or W.value.flags.c_contiguous
    assert S.value.flags.c_contiguous


def test_logistic_model_gradient_on_skinny_data_matches_closed_form():
    """value and derived gradient of mean(logistic(X w)) over column-major data, against the
    closed form Xᵀσ(Xw)/m computed on the row-major array."""
    rng = np.random.default_rng(1)
    A = rng.normal(size=(500, 7))
    w = fm.Variable(7, name="w")
    prob = fm.Problem()
    X = prob.add_client("c0").data(A, name="X")
    f = fm.mean(fm.logistic(X @ w))
    w.value = rng.normal(size=7)
    z = A @ w.value
    assert f.value == pytest.approx(np.mean(np.logaddexp(0.0, z)), rel=1e-14)
    np.testing.assert_allclose(fm.grad(f, w).value, A.T @ scipy.special.expit(z) / 500, rtol=1e-12)


@pytest.mark.parametrize("gradient_first", [False, True])
def test_plan_fuses_logistic_and_sigmoid_of_one_argument_bitwise(gradient_first):
    """A logistic loss's value and gradient need logistic(Xw) and sigmoid(Xw): the plan computes
    them in one kernel call, with exactly the bits of the two separate kernels, whichever of
    the two steps comes first."""
    import re

    from fedmodel.compiler.codegen import Plan
    from fedmodel.expression import evaluate
    rng = np.random.default_rng(2)
    A = rng.normal(size=(300, 4)) * 30.0                 # large margins on both sides
    w = fm.Variable(4, name="w")
    f = fm.mean(fm.logistic(fm.Constant(A) @ w))
    g = fm.grad(f, w)
    outputs = [g, f] if gradient_first else [f, g]
    plan = Plan(outputs, [w])
    assert len(re.findall(r"s\d+, s\d+ = f\d+\(", plan.source)) == 1
    w.value = rng.normal(size=4)
    fused = plan(w.value)
    for got, expr in zip(fused, outputs):
        assert np.array_equal(np.asarray(got), np.asarray(evaluate(expr)))


def test_logistic_and_sigmoid_kernel_equals_the_two_kernels():
    from fedmodel.atoms.elementwise import logistic_and_sigmoid
    value, slope = logistic_and_sigmoid(WIDE)
    assert np.array_equal(value, _logistic(WIDE)) and np.array_equal(slope, _sigmoid(WIDE))
    assert logistic_and_sigmoid(-2.0) == (_logistic(-2.0), _sigmoid(-2.0))


def test_newton_direction_from_an_inverse_equals_the_cholesky_solve():
    """A Newton matrix held as its inverse (`solvers.Inverse`, as the batched executor holds
    them) gives scipy's Cholesky solve's direction to rounding; a singular one a gradient step."""
    from scipy.linalg import cho_factor, cho_solve

    from fedmodel.runtime.solvers import Inverse, _newton_direction
    rng = np.random.default_rng(3)
    A = rng.normal(size=(30, 6))
    H, g = A.T @ A + np.eye(6), rng.normal(size=6)
    expected = -cho_solve(cho_factor(H), g)
    np.testing.assert_allclose(_newton_direction(Inverse(H), g), expected, rtol=1e-13, atol=0)
    np.testing.assert_allclose(_newton_direction(H, g), expected, rtol=1e-13, atol=0)
    for singular in (np.zeros((6, 6)), Inverse(np.zeros((6, 6)))):   # a gradient step
        assert np.array_equal(_newton_direction(singular, g), -g)


def test_value_grad_flattens_the_gradient_of_a_matrix_variable():
    """NodeProgram.value_grad's fast path (one variable, a gradient of its shape) returns the
    flat gradient in the layout's order, against the closed form 2(W − B)."""
    from fedmodel.runtime.program import compile_programs
    W = fm.Variable((2, 3), name="W")
    prob = fm.Problem()
    client = prob.add_client("c0")
    client.minimize(fm.sum_squares(W - client.data(np.arange(6.0).reshape(2, 3), name="B")))
    program = compile_programs(prob)["c0"]
    program.configure(beta=1.0, prox_weight=0.0, center=np.zeros(6))
    value, g = program.value_grad(np.ones(6), np.zeros(0))
    B = np.arange(6.0)
    assert value == pytest.approx(np.sum((1 - B) ** 2)) and np.allclose(g, 2 * (1 - B))


def test_hessian_plan_computes_sigmoid_curvature_once_and_matches_closed_form():
    """∇² mean(logistic(Xw)) = Xᵀ diag(σ(1 − σ)) X / m: the Hessian plan (all d directions at
    once) forms σ(1 − σ) once (one shared 1.0 in Sigmoid's derivative), not per column."""
    from fedmodel.runtime.program import compile_programs
    rng = np.random.default_rng(5)
    A = rng.normal(size=(200, 6))
    w = fm.Variable(6, name="w")
    prob = fm.Problem()
    client = prob.add_client("c0")
    client.minimize(fm.mean(fm.logistic(client.data(A, name="X") @ w)))
    program = compile_programs(prob)["c0"]
    program.configure(beta=1.0, prox_weight=0.0, center=np.zeros(6))
    z = rng.normal(size=6)
    H = program.hessian(z)
    s = scipy.special.expit(A @ z)
    np.testing.assert_allclose(H, A.T @ (A * (s * (1 - s))[:, None]) / 200, rtol=1e-12, atol=1e-15)
    steps = dict(line.split(" = ") for line in program.compiled._hessian_plan.describe().splitlines())
    negated = [slot for slot, step in steps.items() if step.startswith("neg(")]     # −σ
    assert len(negated) == 1
    assert sum(step.startswith("add(") and negated[0] in step for step in steps.values()) == 1


def test_gradient_alone_equals_the_merit_gradient_bitwise():
    """NodeProgram.gradient (a plan without the loss value, used by ProxAL's test (22)) gives
    exactly the bits of merit(x)["grad"], on a Neyman-Pearson client (logistic objective, an
    active logistic constraint in the AL term), and matches the closed form."""
    from fedmodel.runtime.program import compile_programs
    rng = np.random.default_rng(6)
    A0, A1 = rng.normal(size=(300, 5)), rng.normal(size=(120, 5))
    w = fm.Variable(5, name="w")
    prob = fm.Problem()
    client = prob.add_client("c0")
    X0, X1 = client.data(A0, name="X0"), client.data(A1, name="X1")
    client.minimize(fm.mean(fm.logistic(X0 @ w)))
    client.subject_to((fm.mean(fm.logistic(-(X1 @ w))) <= 0.2).named("np"))
    program = compile_programs(prob)["c0"]
    program.configure(beta=300.0, prox_weight=0.01, center=np.zeros(5))
    program.set_multipliers({"np": np.array(0.7)})
    x = rng.normal(size=5)
    alone = program.gradient(x)
    program.compiled.forget()                       # no memoized evaluation: the full plan runs
    assert np.array_equal(alone, program.merit(x)["grad"])
    # closed form: ∇f + [μ + βc]₊ ∇c + ω (x − center)
    s0, s1 = scipy.special.expit(A0 @ x), scipy.special.expit(-(A1 @ x))
    c = np.mean(np.logaddexp(0.0, -(A1 @ x))) - 0.2
    expected = A0.T @ s0 / 300 + max(0.7 + 300.0 * c, 0.0) * (-(A1.T @ s1) / 120) + 0.01 * x
    np.testing.assert_allclose(alone, expected, rtol=1e-10)
    assert np.array_equal(program.prox_remainder(x, alone), alone)   # no prox terms: g itself
