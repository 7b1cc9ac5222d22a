"""Compiler pass: classify terms as smooth, prox-able (nonsmooth with a known prox) or other."""
from __future__ import annotations

from ..atoms import Multiply, Norm1
from ..expression import Constant, Expression, Variable

PROXABLE = (Norm1,)


def prox_term(term: Expression):
    """(atom class, variable, weight) when `term` is `weight · atom(variable)` with a prox and
    a subdifferential we know exactly (e.g. λ‖w‖₁), else None."""
    weight = 1.0
    if isinstance(term, Multiply) and type(term.args[0]) is Constant and term.args[0].size == 1:
        weight, term = float(term.args[0].value), term.args[1]
    if isinstance(term, PROXABLE) and isinstance(term.args[0], Variable) and weight >= 0:
        return type(term), term.args[0], weight
    return None
