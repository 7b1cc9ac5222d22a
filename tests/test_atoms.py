"""Atoms and operators (docs/api.md §2): every public atom and operator is checked for

- its value against an independent numpy/scipy reference, on vector and matrix variables;
- its curvature, sign and monotonicity against what CVXPY reports for the lowered expression
  (`fm.to_cvxpy(expr).is_convex()`, …), with affine, convex, concave, signed and unsigned
  arguments, so DCP composition rules are exercised, not only the atom's own curvature;
- numerical stability (logistic and log-sum-exp for |x| up to 1e3);
- its prox (norm1, norm2, sum_squares, square, abs, simple-set indicators) against the
  defining minimization solved by CVXPY, or a closed form;
- ShapeError messages that name both operands and their shapes.
"""
from __future__ import annotations

import itertools
import re
import warnings

import cvxpy as cp
import numpy as np
import pytest
import scipy.special

import fedmodel as fm
from fedmodel.atoms import PUBLIC, Abs, Exp, Norm1, Norm2, Square, SumSquares
from fedmodel.atoms.base import DECREASING, INCREASING, NONMONOTONE
from fedmodel.compiler.classify import prox_term
from fedmodel.compiler.sets import simple_set
from fedmodel.lowering.to_cvxpy import CvxpyContext

RNG = np.random.default_rng(20240611)
P_PSD = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 3.0]])
P_INDEF = np.array([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 2.0]])


def lowered_value(expr: fm.Expression) -> np.ndarray:
    """Value of CVXPY's lowering of `expr` at the current values of our variables."""
    context = CvxpyContext()
    lowered = fm.to_cvxpy(expr, context)
    for var in expr.variables():
        context.leaves[var.uid].value = var.value
    return np.asarray(lowered.value, dtype=float)


# ---- values ---------------------------------------------------------------------------------
# (case id, builder(x) -> fedmodel expression, reference(x value) -> numpy value, domain)
# domain "pos": the variable is drawn in [0.2, 2] (log, sqrt, fractional powers), else N(0, 1).
C4 = RNG.standard_normal(4)
C32 = RNG.standard_normal((3, 2))
A24 = RNG.standard_normal((2, 4))
A23 = RNG.standard_normal((2, 3))

VALUE_CASES = [
    ("abs", fm.abs, np.abs, "any"),
    ("exp", fm.exp, np.exp, "any"),
    ("huber", fm.huber, lambda v: 2 * scipy.special.huber(1.0, v), "wide"),
    ("huber M=0.3", lambda x: fm.huber(x, 0.3), lambda v: 2 * scipy.special.huber(0.3, v), "any"),
    ("log", fm.log, np.log, "pos"),
    ("log_sum_exp", fm.log_sum_exp, lambda v: scipy.special.logsumexp(v), "any"),
    ("log_sum_exp axis=0", lambda x: fm.log_sum_exp(x, axis=0),
     lambda v: scipy.special.logsumexp(v, axis=0), "any"),
    ("log_sum_exp axis=-1", lambda x: fm.log_sum_exp(x, axis=-1),
     lambda v: scipy.special.logsumexp(v, axis=-1), "any"),
    ("logistic", fm.logistic, lambda v: np.log1p(np.exp(v)), "wide"),
    ("maximum(x, 0.3)", lambda x: fm.maximum(x, 0.3), lambda v: np.where(v > 0.3, v, 0.3), "any"),
    ("maximum(x, -x)", lambda x: fm.maximum(x, -x), np.abs, "any"),
    ("mean", fm.mean, lambda v: v.sum() / v.size, "any"),
    ("mean axis=0", lambda x: fm.mean(x, axis=0), lambda v: v.sum(axis=0) / v.shape[0], "any"),
    ("mean axis=-1", lambda x: fm.mean(x, axis=-1), lambda v: v.sum(axis=-1) / v.shape[-1], "any"),
    ("multiply(c, x)", lambda x: fm.multiply(C4 if x.ndim == 1 else C32, x),
     lambda v: (C4 if v.ndim == 1 else C32) * v, "any"),
    ("multiply(x, x)", lambda x: fm.multiply(x, x), np.square, "any"),
    ("norm1", fm.norm1, lambda v: np.abs(v).sum(), "any"),
    ("norm2", fm.norm2, lambda v: np.sqrt((v ** 2).sum()), "any"),
    ("norm_inf", fm.norm_inf, lambda v: np.abs(v).max(), "any"),
    ("pos", fm.pos, lambda v: np.clip(v, 0, None), "any"),
    ("power 3", lambda x: fm.power(x, 3), lambda v: v * v * v, "any"),
    ("power 0.5", lambda x: fm.power(x, 0.5), np.sqrt, "pos"),
    ("power -1", lambda x: fm.power(x, -1), lambda v: 1 / v, "pos"),
    ("power 1.5", lambda x: fm.power(x, 1.5), lambda v: v * np.sqrt(v), "pos"),
    ("power 4", lambda x: fm.power(x, 4), lambda v: v ** 2 * v ** 2, "any"),
    ("reshape", lambda x: fm.reshape(x, (x.size,)), lambda v: v.ravel(order="C"), "any"),
    ("reshape 2x2", lambda x: fm.reshape(x, (2, x.size // 2)),
     lambda v: v.ravel().reshape(2, -1), "any"),
    ("sqrt", fm.sqrt, np.sqrt, "pos"),
    ("square", fm.square, lambda v: v * v, "any"),
    ("sum", fm.sum, lambda v: v.sum(), "any"),
    ("sum axis=0", lambda x: fm.sum(x, axis=0), lambda v: v.sum(axis=0), "any"),
    ("sum axis=-1", lambda x: fm.sum(x, axis=-1), lambda v: v.sum(axis=-1), "any"),
    ("sum_squares", fm.sum_squares, lambda v: (v * v).sum(), "any"),
    ("transpose", fm.transpose, lambda v: v.T, "any"),
    # operators
    ("x + c", lambda x: x + (C4 if x.ndim == 1 else C32),
     lambda v: v + (C4 if v.ndim == 1 else C32), "any"),
    ("c + x (numpy left)", lambda x: (C4 if x.ndim == 1 else C32) + x,
     lambda v: v + (C4 if v.ndim == 1 else C32), "any"),
    ("2 - x", lambda x: 2 - x, lambda v: 2 - v, "any"),
    ("x - 2", lambda x: x - 2, lambda v: v - 2, "any"),
    ("-x", lambda x: -x, lambda v: -v, "any"),
    ("3 * x", lambda x: 3 * x, lambda v: 3 * v, "any"),
    ("x * c (numpy right)", lambda x: x * (C4 if x.ndim == 1 else C32),
     lambda v: v * (C4 if v.ndim == 1 else C32), "any"),
    ("x / 4", lambda x: x / 4, lambda v: v / 4, "any"),
    ("1 / x", lambda x: 1 / x, lambda v: 1 / v, "pos"),
    ("x / x.sum", lambda x: x / fm.sum(x), lambda v: v / v.sum(), "pos"),
    ("x ** 2", lambda x: x ** 2, lambda v: v * v, "any"),
    ("A @ x", lambda x: (A24 if x.ndim == 1 else A23) @ x,
     lambda v: (A24 if v.ndim == 1 else A23) @ v, "any"),
    ("x @ A", lambda x: x @ (A24.T if x.ndim == 1 else A23[:, :2].T @ A23[:, :2]),
     lambda v: v @ (A24.T if v.ndim == 1 else A23[:, :2].T @ A23[:, :2]), "any"),
    ("x @ x", lambda x: x @ x if x.ndim == 1 else x.T @ x,
     lambda v: v @ v if v.ndim == 1 else v.T @ v, "any"),
    ("x[1:]", lambda x: x[1:], lambda v: v[1:], "any"),
    ("x[0]", lambda x: x[0], lambda v: v[0], "any"),
    ("x[-1]", lambda x: x[-1], lambda v: v[-1], "any"),
    ("x[::2]", lambda x: x[::2], lambda v: v[::2], "any"),
    ("x[::-1]", lambda x: x[::-1], lambda v: v[::-1], "any"),
    ("x[-2::-1]", lambda x: x[-2::-1], lambda v: v[-2::-1], "any"),
    ("x[[2, 0, 2]]", lambda x: x[[2, 0, 2]], lambda v: v[[2, 0, 2]], "any"),
    ("x.T", lambda x: x.T, lambda v: v.T, "any"),
]
MATRIX_ONLY = [
    ("X[:, 1]", lambda X: X[:, 1], lambda v: v[:, 1]),
    ("X[1, :]", lambda X: X[1, :], lambda v: v[1, :]),
    ("X[2, 1]", lambda X: X[2, 1], lambda v: v[2, 1]),
    ("X[0:2, 1:]", lambda X: X[0:2, 1:], lambda v: v[0:2, 1:]),
    ("X[::-1, 0]", lambda X: X[::-1, 0], lambda v: v[::-1, 0]),
    ("X + row", lambda X: X + np.array([1.0, -2.0]), lambda v: v + np.array([1.0, -2.0])),
    ("X + column", lambda X: X + np.array([[1.0], [2.0], [3.0]]),
     lambda v: v + np.array([[1.0], [2.0], [3.0]])),
    ("row * X", lambda X: np.array([2.0, -1.0]) * X, lambda v: np.array([2.0, -1.0]) * v),
    ("X @ vector", lambda X: X @ np.array([1.0, -3.0]), lambda v: v @ np.array([1.0, -3.0])),
    ("vector @ X", lambda X: np.array([1.0, 2.0, -1.0]) @ X, lambda v: np.array([1.0, 2.0, -1.0]) @ v),
    ("X.T @ X", lambda X: X.T @ X, lambda v: v.T @ v),
    ("maximum(X, row)", lambda X: fm.maximum(X, np.array([0.0, 0.5])),
     lambda v: np.maximum(v, np.array([0.0, 0.5]))),
]
VECTOR_ONLY = [
    ("quad_form PSD", lambda x: fm.quad_form(x, P_PSD), lambda v: v @ P_PSD @ v),
    ("quad_form indefinite", lambda x: fm.quad_form(x, P_INDEF), lambda v: v @ P_INDEF @ v),
    ("maximum(x, y const vector)", lambda x: fm.maximum(np.array([0.1, -0.2, 0.3]), x),
     lambda v: np.maximum(v, np.array([0.1, -0.2, 0.3]))),
    ("x scalar broadcast", lambda x: x + fm.sum(x), lambda v: v + v.sum()),
]


def draw(shape, domain):
    if domain == "pos":
        return RNG.uniform(0.2, 2.0, shape)
    if domain == "wide":          # exercise both branches of huber, large logistic arguments
        return 4.0 * RNG.standard_normal(shape)
    return RNG.standard_normal(shape)


@pytest.mark.parametrize("shape", [(4,), (3, 2)], ids=["vector", "matrix"])
@pytest.mark.parametrize("case", VALUE_CASES, ids=[c[0] for c in VALUE_CASES])
def test_value_matches_numpy_and_cvxpy(case, shape):
    name, build, reference, domain = case
    x = fm.Variable(shape, name="x")
    expr = build(x)
    for _ in range(3):
        x.value = draw(shape, domain)
        expected = np.asarray(reference(x.value), dtype=float)
        assert expr.shape == expected.shape, name
        np.testing.assert_allclose(expr.value, expected, rtol=1e-12, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(lowered_value(expr), expected, rtol=1e-9, atol=1e-9,
                                   err_msg=f"{name}: CVXPY lowering")


@pytest.mark.parametrize("case", MATRIX_ONLY + VECTOR_ONLY,
                         ids=[c[0] for c in MATRIX_ONLY + VECTOR_ONLY])
def test_value_of_matrix_and_vector_specific_forms(case):
    name, build, reference = case
    shape = (3, 2) if case in MATRIX_ONLY else (3,)
    x = fm.Variable(shape, name="x")
    expr = build(x)
    for _ in range(3):
        x.value = RNG.standard_normal(shape)
        expected = np.asarray(reference(x.value), dtype=float)
        assert expr.shape == expected.shape
        np.testing.assert_allclose(expr.value, expected, rtol=1e-12, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(lowered_value(expr), expected, rtol=1e-9, atol=1e-9)


def test_every_public_atom_has_a_value_case():
    covered = {re.split(r"[ (]", c[0])[0] for c in VALUE_CASES + VECTOR_ONLY}
    missing = [name for name in PUBLIC if name not in covered]
    assert not missing, f"atoms without a value test: {missing}"
    assert len(PUBLIC) == 21


def test_value_is_none_until_every_leaf_has_a_value():
    x, y = fm.Variable(2, name="x"), fm.Variable(2, name="y")
    expr = fm.sum(x + y)
    x.value = [1.0, 2.0]
    assert expr.value is None
    y.value = [3.0, 4.0]
    assert expr.value == pytest.approx(10.0)
    p = fm.Parameter(name="p")
    assert (p * fm.sum(x)).value is None
    p.value = 2.0
    assert (p * fm.sum(x)).value == pytest.approx(6.0)


# ---- curvature, sign, monotonicity vs CVXPY -----------------------------------------------
def _arguments():
    """Arguments of every DCP kind, as fresh expressions of a vector and a matrix variable."""
    x = fm.Variable(3, name="x")
    X = fm.Variable((3, 2), name="X")
    return {
        "affine": x, "affine matrix": X, "negated affine": -x,
        "convex nonneg": fm.exp(x), "convex matrix": fm.exp(X), "convex unsigned": fm.square(x) - x,
        "concave": fm.log(x), "concave matrix": fm.log(X), "concave nonneg": fm.sqrt(x),
        "concave nonpos": -fm.exp(x), "concave nonpos 2": -fm.square(x),
        "nonconvex": fm.square(x) - fm.exp(x),
    }


UNARY = {
    "abs": fm.abs, "exp": fm.exp, "huber": fm.huber, "huber M=2": lambda a: fm.huber(a, 2.0),
    "log": fm.log, "log_sum_exp": fm.log_sum_exp,
    "log_sum_exp axis=0": lambda a: fm.log_sum_exp(a, axis=0), "logistic": fm.logistic,
    "mean": fm.mean, "mean axis=-1": lambda a: fm.mean(a, axis=-1), "norm1": fm.norm1,
    "norm2": fm.norm2, "norm_inf": fm.norm_inf, "pos": fm.pos, "sqrt": fm.sqrt,
    "square": fm.square, "sum": fm.sum, "sum axis=0": lambda a: fm.sum(a, axis=0),
    "sum_squares": fm.sum_squares, "transpose": fm.transpose,
    "reshape": lambda a: fm.reshape(a, (a.size,)),
    "power 2": lambda a: fm.power(a, 2), "power 3": lambda a: fm.power(a, 3),
    "power 4": lambda a: fm.power(a, 4), "power 6": lambda a: fm.power(a, 6),
    "power 0.5": lambda a: fm.power(a, 0.5), "power 1.5": lambda a: a ** 1.5,
    "power -1": lambda a: fm.power(a, -1), "power -2": lambda a: a ** -2,
    "neg": lambda a: -a, "2 * a": lambda a: 2 * a, "-3 * a": lambda a: -3 * a, "a / 2": lambda a: a / 2,
    "multiply(signed c, a)": lambda a: fm.multiply(np.array([1.0, -1.0, 2.0]).reshape(
        (3,) + (1,) * (a.ndim - 1)), a),
    "a[0]": lambda a: a[0], "a[1:]": lambda a: a[1:], "a[[0, 2]]": lambda a: a[[0, 2]],
    "maximum(a, 1)": lambda a: fm.maximum(a, 1.0), "maximum(a, -a)": lambda a: fm.maximum(a, -a),
    "A @ a": lambda a: np.ones((2, 3)) @ a, "a @ c": lambda a: a @ np.ones(a.shape[-1]),
    "a + 1": lambda a: a + 1, "2 - a": lambda a: 2 - a,
    "quad_form PSD": lambda a: fm.quad_form(a, P_PSD) if a.shape == (3,) else None,
    "quad_form NSD": lambda a: fm.quad_form(a, -P_PSD) if a.shape == (3,) else None,
    "quad_form -diag": lambda a: fm.quad_form(a, -np.diag([1.0, 2.0, 3.0])) if a.shape == (3,) else None,
    "quad_form indefinite": lambda a: fm.quad_form(a, P_INDEF) if a.shape == (3,) else None,
}


def dcp_summary(expr) -> tuple:
    return (bool(expr.is_convex()), bool(expr.is_concave()), bool(expr.is_affine()),
            bool(expr.is_nonneg()), bool(expr.is_nonpos()), tuple(expr.shape))


@pytest.mark.parametrize("atom", list(UNARY), ids=list(UNARY))
def test_curvature_and_sign_agree_with_cvxpy(atom):
    """(convex, concave, affine, nonneg, nonpos, shape) of atom(arg) equals CVXPY's answer for
    the lowered expression, for arguments of every curvature and sign."""
    mismatches = []
    for kind, arg in _arguments().items():
        expr = UNARY[atom](arg)
        if expr is None:
            continue
        ours, theirs = dcp_summary(expr), dcp_summary(fm.to_cvxpy(expr))
        if ours != theirs:
            mismatches.append(f"{atom}({kind}): ours {ours}, CVXPY {theirs}")
        assert expr.is_dcp() == fm.to_cvxpy(expr).is_dcp()
    assert not mismatches, "\n".join(mismatches)


def test_known_curvatures_by_hand():
    """A few answers pinned explicitly, so the CVXPY comparison cannot pass vacuously."""
    x = fm.Variable(3, name="x")
    assert fm.logistic(x).is_convex() and not fm.logistic(x).is_concave()
    assert fm.log(x).is_concave() and not fm.log(x).is_convex()
    assert fm.norm2(np.ones((2, 3)) @ x - 1).is_convex()
    assert not fm.sqrt(fm.exp(x)).is_dcp()              # concave ∘ convex
    assert fm.log_sum_exp(fm.exp(x)).is_convex()
    assert fm.exp(fm.log(x)).is_convex() is False
    assert (2 * x - 1).is_affine() and fm.sum(x).is_affine()
    assert fm.quad_form(x, P_INDEF).is_convex() is False
    assert fm.square(fm.pos(x)).is_convex() and fm.square(fm.pos(x)).is_nonneg()
    assert fm.multiply(x, x).is_dcp() is False          # product of two variables
    assert fm.pos(-fm.exp(x)).is_nonpos() and fm.pos(-fm.exp(x)).is_nonneg()  # identically 0


BINARY_ARGS = {
    "affine": lambda x, y: x, "other affine": lambda x, y: y, "convex": lambda x, y: fm.exp(x),
    "concave": lambda x, y: fm.log(x), "nonconvex": lambda x, y: fm.square(x) - fm.exp(x),
    "concave nonpos": lambda x, y: -fm.exp(x), "convex nonneg": lambda x, y: fm.square(y),
    "positive const": lambda x, y: np.array([1.0, 2.0, 3.0]),
    "negative const": lambda x, y: np.array([-1.0, -2.0, -3.0]),
    "mixed const": lambda x, y: np.array([1.0, -2.0, 3.0]), "scalar 2": lambda x, y: 2.0,
    "scalar -2": lambda x, y: -2.0, "parameter": lambda x, y: fm.Parameter(name="p", value=2.0),
    "matrix const": lambda x, y: np.arange(9.0).reshape(3, 3),
}
BINARY_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
              "multiply": fm.multiply, "maximum": fm.maximum, "/": lambda a, b: a / b,
              "@": lambda a, b: a @ b}


@pytest.mark.parametrize("op", list(BINARY_OPS))
def test_binary_operators_agree_with_cvxpy(op):
    mismatches, checked = [], 0
    for (na, fa), (nb, fb) in itertools.product(BINARY_ARGS.items(), repeat=2):
        x, y = fm.Variable(3, name="x"), fm.Variable(3, name="y")
        a, b = fa(x, y), fb(x, y)
        if not isinstance(a, fm.Expression) and not isinstance(b, fm.Expression):
            continue
        try:
            expr = BINARY_OPS[op](a, b)
        except fm.FedModelError:      # e.g. a / (expression with zero entries)
            continue
        assert isinstance(expr, fm.Expression), f"{na} {op} {nb} gave {type(expr)}"
        checked += 1
        ours, theirs = dcp_summary(expr), dcp_summary(fm.to_cvxpy(expr))
        if ours != theirs:
            mismatches.append(f"({na}) {op} ({nb}): ours {ours}, CVXPY {theirs}")
    assert checked > 50
    assert not mismatches, "\n".join(mismatches)


def _cvxpy_monotonicity(atom, index=0) -> str:
    incr, decr = atom.is_incr(index), atom.is_decr(index)
    return INCREASING if incr and not decr else DECREASING if decr and not incr else NONMONOTONE


MONOTONE_ATOMS = {
    "abs": fm.abs, "exp": fm.exp, "huber": fm.huber, "log": fm.log, "logistic": fm.logistic,
    "pos": fm.pos, "sqrt": fm.sqrt, "square": fm.square, "norm1": fm.norm1, "norm2": fm.norm2,
    "norm_inf": fm.norm_inf, "log_sum_exp": fm.log_sum_exp, "power 2": lambda a: fm.power(a, 2),
    "power 3": lambda a: fm.power(a, 3), "power 6": lambda a: fm.power(a, 6),
    "power 0.5": lambda a: fm.power(a, 0.5), "power -1": lambda a: fm.power(a, -1),
    "quad_form PSD": lambda a: fm.quad_form(a, P_PSD),
    "quad_form -diag": lambda a: fm.quad_form(a, -np.diag([1.0, 2.0, 3.0])),
    "quad_form indefinite": lambda a: fm.quad_form(a, P_INDEF), "maximum": lambda a: fm.maximum(a, 0.5),
}


@pytest.mark.parametrize("atom", list(MONOTONE_ATOMS))
def test_monotonicity_matches_cvxpy_atom(atom):
    x = fm.Variable(3, name="x")
    for kind, arg in {"unsigned": x, "nonneg": fm.exp(x), "nonpos": -fm.exp(x)}.items():
        expr = MONOTONE_ATOMS[atom](arg)
        lowered = fm.to_cvxpy(expr)
        assert expr.monotonicity(0) == _cvxpy_monotonicity(lowered), f"{atom} of a {kind} argument"
    # pinned: exp is increasing, norm2 of a nonneg argument increasing, of an unsigned one not
    assert fm.exp(x).monotonicity(0) == INCREASING
    assert fm.norm2(x).monotonicity(0) == NONMONOTONE
    assert fm.power(x, -1).monotonicity(0) == DECREASING


def test_smoothness():
    x = fm.Variable(3, name="x")
    smooth = [fm.exp(x), fm.logistic(x), fm.log_sum_exp(x), fm.huber(x), fm.sum_squares(x),
              fm.quad_form(x, P_PSD), fm.square(fm.pos(x)), fm.sum_squares(fm.pos(x)), x @ x]
    nonsmooth = [fm.abs(x), fm.pos(x), fm.norm1(x), fm.norm2(x), fm.norm_inf(x),
                 fm.maximum(x, 0), fm.exp(fm.norm1(x)), fm.sum(x) + fm.norm1(x)]
    assert all(e.is_smooth() for e in smooth)
    assert not any(e.is_smooth() for e in nonsmooth)


# ---- numerical stability ------------------------------------------------------------------
def test_logistic_is_finite_and_accurate_for_large_arguments():
    v = np.array([-1000.0, -745.0, -40.0, -1.0, 0.0, 1.0, 40.0, 710.0, 1000.0])
    x = fm.Variable(v.shape, name="x")
    x.value = v
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no overflow warning either
        value = fm.logistic(x).value
        slope = fm.grad(fm.sum(fm.logistic(x)), x).value
    # log(1 + e^v) = max(v, 0) + log1p(e^{-|v|}), exact in double precision
    expected = np.maximum(v, 0) + np.log1p(np.exp(-np.abs(v)))
    assert np.all(np.isfinite(value)) and np.all(np.isfinite(slope))
    np.testing.assert_allclose(value, expected, rtol=1e-15, atol=0)
    assert value[-1] == 1000.0 and value[0] == pytest.approx(np.exp(-1000.0), abs=1e-300)
    # atol: at −745 e^v is the smallest subnormal, which expit flushes to 0
    np.testing.assert_allclose(slope, scipy.special.expit(v), rtol=1e-15, atol=1e-320)
    assert slope[0] == pytest.approx(0.0, abs=1e-300) and slope[-1] == 1.0


@pytest.mark.parametrize("v", [
    np.array([1000.0, 999.0, -1000.0]), np.array([-1000.0, -1000.0]), np.array([800.0, 800.0, 800.0]),
    np.array([-1000.0, 1000.0]), np.array([1e3, 1e3 - 1e-6]),
])
def test_log_sum_exp_is_finite_and_accurate_for_large_arguments(v):
    x = fm.Variable(v.shape, name="x")
    x.value = v
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = fm.log_sum_exp(x).value
        weights = fm.grad(fm.log_sum_exp(x), x).value
    top = v.max()
    expected = top + np.log(np.sum(np.exp(v - top)))
    assert np.isfinite(value) and value == pytest.approx(expected, rel=1e-15)
    assert value == pytest.approx(scipy.special.logsumexp(v), rel=1e-15)
    np.testing.assert_allclose(weights, scipy.special.softmax(v), rtol=1e-12, atol=1e-300)
    assert weights.sum() == pytest.approx(1.0, rel=1e-14)


def test_log_sum_exp_along_an_axis_is_stable():
    V = np.array([[1000.0, -1000.0], [999.0, 1000.0], [-1000.0, -999.0]])
    X = fm.Variable(V.shape, name="X")
    X.value = V
    for axis in (0, 1):
        value = fm.log_sum_exp(X, axis=axis).value
        np.testing.assert_allclose(value, scipy.special.logsumexp(V, axis=axis), rtol=1e-15)
    grad = fm.grad(fm.sum(fm.log_sum_exp(X, axis=1)), X).value
    np.testing.assert_allclose(grad, scipy.special.softmax(V, axis=1), rtol=1e-12, atol=1e-300)


# ---- prox ---------------------------------------------------------------------------------
def cvxpy_prox(penalty, v: np.ndarray, t: float) -> np.ndarray:
    """argmin_x t·penalty(x) + ½‖x − v‖², solved by CVXPY (the definition of the prox)."""
    x = cp.Variable(v.shape)
    cp.Problem(cp.Minimize(t * penalty(x) + 0.5 * cp.sum_squares(x - v))).solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return x.value


PROXES = [
    ("norm1", Norm1.prox, cp.norm1, "vector"),
    ("norm2", Norm2.prox, lambda x: cp.norm(x, 2), "vector"),
    ("sum_squares", SumSquares.prox, cp.sum_squares, "vector"),
    ("abs", Abs.prox, lambda x: cp.sum(cp.abs(x)), "elementwise"),
    ("square", Square.prox, lambda x: cp.sum(cp.square(x)), "elementwise"),
]


@pytest.mark.parametrize("name, prox, penalty, kind", PROXES, ids=[p[0] for p in PROXES])
@pytest.mark.parametrize("t", [0.05, 0.7, 3.0])
def test_prox_solves_its_defining_problem(name, prox, penalty, kind, t):
    v = np.array([1.5, -0.3, 0.02, -2.2, 0.8])
    ours = prox(v, t)
    np.testing.assert_allclose(ours, cvxpy_prox(penalty, v, t), atol=2e-6)
    # and it is the minimizer: no nearby point does better
    objective = lambda z: t * float(penalty(cp.Constant(z)).value) + 0.5 * np.sum((z - v) ** 2)  # noqa: E731
    best = objective(ours)
    for _ in range(20):
        assert objective(ours + 1e-3 * RNG.standard_normal(v.shape)) >= best - 1e-12


def test_prox_closed_forms():
    v = np.array([3.0, -0.5, 0.0, -4.0])
    np.testing.assert_allclose(Norm1.prox(v, 1.0), [2.0, 0.0, 0.0, -3.0])
    np.testing.assert_allclose(Norm2.prox(v, 1.0), v * (1 - 1 / np.linalg.norm(v)))
    np.testing.assert_allclose(Norm2.prox(v, 10.0), np.zeros(4))     # t ≥ ‖v‖: zero
    np.testing.assert_allclose(SumSquares.prox(v, 0.5), v / 2)
    for prox in (Norm1.prox, Norm2.prox, SumSquares.prox, Abs.prox, Square.prox):
        np.testing.assert_allclose(prox(v, 0.0), v)                    # t = 0: identity
    assert Exp.prox is None                                             # no prox: None


def test_prox_of_matrix_arguments_is_entrywise_norm():
    V = np.array([[1.0, -2.0], [0.5, 3.0]])
    np.testing.assert_allclose(Norm1.prox(V, 0.75), np.sign(V) * np.maximum(np.abs(V) - 0.75, 0))
    np.testing.assert_allclose(Norm2.prox(V, 1.0), V * (1 - 1 / np.linalg.norm(V)))


def cvxpy_projection(constraint_of, v):
    x = cp.Variable(v.shape)
    cp.Problem(cp.Minimize(cp.sum_squares(x - v)), [constraint_of(x)]).solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    return x.value


@pytest.mark.parametrize("kind", ["ball", "upper", "lower", "nonneg"])
def test_prox_of_simple_set_indicators_is_the_projection(kind):
    w = fm.Variable(4, name="w")
    u = np.array([0.5, -1.0, 2.0, 0.0])
    constraint, reference = {
        "ball": (fm.norm2(w) <= 1.5, lambda x: cp.norm(x, 2) <= 1.5),
        "upper": (w <= u, lambda x: x <= u),
        "lower": (w >= u, lambda x: x >= u),
        "nonneg": (w >= 0, lambda x: x >= 0),
    }[kind]
    term = simple_set(constraint)
    assert term is not None and term.variable is w
    for v in (np.array([2.0, -3.0, 1.0, 0.5]), np.array([0.1, 0.2, -0.1, 0.0]), 5 * RNG.standard_normal(4)):
        projected = term.prox(v, 0.37)          # the step size does not matter for an indicator
        np.testing.assert_allclose(projected, cvxpy_projection(reference, v), atol=2e-5)
        assert term.value(projected) == 0.0


def test_non_simple_sets_are_not_projected():
    w = fm.Variable(3, name="w")
    assert simple_set(fm.norm2(np.ones((2, 3)) @ w) <= 1) is None
    assert simple_set(fm.sum(w) <= 1) is None
    assert simple_set(fm.norm2(w) == 1) is None


def test_weighted_norm1_term_prox():
    w = fm.Variable(4, name="w")
    term = prox_term(0.25 * fm.norm1(w))
    assert term is not None and term.variable is w
    v = np.array([1.0, -0.1, 0.3, -2.0])
    np.testing.assert_allclose(term.prox(v, 2.0), cvxpy_prox(cp.norm1, v, 0.5), atol=2e-6)
    assert term.value(v) == pytest.approx(0.25 * 3.4)
    assert prox_term(fm.norm1(np.ones((2, 4)) @ w)) is None
    assert prox_term(-1.0 * fm.norm1(w)) is None           # concave: no prox


# ---- shape errors -------------------------------------------------------------------------
def _message(exc_info) -> str:
    assert isinstance(exc_info.value, fm.FedModelError)
    return str(exc_info.value)


@pytest.mark.parametrize("op", [
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: fm.multiply(a, b),
    lambda a, b: fm.maximum(a, b), lambda a, b: a @ b, lambda a, b: a <= b, lambda a, b: a == b,
], ids=["+", "-", "*", "multiply", "maximum", "@", "<=", "=="])
def test_shape_error_names_both_operands_and_shapes(op):
    a, b = fm.Variable(3, name="alpha"), fm.Variable((4, 2), name="beta")
    with pytest.raises(fm.ShapeError) as info:
        op(a, b)
    message = _message(info)
    for fragment in ("alpha", "beta", "(3,)", "(4, 2)"):
        assert fragment in message, f"{fragment!r} missing from: {message}"


def test_shape_errors_with_numpy_operands_on_either_side():
    w = fm.Variable(3, name="w")
    with pytest.raises(fm.ShapeError) as info:
        np.ones((2, 4)) @ w
    assert "(2, 4)" in _message(info) and "w" in _message(info) and "(3,)" in _message(info)
    with pytest.raises(fm.ShapeError) as info:
        np.ones(5) + w
    assert "(5,)" in _message(info) and "w" in _message(info)


@pytest.mark.parametrize("build, fragments", [
    (lambda w, W: fm.quad_form(w, np.eye(2)), ["w", "(3,)", "(2, 2)"]),
    (lambda w, W: fm.reshape(W, (4, 2)), ["W", "(3, 2)", "(4, 2)"]),
    (lambda w, W: w[3], ["w", "(3,)", "3"]),
    (lambda w, W: W[0, 0, 0], ["W", "(3, 2)"]),
    (lambda w, W: w[2:1], ["w", "(3,)", "no entries"]),
    (lambda w, W: fm.sum(w, axis=1), ["w", "(3,)", "axis 1"]),
    (lambda w, W: fm.log_sum_exp(W, axis=2), ["W", "(3, 2)", "axis 2"]),
    (lambda w, W: fm.mean(W, axis=-3), ["W", "(3, 2)", "axis -3"]),
    (lambda w, W: W @ w, ["W", "w", "(3, 2)", "(3,)"]),
    (lambda w, W: fm.grad(W, W), ["W", "(3, 2)"]),
    (lambda w, W: fm.Variable((2, 0)), ["(2, 0)"]),
    (lambda w, W: fm.Variable((2, 2, 2)), ["(2, 2, 2)"]),
])
def test_other_shape_errors_name_the_expression(build, fragments):
    w, W = fm.Variable(3, name="w"), fm.Variable((3, 2), name="W")
    with pytest.raises(fm.ShapeError) as info:
        build(w, W)
    message = _message(info)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"


def test_broadcasting_follows_numpy():
    X = fm.Variable((3, 2), name="X")
    assert (X + np.ones(2)).shape == (3, 2)
    assert (X + np.ones((3, 1))).shape == (3, 2)
    assert (np.ones((1, 2)) * X).shape == (3, 2)
    assert (X + fm.sum(X)).shape == (3, 2)
    with pytest.raises(fm.ShapeError):
        X + np.ones(3)
