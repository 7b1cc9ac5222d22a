"""Elementwise atoms: a scalar function applied entry by entry (exp, log, powers, |x|, [x]₊,
…), and the piecewise atoms their derivatives need. Each derivative is written in the IR, so
gradients can be differentiated again."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import FedModelError
from ..expression import Constant, Expression, as_expr
from .arithmetic import add, multiply, neg
from .base import (AFFINE, CONCAVE, CONVEX, DECREASING, INCREASING, NONMONOTONE, UNKNOWN, Atom,
                   constant_value, constructor, even_monotonicity)
from .prox import shrink, soft_threshold


_ONE = Constant(1.0)


def _logistic(x: Any) -> Any:
    """log(1 + eˣ) as max(x, 0) + log1p(e^{−|x|}): no overflow for any finite x, within an ulp
    or two of `np.logaddexp(0, x)` and ~4× faster (numpy's logaddexp is a scalar loop; this
    is four vectorized passes, in place). It is most of a logistic model's plan time."""
    if np.ndim(x) == 0:
        return np.logaddexp(0.0, x)
    out = np.abs(x, dtype=float)   # a new float array (integer data too), updated in place
    np.negative(out, out=out)
    np.exp(out, out=out)
    np.log1p(out, out=out)
    out += np.maximum(x, 0.0)
    return out


def _sigmoid(x: Any) -> Any:
    """1/(1 + e^{−x}) as e^{min(x, 0)} / (1 + e^{−|x|}): exact in each sign branch up to one
    rounding per operation (as accurate, relatively, as `scipy.special.expit` for every x), no
    overflow, no masks, and ~2.5× faster than expit, whose scalar loop was a fifth of a logistic
    model's plan time. One exponential: e^{min(x, 0)} is e^{−|x|} where x < 0 and exactly 1
    elsewhere, i.e. max(e^{−|x|}, [x ≥ 0])."""
    if np.ndim(x) == 0:
        return np.exp(np.minimum(x, 0.0)) / (1.0 + np.exp(-np.abs(x)))
    denominator = np.abs(x, dtype=float)
    np.negative(denominator, out=denominator)
    np.exp(denominator, out=denominator)
    numerator = np.maximum(denominator, np.greater_equal(x, 0.0))
    denominator += 1.0
    numerator /= denominator
    return numerator


def logistic_and_sigmoid(x: Any) -> tuple[Any, Any]:
    """(log(1 + eˣ), 1/(1 + e^{−x})) sharing e^{−|x|}: bitwise what `_logistic` and `_sigmoid`
    return (the same operations in the same order). A logistic loss's value and gradient need
    both at the same point; plans call this once for the pair (`inline_steps.fused_pairs`)."""
    if np.ndim(x) == 0:
        return _logistic(x), _sigmoid(x)
    e = np.abs(x, dtype=float)
    np.negative(e, out=e)
    np.exp(e, out=e)
    value = np.log1p(e)
    value += np.maximum(x, 0.0)
    slope = np.maximum(e, np.greater_equal(x, 0.0))      # e^{min(x, 0)}, as in `_sigmoid`
    e += 1.0
    slope /= e
    return value, slope


class Elementwise(Atom):
    """A scalar function f applied entry by entry. Subclasses state f's DCP facts as class
    attributes instead of writing the rules: `increasing` (nondecreasing), `even` (f(−x) = f(x),
    increasing on x ≥ 0: its monotonicity follows the argument's sign), `nonneg` (f ≥ 0); an
    atom whose facts depend on a parameter (`Power`) or on its argument (`Pos`) overrides
    `monotonicity` / `sign` instead."""

    increasing = even = nonneg = False

    def monotonicity(self, index):
        if self.increasing:
            return INCREASING
        return even_monotonicity(self.args[0]) if self.even else NONMONOTONE

    def sign(self):
        return (self.nonneg, False)

    def derivative(self, x: Expression) -> Expression | None:
        """f'(x) as an expression (None when identically zero)."""
        raise NotImplementedError

    def vjp(self, index, upstream):
        slope = self.derivative(self.args[0])
        return None if slope is None else multiply(upstream, slope)


class Exp(Elementwise):
    """eˣ entry-wise."""

    display, curvature = "exp", CONVEX
    increasing = nonneg = True

    def numeric(self, x):
        return np.exp(x)

    def derivative(self, x):
        return self


class Log(Elementwise):
    """The natural logarithm entry-wise (its domain x > 0)."""

    display, curvature = "log", CONCAVE
    increasing = True
    defined_everywhere = False

    def numeric(self, x):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(x)

    def derivative(self, x):
        return power(x, -1)


class Power(Elementwise):
    """x**p for a constant p, with CVXPY's rules: p > 1 convex, 0 < p < 1 concave, p < 0 convex.
    As in CVXPY, only p ∈ {2, 4, 8, …} is taken on all of ℝ; any other p (3, 1.5, −1, …) is
    analysed on its domain x ≥ 0 (nonnegative, increasing or decreasing there), which is what
    makes `power(x, 3)` convex. The value is numpy's x**p everywhere."""

    display = "power"

    def __init__(self, x, p):
        self.p = float(p)
        super().__init__(x)

    def params(self):
        return (self.p,)

    @property
    def _even(self) -> bool:
        return self.p == int(self.p) and int(self.p) % 2 == 0

    @property
    def _power_of_two(self) -> bool:
        """p ∈ {2, 4, 8, …}: CVXPY's test for a power defined (and even) on all of ℝ; other
        p ≠ 1 are defined on x ≥ 0 only (CVXPY adds that domain), so they are increasing."""
        p = self.p
        return p >= 2 and p == int(p) and (int(p) & (int(p) - 1)) == 0

    @property
    def defined_everywhere(self) -> bool:
        return self._power_of_two

    @property
    def squares(self) -> bool:
        return self.p == 2

    @property
    def curvature(self):
        p = self.p
        if p == 1:
            return AFFINE
        if p > 1 or p < 0:
            return CONVEX
        return CONCAVE  # 0 < p < 1

    def numeric(self, x):
        if self.p == 2:          # no division, no invalid value: errstate (µs per call) not needed
            return x * x
        if self.p == -1 and isinstance(x, float) and x != 0:   # 1/β of a penalty, every evaluation
            return 1.0 / x
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.p == -1:     # np.divide: a Python float 0 (‖x‖ at its kink) gives inf, not a ZeroDivisionError
                return np.divide(1.0, x)
            if self.p == 0.5:
                return np.sqrt(x)
            return np.power(x, self.p)

    def derivative(self, x):
        if self.p == 2:
            return multiply(2.0, x)
        return multiply(self.p, power(x, self.p - 1))

    def monotonicity(self, index):
        if self.p < 0:
            return DECREASING
        if self._power_of_two:
            return even_monotonicity(self.args[0])
        return INCREASING

    def sign(self):
        if self.p == 1:
            return self.args[0].sign()
        return (True, False)  # as CVXPY: powers other than 2, 4, 8, … live on x ≥ 0

    def render(self):
        return f"power({self.args[0]}, {self.p:g})"


def power(x: Any, p: Any) -> Expression:
    """x ** p entry-wise for a constant, finite scalar exponent p (also `x ** p`)."""
    x = as_expr(x)
    if isinstance(p, Expression):
        value = constant_value(p)
        if value is None or value.size != 1:
            raise FedModelError(f"the exponent of {x} ** {p} must be a scalar constant")
        p = value.item()
    if isinstance(p, np.ndarray) and p.size == 1:
        p = p.item()
    try:
        p = float(p) if np.isscalar(p) and not isinstance(p, str) else None
    except (TypeError, ValueError):
        p = None
    if p is None or not np.isfinite(p):
        raise FedModelError(f"the exponent of power({x}, p) must be a finite number, "
                            "a scalar constant")
    if p == 1:
        return x
    if p == 0:
        return Constant(np.ones(x.shape))
    if isinstance(x, Power) and (p == int(p) and x.p == int(x.p) and not x._even):
        return power(x.args[0], x.p * p)
    return Power(x, p)


def divide(a: Any, b: Any) -> Expression:
    """`a / b`: `a` scaled by the reciprocal of a constant `b`, else `a · b⁻¹` (a `Power`)."""
    a, b = as_expr(a), as_expr(b)
    value = constant_value(b)
    if value is not None:
        if np.any(value == 0):
            raise FedModelError(f"division of {a} by {b}, which has zero entries")
        return multiply(Constant(1.0 / value), a)
    return multiply(a, power(b, -1))


class Sqrt(Elementwise):
    """√x entry-wise (its domain x ≥ 0)."""

    display, curvature = "sqrt", CONCAVE
    increasing = nonneg = True
    defined_everywhere = False

    def numeric(self, x):
        with np.errstate(invalid="ignore"):
            return np.sqrt(x)

    def derivative(self, x):
        return multiply(0.5, power(self, -1))


class Square(Elementwise):
    """x² entry-wise."""

    display, curvature, squares = "square", CONVEX, True
    even = nonneg = True

    def numeric(self, x):
        return x * x

    def derivative(self, x):
        return multiply(2.0, x)

    prox = staticmethod(shrink)


class Abs(Elementwise):
    """|x| entry-wise."""

    display, curvature, smooth = "abs", CONVEX, False
    even = nonneg = True

    def numeric(self, x):
        return np.abs(x)

    def derivative(self, x):
        return Sign(x)

    prox = staticmethod(soft_threshold)


class Logistic(Elementwise):
    """log(1 + eˣ) entry-wise, evaluated without overflow for any finite x (see `_logistic`)."""

    display, curvature = "logistic", CONVEX
    increasing = nonneg = True

    def numeric(self, x):
        return _logistic(x)

    def derivative(self, x):
        return Sigmoid(x)


class Pos(Elementwise):
    """[x]₊ = max(x, 0) entry-wise."""

    display, curvature, smooth = "pos", CONVEX, False
    increasing = True
    smooth_when_squared = True      # [x]₊² is C¹ (the inequality terms of augmented Lagrangians)

    def numeric(self, x):
        return np.maximum(x, 0.0)

    def derivative(self, x):
        return Step(x)

    def sign(self):
        return (True, self.args[0].sign()[1])  # pos of a nonpositive argument is zero


class Huber(Elementwise):
    """x² for |x| ≤ M, 2M|x| − M² otherwise (CVXPY's definition); C¹."""

    display, curvature = "huber", CONVEX
    even = nonneg = curvature_jumps = True

    def __init__(self, x, M=1.0):
        self.M = float(M)
        if not self.M > 0:
            raise FedModelError(f"huber threshold M must be positive, got {M}")
        super().__init__(x)

    def params(self):
        return (self.M,)

    def numeric(self, x):
        a = np.abs(x)
        return np.where(a <= self.M, x * x, 2 * self.M * a - self.M ** 2)

    def derivative(self, x):
        return multiply(2.0, Clip(x, -self.M, self.M))

    def render(self):
        return f"huber({self.args[0]}, {self.M:g})"


# ---- internal atoms: they appear in derived gradients only --------------------------------
class Sigmoid(Elementwise):
    display, curvature = "sigmoid", UNKNOWN
    increasing = nonneg = True

    def numeric(self, x):
        return _sigmoid(x)

    def derivative(self, x):
        # one shared 1.0: the plans' CSE merges σ(1 − σ) across the columns of a Hessian only
        # when the constant is the same node (a new Constant per column is a new slot)
        return multiply(self, add(_ONE, neg(self)))


class _ZeroSlope(Elementwise):
    """Piecewise-constant functions: derivative zero almost everywhere."""

    curvature, smooth = UNKNOWN, False

    def derivative(self, x):
        return None


class Sign(_ZeroSlope):
    display = "sign"

    def numeric(self, x):
        return np.sign(x)


class Step(_ZeroSlope):
    """1 where x > 0, else 0."""

    display = "step"
    nonneg = True

    def numeric(self, x):
        return (x > 0).astype(float)


class Clip(Elementwise):
    display, curvature, smooth = "clip", UNKNOWN, False
    increasing = True

    def __init__(self, x, lower, upper):
        self.lower, self.upper = float(lower), float(upper)
        super().__init__(x)

    def params(self):
        return (self.lower, self.upper)

    def numeric(self, x):
        return np.clip(x, self.lower, self.upper)

    def derivative(self, x):
        return add(Step(add(x, -self.lower)), neg(Step(add(x, -self.upper))))


# ---- constructor functions (the public atom names) -----------------------------------------
exp, log, sqrt, square, logistic, pos = (constructor(atom)
                                         for atom in (Exp, Log, Sqrt, Square, Logistic, Pos))
abs = constructor(Abs)  # noqa: A001 - CVXPY-style name


def huber(x: Any, M: float = 1.0) -> Expression:
    """x² for |x| ≤ M, 2M|x| − M² otherwise, entry-wise (CVXPY's definition)."""
    return Huber(as_expr(x), M)
