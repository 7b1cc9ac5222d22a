"""Constraints, canonicalized when built: `a <= b` → `a − b <= 0`, `a >= b` → `b − a <= 0`,
`a == b` → `a − b == 0`. A constraint keeps a user-facing name and, once placed, its owner."""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import FedModelError, ShapeError
from .expression import OPERATORS, Expression, as_expr


class Constraint:
    """`expr <= 0` (Inequality) or `expr == 0` (Equality), entry-wise."""

    relation = "?"

    def __init__(self, lhs: Any, rhs: Any, name: str | None = None):
        lhs, rhs = as_expr(lhs), as_expr(rhs)
        try:
            np.broadcast_shapes(lhs.shape, rhs.shape)
        except ValueError:
            raise ShapeError(f"constraint {lhs} {self.relation} {rhs}: shapes {lhs.shape} and "
                             f"{rhs.shape} do not broadcast") from None
        self.lhs, self.rhs = lhs, rhs
        self.expr: Expression = lhs - rhs
        self.name = name
        self.owner: str | None = None

    def named(self, name: str) -> "Constraint":
        """Give the constraint a name (used for multipliers and reports)."""
        if not isinstance(name, str) or not name:
            raise FedModelError(f"constraint {self!r}: name {name!r} must be a non-empty string")
        if self.owner is not None:
            raise FedModelError(f"constraint {self!r} is already in block {self.owner!r}; name "
                                "it before passing it to subject_to")
        self.name = name
        return self

    @property
    def shape(self):
        return self.expr.shape

    @property
    def size(self) -> int:
        return self.expr.size

    def violation(self, value: np.ndarray | float) -> float:
        """Largest violation (≥ 0) of the canonical form at the given value of `expr`."""
        raise NotImplementedError

    def is_dcp(self) -> bool:
        raise NotImplementedError

    def __bool__(self) -> bool:
        raise FedModelError("a constraint has no truth value; pass it to subject_to(...)")

    def __repr__(self) -> str:
        label = f"{self.name}: " if self.name else ""
        return f"{label}{self.lhs} {self.relation} {self.rhs}"


class Inequality(Constraint):
    relation = "<="

    def violation(self, value):
        return float(np.max(np.maximum(np.asarray(value), 0.0), initial=0.0))

    def is_dcp(self) -> bool:
        return self.expr.is_convex()


class Equality(Constraint):
    relation = "=="

    def violation(self, value):
        return float(np.max(np.abs(np.asarray(value)), initial=0.0))

    def is_dcp(self) -> bool:
        return self.expr.is_affine()


OPERATORS.update(inequality=Inequality, equality=Equality)   # `a <= b`, `a >= b`, `a == b`
