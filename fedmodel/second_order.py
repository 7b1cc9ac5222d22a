"""Second-order check of a nonconvex model's point, for `fm.verify` (issue 25, item 2).

The KKT certificate is first order: on a nonconvex model it passes a maximum or a saddle as
readily as a minimum (`minimize(-sum_squares(w))` over ‖w‖ ≤ 1: every backend stops at w = 0,
stationary). A local minimum needs dᵀ∇²ℒ(x)d ≥ 0 on the directions d that keep the active
constraints (∇c_e·d = 0); this module measures the most negative such curvature relative to
the curvature of the Lagrangian's pieces, by central differences of the model's values:

- each variable moves by steps of BEND times its natural length (`Certificate.lengths`, or its
  own size), so variables in different units are comparable;
- the directions are the coordinates (at most DIRECTIONS of them, else that many fixed random
  combinations), restricted to the null space of the active constraints' Jacobian (a
  constraint within ACTIVE steps of its bound is active);
- the active constraints' multipliers are the least-squares fit of ∇f + Σ μ_e ∇c_e = 0 there
  (μ ≥ 0 for inequalities), so sets handled by projection (balls, bounds) count as well;
- relative curvature = λ_min(Zᵀ∇²ℒZ) / Σ_k ‖Zᵀ∇²ℓ_k Z‖₂ over the pieces ℓ_k (each canonical
  objective term, each μ_e c_e). A degenerate minimum (a circle of minima: curvature 0 along it) reads
  ≈ 0; a maximum reads −1.

Only for models that are not convex (convex models are certified by CVXPY); the cost is
r² + r + 2m + 2 evaluations of the model's values, r ≤ m ≤ DIRECTIONS (182 at most).
"""
from __future__ import annotations

import numpy as np

from .compiler.codegen import Plan
from .compiler.terms import flatten
from .constraints import Equality

BEND = 1e-4          # the step, relative to each variable's natural length
DIRECTIONS = 12      # at most this many directions (coordinates, or random combinations)
ACTIVE = 10.0        # a constraint within ACTIVE steps of its bound is active


def negative_curvature(problem, values: dict[int, np.ndarray],
                       lengths: dict[int, float]) -> float | None:
    """max(0, −λ_min / scale) at `values` (0: no descent direction of second order; ≈ 1: a
    maximum), or None when it cannot be measured (no length to step by, values undefined)."""
    variables = problem.variables()
    x = [np.asarray(values[v.uid], dtype=float) for v in variables]
    steps = [BEND * max(float(np.max(np.abs(xi), initial=0.0)), lengths.get(v.uid, 0.0))
             for v, xi in zip(variables, x)]
    sizes = [xi.size for xi in x]
    n = sum(sizes)
    if n == 0 or not all(s > 0 for s in steps):
        return None
    scale = np.concatenate([np.full(size, step) for size, step in zip(sizes, steps)])
    # the objective's canonical terms, constants left out: a 1e9 in a term would round its
    # second differences (1e9·eps against h² ∇²f) into a false negative curvature
    terms = [t.expression() for term in problem.objective_terms for t in flatten(term)
             if t.atom.variables()]
    constraints = list(problem.constraints)
    plan = Plan(terms + [c.expr for c in constraints], variables)
    flat = np.concatenate([xi.ravel() for xi in x])

    def evaluate(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the objective terms' values, the constraints' values flat) at x + scale·u."""
        z = flat + scale * u
        parts, at = [], 0
        for xi, size in zip(x, sizes):
            parts.append(z[at:at + size].reshape(xi.shape))
            at += size
        with np.errstate(all="ignore"):
            out = plan(*parts)
        f = np.array([float(np.sum(o)) for o in out[:len(terms)]])
        c = np.concatenate([np.ravel(np.asarray(o, dtype=float)) for o in out[len(terms):]]) \
            if constraints else np.zeros(0)
        return f, c

    try:
        _, c0 = evaluate(np.zeros(n))
    except (ArithmeticError, ValueError):
        return None
    kinds = np.concatenate([np.full(int(np.prod(c.shape)), isinstance(c, Equality))
                            for c in constraints]) if constraints else np.zeros(0, dtype=bool)
    basis = np.eye(n) if n <= DIRECTIONS else \
        np.linalg.qr(np.random.default_rng(0).standard_normal((n, DIRECTIONS)))[0]
    try:
        ups = [evaluate(d) for d in basis.T]
        downs = [evaluate(-d) for d in basis.T]
    except (ArithmeticError, ValueError):
        return None
    # first derivatives along the basis (per unit of u): of f, and of every constraint entry
    g = np.array([(np.sum(up[0]) - np.sum(down[0])) / 2 for up, down in zip(ups, downs)])
    jac = np.array([(up[1] - down[1]) / 2 for up, down in zip(ups, downs)]).T   # entries × basis
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(jac)) and np.all(np.isfinite(c0))):
        return None
    reach = ACTIVE * np.maximum(np.linalg.norm(jac, axis=1), np.finfo(float).tiny)
    active = kinds | (c0 >= -reach)
    rows = jac[active]
    mu = np.zeros(int(np.sum(active)))
    if rows.size:
        mu = np.linalg.lstsq(rows.T, -g, rcond=None)[0]
        mu = np.where(kinds[active], mu, np.maximum(mu, 0.0))
        _, s, vt = np.linalg.svd(rows, full_matrices=True)
        rank = int(np.sum(s > max(s[0], 0.0) * 1e-8)) if s.size else 0
        null = vt[rank:].T
    else:
        null = np.eye(basis.shape[1])
    if null.shape[1] == 0:
        return 0.0     # the active constraints fix the point: no direction to curve along
    directions = basis @ null                                         # n × r, in units of u
    weights = np.concatenate([np.ones(len(terms)), mu])

    def pieces(u: np.ndarray) -> np.ndarray:
        f, c = evaluate(u)
        return np.concatenate([f, c[active]]) * weights

    r = directions.shape[1]
    hessians = np.zeros((len(weights), r, r))     # per piece ℓ_k: Zᵀ∇²ℓ_k Z, by central differences
    try:
        center = pieces(np.zeros(n))
        up = [pieces(directions[:, j]) for j in range(r)]
        down = [pieces(-directions[:, j]) for j in range(r)]
        for j in range(r):
            hessians[:, j, j] = up[j] - 2 * center + down[j]
            for k in range(j):   # the symmetric 2-point stencil on the diagonal ones: exact for quadratics
                both = directions[:, j] + directions[:, k]
                mixed = (pieces(both) + pieces(-both) - up[j] - down[j] - up[k] - down[k] + 2 * center) / 2
                hessians[:, j, k] = hessians[:, k, j] = mixed
    except (ArithmeticError, ValueError):
        return None
    if not np.all(np.isfinite(hessians)):
        return None
    total = np.sum(hessians, axis=0)
    size = float(sum(np.max(np.abs(np.linalg.eigvalsh(h)), initial=0.0) for h in hessians))
    lowest = float(np.min(np.linalg.eigvalsh(total)))
    return max(0.0, -lowest / size) if size > 0 else 0.0
