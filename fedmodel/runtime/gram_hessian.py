"""Dense Hessians of losses of data products as Gram products: ∇²P_i = R + Σ_k Aₖᵀ Mₖ Aₖ with
Mₖ = diag(tₖ) + Σ_j a_j b_jᵀ, formed by BLAS syrk on √|tₖ| ∘ Aₖ over Aₖ's nonzero columns (or
the product its data allows, chosen when the data is bound: `gram_products`), never by the
Hessian-vector plan on the unit directions.

Today's path, the batched Hessian-vector plan ∇(∇P_i·v) on the identity, costs a loss of X w
X @ E (a GEMM although X @ I = X) and Xᵀ (s ⊙ ·): ~4 m N² flops against syrk's m N² (MNIST:
54–61 against 15 ms a Hessian).

The structure is read once per program from the Hessian-vector product's expression
(`CompiledMerit._hvp_expressions`, one vector variable, nothing private):
- along the linear path from its root (sums, products with factors free of the direction v,
  negations), a product `L @ Y` with L = Aᵀ for a constant matrix A (data, or a slice of it) and
  Y linear in u = A @ (s ∘ v) alone (`data_product`: s the compiler's column scales, or none)
  is a Gram term: Y = diag(t) u + Σ_j a_j (b_jᵀ u) (elementwise products with v-free factors,
  sums, negations, broadcasts and full sums: a logistic loss, least squares, an AL term of a
  constraint on the data, whose squared gradient is the rank-one a bᵀ); the factors above it
  must be scalars and, for a vector s, s itself once (the term is then symmetric:
  (A S)ᵀ M (A S));
- t, a_j, b_j times those factors are one plan's outputs, evaluated at the point (one pass);
- the rest of the product (the Gram terms taken out: proximal terms, cross terms, terms the rules
  do not read) is read the same way with u = v itself (diag(t) + Σ a bᵀ: a proximal weight, a
  ball's AL term), else keeps today's path: the batched plan on unit directions;
- every Hessian is checked against today's Hessian-vector product ∇(∇P_i·v) on a random
  direction v (`check_direction`), computed from the product's own expression as the same
  plan's last output (its forward pass, e.g. X w and the loss's derivatives, shared with the
  weights: NP adult's check 0.15 → ~0.05 ms, so d = 14 takes the form: 0.48 → 0.40 ms a
  Hessian); a mismatch drops the form for good. Every Hessian, not the first of a program: a
  term zero at one point (an inactive constraint's AL term, a dropped pair) passes a check
  there (cProx-AL on house prices, tests/test_gram_hessian.py).
A product without data read so (a server's ridge and proximal terms) is formed the same way
from N ≈ 320 on. Anything else (private or matrix variables, no Gram term, too little data:
`MIN_FLOPS`) keeps today's path. Results are bitwise symmetric and today's to round-off (MNIST:
1e-16 relative). The analysis is kept across the solves of a kept program, its rows are not
(`release`).
"""
from __future__ import annotations

import functools

import numpy as np

from ..atoms.arithmetic import Add, Multiply, Neg, add, multiply
from ..atoms.broadcasting import BroadcastTo, SumTo, broadcast_to
from ..atoms.linear import MatMul, Transpose
from ..atoms.sums import Sum, sum as total
from ..compiler.codegen import Plan
from ..compiler.directions import Unbatchable
from ..errors import FedModelError
from ..expression import Constant, Leaf
from . import solvers
from .data_products import check_direction, data_product, is_constant, value_of
from .gram_products import GramRows, add_term, symmetric

# the form is taken when its Gram work Σ m_k N² is at least this many flops: it is never slower
# per Hessian (1,000 × 14 rows: 0.10 against 0.64 ms; 20 × 10: equal), but its analysis, plans
# and first check cost ~1–2 ms a program, which a model of 1,000 tiny clients would pay for nothing
MIN_FLOPS = 100_000
# and this many unknowns (64 while the check was a pass of its own: it cost what d = 14 saved;
# sharing the pass, the form is faster from d = 2, m = 5·10⁴ (3.5 against 5.1 ms) to d = 63)
MIN_COLUMNS = 1
SYRK_MIN_COLUMNS = 64  # below: one GEMM (`gram_products`); tests lower it
GUARD_TOL = 1e-8      # relative mismatch on the random direction above which the form is refused
_UNSET = object()


class _Term:
    """One data matrix's share: its rows R = A diag(s) (`rows`, a `GramRows`: the product its
    data allows; None between solves, `release`) of the expressions (A, s) (`source`; None: the
    direction itself, the rest's diagonal), its weight outputs (summed: several terms on the
    same data take one product) and rank-one pairs (a, b) as output indices."""

    __slots__ = ("source", "rows", "weights", "pairs")

    def __init__(self, source):
        self.source = source
        self.rows = None if source is None else _rows(*source)
        self.weights: list[int] = []
        self.pairs: list[tuple[int, int]] = []

    def gram_rows(self) -> "GramRows | None":
        """`rows`, made again from `source` after a `release`."""
        if self.rows is None and self.source is not None:
            self.rows = _rows(*self.source)
        return self.rows


class Structure:
    """A program's Gram form: the plan of the weights and pairs, the terms, the rest's plan over
    unit directions (None: none) with its blocks."""

    __slots__ = ("plan", "terms", "rest", "blocks", "direction")

    def __init__(self, plan: Plan, terms: list[_Term], rest: "Plan | None", blocks: list, direction):
        self.plan, self.terms, self.rest, self.blocks = plan, terms, rest, blocks
        self.direction = direction


def structure(compiled) -> "Structure | None":
    """The Gram form of a `CompiledMerit` (analysed once, kept on it), or None."""
    found = compiled.__dict__.get("_gram", _UNSET)
    if found is _UNSET:
        try:
            found = _analyse(compiled)
        except (FedModelError, Unbatchable, _NoForm):
            found = None
        compiled._gram = found
    return found


def decline(compiled) -> None:
    """No Gram form for this `CompiledMerit`: a merit of a few Hessians (a client's phase one,
    `own_constraints`: 1–5) would pay the analysis (~1.2 ms at NP adult) for ~0.1 ms each."""
    compiled._gram = None


def release(compiled) -> None:
    """Let go of the rows (A diag(s): a copy of the client's data) of a program's Gram form
    between solves, keeping its analysis (~1.2 ms a client at NP adult): a kept program
    (`solve_cache`) is reused only for the same data; its next Hessian makes them again."""
    found = compiled.__dict__.get("_gram")
    if found is not None:
        for term in found.terms:
            term.rows = None


class _NoForm(Exception):
    """The product does not have the form (`_without` met a Gram term off the linear path)."""


def _analyse(compiled) -> "Structure | None":
    variables = compiled.variables
    if len(variables) != 1 or variables[0].ndim != 1 or compiled.private.size or variables[0].size < MIN_COLUMNS:
        return None
    products, directions = compiled._hvp_expressions
    root, direction, n = products[0], directions[0], variables[0].size
    reader = _Reader(direction)
    grams: list[tuple] = []          # (Gram node, A, s, the scalar factors, (t, pairs))
    reader.walk(root, [], grams, n)
    if (sum(g[1].shape[0] for g in grams) + 1) * n * n < MIN_FLOPS:
        return None
    outputs: list = []
    terms: dict[tuple, _Term] = {}
    for _, A, scale, factors, (t, pairs) in grams:
        A = reader.canonical(A)
        key = (id(A), id(scale) if not isinstance(scale, float) and scale.shape else None)
        if key not in terms:
            terms[key] = _Term((A, None if key[1] is None else scale))
        _add_form(outputs, terms[key], functools.reduce(multiply, factors, Constant(1.0)), t, pairs)
    rest = _without(root, {id(g[0]) for g in grams}, {})
    form = reader.linear(rest, None) if rest is not None else None
    if form is not None and form[0] == "vector" and rest.shape == (n,):
        terms[None] = _Term(None)                   # the rest: diag(t) + Σ a bᵀ, no product
        _add_form(outputs, terms[None], Constant(1.0), form[1], form[2])
        rest = None
    if not grams and rest is not None:
        return None                                 # (no data, and not diagonal plus pairs)
    rest_plan = Plan([rest], variables + directions, batched=directions) if rest is not None else None
    blocks = compiled.unit_blocks(rest_plan.batched_size) if rest_plan is not None else []
    # the check's product (`_matches`) is the plan's last output: one pass over the data with
    # the weights (X w and the loss's derivatives once), the direction its Parameter
    return Structure(Plan(outputs + [root], variables), list(terms.values()), rest_plan, blocks,
                     direction)


def _add_form(outputs: list, term: _Term, c, t, pairs) -> None:
    """The plan outputs of c·t (a weight) and of the pairs (c·a, b) of a term."""
    if t is not None:
        outputs.append(multiply(c, t))
        term.weights.append(len(outputs) - 1)
    for a, b in pairs:
        outputs.extend([multiply(c, a), b])
        term.pairs.append((len(outputs) - 2, len(outputs) - 1))


def _rows(node, scale_node) -> GramRows:
    """A diag(s) of the constant expressions A, s (s None: A), sparse kept sparse (CSR), as its
    Gram products take it."""
    A, scale = value_of(node), None if scale_node is None else value_of(scale_node)
    R = A if scale is None else A.multiply(scale).tocsr() if hasattr(A, "toarray") else A * scale
    return GramRows(R, SYRK_MIN_COLUMNS)


class _Reader:
    """Reads the Hessian-vector product's expression for `_analyse` (memoized per node)."""

    def __init__(self, direction):
        self.direction = direction
        self._uses: dict[int, bool] = {}
        self._same: dict[tuple[int, int], bool] = {}
        self._canonical: list = []

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


def _without(node, removed: set[int], memo: dict):
    """`node` without the Gram terms `removed` (by id; None when nothing is left): they sit on
    its linear path (sums, products with direction-free factors, negations), `_NoForm` else."""
    if id(node) not in memo:
        if id(node) in removed:
            memo[id(node)] = None
        elif isinstance(node, Leaf):
            memo[id(node)] = node
        else:
            new = [_without(a, removed, memo) for a in node.args]
            if all(a is b for a, b in zip(new, node.args)):
                memo[id(node)] = node
            elif isinstance(node, Add):
                kept = [a for a in new if a is not None]
                memo[id(node)] = broadcast_to(_add(kept), node.shape) if kept else None
            elif isinstance(node, (Multiply, Neg)):     # (its other factor is direction-free)
                memo[id(node)] = None if any(a is None for a in new) else node.with_args(*new)
            else:
                raise _NoForm(node.display)
    return memo[id(node)]


def hessian(compiled, z: np.ndarray, values: list) -> "np.ndarray | None":
    """∇²P_i(z) by Gram products (module docstring), or None when the program has no Gram form
    (or a Hessian failed the check: from then on today's path)."""
    found = structure(compiled)
    if found is None:
        return None
    n = z.size
    # the symmetric parts go into one upper triangle U (Fortran order: BLAS syrk, syr2), read as
    # its C-ordered transpose, the lower triangle L: H = L + Lᵀ less L's diagonal, bitwise
    # symmetric in one pass over the transpose; parts formed as full matrices (the rest's plan,
    # sparse and narrow products: M) are symmetrized as today's (0.5 (M + Mᵀ))
    M = compiled.dense_hessian(found.rest, values, found.blocks) if found.rest is not None else None
    upper = np.zeros((n, n), order="F")
    found.direction.value = check_direction(n)
    outputs = found.plan(*values)
    for k, term in enumerate(found.terms):
        M = _add_term(term, outputs, upper, M, n, fresh=k == 0)
    H = symmetric(upper)
    if M is not None:
        H += 0.5 * (M + M.T)
    if not _matches(outputs[-1], H, check_direction(n)):     # (every Hessian: module docstring)
        compiled._gram = None
        return None
    return H


def _add_term(term: _Term, outputs: list, upper: np.ndarray, M, n: int, fresh: bool):
    """One term's products into `upper` or M (`gram_products.add_term`), M returned."""
    pairs = [(outputs[i], outputs[j]) for i, j in term.pairs]
    return add_term(term.gram_rows(), [outputs[i] for i in term.weights], pairs, upper, M, n, fresh)


def _matches(hv: np.ndarray, H: np.ndarray, v: np.ndarray) -> bool:
    """The check (module docstring): H v = ∇²P_i(z) v by today's Hessian-vector product."""
    Hv = H @ v
    scale = solvers.norm_inf(hv) + solvers.norm_inf(Hv)
    return bool(solvers.norm_inf(hv - Hv) <= GUARD_TOL * scale)
