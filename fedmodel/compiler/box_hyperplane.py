"""The exact Euclidean projection onto a box ∩ one hyperplane {l ≤ x ≤ u, aᵀx = b} (a simplex
{Σ w = 1, w ≥ 0}, a budget, an allocation) or a box ∩ one halfspace {aᵀx ≤ b}, where Dykstra's
algorithm (`projection.dykstra`) converges only linearly and ends ~1e-13 outside a bound
(FedADMM's and DP-ADMM's steps project on such sets every round).

By the KKT conditions x(θ) = clip(v − θa, l, u), where aᵀx(θ) is nonincreasing and piecewise
linear in θ with breakpoints (v_i − l_i)/a_i, (v_i − u_i)/a_i: the root of aᵀx(θ) = b is
bracketed among the sorted breakpoints (bisection, O(d log d)), then solved on its linear piece.
For a halfspace: the box's projection where it meets aᵀx ≤ b, else the hyperplane's. The tangent
cone of such a set is a set of the same form (bounds 0 or ±∞, the plane through 0), so the
optimality residuals of `projection.intersection_residual` are exact too (`box_plane_residual`)."""
from __future__ import annotations

import numpy as np


def box_plane_residual(x: np.ndarray, g: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                       a: np.ndarray, equality: bool, plane_active: bool, active: float) -> np.ndarray:
    """g plus the element of the normal cone of {lower ≤ x ≤ upper, aᵀx = b (`equality`) or ≤ b}
    at x closest to −g, −P_T(−g): T = {v : v_i ≥ 0 at a lower bound, ≤ 0 at an upper one (within
    `active`, relative, as `projection.Box.tangent`), aᵀv = 0 (or ≤ 0 where `plane_active`)}."""
    x, g = np.asarray(x, float), np.asarray(g, float)
    scale = active * np.maximum(1.0, np.abs(x))
    lower = np.where(x <= np.broadcast_to(lower, x.shape) + scale, 0.0, -np.inf)
    upper = np.where(x >= np.broadcast_to(upper, x.shape) - scale, 0.0, np.inf)
    if not equality and not plane_active:
        return -np.clip(-g, lower, upper)
    return -project_box_hyperplane(-g, a, 0.0, lower, upper, equality)


def project_box_hyperplane(v: np.ndarray, a: np.ndarray, b: float, lower: np.ndarray,
                           upper: np.ndarray, equality: bool = True) -> np.ndarray:
    """The projection of v onto {lower ≤ x ≤ upper, aᵀx = b} (`equality`; else aᵀx ≤ b), all
    over v's flattened entries (lower, upper broadcast to v; the set is not empty)."""
    shape = np.shape(v)
    v, a = np.ravel(np.asarray(v, float)), np.ravel(np.asarray(a, float))
    lower = np.ravel(np.broadcast_to(np.asarray(lower, float), shape))
    upper = np.ravel(np.broadcast_to(np.asarray(upper, float), shape))

    def x_at(theta: float) -> np.ndarray:
        return np.clip(v - theta * a, lower, upper)

    if not equality and float(a @ x_at(0.0)) <= b:
        return x_at(0.0).reshape(shape)
    moving = a != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        points = np.concatenate([(v - lower)[moving] / a[moving], (v - upper)[moving] / a[moving]])
    points = np.sort(points[np.isfinite(points)])     # (ties: a piece of length 0)
    # the linear piece holding the root: [points[k − 1], points[k]] (unbounded at the ends)
    lo, hi = 0, points.size               # excess(points[j]) ≥ 0 for j < lo, < 0 for j ≥ hi
    if points.size * v.size <= 1 << 16:   # small: every breakpoint at once
        at_points = np.clip(v[None, :] - points[:, None] * a[None, :], lower, upper)
        lo = hi = int(np.count_nonzero(at_points @ a - b >= 0))
    while lo < hi:
        mid = (lo + hi) // 2
        if float(a @ x_at(points[mid])) - b >= 0:
            lo = mid + 1
        else:
            hi = mid
    left = points[lo - 1] if lo > 0 else -np.inf
    right = points[lo] if lo < points.size else np.inf
    inside = (left + right) / 2 if np.isfinite(left + right) else \
        (left + 1.0 if np.isfinite(left) else right - 1.0 if np.isfinite(right) else 0.0)
    at = x_at(inside)
    free = moving & (at > lower) & (at < upper)          # entries that move with θ on the piece
    slope = float(a[free] @ a[free])
    if slope == 0.0:                                      # aᵀx(θ) constant (= b) on the piece
        return at.reshape(shape)
    theta = (float(a[free] @ v[free]) + float(a[~free] @ at[~free]) - b) / slope
    return x_at(float(np.clip(theta, left, right))).reshape(shape)
