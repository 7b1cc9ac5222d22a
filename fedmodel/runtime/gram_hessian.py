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

from ..atoms.arithmetic import multiply
from ..compiler import shared_structure
from ..compiler.codegen import Plan
from ..compiler.directions import Unbatchable
from ..errors import FedModelError
from ..expression import Constant
from . import solvers
from .data_products import check_direction, value_of
from .gram_products import GramRows, add_term, symmetric
from .gram_reader import NoForm, Reader, without

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

    __slots__ = ("plan", "terms", "rest", "blocks", "direction", "equal")

    def __init__(self, plan: Plan, terms: list[_Term], rest: "Plan | None", blocks: list, direction,
                 equal: list):
        self.plan, self.terms, self.rest, self.blocks = plan, terms, rest, blocks
        self.direction, self.equal = direction, equal    # (`Reader.equal`: for `_rebound`)


def structure(compiled) -> "Structure | None":
    """The Gram form of a `CompiledMerit` (analysed once, kept on it), or None."""
    found = compiled.__dict__.get("_gram", _UNSET)
    if found is _UNSET:
        try:
            found = _rebound(compiled)
            if found is _UNSET:
                found = _analyse(compiled)
        except (FedModelError, Unbatchable, NoForm):
            found = None
        compiled._gram = found
    return found


def _rebound(compiled):
    """The form of the first program of `compiled`'s structure (`compiler.shared_structure`)
    re-bound to its nodes, or _UNSET (analysed then). The reading reads the graph alone but
    for the nodes it found equal by value (`Reader.equal`), checked again on this program's;
    the check's output must be this program's own ∇(∇P_i·v), and every Hessian is checked as
    any (NP adult: ~0.2 against 1.2 ms an analysis, 4 of its 5 clients)."""
    share = compiled.__dict__.get("_share")
    template = share.family.template if share is not None else None
    if template is None or template is share or template.owner is None:
        return _UNSET
    found = template.owner.__dict__.get("_gram")
    if not isinstance(found, Structure):
        return _UNSET
    products, directions = compiled._hvp_expressions      # (first: its clones join the map)
    node_of = share.counterparts()
    own = functools.partial(shared_structure.clone_onto, node_of=node_of)
    try:
        if own(found.plan.outputs[-1]) is not products[0] or own(found.direction) is not directions[0]:
            return _UNSET
        reader = Reader(directions[0])
        if not all(reader.same(own(a), own(b)) for a, b in found.equal):
            return _UNSET
        terms = []
        for term in found.terms:
            terms.append(_Term(None if term.source is None else
                               (own(term.source[0]), None if term.source[1] is None else own(term.source[1]))))
            terms[-1].weights, terms[-1].pairs = term.weights, term.pairs
        rest = found.rest.rebound(own) if found.rest is not None else None
        plan = found.plan.rebound(own)
    except KeyError:
        return _UNSET
    blocks = compiled.unit_blocks(rest.batched_size) if rest is not None else []
    return Structure(plan, terms, rest, blocks, directions[0], [])     # (not a template)


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


def _analyse(compiled) -> "Structure | None":
    variables = compiled.variables
    if len(variables) != 1 or variables[0].ndim != 1 or compiled.private.size or variables[0].size < MIN_COLUMNS:
        return None
    products, directions = compiled._hvp_expressions
    root, direction, n = products[0], directions[0], variables[0].size
    reader = Reader(direction)
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
    rest = without(root, {id(g[0]) for g in grams}, {})
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
                     direction, reader.equal)


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
