"""The explicit sympy form of expressions (`to_sympy(expr, explicit=True)`): numpy object
arrays of scalar sympy expressions, one rule per atom class (`@explicit_rule(Add)`); entry-wise
atoms apply their scalar formula (`sympy_forms.SCALAR_RULES`, registered in `to_sympy`) to each
entry. sympy is imported when a rule first runs."""
from __future__ import annotations

from functools import partial

import numpy as np

from ..atoms import (Add, ArgmaxAbs, Atom, BroadcastTo, GreaterEqual, Index, IndexAdjoint, LogSumExp,
                     MatMul, Maximum, Mean, Multiply, Norm1, Norm2, NormInf, QuadForm, Reshape, Softmax,
                     Sum, SumSquares, SumTo, Transpose)
from ..atoms.broadcasting import sum_to_shape
from ..atoms.elementwise import Elementwise
from ..atoms.indexing import numpy_key
from .rules import RuleTable
from .sympy_forms import SCALAR_RULES, no_rule, vectorize_sympy

EXPLICIT_RULES = RuleTable(no_rule("explicit"), "sympy explicit")  # object arrays of scalars
explicit_rule = EXPLICIT_RULES.register


# -- explicit form (numpy object arrays of sympy scalars) --
@explicit_rule(Elementwise, Maximum)
def _entry_by_entry(node: Atom, *args: np.ndarray) -> np.ndarray:
    return vectorize_sympy(partial(SCALAR_RULES, node), *args)


@explicit_rule(Add)
def _add_explicit(node: Add, *args: np.ndarray) -> np.ndarray:
    out = args[0]
    for a in args[1:]:
        out = out + a
    return np.asarray(out, dtype=object)


@explicit_rule(Multiply)
def _multiply_explicit(node: Multiply, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(a * b, dtype=object)


@explicit_rule(MatMul)
def _matmul_explicit(node: MatMul, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(np.dot(a, b), dtype=object)


@explicit_rule(Transpose)
def _transpose_explicit(node: Transpose, x: np.ndarray) -> np.ndarray:
    return x.T


@explicit_rule(Index)
def _index_explicit(node: Index, x: np.ndarray) -> np.ndarray:
    return np.asarray(x[numpy_key(node.key)], dtype=object)


@explicit_rule(IndexAdjoint)
def _scatter_explicit(node: IndexAdjoint, g: np.ndarray) -> np.ndarray:
    import sympy
    out = np.full(node.target, sympy.Integer(0), dtype=object)
    np.add.at(out, numpy_key(node.key), g)   # repeated indices accumulate, as in numeric
    return out


@explicit_rule(Reshape)
def _reshape_explicit(node: Reshape, x: np.ndarray) -> np.ndarray:
    return np.reshape(x, node.target)


@explicit_rule(BroadcastTo)
def _broadcast_to_explicit(node: BroadcastTo, x: np.ndarray) -> np.ndarray:
    return np.asarray(np.broadcast_to(x, node.target), dtype=object)


@explicit_rule(SumTo)
def _sum_to_explicit(node: SumTo, x: np.ndarray) -> np.ndarray:
    return sum_to_shape(x, node.target)


@explicit_rule(Sum)
def _sum_explicit(node: Sum, x: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(x, axis=node.axis), dtype=object)


@explicit_rule(Mean)
def _mean_explicit(node: Mean, x: np.ndarray) -> np.ndarray:
    import sympy
    return np.asarray(np.sum(x, axis=node.axis) * sympy.Rational(1, node.count), dtype=object)


@explicit_rule(GreaterEqual)
def _greater_equal_explicit(node: GreaterEqual, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    import sympy
    return vectorize_sympy(lambda u, v: sympy.Piecewise((1, u >= v), (0, True)), a, b)


@explicit_rule(SumSquares)
def _sum_squares_explicit(node: SumSquares, x: np.ndarray) -> np.ndarray:
    return np.asarray(np.sum(x * x), dtype=object)


@explicit_rule(Norm1)
def _norm1_explicit(node: Norm1, x: np.ndarray) -> np.ndarray:
    import sympy
    return np.asarray(np.sum(vectorize_sympy(sympy.Abs, x)), dtype=object)


@explicit_rule(Norm2)
def _norm2_explicit(node: Norm2, x: np.ndarray) -> np.ndarray:
    import sympy
    return np.asarray(sympy.sqrt(np.sum(x * x)), dtype=object)


@explicit_rule(NormInf)
def _norm_inf_explicit(node: NormInf, x: np.ndarray) -> np.ndarray:
    import sympy
    return np.asarray(sympy.Max(*[sympy.Abs(e) for e in np.ravel(x)]), dtype=object)


@explicit_rule(ArgmaxAbs)
def _argmax_abs_explicit(node: ArgmaxAbs, x: np.ndarray) -> np.ndarray:
    import sympy
    flat = [sympy.Abs(e) for e in np.ravel(x)]
    out = []
    for j, e in enumerate(np.ravel(x)):   # sign(x_j) where |x_j| is the first largest
        first = sympy.And(*[flat[j] > flat[i] for i in range(j)],
                          *[flat[j] >= flat[i] for i in range(j + 1, len(flat))])
        out.append(sympy.Piecewise((sympy.sign(e), first), (0, True)))
    return np.array(out, dtype=object).reshape(np.shape(x))


@explicit_rule(QuadForm)
def _quad_form_explicit(node: QuadForm, x: np.ndarray, P: np.ndarray) -> np.ndarray:
    return np.asarray(np.dot(x, np.dot(P, x)), dtype=object)


@explicit_rule(LogSumExp)
def _log_sum_exp_explicit(node: LogSumExp, x: np.ndarray) -> np.ndarray:
    import sympy
    out = np.apply_along_axis(lambda r: sympy.log(sympy.Add(*[sympy.exp(e) for e in r])),
                              node.axis, x) if node.axis is not None else \
        sympy.log(sympy.Add(*[sympy.exp(e) for e in np.ravel(x)]))
    return np.asarray(out, dtype=object)


@explicit_rule(Softmax)
def _softmax_explicit(node: Softmax, x: np.ndarray) -> np.ndarray:
    import sympy

    def soft(r):
        exps = [sympy.exp(e) for e in r]
        total = sympy.Add(*exps)
        return np.array([e / total for e in exps], dtype=object)
    if node.axis is None:
        return soft(np.ravel(x)).reshape(np.shape(x))
    return np.apply_along_axis(soft, node.axis, x)
