"""Compiler pass helper: the constraints a slack variable alone can always meet.

A private variable t that enters every constraint it appears in as `… − c·t ≤ 0` (c > 0 a
number, t itself, no equality, no other use) can grow without violating anything: each of those
rows is met by a large enough t, whatever the other variables are. The epigraph slacks of
`compiler.epigraph` (t ≥ 1 − y∘(Xw), t ≥ 0) and a user's s ≥ ‖w‖² − 1 are such. A run whose
only violated constraints are such rows cannot have found the model infeasible: raising the
slacks gives a point that meets every constraint. ProxAL's verdict reads this
(`backends.proxal_private.slack_verdict`): the hinge SVM with features ×1e3 ended "infeasible"
on a model every w satisfies (docs/BENCHMARKS.md, newuser5).
"""
from __future__ import annotations

from ..constraints import Constraint, Inequality
from ..expression import Variable
from .terms import flatten


def met_by_slack(constraints: list[Constraint], private: list[Variable]) -> list[Constraint]:
    """The constraints among `constraints` that a variable of `private` meets alone by growing
    (module docstring)."""
    uses: dict[int, list[Constraint]] = {}
    for c in constraints:
        for v in c.expr.variables():
            uses.setdefault(v.uid, []).append(c)
    met: list[Constraint] = []
    for t in private:
        mine = uses.get(t.uid, [])
        if mine and all(_falls_with(c, t) for c in mine):
            met += [c for c in mine if all(c is not m for m in met)]
    return met


def _falls_with(constraint: Constraint, t: Variable) -> bool:
    """`constraint` is an inequality with t in exactly one term, −c·t (c > 0 a number), and
    that term reaches every row (t of the constraint's shape, or a scalar t)."""
    if not isinstance(constraint, Inequality):
        return False
    terms = [term for term in flatten(constraint.expr) if t.uid in {v.uid for v in term.atom.variables()}]
    if len(terms) != 1:
        return False
    term = terms[0]
    reaches = term.atom.shape == constraint.shape or term.atom.size == 1
    return term.atom is t and isinstance(term.coefficient, float) and term.coefficient < 0 and reaches
