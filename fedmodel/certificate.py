"""KKT certificate of a point (paper 1, Definition 1), for any backend's result.

stationarity = dist∞(0, ∇f(x) + ∂h(x) + Σ_j ∇c_j(x) μ_j) over all variables, with the
subdifferential of prox-able terms (`t·norm1(x)`; an entry within KINK of 0 read as 0) and
the normal cone of the simple constraints on each shared variable (norm balls, bounds) as one
intersection (`compiler.sets.merge_sets`: exact; λ‖x‖₁ and ℓ1 balls are applied in turn, an
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
"""
from __future__ import annotations

import numpy as np

from .atoms import add, multiply, sum as sum_
from .compiler.canonical import canonical_constraints, classify_objective, split_names
from .compiler.sets import merge_sets
from .compiler.codegen import Plan
from .compiler.differentiate import grad
from .constraints import Constraint, Equality
from .expression import Constant, Expression, Variable
from .result import Certificate

# entries within KINK·max(1, ‖x‖∞) of a kink of λ‖x‖₁ are scored as at the kink: a solver
# stopped at tolerance 1e-6 leaves 1e-7 where the answer has 0, and sign(1e-7) would charge
# the full weight λ (DALD on examples/ring_lasso.py: 17.5 at a point 1.7e-7 from CVXPY's).
# Reading such an entry as 0 gives the smaller residual, i.e. that of a point within KINK.
KINK = 1e-6


def kkt_certificate(variables: list[Variable], objective_terms: list[Expression],
                    constraints: list[Constraint], values: dict[int, np.ndarray],
                    multipliers: dict[str, np.ndarray]) -> Certificate:
    """The certificate at `values` (by variable uid) with `multipliers` (by constraint name) of
    the model `Σ objective_terms` subject to `constraints` over `variables` (a Problem's
    `variables()`, `objective_terms` and `constraints`; `Problem.kkt_certificate` passes them)."""
    inputs = [values[v.uid] for v in variables]
    # the objective's canonical classification, the same as the compiled programs'
    classified = classify_objective(objective_terms)
    lagrangian_terms, sets = list(classified.smooth), []
    feasibility = 0.0
    residual_plan = Plan([c.expr for c in constraints], variables)
    residuals = residual_plan(*inputs) if constraints else []
    scored = []   # (constraint or rewritten piece, its value; None: evaluated below)
    for constraint, c_value in zip(constraints, residuals):
        feasibility = max(feasibility, constraint.violation(c_value))
        canonical = canonical_constraints([constraint], project=True)
        sets.extend(canonical.sets)
        pieces = canonical.smooth
        if len(pieces) > 1 and not any(n in multipliers for n in split_names(constraint)):
            pieces = [constraint]   # multipliers of the user's form (e.g. from CVXPY)
        scored.extend((piece, c_value if piece is constraint else None) for piece in pieces)
    rewritten = [piece.expr for piece, value in scored if value is None]   # one plan for all
    evaluated = iter(Plan(rewritten, variables)(*inputs) if rewritten else [])
    for piece, value in scored:
        value = np.asarray(next(evaluated) if value is None else value, dtype=float)
        mu = np.broadcast_to(np.asarray(multipliers.get(piece.name, 0.0), dtype=float),
                             piece.shape).copy()
        if isinstance(piece, Equality):
            dist = np.abs(value)
        else:
            dist = np.minimum(np.maximum(mu, 0.0), np.abs(value))   # complementarity
        feasibility = max(feasibility, float(np.max(dist, initial=0.0)))
        if np.any(mu != 0):
            lagrangian_terms.append(sum_(multiply(Constant(mu), piece.expr)))
    prox_terms = list(classified.prox) + merge_sets(sets)   # one normal cone per variable: exact
    lagrangian = add(*lagrangian_terms) if lagrangian_terms else Constant(0.0)
    gradients = Plan([grad(lagrangian, v) for v in variables], variables)(*inputs)
    stationarity = 0.0
    for var, g in zip(variables, gradients):
        g = np.broadcast_to(np.asarray(g, dtype=float), var.shape)
        remainder = g
        for term in prox_terms:
            if term.variable is var:
                remainder = term.residual(values[var.uid], remainder, KINK)
        stationarity = max(stationarity, float(np.max(np.abs(remainder), initial=0.0)))
    return Certificate(stationarity=stationarity, feasibility=feasibility)
