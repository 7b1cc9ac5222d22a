"""Directions along which a model is constant, for `fm.verify`'s solution distance.

A model's minimizers need not be a point: NP monks-1 one-hot (17 columns of rank 12, the class-0
rows' rank 11) has the minimizers w* + {v : X₀v = 0, the constraint still met}, and CVXPY returns
one of them. There "distance to CVXPY's point" says nothing about being wrong. Exactly:

- the variables enter every objective term only through linear maps (the maximal affine
  subexpressions `maps`: data matrices, indexing, the identity of a ‖w‖ term); along the null
  space N of their stacked Jacobian the objective is constant — f(x* + n) = f(x*) for n ∈ N,
  whatever the terms are;
- so z = x* + P_N(x − x*) has the reference's objective, and where z also meets the constraints
  (evaluated, not assumed) it is a minimizer as good as x*: ‖x − z‖ bounds the distance from x
  to the set of minimizers. With the constraints' maps stacked too, every constraint is constant
  along N and z is feasible as x* is (the common null space; the fallback when the objective's
  alone gives an infeasible z).

A wrong point keeps its distance across N: only the part of x − x* along which the model
cannot tell the points apart is removed. Jacobians are built by evaluating the maps at the unit
vectors (at most FLAT_SIZE entries over the variables, else not attempted).
"""
from __future__ import annotations

import numpy as np

from .compiler.codegen import Plan
from .compiler.directions import Unbatchable
from .expression import Expression

FLAT_SIZE = 2000     # variables' entries above which no Jacobian is built (n evaluations of n²)
RANK = 1e-10         # singular values below RANK × the largest span the null space


def maps(expr: Expression) -> list[Expression]:
    """The maximal affine subexpressions of `expr` that read a variable: the linear maps
    through which the variables enter it (for an affine `expr`: itself)."""
    found, stack, seen = [], [expr], set()
    while stack:
        node = stack.pop()
        if id(node) in seen or node.is_constant():
            continue
        seen.add(id(node))
        if node.is_affine():
            found.append(node)
        else:
            stack.extend(node.args)
    return found


def jacobian(affine: list[Expression], variables: list) -> np.ndarray:
    """The stacked Jacobian (rows: the maps' entries; columns: the variables' entries in order)
    of affine expressions: their values at the unit vectors minus their values at 0."""
    sizes = [v.size for v in variables]
    n = sum(sizes)
    zero = [np.zeros(v.shape) for v in variables]
    offsets = [np.ravel(np.asarray(value, dtype=float)) for value in Plan(affine, variables)(*zero)]
    try:    # all n unit vectors at once (directions.py: one matrix product per data matrix)
        eye, at, units = np.eye(n), 0, []
        for v, size in zip(variables, sizes):
            units.append(eye[at:at + size].reshape(v.shape + (n,)))
            at += size
        values = Plan(affine, variables, batched=variables)(*units)
        columns = [np.reshape(np.asarray(val, dtype=float), (-1, n)) for val in values]
        return np.vstack([c - o[:, None] for c, o in zip(columns, offsets)])
    except (Unbatchable, ValueError, TypeError):   # an affine atom without a direction rule
        plan, rows = Plan(affine, variables), []
        for j in range(n):
            unit = np.zeros(n)
            unit[j] = 1.0
            parts = np.split(unit, np.cumsum(sizes)[:-1])
            values = plan(*[p.reshape(v.shape) for p, v in zip(parts, variables)])
            rows.append(np.concatenate([np.ravel(np.asarray(val, dtype=float)) - o
                                        for val, o in zip(values, offsets)]))
        return np.array(rows).T


def null_space(J: np.ndarray, n: int, scale: float = 0.0) -> np.ndarray:
    """An orthonormal basis (n × k) of J's null space (k = 0: the maps see every direction):
    singular values ≤ RANK × max(the largest, `scale`) count as 0."""
    if J.size == 0:
        return np.eye(n)
    # V whole (n × n) needs the full SVD only when J has fewer rows than columns; with one row
    # per record (32,561 for a9a) the full U alone was 8.5 GB and minutes of a verify
    _, s, vt = np.linalg.svd(J, full_matrices=J.shape[0] < n)
    rank = int(np.sum(s > RANK * max(s[0] if s.size else 0.0, scale)))
    return vt[rank:].T


def flat_candidates(problem, x: np.ndarray, x_star: np.ndarray) -> list[tuple[np.ndarray, int, str]]:
    """Points z = x* + P_N(x − x*) of the same objective as x* (module docstring), with N the
    null space of the objective's maps, then of every map (objective and constraints): each
    as (z flat, dim N, which); none where N = {0} or the variables have over FLAT_SIZE entries."""
    variables = problem.variables()
    n = sum(v.size for v in variables)
    if n > FLAT_SIZE:
        return []
    objective = [m for term in problem.objective_terms for m in maps(term)]
    constraint = [m for c in problem.constraints for m in maps(c.expr)]
    found, J = [], jacobian(objective, variables) if objective else np.zeros((0, n))
    for which, extra in (("the objective", []), ("the whole model", constraint)):
        if which == "the whole model":
            if not extra:
                break
            J = np.vstack([J, jacobian(extra, variables)])
        N = null_space(J, n)
        if N.shape[1]:
            found.append((x_star + N @ (N.T @ (x - x_star)), N.shape[1], which))
    return found


def solution_nearby(problem, values: dict, reference: dict, objective_scale: float,
                    rtol: float) -> tuple[dict, int, str] | None:
    """A minimizer z as good as the reference's point (`flat_candidates`), by variable uid,
    nearest to the result's `values`: its objective within ZERO_GAP·rtol of the reference's
    (relative to `objective_scale`) and the constraints met to rtol (fm.verify's relative
    feasibility, at the reference's multipliers); with the null space's dimension and which
    maps spanned it. None when no such z is closer than the reference's point."""
    variables = problem.variables()
    if any(v.uid not in values or v.uid not in reference for v in variables):
        return None
    flat = lambda point: np.concatenate([np.ravel(np.asarray(point[v.uid], dtype=float)) for v in variables])
    x, x_star = flat(values), flat(reference)
    objective = Plan([problem.objective], variables)
    f_star = float(np.sum(objective(*[np.reshape(reference[v.uid], v.shape) for v in variables])[0]))
    best, best_distance = None, np.max(np.abs(x - x_star), initial=0.0)
    for z, dimension, which in flat_candidates(problem, x, x_star):
        distance = np.max(np.abs(x - z), initial=0.0)
        if not distance < best_distance:
            continue
        parts = np.split(z, np.cumsum([v.size for v in variables])[:-1])
        point = {v.uid: part.reshape(v.shape) for v, part in zip(variables, parts)}
        f = float(np.sum(objective(*point.values())[0]))
        if not abs(f - f_star) <= ZERO_GAP * rtol * objective_scale:
            continue
        if problem.constraints and not problem.kkt_certificate(point, {}).relative_feasibility <= rtol:
            continue
        best, best_distance = (point, dimension, which), distance
    return best


ZERO_GAP = 1e-3      # z's objective gap, as a fraction of rtol: round-off on an exact null space
