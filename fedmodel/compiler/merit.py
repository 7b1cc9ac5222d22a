"""Compiler pass: per-node merit functions of the proximal augmented Lagrangian.

For block i with objective f_i, inequality constraints c_I ≤ 0 and equalities c_E = 0 (paper 1,
eqs. 12–14; docs/architecture.md follows β from `prob.solve` into this merit):

    P_i(x, y) = f_i(x, y)
              + (1/(2β)) Σ_I (‖[μ_I + β c_I]₊‖² − ‖μ_I‖²)      (inequality AL term)
              + Σ_E (μ_Eᵀ c_E + (β/2) ‖c_E‖²)                  (equality AL term)
              + (ω/2) ‖x − x̄‖² + (ω_y/2) ‖y − ȳ‖²              (proximal terms)

x are the shared variables, y the block's private ones. β, μ, ω, ω_y and the centers x̄, ȳ are
Parameters: an outer iteration changes their values and never recompiles. Terms and
constraints are first put in canonical form (`canonical`): prox-able terms (λ‖w‖₁ on a shared
variable, on any node) are left out and returned separately for the prox step, and so are
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


def build_merit(terms: list[Expression], constraints: list[Constraint],
                variables: list[Variable], name: str, project: bool = False) -> Merit:
    """The merit P_i of one block, as an IR expression over `variables`."""
    classified = classify_objective(terms)
    sorted_constraints = canonical_constraints(constraints, project)
    proxable = classified.prox + sorted_constraints.sets
    constraints = sorted_constraints.smooth
    unsupported = [how_to_fix(t) for t in classified.unsupported] + \
        [constraint_fix(c) for c in sorted_constraints.unsupported]
    objective = classified.objective
    beta = Parameter((), name=f"beta_{name}", value=1.0)
    half_over_beta = multiply(0.5, power(beta, -1))
    parts = [objective]
    multipliers: dict[str, Parameter] = {}
    for constraint in constraints:
        mu = Parameter(constraint.shape, name=f"mu[{constraint.name}]", value=np.zeros(constraint.shape))
        multipliers[constraint.name] = mu
        if isinstance(constraint, Equality):
            parts.append(sum_(multiply(mu, constraint.expr)))
            parts.append(multiply(multiply(0.5, beta), sum_squares(constraint.expr)))
        else:
            shifted = pos(add(mu, multiply(beta, constraint.expr)))
            parts.append(multiply(half_over_beta, add(sum_squares(shifted), multiply(-1.0, sum_squares(mu)))))
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
                 centers=centers, constraints=constraints, unsupported=unsupported)
