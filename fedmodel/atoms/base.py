"""The `Atom` base class: one node of the IR that is a function of its arguments.

A subclass knows, and only knows, its math: its shape rule, numeric value, derivative rule (a
vector-Jacobian product written in the IR itself), curvature, monotonicity, sign, smoothness,
and its prox where one exists. How it lowers to CVXPY or sympy is the lowerings' business
(`fedmodel.lowering`, one rule per atom class).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..analysis import AFFINE, CONCAVE, CONVEX, DECREASING, INCREASING, NONMONOTONE, UNKNOWN
from ..errors import ShapeError
from ..expression import Expression, Shape, as_expr, evaluate

__all__ = ["AFFINE", "CONCAVE", "CONVEX", "DECREASING", "INCREASING", "NONMONOTONE", "UNKNOWN",
           "Atom", "EntryMap", "Retarget", "broadcast_error", "broadcast_shapes", "constant_value", "constructor",
           "even_monotonicity"]


class Atom(Expression):
    """Base class; subclasses set `display` and override the rule methods they need
    (`numeric`, `vjp`, and the DCP rules `curvature`, `monotonicity`, `sign`, `smooth`)."""

    display = "atom"
    curvature = AFFINE               # curvature of the function itself (may be a property)
    defined_everywhere = True        # on all of ℝ (Log, Sqrt, most powers: a domain; may be a property)

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


class EntryMap(Atom):
    """A linear map that moves, copies or adds up its argument's entries (transpose, index,
    reshape, broadcast, sum): increasing in its argument, and of its sign."""

    def monotonicity(self, index: int) -> str:
        return INCREASING

    def sign(self) -> tuple[bool, bool]:
        return self.args[0].sign()


class Retarget(Atom):
    """An atom of one argument whose shape is a parameter, `target` (reshape, broadcast, the
    sum back over broadcast axes)."""

    def __init__(self, x: Any, shape: Shape):
        self.target = shape
        super().__init__(x)

    def shape_from_args(self) -> Shape:
        return self.target

    def params(self) -> tuple:
        return (self.target,)


def constructor(atom: type[Atom]) -> Callable[[Any], Expression]:
    """The public function of a one-argument atom without parameters, named by its `display`
    and documented by its docstring: `exp = constructor(Exp)` makes `exp(x) = Exp(as_expr(x))`."""
    def construct(x: Any) -> Expression:
        return atom(as_expr(x))
    construct.__name__ = construct.__qualname__ = atom.display
    construct.__module__, construct.__doc__ = atom.__module__, atom.__doc__
    return construct


def broadcast_error(op: str, a: Expression, b: Expression) -> ShapeError:
    """The error for operands `a`, `b` of `op` ("add", "multiply", …) whose shapes do not
    broadcast."""
    return ShapeError(f"cannot {op} {a} (shape {a.shape}) and {b} (shape {b.shape}): the shapes "
                      "do not broadcast; reshape one operand or index it")


def broadcast_shapes(a: Expression, b: Expression, op: str) -> Shape:
    """The shape of `a` ∘ `b` under numpy's broadcasting; `broadcast_error` when there is none."""
    if a.shape == b.shape or b.shape == ():   # most nodes of derived gradients; numpy's
        return a.shape                        # broadcast_shapes costs µs per node built
    if a.shape == ():
        return b.shape
    try:
        return tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise broadcast_error(op, a, b) from None


def constant_value(expr: Expression) -> np.ndarray | None:
    """The value of a constant subexpression that holds no Parameter, else None."""
    if expr.is_constant() and not expr.parameters():
        return np.asarray(evaluate(expr), dtype=float)
    return None


def even_monotonicity(arg: Expression) -> str:
    """Monotonicity of an even function (|x|, x², ‖x‖, …) of `arg`: increasing where the
    argument is ≥ 0, decreasing where it is ≤ 0."""
    nonneg, nonpos = arg.sign()
    return INCREASING if nonneg else DECREASING if nonpos else NONMONOTONE
