"""Compiler pass: classify terms as smooth, prox-able (nonsmooth with a known prox) or other."""
from __future__ import annotations

from ..expression import Expression, Variable
from .canonical import classify_objective


def prox_term(term: Expression):
    """A `ProxTerm` when `term` alone is prox-able (λ‖w‖₁ on a shared variable, λ ≥ 0, in any
    canonical spelling: see `canonical.classify_objective`), else None."""
    found = classify_objective([term])
    return found.prox[0] if found.prox and not found.smooth else None


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
