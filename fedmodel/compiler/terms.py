"""Compiler pass helper: an expression as a flat sum of canonical terms `Σ_k c_k · atom_k`
(`flatten`), shared by the canonical pass (`canonical`) and the set recognizer (`sets`), so
neither imports the other."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from ..atoms import (Abs, Add, BroadcastTo, MatMul, Mean, Multiply, Neg, Norm1, Sum, abs as abs_,
                     broadcast_to, multiply)
from ..expression import Expression

Coefficient = Union[float, Expression]   # a float, or a scalar expression over Parameters


@dataclass
class Term:
    """One canonical term `coefficient · atom`."""
    coefficient: Coefficient
    atom: Expression

    def expression(self) -> Expression:
        if isinstance(self.coefficient, float) and self.coefficient == 1.0:
            return self.atom
        return multiply(self.coefficient, self.atom)


def _times(a: Coefficient, b: Coefficient) -> Coefficient:
    if isinstance(a, float) and isinstance(b, float):
        return a * b
    if isinstance(a, float) and a == 1.0:
        return b
    if isinstance(b, float) and b == 1.0:
        return a
    return multiply(a, b)


def _scalar(expr: Expression) -> Coefficient | None:
    """`expr` as a coefficient when it is a scalar constant (Parameters allowed, no data)."""
    if expr.size != 1 or not expr.is_constant() or expr.data_owners():
        return None
    if expr.parameters():
        return expr if expr.shape == () else None
    return float(np.asarray(expr.value).item())


def _scaled(expr: Multiply) -> tuple[Coefficient, Expression] | None:
    """(c, e) when `expr` is c·e or e·c with c a scalar coefficient (`_scalar`) and e of
    `expr`'s shape, else None."""
    for side, other in ((expr.args[0], expr.args[1]), (expr.args[1], expr.args[0])):
        c = _scalar(side)
        if c is not None and other.shape == expr.shape:
            return c, other
    return None


def flatten(expr: Expression, coefficient: Coefficient = 1.0) -> list[Term]:
    """Terms whose sum (broadcast to `expr.shape`) is `expr`."""
    if isinstance(expr, Add):
        return [t for arg in expr.args for t in flatten(arg, coefficient)]
    if isinstance(expr, Neg):
        return flatten(expr.args[0], _times(-1.0, coefficient))
    if isinstance(expr, Multiply) and (scaled := _scaled(expr)) is not None:
        c, other = scaled
        return flatten(other, _times(coefficient, c))
    if isinstance(expr, BroadcastTo):
        return [Term(t.coefficient, broadcast_to(t.atom, expr.shape) if t.atom.size > 1 else t.atom)
                for t in flatten(expr.args[0], coefficient)]
    if isinstance(expr, Sum) and isinstance(expr.args[0], Add) \
            and all(a.shape == expr.args[0].shape for a in expr.args[0].args):
        return [t for arg in expr.args[0].args for t in flatten(expr.with_args(arg), coefficient)]
    return [Term(coefficient, _normalize(expr))]


def _normalize(atom: Expression) -> Expression:
    """One spelling per prox-able atom: `sum(abs(w))` → `norm1(w)`, `norm1(c·w)` → |c|·… is
    left to `_norm1_of` (it moves a factor into the coefficient)."""
    if type(atom) is Sum and atom.shape == () and isinstance(atom.args[0], Abs):
        return Norm1(atom.args[0].args[0])      # also sum(abs(w), axis=0) of a vector w
    return atom


def summed_size(term: Expression) -> Expression:
    """A term whose value's size counts what it adds up (how `fedmodel.certificate` and the
    clients' own check size a constraint's terms): Σ|v| for sum(v) (or a mean), |A|·|v|
    for A @ v with A free of variables. A budget sum(w) >= 0 met at sum(w) = -1.5e-12 by
    cancellation has terms of size ~Σ|w_j|, not 1.5e-12, which read a rounding error as a 100 %
    violation (docs/BENCHMARKS.md, newuser4's house budget in units of 1e5)."""
    coefficient, atom = 1.0, term
    if isinstance(term, Multiply) and not term.args[0].variables():
        coefficient, atom = term.args[0], term.args[1]
    if isinstance(atom, (Sum, Mean)) and atom.args[0].variables():
        atom = atom.with_args(abs_(atom.args[0]))
    elif isinstance(atom, MatMul) and sum(not a.variables() for a in atom.args) == 1:
        atom = atom.with_args(*(abs_(a) for a in atom.args))
    else:
        return term
    return multiply(abs_(coefficient), atom)
