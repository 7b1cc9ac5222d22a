"""How far a point's stationarity remainder still allows it to be from the answer, read through
the curvature: the Newton step s = H⁻¹r of the smooth Lagrangian at x (H its Hessian on the
entries free to move, r the certificate's remainder there), per variable relative to its size —
for `fedmodel.certificate` (issue 25 item 2: a verify that cannot pass a wrong answer).

Why: the relative stationarity compares r with the gradients' sizes, and on an ill-conditioned
model a small r hides a large gap along a flat direction. nu17: a lasso over power-plant data
with its features ×1e3 beside an intercept column of ones — CVXPY-Clarabel said "optimal" with
the intercept 0.06 where the answer has 4.5e5, the objective 23 % above the optimum, relative
stationarity 2e-5: `fm.verify` passed it, and ProxAL "converged" to the same wrong point (the
gap, 4.7e6, is 2e-5 of the objective's change from the origin, 2e11: the objective scale does not
see it either). For a quadratic x − s is the answer exactly (the free entries' face held), to
second order otherwise: the backends' own distance rules (ProxAL's Newton reading) read the same.

H comes from forward differences of the compiled gradients (exact for a quadratic), one
gradient per entry, in the column-scaled coordinates x = D u (D the compiler's equilibration),
then Jacobi-scaled (diag(H)^-½ on both sides: a separate intercept variable has no column scale,
and beside features in units 1e3 its direction fell under the cutoff, review17a D2); directions
whose curvature is below FLAT of the largest are left out (their remainder is round-off, or the
model is flat there and the distance rule of verify decides). Read only where it is exact and
affordable: models whose only constraints are bounds on variables (the bounds met and the ℓ1
terms' zeros held), at most MAX_ENTRIES entries, and entries × data floats ≤ MAX_WORK (one
gradient over 50,000 rows × 64 columns costs ~0.1 s: 64 of them per solve were 3–16 s).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .expression import Constant, postorder

MAX_ENTRIES = 64    # entries of all variables together; above, no reading (n gradients)
MAX_WORK = 5e7      # entries × the model's data floats; above, no reading
STEP = 1e-4         # the difference's step, relative to the scaled point's size
FLAT = 1e-9         # curvature below FLAT × the largest (Jacobi-scaled) is no reading


def relative_distance(gradient: Callable[[list[np.ndarray]], list[np.ndarray]],
                      inputs: list[np.ndarray], remainders: list[np.ndarray], held: list[np.ndarray],
                      scales: list[np.ndarray | None], lengths: list[float]) -> tuple[float, int | None]:
    """(max over variables v of ‖s_v‖∞ / max(‖x_v‖∞, ℓ_v), that v's index) at `inputs` x (one
    array per variable), s = H⁻¹r: `gradient(inputs)` the smooth Lagrangian's gradients,
    `remainders` r per variable, `held` (bool, per variable) the entries that do not move (an ℓ1
    term's zeros, bounds met), `scales` the column scales D per variable (None: 1), `lengths` ℓ_v
    the variables' natural lengths. (0, None) where there is nothing to read (too many entries,
    no free entry, not convex there, a step off the domain)."""
    shapes = [np.shape(x) for x in inputs]
    sizes = [int(np.prod(s)) for s in shapes]
    n = sum(sizes)
    if n == 0 or n > MAX_ENTRIES:
        return 0.0, None
    d = np.concatenate([np.ones(k) if s is None else np.broadcast_to(np.asarray(s, float), shape).ravel()
                        for k, s, shape in zip(sizes, scales, shapes)])
    x = np.concatenate([np.ravel(v) for v in inputs])
    free = ~np.concatenate([np.ravel(h) for h in held])
    r = np.concatenate([np.ravel(v) for v in remainders])[free] * d[free]
    if not np.any(free) or not np.all(np.isfinite(r)):
        return 0.0, None
    h = STEP * max(float(np.max(np.abs(x / d))), 1.0)

    def flat_gradient(u: np.ndarray) -> np.ndarray:
        z, out, at_ = x + d * u, [], 0
        for k, shape in zip(sizes, shapes):
            out.append(z[at_:at_ + k].reshape(shape))
            at_ += k
        return np.concatenate([np.ravel(g) for g in gradient(out)])
    H = np.zeros((n, n))
    with np.errstate(all="ignore"):
        try:
            here = flat_gradient(np.zeros(n))
            for j in np.flatnonzero(free):
                e = np.zeros(n)
                e[j] = h
                H[:, j] = d * (flat_gradient(e) - here) / h
        except (ArithmeticError, ValueError):
            return 0.0, None
    H = H[np.ix_(free, free)]
    H = (H + H.T) / 2
    if not np.all(np.isfinite(H)):
        return 0.0, None
    diagonal = np.diag(H)
    jacobi = np.where(diagonal > 0, 1.0 / np.sqrt(np.where(diagonal > 0, diagonal, 1.0)), 1.0)
    values, vectors = np.linalg.eigh(jacobi[:, None] * H * jacobi[None, :])
    top = float(np.max(np.abs(values), initial=0.0))
    if not top > 0 or values[0] < -FLAT * top * 1e3:   # not convex here: no reading
        return 0.0, None
    keep = values > FLAT * top
    step = np.zeros(n)
    step[free] = d[free] * jacobi * (vectors[:, keep] @ ((vectors[:, keep].T @ (jacobi * r)) / values[keep]))
    worst, where, at_ = 0.0, None, 0
    for i, (k, xi, length) in enumerate(zip(sizes, inputs, lengths)):
        size = max(float(np.max(np.abs(xi), initial=0.0)), length)
        moved = float(np.max(np.abs(step[at_:at_ + k]), initial=0.0))
        far = moved / size if size > 0 else (np.inf if moved > 0 else 0.0)
        if far > worst:
            worst, where = far, i
        at_ += k
    return worst, where


def held_entries(x: np.ndarray, near_zero: np.ndarray, tiny: float, terms: list) -> np.ndarray:
    """The entries of x the distance holds, for the prox `terms` of its variable: an ℓ1 term's
    zeros (`near_zero` == 0), a box's bounds met (within `tiny`)."""
    held = np.zeros(np.shape(x), dtype=bool)
    for term in terms:
        if term.box is not None:
            lower, upper = (np.broadcast_to(np.asarray(b, float), np.shape(x)) for b in term.box)
            held |= (x <= lower + tiny) | (x >= upper - tiny)
        else:
            held |= near_zero == 0
    return held


def summed_gradients(plan, skip: int, members: list[list[int]], variables: list) -> Callable:
    """inputs → per variable the sum of `plan`'s gradient outputs (those after the first `skip`,
    one per piece and each of its variables `members`): the certificate's ∇ of the smooth part."""
    def gradient(inputs: list[np.ndarray]) -> list[np.ndarray]:
        out, total = iter(plan(*inputs)[skip:]), [np.zeros(v.shape) for v in variables]
        for idx in members:
            for i in idx:
                total[i] = total[i] + np.broadcast_to(np.asarray(next(out), float), variables[i].shape)
        return total
    return gradient


def affordable(objective_terms: list, inputs: list[np.ndarray]) -> bool:
    """Whether the reading's gradients (one per entry) stay within MAX_WORK: entries × the
    floats of the objective's data and constants."""
    floats = sum(int(np.size(leaf.value)) for leaf in postorder(list(objective_terms))
                 if isinstance(leaf, Constant))
    return sum(int(np.size(x)) for x in inputs) * floats <= MAX_WORK
