"""The reading of a Hessian-vector product ∇(∇P_i·v) as Gram terms for `gram_hessian` (its
module docstring says what is read): along the linear path from the root, the products Aᵀ Y
with Y linear in A (s ∘ v), each Y as diag(t) + Σ a bᵀ, and the rest without them.
"""
from __future__ import annotations

import numpy as np

from ..atoms.arithmetic import Add, Multiply, Neg, add, multiply
from ..atoms.broadcasting import BroadcastTo, SumTo, broadcast_to
from ..atoms.linear import MatMul, Transpose
from ..atoms.sums import Sum, sum as total
from ..expression import Constant, Leaf
from .data_products import data_product, is_constant, value_of


class NoForm(Exception):
    """The product does not have the form (`without` met a Gram term off the linear path)."""


class Reader:
    """Reads the Hessian-vector product's expression for `gram_hessian` (memoized per node)."""

    def __init__(self, direction):
        self.direction = direction
        self._uses: dict[int, bool] = {}
        self._same: dict[tuple[int, int], bool] = {}
        self._canonical: list = []
        # the distinct nodes found equal by value: what another program of the structure must
        # also have to take this reading (`gram_hessian._rebound`); unequal ones only keep a
        # term apart or on today's path, right for any values
        self.equal: list[tuple] = []

    def walk(self, node, factors: list, grams: list, n: int) -> None:
        """The Gram terms (`gram`) on the product's linear path from `node` into `grams`."""
        if not self.uses(node):
            return
        if isinstance(node, Add):
            for a in node.args:
                self.walk(a, factors, grams, n)
        elif isinstance(node, Multiply):
            a, b = node.args
            if self.uses(a) != self.uses(b):
                dependent, free = (a, b) if self.uses(a) else (b, a)
                self.walk(dependent, factors + [free], grams, n)
        elif isinstance(node, Neg):
            self.walk(node.args[0], factors + [Constant(-1.0)], grams, n)
        elif isinstance(node, MatMul):
            found = self.gram(node, factors, n)
            if found is not None:
                grams.append((node,) + found)

    def uses(self, node) -> bool:
        """Whether the direction occurs in `node`."""
        found = self._uses.get(id(node))
        if found is None:
            found = self._uses[id(node)] = node is self.direction if isinstance(node, Leaf) else \
                any(self.uses(a) for a in node.args)
        return found

    def canonical(self, A):
        """The first node seen with A's value (terms on equal data share one syrk)."""
        for B in self._canonical:
            if self.same(A, B):
                return B
        self._canonical.append(A)
        return A

    def same(self, a, b) -> bool:
        """Whether two constant expressions (or scales) have the same value."""
        if isinstance(a, float) or isinstance(b, float):
            return a == b if isinstance(a, float) and isinstance(b, float) else False
        if a is b:
            return True
        key = (id(a), id(b))
        if key not in self._same:
            x, y = value_of(a), value_of(b)
            if x.shape != y.shape or hasattr(x, "toarray") != hasattr(y, "toarray"):
                self._same[key] = False
            elif hasattr(x, "toarray"):
                self._same[key] = (x != y).nnz == 0
            else:
                self._same[key] = bool(np.array_equal(x, y))
            if self._same[key]:
                self.equal.append((a, b))
        return self._same[key]

    def gram(self, node, factors, n):
        """(A, s, scalar factors, (t, pairs)) of `L @ Y` read as a Gram term, else None."""
        L, Y = node.args
        if not isinstance(L, Transpose) or L.ndim != 2 or not is_constant(L) or Y.shape != (L.shape[1],):
            return None
        form = self.linear(Y, L.args[0])
        if form is None or form[0] != "vector":
            return None
        A, scale = form[3]
        scalars = [f for f in factors if f.shape == ()]
        vectors = [f for f in factors if f.shape != ()]
        if isinstance(scale, float) or scale.shape == ():
            if vectors:
                return None
            if not isinstance(scale, float):
                scalars.append(scale)
        elif len(vectors) != 1 or vectors[0].shape != (n,) or not is_constant(vectors[0]) or \
                not self.same(vectors[0], scale):
            return None
        return A, scale, scalars, form[1:3]

    def linear(self, node, A):
        """Y linear in one u = A @ (s ∘ v) (A None: u = v itself): ("vector", t, pairs, (A, s))
        for Y = t ∘ u + Σ a (bᵀu) (t None: no diagonal) with Y of u's shape, ("scalar", b,
        None, (A, s)) for Y = bᵀu of shape (); else None."""
        form = self._linear(node, A)
        if form is None:
            return None
        u = (self.direction if A is None else A).shape[:1]
        return form if node.shape == (u if form[0] == "vector" else ()) else None

    def _linear(self, node, A):
        if node is self.direction:
            return ("vector", Constant(1.0), [], (None, 1.0)) if A is None else None
        product = data_product(node, self.direction)
        if product is not None:
            found = A is not None and product[0].ndim == 2 and self.same(product[0], A)
            return ("vector", Constant(1.0), [], product) if found else None
        if isinstance(node, Leaf) or not self.uses(node):
            return None
        if isinstance(node, Neg):
            node, free = node.args[0], Constant(-1.0)
        elif isinstance(node, Multiply):
            a, b = node.args
            if self.uses(a) == self.uses(b):
                return None
            node, free = (a, b) if self.uses(a) else (b, a)
        elif isinstance(node, Add):
            return self._sum(node, A)
        elif isinstance(node, (SumTo, BroadcastTo, Sum)):
            return self._reshaped(node, A)
        else:
            return None
        form = self.linear(node, A)
        if form is None:
            return None
        kind, t, pairs, product = form
        if kind == "scalar":
            return ("scalar", multiply(free, t), None, product) if free.shape == () else \
                ("vector", None, [(free, t)], product)
        return ("vector", None if t is None else multiply(free, t),
                [(multiply(free, a), b) for a, b in pairs], product)

    def _sum(self, node, A):
        forms = [self.linear(a, A) for a in node.args]
        if any(f is None for f in forms) or any(not self.same(f[3][1], forms[0][3][1]) for f in forms):
            return None
        if node.shape == ():
            if any(f[0] != "scalar" for f in forms):
                return None
            return ("scalar", _add([f[1] for f in forms]), None, forms[0][3])
        diagonal = [f[1] for f in forms if f[0] == "vector" and f[1] is not None]
        pairs = [p for f in forms if f[0] == "vector" for p in f[2]]
        pairs += [(Constant(1.0), f[1]) for f in forms if f[0] == "scalar"]
        return ("vector", _add(diagonal) if diagonal else None, pairs, forms[0][3])

    def _reshaped(self, node, A):
        form = self.linear(node.args[0], A)
        if form is None:
            return None
        kind, t, pairs, product = form
        if isinstance(node, BroadcastTo) and kind == "scalar" and len(node.shape) == 1:
            return ("vector", None, [(Constant(1.0), t)], product)
        summed = node.shape == () and kind == "vector" and \
            (isinstance(node, SumTo) or (type(node) is Sum and node.axis is None))
        if not summed:
            return None
        m = node.args[0].shape[0]
        parts = ([] if t is None else [t]) + [multiply(total(a) if a.shape else multiply(a, float(m)), b)
                                              for a, b in pairs]
        return ("scalar", _add(parts), None, product)


def _add(parts: list):
    return parts[0] if len(parts) == 1 else add(*parts)


def without(node, removed: set[int], memo: dict):
    """`node` without the Gram terms `removed` (by id; None when nothing is left): they sit on
    its linear path (sums, products with direction-free factors, negations), `NoForm` else."""
    if id(node) not in memo:
        if id(node) in removed:
            memo[id(node)] = None
        elif isinstance(node, Leaf):
            memo[id(node)] = node
        else:
            new = [without(a, removed, memo) for a in node.args]
            if all(a is b for a, b in zip(new, node.args)):
                memo[id(node)] = node
            elif isinstance(node, Add):
                kept = [a for a in new if a is not None]
                memo[id(node)] = broadcast_to(_add(kept), node.shape) if kept else None
            elif isinstance(node, (Multiply, Neg)):     # (its other factor is direction-free)
                memo[id(node)] = None if any(a is None for a in new) else node.with_args(*new)
            else:
                raise NoForm(node.display)
    return memo[id(node)]
