"""The `Atom` base class: one node of the IR that is a function of its arguments.

A subclass knows, and only knows: its shape rule, numeric value, derivative rule (a
vector-Jacobian product written in the IR itself), curvature, monotonicity, sign, smoothness,
CVXPY and sympy lowerings, and its prox where one exists.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import FedModelError, ShapeError
from ..expression import Expression, Shape, as_expr

CONVEX, CONCAVE, AFFINE, UNKNOWN = "convex", "concave", "affine", "unknown"
INCREASING, DECREASING, NONMONOTONE = "increasing", "decreasing", "nonmonotone"


class Atom(Expression):
    """Base class; subclasses set `display` and override the rule methods they need."""

    display = "atom"
    smooth = True                    # differentiable everywhere on its domain
    curvature = AFFINE               # curvature of the function itself (may be a property)
    internal = False                 # atoms introduced by differentiation only

    def __init__(self, *args: Any):
        self.args = tuple(as_expr(a) for a in args)
        self.shape = self.shape_from_args()

    # ---- rules subclasses override -------------------------------------------------------
    def shape_from_args(self) -> Shape:
        return self.args[0].shape

    def params(self) -> tuple:
        """Hashable non-expression parameters (axis, exponent, …); part of the CSE key."""
        return ()

    def numeric(self, *values: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def vjp(self, index: int, upstream: Expression) -> Expression | None:
        """Adjoint contribution to argument `index` given the adjoint `upstream` of the output.

        Returns an expression of the argument's shape, or None when the derivative is zero.
        """
        raise NotImplementedError(f"{self.display} has no derivative rule")

    def monotonicity(self, index: int) -> str:
        return NONMONOTONE

    def sign(self) -> tuple[bool, bool]:
        """(is nonnegative, is nonpositive) from the argument signs."""
        return (False, False)

    def to_cvxpy(self, *args: Any) -> Any:
        raise FedModelError(f"{self.display} has no CVXPY lowering (it appears only in derived "
                            "gradients, which CVXPY does not need)")

    def to_sympy(self, *args: Any) -> Any:
        """Symbolic rendering over MatrixSymbols; reads like the formula in a paper.
        The default is `display(args)`, a scalar or a matrix expression of this atom's shape."""
        from ..lowering.to_sympy import function
        return function(self.display, self.shape, *args)

    def to_sympy_explicit(self, *args: np.ndarray) -> np.ndarray:
        """Entry-wise lowering: arguments and result are numpy object arrays of sympy scalars."""
        raise NotImplementedError(f"{self.display} has no explicit sympy lowering")

    prox: Callable | None = None     # prox(v, t) = argmin_x t*atom(x) + ½‖x − v‖², atoms of a variable

    # ---- rendering ----------------------------------------------------------------------
    def render(self) -> str:
        inner = ", ".join(str(a) for a in self.args)
        extra = ", ".join(f"{p}" for p in self.params() if p is not None)
        return f"{self.display}({inner}{', ' + extra if extra else ''})"

    def with_args(self, *args: Expression) -> "Atom":
        """Same atom (same parameters) on other arguments."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.args = tuple(args)
        clone.shape = clone.shape_from_args()
        return clone


def broadcast_shapes(a: Expression, b: Expression, op: str) -> Shape:
    if a.shape == b.shape or b.shape == ():   # most nodes of derived gradients; numpy's
        return a.shape                        # broadcast_shapes costs µs per node built
    if a.shape == ():
        return b.shape
    try:
        return tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise ShapeError(
            f"cannot {op} {a} (shape {a.shape}) and {b} (shape {b.shape}): the shapes do not "
            "broadcast; reshape one operand or index it") from None


def constant_value(expr: Expression) -> np.ndarray | None:
    """The value of a constant subexpression that holds no Parameter, else None."""
    if expr.is_constant() and not expr.parameters():
        from ..compiler.codegen import evaluate
        return np.asarray(evaluate(expr), dtype=float)
    return None


def elementwise_sign(value: np.ndarray | None) -> tuple[bool, bool]:
    if value is None:
        return (False, False)
    return (bool(np.all(value >= 0)), bool(np.all(value <= 0)))


def vectorize_sympy(func: Callable, *arrays: np.ndarray) -> np.ndarray:
    """Apply a scalar sympy function entry-wise to object arrays (numpy broadcasting)."""
    out = np.vectorize(func, otypes=[object])(*arrays)
    return np.asarray(out, dtype=object)
