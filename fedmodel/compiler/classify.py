"""Compiler pass: classify terms as smooth, prox-able (nonsmooth with a known prox) or other."""
from __future__ import annotations

import numpy as np

from ..atoms import Multiply, Norm1
from ..expression import Constant, Expression, Variable

PROXABLE = (Norm1,)


def prox_term(term: Expression):
    """A `ProxTerm` when `term` is `weight · atom(variable)` with a prox and a subdifferential
    we know exactly (λ‖w‖₁ on a shared variable), else None."""
    from .sets import norm1_term
    weight = 1.0
    if isinstance(term, Multiply) and type(term.args[0]) is Constant and term.args[0].size == 1:
        weight, term = float(np.asarray(term.args[0].value).item()), term.args[1]
    if isinstance(term, PROXABLE) and isinstance(term.args[0], Variable) and weight >= 0 \
            and term.args[0].owner is None:
        return norm1_term(term.args[0], weight)
    return None


def polynomial_degree(expr: Expression) -> float:
    """Degree of `expr` as a polynomial in the variables (inf when not polynomial).

    Degree ≤ 2 means a quadratic: its Hessian is constant and a subproblem is one linear solve.
    """
    from ..atoms import (BroadcastTo, Index, MatMul, Mean, Neg, Power, QuadForm, Reshape, Square,
                         Sum, SumSquares, SumTo, Transpose, Add, Multiply)
    from ..expression import Leaf
    if isinstance(expr, Variable):
        return 1
    if isinstance(expr, Leaf):
        return 0
    degrees = [polynomial_degree(a) for a in expr.args]
    if isinstance(expr, Add):
        return max(degrees)
    if isinstance(expr, (Neg, Transpose, Index, Reshape, BroadcastTo, Sum, Mean, SumTo)):
        return degrees[0]
    if isinstance(expr, (Multiply, MatMul)):
        return sum(degrees)
    if isinstance(expr, (Square, SumSquares, QuadForm)) or (isinstance(expr, Power) and expr.p == 2):
        return 2 * degrees[0]
    return 0 if all(d == 0 for d in degrees) else float("inf")
