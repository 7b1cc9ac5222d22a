"""The exact Euclidean projection onto a box ∩ one hyperplane {l ≤ x ≤ u, aᵀx = b} (a simplex
{Σ w = 1, w ≥ 0}, a budget, an allocation) or a box ∩ one halfspace {aᵀx ≤ b}.

Dykstra's algorithm (`projection.dykstra`) converges only linearly there: a stacking model's
simplex took up to its 20,000 cycles a projection, thousands of projections a Newton step
(newuser12's nu12_simplex_hang: no answer in 120 s, CVXPY 0.07 s). The KKT conditions give the
projection in closed form up to one scalar: x(θ) = clip(v − θa, l, u), where aᵀx(θ) is
nonincreasing and piecewise linear in θ with breakpoints (v_i − l_i)/a_i, (v_i − u_i)/a_i. The
root of aᵀx(θ) = b is found by bisection over the sorted breakpoints (O(d log d)), then exactly
on its linear piece. For a halfspace: the box's projection where it meets aᵀx ≤ b, else the
hyperplane's (the constraint is then active). The tangent cone of such a set at a point is a set
of the same form (bounds 0 or ±∞, the plane through 0), so optimality residuals
(`projection.intersection_residual`) are exact too (`BoxPlane.tangent_residual`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .projection import ACTIVE, Box, Halfspace, Subspace


@dataclass
class BoxPlane:
    """{lower ≤ x ≤ upper, aᵀx = b} (`equality`; else aᵀx ≤ b), from a box piece and a
    halfspace or one-row subspace piece (`of`)."""
    box: Box
    plane: Halfspace | Subspace

    @classmethod
    def of(cls, pieces: list) -> "BoxPlane | None":
        boxes = [p for p in pieces if isinstance(p, Box)]
        other = [p for p in pieces if not isinstance(p, Box)]
        if len(pieces) == 2 and boxes and (isinstance(other[0], Halfspace) or (
                isinstance(other[0], Subspace) and other[0].Q.shape[0] == 1)):
            return cls(boxes[0], other[0])
        return None

    def _plane(self) -> tuple[np.ndarray, float, bool]:
        if isinstance(self.plane, Halfspace):
            return self.plane.a, self.plane.b, False
        return self.plane.Q[0], float(self.plane.Q[0] @ self.plane.point), True

    def project(self, v: np.ndarray) -> np.ndarray:
        a, b, equality = self._plane()
        return project_box_hyperplane(v, a, b, self.box.lower, self.box.upper, equality)

    def tangent_residual(self, x: np.ndarray, g: np.ndarray, active: float = ACTIVE) -> np.ndarray:
        """g plus the element of the normal cone at x closest to −g, −P_T(−g) (T the tangent
        cone, the pieces' active tests as `Box.tangent`, `Halfspace.tangent`)."""
        x, g = np.asarray(x, float), np.asarray(g, float)
        scale = active * np.maximum(1.0, np.abs(x))
        lower = np.where(x <= self.box.lower + scale, 0.0, -np.inf)
        upper = np.where(x >= self.box.upper - scale, 0.0, np.inf)
        a, _, equality = self._plane()
        if not equality and not self.plane.active(x, active):
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
