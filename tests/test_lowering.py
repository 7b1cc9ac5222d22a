"""Lowerings: `fm.to_cvxpy` preserves DCP structure (CVXPY accepts every convex model built
from the atoms, and solves it) and values (lowered expressions evaluate to the IR's values at
random points, with parameters and data); `fm.to_sympy` renders every atom (data become
MatrixSymbols named after the data) and its values agree with ours."""
from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedmodel as fm
from fedmodel.lowering.to_cvxpy import CvxpyContext

RNG = np.random.default_rng(11)
A = RNG.standard_normal((5, 3))
b = RNG.standard_normal(5)
P = np.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]])


def lower_with_values(expr: fm.Expression):
    """(lowered expression, its value at the current values of our variables)."""
    context = CvxpyContext()
    lowered = fm.to_cvxpy(expr, context)
    for var in expr.variables():
        context.leaves[var.uid].value = var.value
    return lowered, lowered.value


def dcp_summary(expr) -> tuple:
    return (bool(expr.is_convex()), bool(expr.is_concave()), bool(expr.is_affine()),
            bool(expr.is_nonneg()), bool(expr.is_nonpos()), tuple(expr.shape))


# ---- convex models: CVXPY accepts and solves them -----------------------------------------
def convex_models():
    """(name, objective, constraints) over w ∈ ℝ³, X ∈ ℝ³ˣ², each convex by DCP rules."""
    w, X = fm.Variable(3, name="w"), fm.Variable((3, 2), name="X")
    return w, X, [
        ("logistic regression + l1", fm.mean(fm.logistic(A @ w)) + 0.1 * fm.norm1(w), []),
        ("least squares in a ball", fm.sum_squares(A @ w - b), [fm.norm2(w) <= 0.5]),
        ("huber regression", fm.sum(fm.huber(A @ w - b, 0.5)), [w >= -1, w <= 1]),
        ("quad_form + linear", fm.quad_form(w, P) + np.ones(3) @ w, [fm.sum(w) == 1]),
        ("lse", fm.log_sum_exp(A @ w), [fm.norm_inf(w) <= 2]),
        ("entropy-like", -fm.sum(fm.log(w)) + fm.sum(fm.exp(w)), [fm.sum(w) <= 3]),
        ("sqrt and powers", fm.sum(fm.power(w, 2)) - fm.sum(fm.sqrt(w)) + fm.sum(w ** -1),
         [w >= 0.1]),
        ("pos and maximum", fm.sum(fm.pos(A @ w - 1)) + fm.sum(fm.maximum(w, -w)), []),
        ("abs", fm.sum(fm.abs(A @ w - b)), [fm.abs(w[0]) <= 0.5]),
        ("matrix softmax CE", fm.mean(fm.log_sum_exp(A @ X, axis=1))
         - fm.sum(fm.multiply(np.eye(2)[[0, 1, 1, 0, 1]], A @ X)) / 5 + fm.sum_squares(X),
         [fm.norm2(X) <= 10]),
        ("matrix mean and transpose", fm.sum_squares(X.T @ np.ones(3) - 1) + fm.mean(fm.exp(X)),
         [fm.sum(X, axis=0) <= 1, X[0, :] >= -1]),
        ("concave constraint", fm.sum_squares(w - 2), [fm.sum(fm.log(w)) >= -1, fm.sqrt(w[1]) >= 0.2]),
        ("AL-style squared pos", fm.square(fm.pos(0.5 + fm.mean(fm.logistic(-(A @ w))) - 0.4))
         + fm.sum_squares(w), []),
        ("reshape and index", fm.norm1(fm.reshape(X, (6,))) + fm.sum_squares(X[:, 1] - 1)
         + fm.square(X[2, 0] + 1), []),
        ("scaled, divided", fm.sum_squares(w) / 4 + 3 * fm.norm2(w - 1), [w / 2 <= 1]),
    ]


@pytest.mark.parametrize("index", range(15))
def test_cvxpy_accepts_and_solves_every_convex_model(index):
    w, X, models = convex_models()
    name, objective, constraints = models[index]
    assert objective.is_convex(), name
    context = CvxpyContext()
    lowered = cp.Problem(cp.Minimize(fm.to_cvxpy(objective, context)),
                         [fm.to_cvxpy(c.expr, context) <= 0 if isinstance(c, fm.Inequality)
                          else fm.to_cvxpy(c.expr, context) == 0 for c in constraints])
    assert lowered.is_dcp(), name
    lowered.solve()
    assert lowered.status == cp.OPTIMAL, name
    # the optimum, evaluated by the IR, is the optimal value CVXPY reports
    for var in objective.variables() + [v for c in constraints for v in c.expr.variables()]:
        var.value = context.leaves[var.uid].value
    assert objective.value == pytest.approx(lowered.value, rel=1e-6, abs=1e-7)
    for c in constraints:                   # and it is feasible for our constraints
        residual = np.asarray(c.expr.value)
        assert np.all(residual <= 1e-6) if isinstance(c, fm.Inequality) \
            else np.all(np.abs(residual) <= 1e-6)


def test_nonconvex_expressions_are_not_dcp_in_either():
    w = fm.Variable(3, name="w")
    for expr in (fm.sqrt(fm.exp(w)), fm.multiply(w, w), fm.log(fm.square(w)), w @ w,
                 fm.exp(fm.log(w)) - fm.square(w), fm.quad_form(w, np.diag([1.0, -1.0, 1.0]))):
        assert not expr.is_dcp()
        assert not fm.to_cvxpy(expr).is_dcp()


def test_parameters_and_data_lower_to_cvxpy_parameters_and_constants():
    w = fm.Variable(3, name="w")
    lam = fm.Parameter(name="lam", value=0.7)
    Z = fm.Data(A, owner="c0", name="Z")
    expr = fm.sum_squares(Z @ w - b) + lam * fm.sum(w)
    assert expr.is_convex() and not (lam * fm.norm1(w)).is_convex()   # lam's sign is unknown
    context = CvxpyContext()
    lowered = fm.to_cvxpy(expr, context)
    params = lowered.parameters()
    assert len(params) == 1 and params[0].name() == "lam" and params[0].value == 0.7
    assert lowered.is_dcp(dpp=True)
    w.value = RNG.standard_normal(3)
    context.leaves[w.uid].value = w.value
    assert lowered.value == pytest.approx(expr.value, rel=1e-12)
    lam.value = 2.0                          # our parameter changes, the lowered one follows on re-lowering
    assert fm.to_cvxpy(expr, CvxpyContext()).parameters()[0].value == 2.0


def test_one_context_lowers_one_consistent_problem():
    w = fm.Variable(3, name="w")
    context = CvxpyContext()
    a, c = fm.to_cvxpy(fm.sum(w), context), fm.to_cvxpy(fm.norm2(w), context)
    assert a.variables()[0] is c.variables()[0]
    assert fm.to_cvxpy(fm.sum(w)).variables()[0] is not a.variables()[0]   # a fresh context


def test_scalar_constants_lower_to_cvxpy_expressions():
    assert isinstance(fm.to_cvxpy(fm.Constant(2.0)), cp.Expression)
    p = fm.Parameter(name="p", value=1.0)
    assert fm.to_cvxpy(0 * p).is_constant()


# ---- random expression trees (hypothesis) -------------------------------------------------
@st.composite
def expression_trees(draw, max_depth: int = 3):
    """A random well-shaped expression over x ∈ ℝ³, X ∈ ℝ³ˣ² from all public atoms and
    operators (convex, concave, nonsmooth, nonconvex alike), and a point to evaluate it at."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x, X = fm.Variable(3, name="x"), fm.Variable((3, 2), name="X")

    def data(*shape):
        return np.round(rng.standard_normal(shape), 2)

    def array(shape, depth):
        if depth <= 0:
            return x if shape == (3,) else X
        kind = draw(st.sampled_from([
            "leaf", "abs", "exp", "huber", "log", "logistic", "pos", "sqrt", "square", "power",
            "neg", "scale", "shift", "maximum const", "maximum", "multiply const", "product",
            "sum", "affine map"]))
        if kind == "leaf":
            return array(shape, 0)
        if kind == "affine map":
            if shape == (3,):
                return draw(st.sampled_from([
                    lambda: data(3, 3) @ array((3,), depth - 1),
                    lambda: array((3, 2), depth - 1) @ data(2),
                    lambda: fm.sum(array((3, 2), depth - 1), axis=1),
                    lambda: fm.mean(array((3, 2), depth - 1), axis=1),
                    lambda: fm.log_sum_exp(array((3, 2), depth - 1), axis=1),
                    lambda: fm.reshape(array((3, 2), depth - 1)[:, 0], (3,)),
                    lambda: array((3, 2), depth - 1)[:, 1],
                ]))()
            return draw(st.sampled_from([
                lambda: data(3, 3) @ array((3, 2), depth - 1),
                lambda: (array((3, 2), depth - 1).T @ data(3, 3)).T,
                lambda: fm.reshape(array((3, 2), depth - 1), (2, 3)).T,
                lambda: fm.multiply(fm.reshape(array((3,), depth - 1), (3, 1)), np.abs(data(2)) + 0.1),
            ]))()
        if kind == "sum":
            return array(shape, depth - 1) + array(shape, depth - 1)
        e = array(shape, depth - 1)
        if kind in ("abs", "exp", "log", "logistic", "pos", "sqrt", "square"):
            return getattr(fm, kind)(e)
        if kind == "huber":
            return fm.huber(e, draw(st.sampled_from([0.5, 1.0, 2.0])))
        if kind == "power":
            return fm.power(e, draw(st.sampled_from([2, 3, 4, 0.5, 1.5, -1])))
        if kind == "neg":
            return -e
        if kind == "scale":
            return draw(st.sampled_from([2.0, -0.5, 3.0])) * e
        if kind == "shift":
            return e + data(*shape) if draw(st.booleans()) else 1.0 - e
        if kind == "maximum const":
            return fm.maximum(e, 0.2)
        if kind == "maximum":
            return fm.maximum(e, array(shape, depth - 1))
        if kind == "multiply const":
            return fm.multiply(np.abs(data(*shape)) + 0.1, e)
        return fm.multiply(e, array(shape, depth - 1))       # "product" (not DCP)

    def scalar(depth):
        kind = draw(st.sampled_from(["sum", "mean", "norm1", "norm2", "norm_inf", "sum_squares",
                                     "log_sum_exp", "quad_form", "quad_form nsd", "entry",
                                     "dot", "scalar atom"]))
        shape = draw(st.sampled_from([(3,), (3, 2)])) if kind in (
            "sum", "mean", "norm1", "norm2", "norm_inf", "sum_squares", "log_sum_exp") else (3,)
        e = array(shape, depth)
        if kind == "quad_form":
            return fm.quad_form(e, P)
        if kind == "quad_form nsd":
            return fm.quad_form(e, -P)
        if kind == "entry":
            return e[draw(st.integers(0, 2))]
        if kind == "dot":
            return data(3) @ e
        if kind == "scalar atom":
            return draw(st.sampled_from([fm.exp, fm.logistic, fm.square, fm.abs]))(fm.sum(e))
        return getattr(fm, kind)(e)

    expr = scalar(draw(st.integers(0, max_depth))) if draw(st.booleans()) \
        else array(draw(st.sampled_from([(3,), (3, 2)])), draw(st.integers(1, max_depth)))
    if draw(st.booleans()):
        other = scalar(draw(st.integers(0, max_depth - 1)))
        expr = expr + other if draw(st.booleans()) else expr - other
    values = {x: rng.uniform(0.2, 1.5, 3), X: rng.uniform(0.2, 1.5, (3, 2))}
    return expr, values


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expression_trees())
def test_random_trees_lower_with_equal_values_and_curvature(tree):
    expr, values = tree
    for var, value in values.items():
        var.value = value
    with np.errstate(all="ignore"):          # log/sqrt/powers of negative entries: nan in both
        lowered, lowered_value = lower_with_values(expr)
        ours = expr.value
    assert np.shape(ours) == tuple(lowered.shape)
    np.testing.assert_allclose(ours, lowered_value, rtol=1e-9, atol=1e-9, equal_nan=True)
    assert dcp_summary(expr) == dcp_summary(lowered), str(expr)
    if expr.shape == () and expr.is_convex():
        assert cp.Problem(cp.Minimize(lowered)).is_dcp()
    if expr.shape == () and expr.is_concave():
        assert cp.Problem(cp.Maximize(lowered)).is_dcp()


# ---- sympy --------------------------------------------------------------------------------
def test_to_sympy_reads_like_the_formula():
    w = fm.Variable(3, name="w")
    X0 = fm.Data(A, owner="c0", name="X0")
    text = sympy.latex(fm.to_sympy(fm.mean(fm.logistic(X0 @ w)) / 5))
    assert "logistic" in text and "X_{0} w" in text and "mean" in text
    symbolic = fm.to_sympy(fm.sum_squares(X0 @ w - 1) + 0.5 * fm.norm1(w))
    names = {s.name for s in symbolic.free_symbols if isinstance(s, sympy.MatrixSymbol)}
    assert names == {"X0", "w"}
    assert {s.shape for s in symbolic.free_symbols} == {(5, 3), (3, 1)}
    assert sympy.latex(fm.to_sympy(fm.quad_form(w, fm.Data(P, owner="c0", name="P")))) == "w^{T} P w"


def _all_atom_expressions():
    w, W = fm.Variable(3, name="w"), fm.Variable((3, 2), name="W")
    Z = fm.Data(A, owner="c0", name="Z")
    return w, W, [
        fm.abs(w), fm.exp(W), fm.huber(w, 0.5), fm.log(W), fm.log_sum_exp(W), fm.log_sum_exp(W, axis=1),
        fm.logistic(Z @ w), fm.maximum(w, 0.3), fm.maximum(W, np.array([0.0, 1.0])), fm.mean(W),
        fm.mean(W, axis=0), fm.multiply(W, W), fm.norm1(W), fm.norm2(w), fm.norm_inf(w),
        fm.pos(w - 1), fm.power(W, 3), fm.quad_form(w, P), fm.reshape(W, (2, 3)), fm.sqrt(w),
        fm.square(W), fm.sum(W, axis=1), fm.sum_squares(Z @ w - b), fm.transpose(W),
        w[1:] * w[0], W[1, :], W[:, 0], W[2, 1], w[[0, 2]], W - np.array([1.0, 2.0]),
        W + np.ones((3, 1)), fm.multiply(w, fm.exp(w)), w / fm.sum(w), w @ w + 1, W.T @ w,
        w @ W, fm.exp(w @ w) * w, np.ones((2, 3)) @ W, 2 - w, -(W @ np.ones(2)),
        fm.grad(fm.mean(fm.logistic(Z @ w)), w),
        fm.grad(fm.sum(fm.log_sum_exp(Z @ W, axis=1)), W),
        fm.grad(fm.norm_inf(w) + fm.sum(fm.huber(w)) + fm.sum_squares(w[[0, 0]]), w),
    ]


def test_to_sympy_renders_every_atom_with_the_right_shape():
    w, W, exprs = _all_atom_expressions()
    for expr in exprs:
        symbolic = fm.to_sympy(expr)
        assert sympy.latex(symbolic) and str(symbolic)
        if expr.shape:
            rows, cols = (expr.shape + (1,))[:2]
            assert tuple(symbolic.shape) == (rows, cols), str(expr)
        else:
            assert not getattr(symbolic, "is_Matrix", False) or tuple(symbolic.shape) == (1, 1), str(expr)


def test_explicit_sympy_values_agree_with_ours():
    w, W, exprs = _all_atom_expressions()
    w.value, W.value = RNG.uniform(0.2, 1.5, 3), RNG.uniform(0.2, 1.5, (3, 2))
    for expr in exprs:
        symbols: dict = {}
        explicit = np.asarray(fm.to_sympy(expr, explicit=True, symbols=symbols), dtype=object)
        subs = {}
        for var in (w, W):
            if var.uid in symbols:
                subs.update({s: float(v) for s, v in zip(np.ravel(symbols[var.uid]), np.ravel(var.value))})
        values = np.array([float(sympy.sympify(e).subs(subs)) for e in np.ravel(explicit)])
        np.testing.assert_allclose(values.reshape(expr.shape), expr.value, rtol=1e-10, atol=1e-12,
                                   err_msg=str(expr))


def test_symbolic_linear_algebra_evaluates_to_our_values():
    """The MatrixSymbol form of matrix-algebra expressions, with matrices substituted and
    evaluated by sympy, equals our value."""
    w, W = fm.Variable(3, name="w"), fm.Variable((3, 2), name="W")
    Z = fm.Data(A, owner="c0", name="Z")
    Q = fm.Data(P, owner="c0", name="Q")
    w.value, W.value = RNG.standard_normal(3), RNG.standard_normal((3, 2))
    for expr in (Z @ w - b, fm.quad_form(w, Q) + w @ w, W.T @ w, Z @ W, w @ W - 1, 2 * W + W,
                 (Z @ w)[1] + w[0], fm.multiply(w, w), W[1, :], W[:, 1] - w):
        symbolic = fm.to_sympy(expr)
        subs = {}
        for leaf in expr.leaves():
            if leaf.shape:
                rows, cols = (leaf.shape + (1,))[:2]
                subs[sympy.MatrixSymbol(leaf.name, rows, cols)] = sympy.Matrix(
                    np.asarray(leaf.value, dtype=float).reshape(rows, cols))
        value = symbolic.subs(subs).doit()
        if getattr(value, "is_Matrix", False):
            value = np.array(value.as_explicit().tolist(), dtype=float)
        value = np.asarray(value, dtype=float)       # fails if a symbol is left over
        np.testing.assert_allclose(np.reshape(value, expr.shape), expr.value, rtol=1e-12,
                                   err_msg=str(expr))
