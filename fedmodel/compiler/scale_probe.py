"""Compiler pass helper of the equilibration (`scaling`): the probes that size each variable and
the objective from the model at the origin, as a few scalars per probed block (at most
PROBE_BLOCKS clients, evenly spaced, extrapolated to all).

- smooth terms (`probe`): per variable, the size of the gradient and the curvature along it
  (the Newton step's length, and the curvature that σ makes one);
- shifted norm terms λ‖c·w + b‖ (`norm_probe`), prox terms with no gradient or curvature to
  probe: their anchors a = −b/c (a geometric median's points, in the data's units) give the
  variable's size, their weights λ the objective's slope. A variable no smooth term sizes takes
  δ = the anchors' root-mean-square size per entry and σ = 1/(Σλ δ) (`objective_scale`): in v
  the anchors are the same at any units and the norms' slope, all of them together, is one. Before, such a variable
  kept δ = σ = 1, and a geometric median with its anchors ×10^±6 met tolerances and penalties
  sized for units: DALD and FedADMM ran to their caps (docs/BENCHMARKS.md, branch geomed).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..atoms import Add, Index, MatMul, Multiply, Neg, add, multiply, sum as sum_
from ..atoms.indexing import numpy_key
from ..expression import Expression, Leaf, Parameter, Variable, postorder
from .canonical import classify_objective
from .codegen import Plan
from .differentiate import grad
from .norm_terms import shifted_norm
from .terms import flatten

PROBE_BLOCKS = 32      # clients probed for the objective's scale (evenly spaced; scalars out)
LIMIT = 1e250          # no factor beyond: data that far off are refused before (`check_scaling`)


def factor(x: float) -> float:
    """`x` > 0 clipped to [1/LIMIT, LIMIT]; 1 for anything that is not a positive finite
    number (not rounded: see `scaling`'s docstring)."""
    if not (np.isfinite(x) and x > 0):
        return 1.0
    return float(min(max(x, 1.0 / LIMIT), LIMIT))


def probed_blocks(problem) -> list[tuple]:
    """(block, weight): the server and up to PROBE_BLOCKS clients, each standing for
    len(clients) / len(probed clients) of them."""
    clients = problem.clients
    step = max(1, len(clients) // PROBE_BLOCKS)
    probed = clients[::step][:PROBE_BLOCKS]
    return [(problem.server, 1.0)] + [(c, len(clients) / len(probed)) for c in probed]


# ---- smooth terms ------------------------------------------------------------------------------
def probe(problem, variables: list[Variable], columns: dict[int, np.ndarray]):
    """(length ℓ_v, curvature L_v) of each variable from each probed block's smooth objective at
    the origin, in the column-scaled coordinates v = w / D: ℓ_v = Σ‖g_i‖³ / Σ g_iᵀH_i g_i (the
    Newton step along the gradient), L_v = Σ g_iᵀH_i g_i / ‖g_i‖² (extrapolated to every
    client when only PROBE_BLOCKS of them are probed). A variable with a gradient but no
    curvature along it (a Huber loss whose residuals at the origin all lie beyond M) takes
    ℓ_v = Σ|f_i(0)| / Σ‖g_i‖, the step at which f's linear model reaches zero, and L_v the
    curvature that makes σ·f(0) one (`linear_fallback`). Before, it kept δ = σ = 1: raw Boston
    housing under a Huber loss converged at ×1 and ran to every cap at ×1e-3 (newuser9)."""
    cubes: dict[int, float] = {}
    bends: dict[int, float] = {}
    curvature: dict[int, float] = {}
    flat: dict[int, list] = {}       # uid → [Σ|f_i(0)|, Σ‖g_i‖] over blocks with no curvature
    for block, weight in probed_blocks(problem):
        classified = classify_objective(block.terms)
        smooth = [t for t in classified.smooth if not any(t is u for u in classified.unsupported)]
        f = add(*smooth) if smooth else None
        if f is None or f.is_constant():
            continue
        try:
            found = block_probe(f, columns)
        except ArithmeticError:   # undefined at the origin (1/x, log x): no estimate from here
            continue
        for uid, (norm, bend) in found.items():
            cubes[uid] = cubes.get(uid, 0.0) + weight * norm ** 3
            bends[uid] = bends.get(uid, 0.0) + weight * abs(bend)
            if norm > 0:
                curvature[uid] = curvature.get(uid, 0.0) + weight * abs(bend) / norm ** 2
            if norm > 0 and bend == 0 and not f.is_affine():   # (an affine f's |f(0)| is its constant's)
                totals = flat.setdefault(uid, [0.0, 0.0])
                totals[0] += weight * _at_origin(f)
                totals[1] += weight * norm
    lengths = {uid: cubes[uid] / bends[uid] for uid in cubes if bends.get(uid, 0.0) > 0
               and cubes[uid] > 0}
    linear_fallback(variables, flat, lengths, curvature)
    return lengths, curvature


def linear_fallback(variables: list[Variable], flat: dict[int, list], lengths: dict[int, float],
                    curvature: dict[int, float]) -> None:
    """ℓ_v = Σ|f_i(0)| / Σ‖g_i‖ and L_v = Σ|f_i(0)|·size / ℓ_v² (so that σ = 1/(L_v δ²) is
    1/Σ|f_i(0)|) for each variable of `flat` no block gave a curvature (`probe`)."""
    sizes = {v.uid: v.size for v in variables}
    for uid, (value, slope) in flat.items():
        if uid in lengths or curvature.get(uid, 0.0) > 0 or not (value > 0 and slope > 0) \
                or not np.isfinite(value):
            continue
        lengths[uid] = value / slope
        curvature[uid] = value * sizes.get(uid, 1) / lengths[uid] ** 2


def _at_origin(f: Expression) -> float:
    """|f(0)| (0 where undefined)."""
    try:
        with np.errstate(all="ignore"):
            value = abs(float(np.sum(value_at(f, {}))))
    except (ArithmeticError, ValueError, TypeError):
        return 0.0
    return value if np.isfinite(value) else 0.0


def block_probe(f: Expression, columns: dict[int, np.ndarray]) -> dict[int, tuple[float, float]]:
    """{uid: (‖D g‖, (D²g)ᵀ H (D²g))} of `f` at the origin, per variable (each variable probed
    alone: its own block of the Hessian)."""
    variables = f.variables()
    zeros = [np.zeros(v.shape) for v in variables]
    gradients = [grad(f, v) for v in variables]
    with np.errstate(all="ignore"):
        values = Plan(gradients, variables)(*zeros)
    out = {}
    for var, g_expr, g in zip(variables, gradients, values):
        d = columns.get(var.uid, 1.0)
        g = np.broadcast_to(np.asarray(g, float), var.shape)
        if not np.all(np.isfinite(g)):
            continue
        direction = d * d * g
        norm = float(np.linalg.norm(d * g))
        if norm == 0.0:
            continue
        dp = Parameter(var.shape, name="probe_direction", value=direction)
        with np.errstate(all="ignore"):
            hv = Plan([grad(sum_(multiply(g_expr, dp)), var)], variables)(*zeros)[0]
        bend = float(np.sum(direction * np.broadcast_to(np.asarray(hv, float), var.shape)))
        if np.isfinite(bend):
            out[var.uid] = (norm, bend)
    return out


def objective_scale(variables: list[Variable], deltas: dict[int, float],
                    curvature: dict[int, float], slopes: dict[int, float],
                    linear: float = 0.0) -> float:
    """σ = 1 / (L δ²): the curvature along the gradient one in the final coordinates, read on
    the largest shared variable with a measured curvature; with none, σ = 1 / (Σλ δ) on the
    largest with norm terms (`norm_probe`): their slope one per unit of v; with neither, 1 /
    `linear` (Σ c·Σω·D_t of the epigraph slacks: the losses' slope one per unit of v); else 1."""
    ranked = sorted(variables, key=lambda v: (v.owner is not None, -v.size))
    for var in ranked:
        if curvature.get(var.uid, 0.0) > 0:
            return factor(1.0 / (curvature[var.uid] * deltas[var.uid] ** 2))
    for var in ranked:
        if slopes.get(var.uid, 0.0) > 0:
            return factor(1.0 / (slopes[var.uid] * deltas[var.uid]))
    return factor(1.0 / linear) if linear > 0 else 1.0


# ---- shifted norm terms ---------------------------------------------------------------------------
def norm_probe(problem) -> tuple[dict[int, float], dict[int, float]]:
    """(size, slope) per variable of its shifted norm terms λ‖w − a‖ in the probed blocks:
    size = √(Σ‖a‖² / (count · entries)) (the anchors' root-mean-square entry; 0 for λ‖w‖),
    slope = Σλ (the whole objective's, as the curvature `probe` sums is the whole objective's).
    Each block reports ‖a‖², λ and a count per variable."""
    squares: dict[int, float] = {}
    weights: dict[int, float] = {}
    counts: dict[int, float] = {}
    entries: dict[int, int] = {}
    for block, weight in probed_blocks(problem):
        for term in (t for expr in block.terms for t in flatten(expr)):
            try:
                found = shifted_norm(term)
                if found is None:
                    continue
                var, norm = found
                anchor, lam = norm.shift(), norm.lam()
            except ValueError:     # a Parameter without a value or a negative weight: refused later
                continue
            uid = var.uid
            squares[uid] = squares.get(uid, 0.0) + weight * float(np.sum(np.square(anchor)))
            weights[uid] = weights.get(uid, 0.0) + weight * lam
            counts[uid] = counts.get(uid, 0.0) + weight
            entries[uid] = var.size
    sizes = {uid: float(np.sqrt(squares[uid] / (counts[uid] * entries[uid]))) for uid in counts}
    return sizes, weights


# ---- epigraph rows (`epigraph`: t ≥ a(w), a slack t per row) --------------------------------------
def epigraph_probe(problem, scales: dict[int, Any],
                    sized: set[int]) -> tuple[dict[int, float], dict[int, float]]:
    """(δ per variable, the slacks' objective slopes) from the epigraph rows a(w) − t ≤ 0 (the
    slacks marked `epigraph_slope`): for a variable read there that no smooth or norm term sizes
    (not in `sized`: the hinge's w, whose only smooth term, a ridge, has no gradient at the
    origin), the rows' size at the origin over their change along one unit of its columns
    `scales`: the v at which a(Dv) moves as much as it is, 1/(s·|X|) for 1 − y∘(s·X)w, |y|/|X|
    for s·y − s·X w. Root-mean-square over the rows, a typical row, not the outlier: on the SVM
    of tests/test_epigraph.py the largest row took ProxAL 1,015 round trips, the typical 618
    (δ = 1 as before: 592). Before, w and the slacks kept δ = 1 while the rows' r shrank as 1/s:
    at data ×10³ the hinge's t entered its rows ×2e-4, and ProxAL / cProx-AL stalled where at
    ×1 they converged (newuser5, issue 25)."""
    slacks = {v.uid: v.epigraph_slope for v in problem.variables()
              if getattr(v, "epigraph_slope", None)}
    if not slacks:
        return {}, {}
    size: dict[int, float] = {}
    change: dict[int, float] = {}
    with np.errstate(all="ignore"):
        for expr in (c.expr for c in problem.constraints):
            found = [v for v in expr.variables() if v.uid not in slacks and v.uid not in sized]
            if len(found) == len(expr.variables()) or not found:   # no slack, or nothing to size
                continue
            at_zero = np.asarray(value_at(expr, {}), float)
            for var in found:
                moved = np.asarray(value_at(expr, {var.uid: scales.get(var.uid, 1.0)}), float)
                size[var.uid] = max(size.get(var.uid, 0.0), _rms(at_zero))
                change[var.uid] = max(change.get(var.uid, 0.0), _rms(moved - at_zero))
    return {uid: factor(size[uid] / change[uid]) for uid in change
            if size[uid] > 0 and change[uid] > 0}, slacks


def slack_sizes(problem, scales: dict[int, Any], slacks: set[int]) -> dict[int, float]:
    """D_t of each slack of `slacks` (uids: the epigraph's, the split's) given the other
    variables' `scales`: the t at which its term is as large as its rows at the origin or over
    one unit of every scaled variable (largest over the rows: t bounds each), so a(Dv) − t is
    a(Dv) − D_t v_t with both of one size."""
    out: dict[int, float] = {}
    with np.errstate(all="ignore"):
        for c in problem.constraints:
            found = [v.uid for v in c.expr.variables() if v.uid in slacks]
            if len(found) != 1:
                continue
            at_zero = np.asarray(value_at(c.expr, {}), float)
            moved = np.asarray(value_at(c.expr, {u: d for u, d in scales.items() if u != found[0]}),
                               float)
            per_unit = _largest(np.asarray(value_at(c.expr, {found[0]: 1.0}), float) - at_zero)
            if per_unit > 0:      # the t at which its term is as large as the row
                size = max(_largest(at_zero), _largest(moved - at_zero)) / per_unit
                out[found[0]] = max(out.get(found[0], 0.0), size)
    return {uid: factor(d) for uid, d in out.items()}


def _rms(x: np.ndarray) -> float:
    value = float(np.sqrt(np.mean(np.square(x)))) if np.size(x) else 0.0
    return value if np.isfinite(value) else 0.0


def _largest(x: np.ndarray) -> float:
    value = float(np.max(np.abs(x), initial=0.0))
    return value if np.isfinite(value) else 0.0


def constant_matrix(node: Expression) -> Any:
    """The value of `node` when it is data, a constant or a Parameter with a value, or an
    expression of those alone (−X, 2·X, Xᵀ, y∘X, λ·X), else None. `-c.data(yX) @ w` parses as
    (−yX) @ w (unary minus binds before @): read only as a Constant, its w took no column scales,
    and a logistic loss on columns in units 10^±3 ran ProxAL, cProx-AL, DALD and FedADMM to
    their caps where `-(X @ w)` converged (docs/BENCHMARKS.md, branch logunits). A Parameter is
    read at its value now: the copy is built at each solve, and any positive D is an exact
    change of variables, so a value changed later costs conditioning, never the answer."""
    if isinstance(node, Leaf):
        value = node.value if not isinstance(node, Variable) else None
        return value if getattr(value, "ndim", 0) == 2 else None
    if node.variables() or any(p.value is None for p in node.parameters()):
        return None
    try:
        with np.errstate(all="ignore"):
            value = value_at(node, {})
    except (ArithmeticError, ValueError, TypeError):
        return None
    return value if getattr(value, "ndim", 0) == 2 else None


def data_reads(expr: Expression) -> list[tuple[Variable, np.ndarray, Any]]:
    """[(w, entries, X)]: each vector variable w that `expr` reads through a matrix X of data
    (`constant_matrix`), X's column j reading w[entries[j]] — X @ u or u @ Xᵀ with u linear in
    variables (`linear_reads`: w, −w, c·w, w[idx], w + a, M @ w, fm.hstack([w, v]), nested).
    A product read through an outer one (M @ w inside X @ (M @ w)) counts only as (X M) @ w.
    Before, only X @ w was read: `X @ (−w)`, `X @ w[idx]`, `w @ X.T`, `(λ·X) @ w` with λ a
    Parameter took no column scales, and least squares on columns in units 10^±3 ran every
    backend to its cap (newuser9)."""
    reads: dict[int, list] = {}
    through: set[int] = set()
    for node in postorder([expr]):
        if not isinstance(node, MatMul):
            continue
        a, b = node.args
        if a.ndim == 2 and b.ndim == 1:
            matrix, side, transposed = a, b, False
        elif a.ndim == 1 and b.ndim == 2:
            matrix, side, transposed = b, a, True
        else:
            continue
        if getattr(matrix, "embedding", False):    # fm.hstack's placement of u: not data
            continue
        if (value := constant_matrix(matrix)) is None:
            continue
        looked: set[int] = set()
        found = linear_reads(side, looked)
        if found:         # the products looked through count only here
            through |= looked
            x = value.T if transposed else value
            reads[id(node)] = [(w, entries, x if p is None else x @ p) for w, entries, p in found]
    return [r for key, found in reads.items() if key not in through for r in found]


def linear_reads(expr: Expression, through: set[int]) -> list[tuple] | None:
    """[(w, entries, P)] with `expr` = Σ P_k w_k[entries_k] + a constant (P None: the identity;
    signs and nonzero scalar factors dropped), else None; the products with a constant matrix
    it looks through are added to `through`."""
    if isinstance(expr, Variable):
        return [(expr, np.arange(expr.size), None)] if expr.ndim == 1 else None
    if isinstance(expr, Neg):
        return linear_reads(expr.args[0], through)
    if isinstance(expr, Index) and expr.args[0].ndim == 1 and expr.ndim == 1:     # (w[3]: a scalar, broadcast)
        inner = linear_reads(expr.args[0], through)
        key = numpy_key(expr.key)
        return None if inner is None else \
            [(w, e[key], None) if p is None else (w, e, p[key]) for w, e, p in inner]
    if isinstance(expr, Multiply):
        for k, x in (expr.args, expr.args[::-1]):
            if k.shape == () and k.is_constant() and all(p.value is not None for p in k.parameters()):
                scalar = float(value_at(k, {}))
                return linear_reads(x, through) if np.isfinite(scalar) and scalar != 0 else None
    if isinstance(expr, Add):
        parts = [linear_reads(a, through) for a in expr.args if not a.is_constant()]
        if any(a.shape != expr.shape for a in expr.args if not a.is_constant()):
            return None          # a part broadcast (w[:3] + w[3]): no entry-for-entry reading
        return None if not parts or any(p is None for p in parts) else [r for p in parts for r in p]
    if isinstance(expr, MatMul) and expr.args[0].ndim == 2 and expr.args[1].ndim == 1:
        inner = linear_reads(expr.args[1], through)
        m = constant_matrix(expr.args[0])
        if inner is None or m is None:
            return None
        through.add(id(expr))
        return [(w, e, m if p is None else m @ p) for w, e, p in inner]
    return None


def value_at(expr: Expression, values: dict[int, np.ndarray]) -> Any:
    """`expr` with each variable at `values[uid]` (zero when absent), interpreted node by node:
    one evaluation of a small expression, cheaper than compiling a plan for it."""
    memo: dict[int, Any] = {}
    for node in postorder([expr]):
        if isinstance(node, Variable):
            memo[id(node)] = np.broadcast_to(values.get(node.uid, 0.0), node.shape)
        elif isinstance(node, Leaf):
            memo[id(node)] = node.value
        else:
            memo[id(node)] = node.numeric(*[memo[id(a)] for a in node.args])
    return memo[id(expr)]
