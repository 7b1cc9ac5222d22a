"""Compiler pass: per-node merit functions of the proximal augmented Lagrangian.

For block i with objective f_i, inequality constraints c_I ≤ 0 and equalities c_E = 0 (paper 1,
eqs. 12–14; docs/architecture.md follows β from `prob.solve` into this merit):

    P_i(x, y) = f_i(x, y)
              + (1/(2β)) Σ_I (‖[μ_I + β c_I]₊‖² − ‖μ_I‖²)      (inequality AL term)
              + Σ_E (μ_Eᵀ c_E + (β/2) ‖c_E‖²)                  (equality AL term)
              + (ω/2) ‖x − x̄‖² + (ω_y/2) ‖y − ȳ‖²              (proximal terms)

x are the shared variables, y the block's private ones. β, μ, ω, ω_y and the centers x̄, ȳ are
Parameters: an outer iteration changes their values and never recompiles. Terms and
constraints are first put in canonical form (`canonical`): prox-able terms (λ‖w‖₁, λ‖w − a‖₂,
λ‖w − a‖₁ on a shared variable, on any node) are left out and returned separately for the prox step, and so are
simple constraints on a shared variable (norm balls, bounds) when `project=True`; nonsmooth
constraints with a smooth equivalent are rewritten.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..atoms import add, multiply, pos, power, sum as sum_, sum_squares
from ..constraints import Constraint, Equality
from ..expression import Expression, Parameter, Variable
from .canonical import (canonical_constraints, classify_objective, constraint_fix,
                        how_to_fix)
from .norm_terms import shifted_conflict
from .sets import ProxTerm


@dataclass
class Merit:
    expression: Expression                    # P_i
    objective: Expression                     # f_i (smooth part)
    prox_terms: list[ProxTerm]                # prox-able terms and projected constraints
    beta: Parameter
    multipliers: dict[str, Parameter]         # by constraint name
    prox_weight: Parameter                    # ω (shared variables)
    private_weight: Parameter                 # ω_y
    centers: dict[int, Parameter] = field(default_factory=dict)   # variable uid -> center
    constraints: list[Constraint] = field(default_factory=list)    # those in the AL (canonical)
    unsupported: list[str] = field(default_factory=list)   # terms with no prox nor gradient, why
    # the constraints a local solve keeps (`local=True`): name -> their own penalty σ, which
    # replaces β in their AL term (their μ are then the local solves' multipliers)
    local_penalties: dict[str, Parameter] = field(default_factory=dict)


LOCAL_PENALTY = 300.0   # σ of a local constraint's AL term outside a local solve (a typical initial AL penalty)
# rows up to which a constraint is held locally: its certificate reads ∇g row by row (one plan
# evaluation each, `local_al.LocalPlans.jacobian`); a larger one stays in the AL
LOCAL_ROWS = 64


def is_local(constraint: Constraint, variables: list[Variable]) -> bool:
    """A constraint a client's local solve can hold itself: a smooth convex inequality of at
    most LOCAL_ROWS rows on the shared variables only (`variables` with no owner), not a set
    (sets are projected)."""
    reads = {v.uid for v in constraint.expr.variables()}
    shared = {v.uid for v in variables if v.owner is None}
    return not isinstance(constraint, Equality) and constraint.expr.is_smooth() \
        and constraint.expr.is_convex() and bool(reads) and reads <= shared \
        and int(np.prod(constraint.shape, dtype=int)) <= LOCAL_ROWS


def build_merit(terms: list[Expression], constraints: list[Constraint],
                variables: list[Variable], name: str, project: bool = False,
                local: bool = False) -> Merit:
    """The merit P_i of one block, as an IR expression over `variables`. With `local`, the
    smooth convex inequalities on shared variables (`is_local`) get their own penalty
    Parameter σ in place of β (`Merit.local_penalties`): a local solve holds them exactly by a
    method of multipliers on (μ, σ), the outer loop leaves their μ alone."""
    classified = classify_objective(terms)
    sorted_constraints = canonical_constraints(constraints, project)
    proxable = classified.prox + sorted_constraints.sets
    constraints = sorted_constraints.smooth
    unsupported = [how_to_fix(t) for t in classified.unsupported] + \
        [constraint_fix(c) for c in sorted_constraints.unsupported] + shifted_conflict(proxable)
    objective = classified.objective
    beta = Parameter((), name=f"beta_{name}", value=1.0)
    half_over_beta = multiply(0.5, power(beta, -1))
    parts = [objective]
    multipliers: dict[str, Parameter] = {}
    penalties: dict[str, Parameter] = {}
    for constraint in constraints:
        mu = Parameter(constraint.shape, name=f"mu[{constraint.name}]", value=np.zeros(constraint.shape))
        multipliers[constraint.name] = mu
        if isinstance(constraint, Equality):
            parts.append(sum_(multiply(mu, constraint.expr)))
            parts.append(multiply(multiply(0.5, beta), sum_squares(constraint.expr)))
            continue
        penalty, half = beta, half_over_beta
        if local and is_local(constraint, variables):
            penalty = penalties[constraint.name] = Parameter((), name=f"sigma[{constraint.name}]",
                                                             value=LOCAL_PENALTY)
            half = multiply(0.5, power(penalty, -1))
        shifted = pos(add(mu, multiply(penalty, constraint.expr)))
        parts.append(multiply(half, add(sum_squares(shifted), multiply(-1.0, sum_squares(mu)))))
    prox_weight = Parameter((), name=f"omega_{name}", value=0.0)
    private_weight = Parameter((), name=f"omega_y_{name}", value=0.0)
    centers = {}
    for var in variables:
        center = Parameter(var.shape, name=f"center[{var.name}]", value=np.zeros(var.shape))
        centers[var.uid] = center
        weight = prox_weight if var.owner is None else private_weight
        parts.append(multiply(multiply(0.5, weight), sum_squares(add(var, multiply(-1.0, center)))))
    return Merit(expression=add(*parts), objective=objective, prox_terms=proxable, beta=beta,
                 multipliers=multipliers, prox_weight=prox_weight, private_weight=private_weight,
                 centers=centers, constraints=constraints, unsupported=unsupported,
                 local_penalties=penalties)
