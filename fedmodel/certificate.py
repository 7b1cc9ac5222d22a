"""KKT certificate of a point (paper 1, Definition 1), for any backend's result.

stationarity = dist∞(0, ∇f(x) + ∂h(x) + Σ_j ∇c_j(x) μ_j) over all variables, with the
subdifferential of prox-able terms (`t·norm1(x)`) handled exactly; other nonsmooth terms
contribute their (sub)gradient at x. feasibility = max_j of [c_j]₊ and the complementarity
min(μ_j, |c_j|) for inequalities, |c_j| for equalities. This equals dist∞(c_j, N(μ_j)) of
Definition 1 when μ_j = 0 or μ_j ≥ |c_j|, and does not jump when a solver returns a tiny
positive multiplier (1e-9) for an inactive constraint, which Definition 1 would score as |c_j|.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .atoms import add, multiply, sum as sum_
from .compiler.classify import prox_term
from .compiler.codegen import Plan
from .compiler.differentiate import grad
from .constraints import Equality
from .expression import Constant
from .result import Certificate

if TYPE_CHECKING:
    from .problem import Problem


def kkt_certificate(problem: "Problem", values: dict[int, np.ndarray],
                    multipliers: dict[str, np.ndarray]) -> Certificate:
    variables = problem.variables()
    inputs = [values[v.uid] for v in variables]
    smooth_terms, prox_terms = [], []
    for block in problem.blocks:
        for term in block.terms:
            found = prox_term(term)
            (prox_terms if found else smooth_terms).append(found or term)
    lagrangian_terms = list(smooth_terms)
    feasibility = 0.0
    residual_plan = Plan([c.expr for c in problem.constraints], variables)
    residuals = residual_plan(*inputs) if problem.constraints else []
    for constraint, c_value in zip(problem.constraints, residuals):
        mu = np.broadcast_to(np.asarray(multipliers.get(constraint.name, 0.0), dtype=float),
                             constraint.shape).copy()
        c_value = np.asarray(c_value, dtype=float)
        if isinstance(constraint, Equality):
            dist = np.abs(c_value)
        else:
            dist = np.maximum(np.maximum(c_value, 0.0), np.minimum(np.maximum(mu, 0.0), np.abs(c_value)))
        feasibility = max(feasibility, float(np.max(dist, initial=0.0)))
        if np.any(mu != 0):
            lagrangian_terms.append(sum_(multiply(Constant(mu), constraint.expr)))
    lagrangian = add(*lagrangian_terms) if lagrangian_terms else Constant(0.0)
    gradients = Plan([grad(lagrangian, v) for v in variables], variables)(*inputs)
    stationarity = 0.0
    for var, g in zip(variables, gradients):
        g = np.broadcast_to(np.asarray(g, dtype=float), var.shape)
        dist = np.abs(g)
        for atom_type, prox_var, weight in prox_terms:
            if prox_var is var:
                dist = atom_type.subdifferential_distance(values[var.uid], g, weight)
        stationarity = max(stationarity, float(np.max(dist, initial=0.0)))
    return Certificate(stationarity=stationarity, feasibility=feasibility)
