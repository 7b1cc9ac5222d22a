"""Compiler pass: the gradient of an objective record by record.

A node's objective is often a sum (or mean) of per-record losses over the rows of its data
matrices. For objectives whose records enter only through products `A @ w` (A a data matrix, w
a shared variable) combined row by row — elementwise atoms, row-wise sums or log_sum_exp, then
sums or means over the rows — the gradient of record i's term is a_i ⊗ u_i, with S = A @ w and
u = ∂f/∂S. `RecordGradients` rewrites each product as a new variable S, checks that the result
is separable by rows, and compiles two plans: S from w, and u from (w, S). Differential privacy
uses the L1 norms of these terms as the sensitivity of the gradient to one record, and clips
them (each term scaled to an L1 norm ≤ a bound) for a sensitivity that holds for every record.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from ..atoms import (Add, ArgmaxAbs, BroadcastTo, GreaterEqual, Index, IndexAdjoint, LogSumExp,
                     MatMul, Maximum, Mean, Multiply, Neg, Norm1, Norm2, NormInf, QuadForm, Reshape,
                     Softmax, Sum, SumSquares, SumTo, Transpose)
from ..atoms.elementwise import Elementwise
from ..errors import FedModelError
from ..atoms.arithmetic import multiply
from ..expression import Constant, Data, Expression, Leaf, Variable
from .codegen import Plan
from .differentiate import grad as derive
from ..lowering.rules import RuleTable

# how a subexpression depends on the records (see `_separable`)
_ROWS, _TOTAL, _FREE, _CONST = "rows", "total", "free", "const"


class _Product(NamedTuple):
    """One product `A @ w` of the objective and the variable S that stands for it."""
    product: MatMul      # A @ w, as written in the objective
    data: Data           # A: one record per row
    rows: Variable       # S, of the product's shape


class NotRecordSeparable(FedModelError):
    """The objective does not read its records in a form whose per-record gradients are known."""


class RecordGradients:
    """‖∇f(z; D) − ∇f(z; D without record i)‖₁ for every record i of `objective`, whose records
    are rows of data matrices entering through products `A @ w` (w among `shared`) and combined
    row by row (elementwise atoms, row-wise sums / log_sum_exp, then sums or means over the
    rows). Each product becomes S = A @ w; with u = ∂f/∂S the record's term is a_i ⊗ u_i and its
    L1 norm ‖a_i‖₁‖u_i‖₁. Records of several matrices with the same row count are treated as the
    same records (their norms add: an upper bound). `where` names the node in errors."""

    def __init__(self, objective: Expression, shared: list[Variable], where: str):
        ids = {v.uid for v in shared}
        products: dict[tuple[int, int], _Product] = {}
        memo: dict[int, Any] = {}

        def substitute(node):
            if id(node) not in memo:
                a = getattr(node, "args", ())
                if (isinstance(node, MatMul) and isinstance(a[0], Data) and a[0].ndim == 2
                        and isinstance(a[1], Variable) and a[1].uid in ids):
                    key = (a[0].uid, a[1].uid)
                    if key not in products:
                        products[key] = _Product(node, a[0], Variable(node.shape,
                                                                      name=f"rows[{a[0].name}]"))
                    memo[id(node)] = products[key].rows
                elif isinstance(node, Leaf):
                    memo[id(node)] = node
                else:
                    new = [substitute(x) for x in a]
                    memo[id(node)] = node if all(x is y for x, y in zip(new, a)) else node.with_args(*new)
            return memo[id(node)]

        reduced = substitute(objective)
        records = {p.rows.uid: p.rows.shape[0] for p in products.values()}
        kinds: dict[int, str | None] = {}
        kind = _separable(reduced, records, kinds)
        direct = [v.name for v in shared
                  if any(isinstance(leaf, Data) for leaf in derive(reduced, v).leaves())]
        if kind not in (_TOTAL, _FREE, _CONST) or direct:
            raise NotRecordSeparable(
                f"per-record gradients of {where!r} need an objective that reads its records only "
                "as rows of `data @ w` products combined row by row (elementwise atoms, row-wise "
                "sums or log_sum_exp, then sum/mean over rows)"
                + (f"; data also enters the gradient of {direct} directly" if direct else ""))
        self.products = list(products.values())
        self._shared = [v.uid for v in shared]
        self._forward = Plan([p.product for p in self.products], shared) if products else None
        self._adjoint = Plan([derive(reduced, p.rows) for p in self.products],
                             shared + [p.rows for p in self.products]) if products else None
        self._row_l1 = [np.sum(np.abs(p.data.value), axis=1) for p in self.products]
        self._objective, self._reduced, self._kinds, self._where = objective, reduced, kinds, where
        self._shared_vars = list(shared)
        self._values: tuple | None = None     # `record_values`' plan and terms, compiled on first use
        self._row_l2: list | None = None      # `record_l2`'s row norms, computed on first use

    def _terms(self, parts: list[np.ndarray]) -> tuple[list[np.ndarray], dict[int, np.ndarray]]:
        """The adjoints u = ∂f/∂S (one per product, of S's shape) and, per record count m, the
        L1 norm of each of the m records' terms (summed over the products with m rows)."""
        rows = self._forward(*parts)
        adjoints = [np.broadcast_to(u, p.rows.shape)
                    for p, u in zip(self.products, self._adjoint(*parts, *rows))]
        totals: dict[int, np.ndarray] = {}
        for product, row_l1, u in zip(self.products, self._row_l1, adjoints):
            S = product.rows
            per_row = row_l1 * (np.abs(u).reshape(S.shape[0], -1).sum(axis=1))
            totals[S.shape[0]] = totals.get(S.shape[0], 0.0) + per_row
        return adjoints, totals

    def max_l1(self, parts: list[np.ndarray]) -> float:
        """max_i ‖record i's gradient term‖₁ at the point `parts` (shared variables' values)."""
        if not self.products:
            return 0.0
        _, totals = self._terms(parts)
        return float(max(np.max(t) for t in totals.values()))

    def clipping_correction(self, parts: list[np.ndarray], bound: float) -> list[np.ndarray] | None:
        """Σ_i (s_i − 1)·(record i's term), s_i = min(1, bound/‖term_i‖₁), per shared variable
        (values of their shapes): added to ∇f it clips every record's term to L1 norm ≤ bound,
        leaving the record-free part of ∇f as it is. None when no term exceeds `bound` (∇f is
        then already clipped, bit for bit)."""
        if not self.products:
            return None
        adjoints, totals = self._terms(parts)
        if not any(np.any(t > bound) for t in totals.values()):
            return None
        with np.errstate(divide="ignore"):
            shrink = {m: np.where(t > bound, bound / t, 1.0) - 1.0 for m, t in totals.items()}
        correction = [np.zeros(np.shape(x)) for x in parts]
        for product, u in zip(self.products, adjoints):
            S = product.rows
            factor = shrink[S.shape[0]].reshape((S.shape[0],) + (1,) * (u.ndim - 1))
            k = self._shared.index(product.product.args[1].uid)
            # Σ_i a_i ⊗ (s_i − 1)·u_i over this product's records
            correction[k] = correction[k] + product.data.value.T @ (factor * u)
        return correction


    def record_l2(self, parts: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """(an upper bound of ‖record i's gradient term‖₂ for every record i, the adjoints u):
        ‖a_i ⊗ u_i‖₂ = ‖a_i‖₂‖u_i‖₂ per product, summed over the products (triangle
        inequality). Needs every product to read records of one row count (NotRecordSeparable)."""
        counts = {p.rows.shape[0] for p in self.products}
        if len(counts) > 1:
            raise NotRecordSeparable(f"{self._where!r} reads records of several row counts {sorted(counts)}; "
                                     "a sampled release needs one set of records")
        rows = self._forward(*parts)
        adjoints = [np.broadcast_to(u, p.rows.shape)
                    for p, u in zip(self.products, self._adjoint(*parts, *rows))]
        if self._row_l2 is None:        # ‖a_i‖₂ of every product's rows, once
            self._row_l2 = [np.sqrt(np.asarray(p.data.value.multiply(p.data.value).sum(axis=1) if
                                               hasattr(p.data.value, "multiply") else
                                               np.einsum("ij,ij->i", p.data.value, p.data.value), float).ravel())
                            for p in self.products]
        norms = 0.0
        for product, row_l2, u in zip(self.products, self._row_l2, adjoints):
            norms = norms + row_l2 * np.linalg.norm(np.asarray(u).reshape(product.rows.shape[0], -1), axis=1)
        return np.asarray(norms, float), adjoints

    def weighted_terms(self, parts: list[np.ndarray], weights: np.ndarray,
                       adjoints: list[np.ndarray]) -> list[np.ndarray]:
        """Σ_i weights_i·(record i's gradient term) per shared variable (values of their shapes),
        from the adjoints `record_l2` returned at the same point."""
        total = [np.zeros(np.shape(x)) for x in parts]
        for product, u in zip(self.products, adjoints):
            factor = weights.reshape((product.rows.shape[0],) + (1,) * (np.ndim(u) - 1))
            k = self._shared.index(product.product.args[1].uid)
            total[k] = total[k] + np.reshape(product.data.value.T @ (factor * u), np.shape(parts[k]))
        return total

    def record_values(self, parts: list[np.ndarray]) -> np.ndarray:
        """Record i's term of the objective's value at `parts`, for every record i (a vector
        whose sum is the objective less its record-free part). Needs a scalar objective whose
        records are those of one row count; raises `NotRecordSeparable` otherwise."""
        return self._value_and_terms(parts)[1]

    def clipped_value(self, parts: list[np.ndarray], bound: float) -> float:
        """The objective's value with every record's term clipped to [−bound, bound]: replacing
        one record then moves it by at most 2·bound, whatever the records (the record-free part
        is kept as it is)."""
        value, terms = self._value_and_terms(parts)
        return value - float(np.sum(terms)) + float(np.sum(np.clip(terms, -bound, bound)))

    def _value_and_terms(self, parts: list[np.ndarray]) -> tuple[float, np.ndarray]:
        """The objective's value and its records' terms, from one evaluation of the value plan."""
        plan, ops = self._value_terms()
        outputs = plan(*parts, *(self._forward(*parts) if self.products else []))
        terms: Any = np.zeros(0)
        for k, op in enumerate(ops):            # outputs: (scale_k, X_k) pairs, then the value
            rows = op(np.asarray(outputs[2 * k + 1], float))
            term = float(outputs[2 * k]) * rows.reshape(rows.shape[0], -1).sum(axis=1)
            terms = term if k == 0 else terms + term
        return float(outputs[-1]), terms

    def _value_terms(self) -> tuple[Plan, list]:
        """A plan of (scale_k, X_k) pairs and the objective, with record i's term of the value
        Σ_k scale_k · Σ_j op_k(X_k)[i, j] (X_k a row-wise node: its row i reads record i only)."""
        if self._values is None:
            if len({p.rows.shape[0] for p in self.products}) > 1 or self._objective.size != 1:
                raise NotRecordSeparable(
                    f"per-record values of {self._where!r} need a scalar function of records of one "
                    "row count")
            terms = _value_terms(self._reduced, self._kinds, Constant(1.0), self._where)
            outputs = [x for scale, node, _ in terms for x in (scale, node)] + [self._reduced]
            inputs = self._shared_vars + [p.rows for p in self.products]
            self._values = (Plan(outputs, inputs), [op for _, _, op in terms])
        return self._values


def _value_terms(node: Expression, kinds: dict, scale: Expression, where: str) -> list:
    """(scale, X, op) triples of a record-separable ("total") node summed to a scalar: its record
    i's term is Σ_k scale_k · Σ_j op_k(X_k)[i, j]. Linear maps of totals pass their factor down;
    sums over rows with axis 0 are vectors that a sum or mean over all entries reduces above.
    Each atom's part is the `terms` of its record rule (RECORD_RULES)."""
    kind = kinds[id(node)]
    if kind in (_FREE, _CONST):
        return []
    rule = RECORD_RULES.find(node) if kind == _TOTAL else None
    if rule is not None and rule.terms is not None:
        found = rule.terms(node, [kinds[id(a)] for a in node.args], scale,
                           lambda x, factor: _value_terms(x, kinds, factor, where))
        if found is not None:
            return found
    raise NotRecordSeparable(f"per-record values of {where!r}: cannot split {node} by records")


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def record_count(objective: Expression) -> int:
    """The number of records of `objective`: the most rows of a data leaf it reads (1 if none)."""
    sizes = [leaf.shape[0] for leaf in objective.leaves() if isinstance(leaf, Data) and leaf.ndim >= 1]
    return max(sizes, default=1)


def _separable(node: Expression, records: dict[int, int],
               memo: dict[int, str | None]) -> str | None:
    """Kind of a node after the substitution: const (no variable), free (shared variables, no
    record), rows (row i depends on record i only), total (a sum of per-record terms), or None."""
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, Leaf):
        out = _ROWS if node.uid in records else _FREE if isinstance(node, Variable) else _CONST
    else:
        kinds = [_separable(a, records, memo) for a in node.args]
        out = _combine(node, kinds)
    memo[id(node)] = out
    return out


def _combine(node: Expression, kinds: list[str | None]) -> str | None:
    """The kind of `node` from its arguments' kinds (None: not separable by records)."""
    if None in kinds:
        return None
    if all(k == _CONST for k in kinds):
        return _CONST
    if _ROWS not in kinds and _TOTAL not in kinds:
        return _FREE
    # an atom without a rule is taken as not separable (right for any atom: the pass then
    # refuses the objective); tests/test_atom_rules.py is what makes every atom state its rule
    rule = RECORD_RULES.find(node)
    return rule.kind(node, kinds) if rule else None


# a `RecordRule` per atom class (below)
RECORD_RULES = RuleTable(lambda node: FedModelError(
    f"per-record gradients have no rule for the atom {type(node).__name__} ({node.display})"),
    name="per-record")


class RecordRule(NamedTuple):
    """An atom's per-record rule: `kind(node, kinds)` its kind from its arguments' kinds;
    `terms(node, kinds, scale, split)` the (scale, X, op) triples of a node that is a sum over
    records (`_value_terms`; `split(arg, factor)` recurses), None where it has none."""
    kind: Callable[[Expression, list[str]], str | None]
    terms: Callable[..., list | None] | None = None


def _record_rule(total, rows, terms=None) -> RecordRule:
    """The rule of an atom from its two cases: `total(node, kinds)` when an argument is a sum
    over records (only linear maps of one stay separable), else `rows(node, kinds, m)` when
    arguments are rows of m records and none reads the model outside `A @ w`."""
    def kind(node: Expression, kinds: list[str]) -> str | None:
        if _TOTAL in kinds:
            return total(node, kinds)
        if _FREE in kinds:               # a record mixed with the model outside `A @ w`
            return None
        m = {a.shape[0] for a, k in zip(node.args, kinds) if k == _ROWS}
        return rows(node, kinds, m.pop()) if len(m) == 1 else None
    return RecordRule(kind, terms)


def _linear_total(node: Expression, kinds: list[str]) -> str | None:
    return _TOTAL if set(kinds) <= {_TOTAL, _CONST} else None


def _product_total(node: Expression, kinds: list[str]) -> str | None:
    """A product is linear in its one non-constant factor."""
    return _linear_total(node, kinds) if kinds.count(_CONST) == len(kinds) - 1 else None


def _none(node: Expression, kinds: list[str], m: int | None = None) -> None:
    return None


def _row_wise(node: Expression, kinds: list[str], m: int) -> str | None:
    """Row i of the result reads row i of the arguments only (entry-wise maps, broadcasts)."""
    return _ROWS if node.shape[:1] == (m,) else None


# -- the value terms of sums over records: a linear map of totals passes its factor down --
def _add_terms(node, kinds, scale, split):
    return [t for a in node.args for t in split(a, scale)] if _TOTAL in kinds else None


def _neg_terms(node, kinds, scale, split):
    return split(node.args[0], multiply(-1.0, scale)) if _TOTAL in kinds else None


def _same_terms(node, kinds, scale, split):
    """A reshape (or a broadcast of one entry) of a total: its terms."""
    if _TOTAL in kinds and (isinstance(node, Reshape) or node.size == 1):
        return split(node.args[0], scale)
    return None


def _scaled_terms(node, kinds, scale, split):
    """A total times a scalar factor."""
    if _TOTAL in kinds and all(a.size == 1 for a in node.args):
        factor, total = node.args if kinds[1] == _TOTAL else node.args[::-1]
        return split(total, multiply(factor, scale))
    return None


def _sum_terms(node, kinds, scale, split):
    """A sum (mean) of a total over all entries passes it down (1/count); a sum over the rows
    (all entries, or axis 0 summed further up) is itself the records' terms."""
    mean = isinstance(node, Mean)
    if _TOTAL in kinds:
        if node.axis is None:
            return split(node.args[0], multiply(1.0 / node.count, scale) if mean else scale)
        return None
    if kinds[0] == _ROWS and node.axis in (None, 0):
        return [(multiply(1.0 / node.count, scale) if mean else scale, node.args[0], _identity)]
    return None


def _entry_terms(op):
    """A sum of `op` over the rows' entries (sum of squares, 1-norm)."""
    def terms(node, kinds, scale, split):
        return [(scale, node.args[0], op)] if kinds[0] == _ROWS else None
    return terms


RECORD_RULES.register(Add)(_record_rule(
    lambda node, kinds: _TOTAL if _ROWS not in kinds else None, _row_wise, _add_terms))
RECORD_RULES.register(Neg)(_record_rule(_linear_total, _row_wise, _neg_terms))
RECORD_RULES.register(BroadcastTo, Reshape)(_record_rule(_linear_total, _row_wise, _same_terms))
RECORD_RULES.register(Multiply)(_record_rule(_product_total, _row_wise, _scaled_terms))
RECORD_RULES.register(Elementwise, Maximum)(_record_rule(_none, _row_wise))
RECORD_RULES.register(Sum, Mean)(_record_rule(          # a sum over the rows is a total
    _linear_total, lambda node, kinds, m: _TOTAL if node.axis in (None, 0) else _ROWS, _sum_terms))
RECORD_RULES.register(SumSquares)(_record_rule(_none, lambda node, kinds, m: _TOTAL,
                                               _entry_terms(np.square)))
RECORD_RULES.register(Norm1)(_record_rule(_none, lambda node, kinds, m: _TOTAL, _entry_terms(np.abs)))
RECORD_RULES.register(LogSumExp)(_record_rule(    # row-wise only along the rows' own axes
    _none, lambda node, kinds, m: _ROWS if node.axis not in (None, 0) else None))
RECORD_RULES.register(MatMul)(_record_rule(       # the rows times a constant matrix
    _product_total,
    lambda node, kinds, m: _ROWS if kinds == [_ROWS, _CONST] and node.args[0].ndim == 2 else None))
# Not separable by records: a transpose or an index mixes rows; the norms 2 and ∞, quad_form
# and softmax are not sums of per-row terms; the rest occur only in derived gradients.
RECORD_RULES.register(Transpose, Index, IndexAdjoint, SumTo, GreaterEqual, Norm2, NormInf,
                      ArgmaxAbs, QuadForm, Softmax)(RecordRule(lambda node, kinds: None))
