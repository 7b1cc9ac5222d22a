"""Atoms that reduce an array to a scalar (or along an axis): norms, sums of squares,
quadratic forms, log-sum-exp. Norms of matrices are entry-wise (‖vec X‖)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import FedModelError, ShapeError
from ..expression import Constant, Expression, as_expr
from .arithmetic import add, multiply, neg
from .base import (CONCAVE, CONVEX, DECREASING, INCREASING, NONMONOTONE, UNKNOWN, Atom,
                   constant_value, constructor, even_monotonicity)
from .broadcasting import broadcast_to
from .elementwise import Sign, power, square
from .linear import matmul, transpose
from .prox import shrink, soft_threshold
from .sums import AlongAxis, keep_reduced_axis, normalize_axis, sum as sum_


class Reduction(Atom):
    curvature = CONVEX

    def shape_from_args(self):
        return ()

    def sign(self):
        return (True, False)

    def monotonicity(self, index):
        return even_monotonicity(self.args[0])


class SumSquares(Reduction):
    """Σ x_j², the squared ℓ2 (Frobenius) norm."""

    display, squares = "sum_squares", True

    def numeric(self, x):
        if isinstance(x, float):      # a scalar (an AL term's [μ + βc]₊): no array round trip;
            x = float(x)              # Python floats overflow to inf silently, as vdot does
            return x * x
        x = np.asarray(x)
        return float(np.vdot(x, x))

    def vjp(self, index, upstream):
        return multiply(multiply(2.0, upstream), self.args[0])

    prox = staticmethod(shrink)


class Norm(Reduction):
    """A norm of the entries: nonsmooth at 0; its vjp is the upstream times a subgradient."""

    smooth = False

    def subgradient(self) -> Expression:
        """A subgradient of the norm at its argument, as an expression of the argument's shape."""
        raise NotImplementedError

    def vjp(self, index, upstream):
        return multiply(upstream, self.subgradient())


class Norm1(Norm):
    """Σ|x_j|; subgradient sign(x)."""

    display = "norm1"
    prox = staticmethod(soft_threshold)

    def numeric(self, x):
        return float(np.abs(x).sum())

    def subgradient(self):
        return Sign(self.args[0])


class Norm2(Norm):
    """‖x‖₂ (Frobenius for a matrix); gradient x/‖x‖₂."""

    display = "norm2"

    def numeric(self, x):
        return float(np.linalg.norm(np.ravel(x)))

    def subgradient(self):
        return multiply(power(self, -1), self.args[0])

    @staticmethod
    def prox(v: np.ndarray, t: float) -> np.ndarray:
        """Block soft-thresholding."""
        norm = np.linalg.norm(v)
        return np.zeros_like(v) if norm <= t else (1.0 - t / norm) * v


class NormInf(Norm):
    """max_j |x_j|; subgradient `ArgmaxAbs`."""

    display = "norm_inf"

    def numeric(self, x):
        return float(np.abs(x).max())

    def subgradient(self):
        return ArgmaxAbs(self.args[0])


class ArgmaxAbs(Atom):
    """sign(x_j) at the first entry of largest |x_j|, zero elsewhere: a subgradient of ‖x‖∞."""

    display, curvature, smooth = "argmax_abs", UNKNOWN, False

    def numeric(self, x):
        out = np.zeros(np.shape(x))
        flat = np.abs(x).argmax()
        out.flat[flat] = np.sign(np.ravel(x)[flat])
        return out

    def vjp(self, index, upstream):
        return None


class QuadForm(Reduction):
    """xᵀ P x for a constant matrix P (convex when P is PSD, concave when NSD)."""

    display = "quad_form"

    def __init__(self, x, P):
        super().__init__(x, P)
        n = x.shape[0] if x.ndim == 1 else None
        if x.ndim != 1 or P.shape != (n, n):
            raise ShapeError(f"quad_form(x, P) needs a vector x and a square P of matching size: "
                             f"got x = {x} (shape {x.shape}) and P = {P} (shape {P.shape})")
        if not P.is_constant():
            raise FedModelError(f"quad_form({x}, {P}): P must be constant")

    def fixed_P(self) -> np.ndarray | None:
        """P's value when it is fixed (no Parameter in it), else None: a Parameter's value
        may change after the expression is built, so nothing may be baked in from it."""
        return constant_value(self.args[1])

    def _eigs(self):
        if not hasattr(self, "_eig_cache"):
            value = self.fixed_P()
            self._eig_cache = None if value is None else np.linalg.eigvalsh((value + value.T) / 2)
        return self._eig_cache

    @property
    def curvature(self):
        eigs = self._eigs()
        if eigs is None:
            return UNKNOWN
        scale = max(1.0, float(np.abs(eigs).max()))
        if eigs.min() >= -1e-10 * scale:
            return CONVEX
        if eigs.max() <= 1e-10 * scale:
            return CONCAVE
        return UNKNOWN

    def sign(self):
        c = self.curvature
        return (c == CONVEX, c == CONCAVE)

    def monotonicity(self, index):
        # ∇ₓ(xᵀPx) = (P + Pᵀ)x: of one sign when x and P (entry-wise) have signs, as in CVXPY
        if index == 1:
            return NONMONOTONE
        P = self.fixed_P()
        if P is None:
            return NONMONOTONE
        x_nonneg, x_nonpos = self.args[0].sign()
        P_nonneg, P_nonpos = bool(np.all(P >= 0)), bool(np.all(P <= 0))
        if (x_nonneg and P_nonneg) or (x_nonpos and P_nonpos):
            return INCREASING
        if (x_nonneg and P_nonpos) or (x_nonpos and P_nonneg):
            return DECREASING
        return NONMONOTONE

    def numeric(self, x, P):
        return float(x @ P @ x)

    def vjp(self, index, upstream):
        x, P = self.args
        if index == 1:
            return None
        fixed = self.fixed_P()
        symmetric = Constant(fixed + fixed.T) if fixed is not None else add(P, transpose(P))
        return multiply(upstream, matmul(symmetric, x))

    def render(self):
        return f"quad_form({self.args[0]}, {self.args[1]})"


class LogSumExp(AlongAxis):
    """log Σ exp(x) (optionally along an axis), shifted by the max so it never overflows."""

    display, curvature = "log_sum_exp", CONVEX

    def numeric(self, x):
        x = np.asarray(x)
        top = np.max(x, axis=self.axis, keepdims=True)
        out = np.log(np.sum(np.exp(x - top), axis=self.axis, keepdims=True)) + top
        return out.reshape(self.shape) if self.shape else float(out.ravel()[0])

    def vjp(self, index, upstream):
        shape = self.args[0].shape
        upstream = keep_reduced_axis(upstream, shape, self.axis)
        return multiply(broadcast_to(upstream, shape), Softmax(self.args[0], self.axis))

    def monotonicity(self, index):
        return INCREASING

    def sign(self):
        return (self.args[0].sign()[0], False)  # lse(x) ≥ max(x)


class Softmax(AlongAxis):
    """exp(x − lse(x)) along an axis (all entries when axis is None): the gradient of lse."""

    display, curvature = "softmax", UNKNOWN

    def shape_from_args(self):
        return self.args[0].shape        # normalized along the axis, not reduced

    def numeric(self, x):
        x = np.asarray(x)
        z = np.exp(x - np.max(x, axis=self.axis, keepdims=True))
        return z / np.sum(z, axis=self.axis, keepdims=True)

    def vjp(self, index, upstream):
        # J^T g = s ∘ (g − Σ_axis g∘s)
        shape = self.args[0].shape
        inner = keep_reduced_axis(sum_(multiply(upstream, self), self.axis), shape, self.axis)
        return multiply(self, add(upstream, neg(broadcast_to(inner, shape))))

    def sign(self):
        return (True, False)


# ---- constructor functions ---------------------------------------------------------------
sum_squares, norm1, norm2, norm_inf = (constructor(atom) for atom in (SumSquares, Norm1, Norm2, NormInf))


def quad_form(x: Any, P: Any) -> Expression:
    """xᵀ P x for a constant square matrix P (convex when P is PSD, concave when NSD)."""
    return QuadForm(as_expr(x), as_expr(P))


def log_sum_exp(x: Any, axis: int | None = None) -> Expression:
    """log Σ exp(x) over all entries, or along `axis` (convex, increasing)."""
    x = as_expr(x)
    return LogSumExp(x, normalize_axis(axis, x))


def power_or_squares(x: Any, p: Any) -> Expression:
    """`power(x, p)` (also `x ** p`), except that ‖a‖₂ ** 2 — CVXPY's `power(norm(a), 2)` — is
    `sum_squares(a)`: the same function, smooth where the norm is not (every backend refused
    `power(norm2(X @ w - y), 2)` for "a nonsmooth term without a prox")."""
    x = as_expr(x)
    if isinstance(x, Norm2) and np.isscalar(p) and p == 2:
        return sum_squares(x.args[0])
    return power(x, p)


def square_or_squares(x: Any) -> Expression:
    """`square(x)`; `square(norm2(a))` is `sum_squares(a)`, as in `power_or_squares`."""
    x = as_expr(x)
    return sum_squares(x.args[0]) if isinstance(x, Norm2) else square(x)
