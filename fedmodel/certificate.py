"""KKT certificate of a point (paper 1, Definition 1), for any backend's result.

stationarity = dist∞(0, ∇f(x) + ∂h(x) + Σ_j ∇c_j(x) μ_j) over all variables, with the
subdifferential of prox-able terms (`t·norm1(x)`; an entry within KINK of 0 read as 0) and
the normal cone of the simple constraints on each shared variable (norm balls, bounds) as one
intersection (`compiler.intersections.merge_sets`: exact; λ‖x‖₁ and ℓ1 balls are applied in turn, an
upper bound); other nonsmooth terms contribute their (sub)gradient at x. Affine constraints are
scored through their multipliers, also where FedADMM and DP-ADMM project on them (they report
the projections' multipliers, `compiler.sets.affine_multipliers`).
Terms and constraints are classified by the compiler's canonical pass (`compiler.canonical`),
as in the node programs; a constraint the compiler splits (`abs(a) <= t` → `±a <= t`) is
scored by its pieces when the multipliers are the pieces' (federated backends), else as
written (CVXPY's multipliers). feasibility = max_j of [c_j]₊ and the complementarity
min(μ_j, |c_j|) for inequalities, |c_j| for equalities. This equals dist∞(c_j, N(μ_j)) of
Definition 1 when μ_j = 0 or μ_j ≥ |c_j|, and does not jump when a solver returns a tiny
positive multiplier (1e-9) for an inactive constraint, which Definition 1 would score as |c_j|.

Those two are absolute, so they depend on the data's units (×10⁻⁶ makes every point look
stationary). The relative measures beside them (`fm.verify` decides on these) are each divided
by their own scale, computed from the model at the point, so multiplying the data by any power
of ten leaves them unchanged for models homogeneous in the data:

- the Lagrangian's pieces P_k are the objective's canonical terms and each multiplier-weighted
  constraint Σ μ_j c_j; each has a size |P_k(x)| ∨ |P_k(x) − P_k(0)| (its value, or its change
  from the origin when the value is near 0, e.g. a least-squares loss at a perfect fit);
- relative stationarity: per variable v, the remainder over the size of the gradients that
  must cancel, G_v = Σ_k ‖∇_v P_k(x)‖∞ + λ_v (norm1 weights), and at least their size at the
  origin Σ_k ‖∇_v P_k(0)‖∞ (they all vanish at a perfect fit, where the remainder is rounding;
  for a quadratic the ratio is then about the relative distance ‖H(x − x*)‖ / ‖H x*‖) — or,
  where smaller, the curvature at x along x, Σ_k ‖∇_v(∇P_k(x)·x)‖∞, the same for a quadratic;
  the larger of that ratio and the same one in column-scaled units (x = D u, D the compiler's
  per-column equilibration of `X @ x`), so that columns in other units are seen one by one;
- relative feasibility: per constraint, its violation over the size of its terms at x (the
  largest entry of Σ_t |t(x)| over the canonical terms t of `lhs − rhs`), a term c·v linear in
  a variable counting at least |c| times v's length (below), so that a bound met at 0 has a size;
- relative complementarity: Σ_j Σ_e μ_je |c_je(x)| (the Lagrangian's departure from f) over
  the Lagrangian's size Σ_k size(P_k);
- `objective_scale` (the objective's pieces' sizes) and `lengths` (per variable, the
  Lagrangian's size over G_v: how far x must move to change it by its own size) are the
  scales `fm.verify` measures the objective gap and a distance to a zero optimum against.

Where the model gives no such scale at the point (`_natural_lengths`): a variable's length is
also G_v over the curvature (−log(1 + w) + w at w* = 0 has L = 0), or, where both are rounding,
the length its constraints' constants give it (w ≥ −1: 1; a homogeneous ‖Xw‖² has none of its
own); where x_v is rounding around 0 on that length, the gradients' change over it is G_v's
floor and the objective's scale is at least ½ Σ_v ℓ_v times it. A variable no objective term
reads (a split constraint's slack) has the constraints it carries for its length, and the
Lagrangian's size over it (×KINK) for its G_v: its μ − μ_i at a nearly inactive constraint
(μ ≈ 1e-11) is rounding.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from .atoms import Abs, Norm1, Norm2, NormInf, Square, SumSquares, multiply, sum as sum_
from .compiler.canonical import canonical_constraints, classify_objective, flatten, split_names
from .compiler.terms import summed_size
from .compiler.codegen import Plan
from .compiler.intersections import merge_sets
from .compiler.scaling import column_scales
from .compiler.differentiate import grad
from .constraints import Constraint, Equality
from .newton_distance import held_entries, relative_distance, summed_gradients
from .expression import Constant, Expression, Variable
from .result import Certificate

# entries within KINK·max(1, ‖x‖∞) of a kink of λ‖x‖₁ are scored as at the kink: a solver
# stopped at tolerance 1e-6 leaves 1e-7 where the answer has 0, and sign(1e-7) would charge
# the full weight λ (DALD on examples/ring_lasso.py: 17.5 at a point 1.7e-7 from CVXPY's).
# Reading such an entry as 0 gives the smaller residual, i.e. that of a point within KINK.
# The relative stationarity reads entries within KINK·‖x‖∞ as 0 (no unit length 1).
KINK = 1e-6
# a point within NEAR (relative) inside a set is also scored with the normal cone of the set's
# point NEAR farther out (the ε-KKT reading of a point ε from the boundary), an order below
# verify's 1e-3 and at the backends' dist_tol
NEAR = 1e-4


def kkt_certificate(variables: list[Variable], objective_terms: list[Expression],
                    constraints: list[Constraint], values: dict[int, np.ndarray],
                    multipliers: dict[str, np.ndarray]) -> Certificate:
    """The certificate at `values` (by variable uid) with `multipliers` (by constraint name) of
    the model `Σ objective_terms` subject to `constraints` over `variables` (a Problem's
    `variables()`, `objective_terms` and `constraints`; `Problem.kkt_certificate` passes them)."""
    inputs = [np.asarray(values[v.uid], dtype=float) for v in variables]
    # the objective's canonical classification, the same as the compiled programs'
    classified = classify_objective(objective_terms)
    pieces = [t for t in classified.smooth if t.variables()]   # P_k with a gradient
    constants = [t for t in classified.smooth if not t.variables()]
    n_objective = len(pieces)
    sets = []
    feasibility = 0.0
    canonicals = []
    for constraint in constraints:
        canonical = canonical_constraints([constraint], project=True)
        sets.extend(canonical.sets)
        parts = canonical.smooth
        if len(parts) > 1 and not any(n in multipliers for n in split_names(constraint)):
            parts = [constraint]   # multipliers of the user's form (e.g. from CVXPY)
        canonicals.append(parts)
    # one plan at x: each constraint as written, the rewritten pieces, the constraints'
    # canonical terms (their sizes scale the violations), the objective's constant terms
    rewritten = [part.expr for parts, c in zip(canonicals, constraints) for part in parts
                 if part is not c]
    terms = [[summed_size(t.expression()) for t in flatten(c.expr)] for c in constraints]
    outputs = [c.expr for c in constraints] + rewritten + [t for ts in terms for t in ts] + constants
    evaluated = iter(Plan(outputs, variables)(*inputs) if outputs else [])
    residuals = [next(evaluated) for _ in constraints]
    rewritten_values = [next(evaluated) for _ in rewritten]
    term_values = [[next(evaluated) for _ in ts] for ts in terms]
    constant_value = sum(float(np.sum(next(evaluated))) for _ in constants)
    violations = []   # (constraint, its violation, the size of its terms at x), judged below
    carried = {}      # per variable uid: the largest size of the constraints it appears in
    for constraint, c_value, values_of_terms in zip(constraints, residuals, term_values):
        violation = constraint.violation(c_value)
        feasibility = max(feasibility, violation)
        size = np.zeros(np.shape(c_value))
        for value in values_of_terms:
            size = size + np.abs(np.asarray(value, dtype=float))
        violations.append((constraint, violation, float(np.max(size, initial=0.0))))
        for var in constraint.expr.variables():
            carried[var.uid] = max(carried.get(var.uid, 0.0), violations[-1][2])
    bounds = _bound_lengths(constraints, term_values)
    rewritten_values = iter(rewritten_values)
    complementarity = []   # (piece name, Σ μ·|c|) of each inequality piece
    for constraint, c_value, parts in zip(constraints, residuals, canonicals):
        for part in parts:
            value = np.asarray(c_value if part is constraint else next(rewritten_values), dtype=float)
            mu = np.broadcast_to(np.asarray(multipliers.get(part.name, 0.0), dtype=float),
                                 part.shape).copy()
            if isinstance(part, Equality):
                dist = np.abs(value)
            else:
                dist = np.minimum(np.maximum(mu, 0.0), np.abs(value))   # complementarity
                complementarity.append((part.name, float(np.sum(np.maximum(mu, 0.0) * np.abs(value)))))
            feasibility = max(feasibility, float(np.max(dist, initial=0.0)))
            if np.any(mu != 0):
                pieces.append(sum_(multiply(Constant(mu), part.expr)))
    prox_terms = list(classified.prox) + merge_sets(sets)   # one normal cone per variable: exact
    slot = {v.uid: i for i, v in enumerate(variables)}
    members = [[slot[u.uid] for u in piece.variables() if u.uid in slot] for piece in pieces]
    # every piece and its gradient in each of its variables, at x and at the origin
    gradients = [grad(piece, variables[i]) for piece, idx in zip(pieces, members) for i in idx]
    plan = Plan(pieces + gradients, variables)
    at_x = plan(*inputs) if pieces else []
    weights = column_scales(SimpleNamespace(objective_terms=objective_terms, constraints=constraints),
                             variables, excluded=set())   # D per entry (the model as a problem)
    at_zero = _at_origin(plan, variables) if pieces else []
    bends = _bends(plan, inputs, len(pieces), [weights.get(variables[i].uid) for idx in members
                                                for i in idx]) if pieces else []
    sums = [np.zeros(v.shape) for v in variables]          # ∇ of the Lagrangian's smooth part
    scales = np.zeros(len(variables))                       # G_v
    floors = np.zeros(len(variables))                       # G_v's floor: the gradients at 0
    local = np.zeros(len(variables))                        # ... unless x's own curvature is less
    # G_v, its floor and the curvature again in the column-scaled coordinates w = D v (the
    # compiler's equilibration of `X @ w`): columns in units 1e-4 … 1e5 left a stuck entry in
    # small units invisible beside the large units' gradients (a box-constrained least squares
    # "converged" at 2.2 f*, relative stationarity 4e-6)
    scaled = {i: np.zeros(3) for i, v in enumerate(variables) if v.uid in weights}
    undefined = np.zeros(len(variables), dtype=bool)        # a gradient undefined at 0
    sizes = []
    outputs_x, outputs_zero, bent = iter(at_x[len(pieces):]), iter(at_zero[len(pieces):]), iter(bends)
    for k, idx in enumerate(members):
        value, zero = float(np.sum(at_x[k])), float(np.sum(at_zero[k]))
        sizes.append(max(abs(value), abs(value - zero) if np.isfinite(zero) else 0.0))
        for i in idx:
            g = np.broadcast_to(np.asarray(next(outputs_x), dtype=float), variables[i].shape)
            sums[i] = sums[i] + g
            scales[i] += float(np.max(np.abs(g), initial=0.0))
            g0 = np.abs(np.asarray(next(outputs_zero), dtype=float))
            if np.all(np.isfinite(g0)):
                floors[i] += float(np.max(g0, initial=0.0))
            else:     # −log(w) at 0: no floor, but a scale of its own (`_natural_lengths`)
                undefined[i] = True
            bend, bend_scaled = next(bent)
            local[i] += bend
            if i in scaled:
                d = weights[variables[i].uid]
                scaled[i] += [np.max(np.abs(d * g), initial=0.0), np.max(d * g0, initial=0.0),
                              bend_scaled]
    objective_scale = sum(sizes[:n_objective]) + abs(constant_value)
    in_objective = {i for idx in members[:n_objective] for i in idx}
    for term in classified.prox:    # λ‖w‖₁: its subgradients are up to λ in size
        i = slot[term.variable.uid]
        in_objective.add(i)
        scales[i] += term.weight()
        objective_scale += float(term.value(inputs[i]))
    lagrangian_scale = objective_scale + sum(sizes[n_objective:])
    scale = np.maximum(scales, floors)
    with np.errstate(all="ignore"):    # a point off the domain: nan scales, judged elsewhere
        # a constant term has no length: 1e9 + ‖Ax − b‖² read ‖x‖ ~ 1e9 / ‖Aᵀb‖
        point = np.divide(lagrangian_scale - abs(constant_value), scale,
                          out=np.zeros(len(variables)), where=scale > 0)
    for i, var in enumerate(variables):
        # a variable no objective term reads (a split constraint's slack) has only μ·∇c to
        # cancel: at a nearly inactive constraint (μ ≈ 1e-11) their rounding read 2e-3 of their
        # own size. Its length is its own size or that of the constraints it carries, and its
        # multipliers within KINK of the size L / length they would have are read as 0
        own = max(float(np.max(np.abs(inputs[i]), initial=0.0)), carried.get(var.uid, 0.0))
        if i not in in_objective and own > 0:
            scales[i] = max(scales[i], KINK * lagrangian_scale / own)
            point[i] = own
    natural, at_length = _natural_lengths(plan, inputs, members, len(pieces), point, scales,
                                          np.where(undefined, np.inf, floors),
                                          [bounds.get(v.uid, 0.0) for v in variables])
    objective_scale = max(objective_scale, 0.5 * float(np.sum(natural * at_length)))
    stationarity, relative_stationarity, worst_variable = 0.0, 0.0, None
    lengths, remainders, held = {}, [], []
    for i, var in enumerate(variables):
        remainder, relative = sums[i], sums[i]
        x = inputs[i]
        lengths[var.uid] = float(natural[i])
        # within KINK of the point's size — or of the variable's natural length, when the whole
        # point is rounding around an optimum at 0 (a lasso's w = 0 returned as 1e-13 entries
        # read 0.68 "not stationary", CVXPY's answer included)
        tiny = KINK * max(float(np.max(np.abs(x), initial=0.0)), lengths[var.uid])
        near_zero = np.where(np.abs(x) <= tiny, 0.0, x)
        for term in prox_terms:
            if term.variable is var:
                remainder = term.residual(x, remainder, KINK)
                # a set's normal cone at x itself too (the smaller residual): bounds ±5e-6 (a
                # column in units 1e5) are "tiny" beside entries of 5e3, and zeroed they read
                # inactive — the exact optimum 0.36 "not stationary", CVXPY's included
                # and at x pushed NEAR outward onto a set it is within NEAR of: a backend stops up
                # to its dist_tol (1e-4) from the answer, and DALD's point 2.1e-5 inside an active
                # ball (within 2e-5 of CVXPY's) read its whole gradient, 0.78 "not stationary"
                found = [term.residual(z, relative, 0.0) for z in
                         ((near_zero, x, term.prox(x * (1.0 + NEAR), 1.0)) if term.constraint is not None
                          else (near_zero,))]
                relative = min(found, key=lambda r: float(np.max(np.abs(r), initial=0.0)))
        remainders.append(relative)
        held.append(held_entries(x, near_zero, tiny, [t for t in prox_terms if t.variable is var]))
        stationarity = max(stationarity, float(np.max(np.abs(remainder), initial=0.0)))
        # the floor stands for gradients that vanish at a perfect fit; where the loss saturates
        # (separable data in large units) the gradients at 0 exceed those near x by orders of
        # magnitude, and a point 50 % from the optimum read as stationary to 1e-5: the floor is
        # then the curvature at x along x, |∇²P(x)·x| (= |∇P(0)| for a quadratic at a perfect fit)
        # (where x is rounding around 0, no gradient at x has a size: the gradients' change over
        # the variable's natural length, `_natural_lengths`, is their floor)
        ratio = _ratio(float(np.max(np.abs(relative), initial=0.0)),
                       max(scales[i], min(floors[i], local[i]), at_length[i]))
        if i in scaled:     # and in column-scaled units (the gradients there are D·∇)
            d, (g_d, floor_d, local_d) = weights[var.uid], scaled[i]
            ratio = max(ratio, _ratio(float(np.max(np.abs(d * relative), initial=0.0)),
                                      max(g_d, min(floor_d, local_d), at_length[i] * np.max(d))))
        if ratio > relative_stationarity:
            relative_stationarity, worst_variable = ratio, var.label
    # the distance the remainder allows through the curvature (`newton_distance`): where it is
    # cheap and exact — no constraints but bounds on variables, the only nonsmooth terms ℓ1
    # norms (the bounds met and the ℓ1 zeros held)
    if not any(canonicals) and all(t.kind == "norm1" or t.box is not None for t in prox_terms) \
            and pieces and not classified.unsupported:
        far = relative_distance(summed_gradients(plan, len(pieces), members, variables), inputs,
                                remainders, held, [weights.get(v.uid) for v in variables], list(natural))
        if far > relative_stationarity:
            relative_stationarity = far
            worst_variable = worst_variable or variables[0].label
    relative_feasibility, worst_constraint = 0.0, None
    for constraint, violation, size in violations:
        # a term c·v linear in a variable counts at least |c| times v's natural length: a bound
        # s >= 0 met at s = 0 has terms of size 0, and 1e-12 would read as a 100 % violation
        for term in flatten(constraint.expr):
            if isinstance(term.atom, Variable) and isinstance(term.coefficient, float):
                size = max(size, abs(term.coefficient) * lengths.get(term.atom.uid, 0.0))
        relative = _ratio(violation, size)
        if relative > relative_feasibility:
            relative_feasibility, worst_constraint = relative, constraint.name
    total = sum(value for _, value in complementarity)
    relative_complementarity = _ratio(total, lagrangian_scale)
    worst = {"stationarity": worst_variable, "feasibility": worst_constraint,
             "complementarity": max(complementarity, key=lambda p: p[1])[0] if total > 0 else None}
    return Certificate(stationarity=stationarity, feasibility=feasibility,
                       relative_stationarity=relative_stationarity,
                       relative_feasibility=relative_feasibility,
                       relative_complementarity=relative_complementarity,
                       objective_scale=objective_scale, lengths=lengths, worst=worst)


def _ratio(value: float, scale: float) -> float:
    """value / scale, with 0/0 = 0 (nothing to measure), x/0 = inf (no scale to excuse x) and
    inf/inf = inf (a point off the objective's domain: nothing excuses it)."""
    if value == 0:
        return 0.0
    if not scale > 0 or np.isinf(scale):
        return float("inf")
    return value / scale


BEND = 1e-4    # the relative step of the central difference along x


def _along(plan: Plan, inputs: list[np.ndarray], steps: list[np.ndarray], skip: int,
           weights: list | None = None) -> list[float]:
    """‖g(x + s) − g(x − s)‖∞ / 2 of each output g after the first `skip` (the gradients): a
    central difference along the steps `s`, exact for quadratics; inf where it is undefined.
    With `weights` (one per output: an array or None), also ‖weight · (…)‖∞ / 2: pairs."""
    count, pairs = len(plan.outputs) - skip, weights is not None
    weights = weights if pairs else [None] * count
    with np.errstate(all="ignore"):
        try:
            up = plan(*[x + step for x, step in zip(inputs, steps)])[skip:]
            down = plan(*[x - step for x, step in zip(inputs, steps)])[skip:]
        except (ArithmeticError, ValueError):
            return [(np.inf, np.inf) if pairs else np.inf] * count
        differences = [np.abs(np.asarray(a, dtype=float) - np.asarray(b, dtype=float)) / 2
                       for a, b in zip(up, down)]
        changes = [(np.max(x, initial=0.0), np.max(x * (1.0 if d is None else d), initial=0.0))
                   for x, d in zip(differences, weights)]
    finite = [tuple(float(c) if np.isfinite(c) else float("inf") for c in pair) for pair in changes]
    return finite if pairs else [pair[0] for pair in finite]


def _bends(plan: Plan, inputs: list[np.ndarray], skip: int, weights: list) -> list[tuple]:
    """|∇²P_k(x)·x|∞ for each gradient output after the first `skip` (the pieces), along the
    ray through x, and the same weighted by its variable's column scales (or not, for None);
    inf where it is undefined, so that the gradients at 0 stay the floor."""
    return [(a / BEND, b / BEND) for a, b in _along(plan, inputs, [BEND * x for x in inputs], skip,
                                                    weights)]


def _natural_lengths(plan: Plan, inputs: list[np.ndarray], members: list[list[int]], skip: int,
                     point: np.ndarray, gradients: np.ndarray, at_origin: np.ndarray,
                     bounds: list[float]):
    """Per variable, its natural length ℓ_v and, where the gradients vanish at the origin and
    x_v is rounding around 0 (within KINK·ℓ_v), their change over that length (else 0).

    ℓ_v is the larger of L / G_v (`point`) and G_v / |∇²L| (how far the gradients at x go before
    they change by their own size: −log(1 + w) + w at w* = 0 has L = 0 but ℓ = 2). A Lagrangian
    whose gradients in v vanish at the origin (`at_origin`, the floors) may have no length of its
    own — a homogeneous ‖Xw‖² at w* = 0, f* = 0, where every measure read 1e-12 against 1e-12 —
    and where both are rounding next to the length the constraints' constants set
    (`_bound_lengths`: w ≥ −1 gives 1), that one is ℓ_v. Only there: where the gradients at 0
    have a size, the model has a length of its own, and a loose bound (a big-M w ≤ 1e6) must
    not make a wrong point near 0 look like rounding."""
    sizes = np.array([float(np.max(np.abs(x), initial=0.0)) for x in inputs])
    bounds = np.asarray(bounds, dtype=float)
    probe = np.maximum(sizes, point)   # the step's length, per variable: the bound's where it decides
    probe = np.where((at_origin == 0) & (probe < KINK * bounds), bounds, probe)
    natural, at_length = point.copy(), np.zeros(len(inputs))
    curvature = np.zeros(len(inputs))   # Σ_k |∇²P_k·(probe ξ)|∞, ξ a fixed ±1 direction
    if skip:
        signs = np.random.default_rng(0)
        steps = [BEND * p * np.where(signs.random(np.shape(x)) < 0.5, -1.0, 1.0)
                 for p, x in zip(probe, inputs)]
        changes = iter(_along(plan, inputs, steps, skip))
        for idx in members:
            for i in idx:
                curvature[i] += next(changes) / BEND
    for i in range(len(inputs)):
        bent = probe[i] > 0 and 0 < curvature[i] < float("inf")
        if bent:
            natural[i] = max(natural[i], gradients[i] * probe[i] / curvature[i])
        if at_origin[i] > 0:
            continue
        if natural[i] < KINK * bounds[i]:
            natural[i] = bounds[i]
        if bent and sizes[i] <= KINK * natural[i]:
            at_length[i] = curvature[i] * natural[i] / probe[i]
    return natural, at_length


def _bound_lengths(constraints: list[Constraint], term_values: list[list]) -> dict[int, float]:
    """Per variable uid, the length its constraints' constants give it: |b / c| for a constraint
    c·v + b (also c·‖v‖ in any norm, c·|v|), √|b / c| for c·‖v‖₂² + b, b its constant terms."""
    lengths: dict[int, float] = {}
    for constraint, values in zip(constraints, term_values):
        terms = flatten(constraint.expr)
        constant = sum(float(np.max(np.abs(np.asarray(v, dtype=float)), initial=0.0))
                       for t, v in zip(terms, values) if not t.atom.variables())
        for term in terms if constant > 0 else ():
            atom, power = term.atom, 1.0
            if isinstance(atom, (Abs, Norm1, Norm2, NormInf)):
                atom = atom.args[0]
            elif isinstance(atom, (Square, SumSquares)):
                atom, power = atom.args[0], 2.0
            if isinstance(atom, Variable) and isinstance(term.coefficient, float) and term.coefficient:
                length = (constant / abs(term.coefficient)) ** (1 / power)
                lengths[atom.uid] = max(lengths.get(atom.uid, 0.0), length)
    return lengths


def _at_origin(plan: Plan, variables: list[Variable]) -> list[np.ndarray]:
    """Every output of `plan` with every variable at 0 (nan where undefined, e.g. log(0))."""
    zeros = [np.zeros(v.shape) for v in variables]
    try:
        with np.errstate(all="ignore"):
            return list(plan(*zeros))
    except (ArithmeticError, ValueError):
        return [np.full(out.shape, np.nan) for out in plan.outputs]
