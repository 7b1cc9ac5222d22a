"""Shape-aware sympy building blocks for the atoms' symbolic forms (`fedmodel.lowering.to_sympy`).

Our shapes map to sympy's as () → scalar, (n,) → n×1 column, (m, n) → m×n. Every atom's
symbolic form must have the sympy shape of the atom's shape, or sympy refuses to combine it
with its neighbours (`multiply(x, exp(x))`, `X − b` with a broadcast row, …): `function`
renders an atom as `name(args)` with the right shape (a scalar function, or a matrix
expression sympy can multiply and add), `broadcast` lifts a value to a larger shape with
ones-matrices, `as_scalar` turns a 1×1 matrix product into a scalar. sympy is imported on
first use.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

import numpy as np

from .rules import RuleTable

Shape = tuple[int, ...]


def no_rule(form: str) -> Callable[[Any], Exception]:
    """The error of a rule table with no rule for a node (`RuleTable`'s default)."""
    return lambda node: NotImplementedError(f"{node.display} has no {form} sympy lowering")


# the formula of an entry-wise atom on scalars (registered in `to_sympy`, applied entry by entry
# by the symbolic and explicit forms)
SCALAR_RULES = RuleTable(no_rule("scalar"))


def sympy_shape(shape: Shape) -> tuple[int, int] | None:
    if not shape:
        return None
    return (shape[0], 1) if len(shape) == 1 else (shape[0], shape[1])


def is_matrix(value: Any) -> bool:
    return bool(getattr(value, "is_Matrix", False))


@lru_cache(maxsize=None)
def _matrix_function_class():
    import sympy
    from sympy.matrices.expressions.matexpr import MatrixExpr

    class MatrixFunction(MatrixExpr):
        """`name(args)` as an m×n matrix expression (an atom's value on matrix arguments)."""

        def __new__(cls, name, rows, cols, *args):
            name = name if isinstance(name, sympy.Symbol) else sympy.Symbol(name)
            return sympy.Basic.__new__(cls, name, sympy.Integer(rows), sympy.Integer(cols),
                                       *map(sympy.sympify, args))

        @property
        def name(self) -> str:
            return self.args[0].name

        @property
        def shape(self):
            return (self.args[1], self.args[2])

        @property
        def arguments(self):
            return self.args[3:]

        def _entry(self, i, j, **kwargs):
            return sympy.Function(self.name)(*self.arguments, i, j)

        def _latex(self, printer):
            inner = ", ".join(printer._print(a) for a in self.arguments)
            name = self.name.replace("_", r"\_")
            return rf"\operatorname{{{name}}}\left({inner}\right)"

        def _sympystr(self, printer):
            return f"{self.name}({', '.join(printer._print(a) for a in self.arguments)})"

    class Scalar(sympy.Expr):
        """A 1×1 matrix expression (xᵀPx, wᵀw) used as the scalar it is; prints as the matrix."""

        is_commutative = True

        def __new__(cls, matrix):
            return sympy.Expr.__new__(cls, matrix)

        def doit(self, **hints):
            matrix = self.args[0].doit(**hints)
            if not isinstance(matrix, sympy.MatrixBase) and not matrix.free_symbols:
                matrix = matrix.as_explicit()      # numbers substituted: evaluate the product
            return matrix[0, 0] if isinstance(matrix, sympy.MatrixBase) else Scalar(matrix)

        def _latex(self, printer):
            return printer._print(self.args[0])

        def _sympystr(self, printer):
            return printer._print(self.args[0])

    return MatrixFunction, Scalar


def function(name: str, shape: Shape, *args: Any) -> Any:
    """`name(args)` as a scalar (shape ()) or as a matrix expression of the given shape."""
    import sympy
    target = sympy_shape(shape)
    if target is None:
        return sympy.Function(name, real=True, commutative=True)(*args)
    return _matrix_function_class()[0](name, *target, *args)


def broadcast(value: Any, from_shape: Shape, to_shape: Shape) -> Any:
    """`value` (of our shape `from_shape`) lifted to `to_shape` with numpy's broadcasting."""
    import sympy
    from_shape, to_shape = tuple(from_shape), tuple(to_shape)
    if from_shape == to_shape or not to_shape:
        return value
    rows, cols = sympy_shape(to_shape)
    if not from_shape or from_shape in ((1,), (1, 1)):        # scalar: c · 1
        scalar = as_scalar(value)
        return scalar * sympy.OneMatrix(rows, cols)
    if len(from_shape) == 1:                                  # (n,) → (m, n): rows of the vector
        return sympy.OneMatrix(rows, 1) * sympy.Transpose(value)
    if from_shape[1] == 1:                                    # (m, 1) → (m, n)
        return value * sympy.OneMatrix(1, cols)
    return sympy.OneMatrix(rows, 1) * value                   # (1, n) → (m, n)


def as_scalar(value: Any) -> Any:
    """A 1×1 matrix expression (e.g. xᵀPx) as the scalar it stands for."""
    if is_matrix(value) and tuple(value.shape) == (1, 1):
        return _matrix_function_class()[1](value)
    return value


def vectorize_sympy(func: Callable, *arrays: np.ndarray) -> np.ndarray:
    """Apply a scalar sympy function entry-wise to object arrays (numpy broadcasting)."""
    out = np.vectorize(func, otypes=[object])(*arrays)
    return np.asarray(out, dtype=object)
