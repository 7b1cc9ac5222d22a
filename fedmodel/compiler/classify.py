"""Compiler pass: classify terms as smooth, prox-able (nonsmooth with a known prox) or other."""
from __future__ import annotations

from .. import atoms as A
from ..errors import FedModelError
from ..expression import Expression, Leaf, Variable
from ..lowering.rules import RuleTable
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
    if isinstance(expr, Variable):
        return 1
    if isinstance(expr, Leaf):
        return 0
    # an atom without a rule is taken as not polynomial (right for any atom, if slower);
    # tests/test_atom_rules.py is what makes every atom state its rule
    rule = DEGREE_RULES.find(expr) or _not_polynomial
    return rule(expr, [polynomial_degree(a) for a in expr.args])


# rule(node, degrees of its arguments) -> the node's degree
DEGREE_RULES = RuleTable(lambda node: FedModelError(
    f"classification has no degree rule for the atom {type(node).__name__} ({node.display})"),
    name="classification")
degree_rule = DEGREE_RULES.register


@degree_rule(A.Add)
def _highest(node: Expression, degrees: list[float]) -> float:
    return max(degrees)


@degree_rule(A.Neg, A.Transpose, A.Index, A.Reshape, A.BroadcastTo, A.Sum, A.Mean, A.SumTo)
def _linear(node: Expression, degrees: list[float]) -> float:
    return degrees[0]


@degree_rule(A.Multiply, A.MatMul)
def _product(node: Expression, degrees: list[float]) -> float:
    return sum(degrees)


@degree_rule(A.Square, A.SumSquares, A.QuadForm)
def _squared(node: Expression, degrees: list[float]) -> float:
    return 2 * degrees[0]


@degree_rule(A.Power)
def _power(node: Expression, degrees: list[float]) -> float:
    return 2 * degrees[0] if node.p == 2 else _not_polynomial(node, degrees)


# Not polynomials: their degree is 0 on constants (a constant) and inf otherwise. (IndexAdjoint
# is linear, but only derived gradients hold it, which are never classified.)
@degree_rule(A.Exp, A.Log, A.Sqrt, A.Abs, A.Logistic, A.Pos, A.Huber, A.Sigmoid, A.Sign, A.Step,
             A.Clip, A.Maximum, A.GreaterEqual, A.IndexAdjoint, A.Norm1, A.Norm2, A.NormInf,
             A.ArgmaxAbs, A.LogSumExp, A.Softmax)
def _not_polynomial(node: Expression, degrees: list[float]) -> float:
    return 0 if all(d == 0 for d in degrees) else float("inf")
