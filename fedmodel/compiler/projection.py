"""Euclidean projections onto the simple sets the compiler recognizes (`compiler.sets`), and onto
intersections of them by Dykstra's algorithm — one implementation for every backend that
projects (FedADMM's and DP-ADMM's server and client steps, ProxAL's server step).

A `Piece` is one closed convex set over a variable's flattened entries with an exact
projection: a Euclidean ball ‖x‖₂ ≤ r, an ellipsoid ‖e∘x‖₂ ≤ r (a ball on column-scaled
entries, `Ellipsoid`: the root of a secular equation), an ℓ1 ball (weighted: Σ e_i|x_i| ≤ r), a
box l ≤ x ≤ u, a halfspace aᵀx ≤ b and an affine subspace A x = b. Each also projects onto its tangent cone at a point (`tangent`), which
gives the optimality residual of a point of the set: the element of the normal cone N(x) closest
to −g is found through Moreau's decomposition, g + P_N(−g) = −P_T(−g) with T = N° the tangent
cone, and the tangent cone of an intersection is the intersection of the pieces' tangent cones
(under Slater's condition), projected on by Dykstra again.

Dykstra's algorithm (Boyle & Dykstra 1986; Bauschke & Combettes, *Convex Analysis and Monotone
Operator Theory*, §30.2): x⁰ = v, p_k = 0; one cycle projects x + p_k on each piece k in turn,
y = P_k(x + p_k), p_k ← x + p_k − y, x ← y. Unlike alternating projections it converges to the
projection of v onto the intersection, not to some point of it. It stops when a cycle moves x by
at most `DYKSTRA_TOL`·max(1, ‖v‖∞) in every entry and x is in every piece to that tolerance, or
after `DYKSTRA_CYCLES` cycles (then the last x: within the pieces to roughly the last cycle's move).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import FedModelError
from ..atoms.prox import project_l1_ball
from .box_hyperplane import box_plane_residual, project_box_hyperplane

ACTIVE = 1e-7          # a point within ACTIVE (relative) of a piece's boundary is on it
DYKSTRA_TOL = 1e-13    # relative move of a cycle at which Dykstra's algorithm stops
DYKSTRA_CYCLES = 20_000


class Piece:
    """A closed convex set over flat vectors with a closed-form projection."""

    def project(self, v: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def tangent(self, x: np.ndarray, v: np.ndarray, active: float = ACTIVE) -> np.ndarray | None:
        """The projection of v onto the tangent cone of the set at x (x in the set; a point
        within `active`, relative, of a boundary is on it), or None when the piece has no
        closed form for it."""
        raise NotImplementedError

    def normals(self, x: np.ndarray, active: float = ACTIVE) -> np.ndarray | None:
        """The outward normals (rows) of the piece's constraints active at x (within `active`,
        relative): its normal cone there is their nonnegative combinations. None where it has
        no such form (an ℓ1 ball)."""
        return None

    def distance(self, x: np.ndarray) -> float:
        """‖x − P(x)‖∞: how far x is outside the set."""
        return float(np.max(np.abs(x - self.project(x)), initial=0.0))

    def current(self) -> "Piece":
        """The set as it is now: itself, or for a `Parametric` piece its constant piece at the
        Parameters' present values."""
        return self


class Parametric(Piece):
    """A piece whose numbers (a radius, bounds, an offset) are Parameters: `build()` gives the
    constant piece at their present values, read at each use (a Parameter changes between solves
    without recompiling). Callers that use a piece many times take `current()` once."""

    def __init__(self, build):
        self.build = build

    def current(self):
        return self.build().current()

    def project(self, v):
        return self.current().project(v)

    def tangent(self, x, v, active=ACTIVE):
        return self.current().tangent(x, v, active)

    def normals(self, x, active=ACTIVE):
        return self.current().normals(x, active)


class Ball(Piece):
    """‖x‖₂ ≤ radius."""

    def __init__(self, radius: float):
        self.radius = float(radius)

    def project(self, v):
        norm = np.linalg.norm(v)
        return v if norm <= self.radius else v * (self.radius / norm)

    def tangent(self, x, v, active=ACTIVE):
        norm = np.linalg.norm(x)
        if norm < self.radius * (1 - active):
            return v
        if self.radius == 0 or norm == 0:    # the point {0}: T = {0}
            return np.zeros_like(v)
        unit = x / norm                      # T = {v : xᵀv ≤ 0}
        return v - max(0.0, float(unit @ v)) * unit

    def normals(self, x, active=ACTIVE):
        norm = np.linalg.norm(x)
        if norm < self.radius * (1 - active):
            return np.zeros((0, x.size))
        return _every_direction(x.size) if self.radius == 0 or norm == 0 else (x / norm)[None, :]


class Ellipsoid(Piece):
    """‖e∘x‖₂ ≤ radius, e > 0 per entry: the ball ‖w‖₂ ≤ r on w = D v after column scaling
    (`compiler.set_scaling`). Its projection is x = y / (1 + λe²), λ ≥ 0 the root of
    ‖e∘x(λ)‖ = radius (`project_ellipsoid`); its normal at a boundary point x is e²∘x."""

    def __init__(self, weights: np.ndarray, radius: float):
        self.weights, self.radius = np.ravel(np.asarray(weights, float)), float(radius)
        top = float(np.max(self.weights, initial=0.0))
        # e / max e (≤ 1: no overflow in e⁴), its square and radius / max e, once
        e = self.weights / top
        self._scaled = (e, e * e, float(np.min(e * e, initial=1.0)), self.radius / top)

    def project(self, v):
        return _secular(np.asarray(v, float), *self._scaled)

    def tangent(self, x, v, active=ACTIVE):
        if np.linalg.norm(self.weights * x) < self.radius * (1 - active):
            return v
        normal = self.weights ** 2 * x
        size = float(normal @ normal)
        if self.radius == 0 or size == 0:    # the point {0}: T = {0}
            return np.zeros_like(v)
        return v - (max(0.0, float(normal @ v)) / size) * normal

    def normals(self, x, active=ACTIVE):
        if np.linalg.norm(self.weights * x) < self.radius * (1 - active):
            return np.zeros((0, x.size))
        normal = self.weights ** 2 * x
        size = np.linalg.norm(normal)
        return _every_direction(x.size) if self.radius == 0 or size == 0 else (normal / size)[None, :]


def _every_direction(n: int) -> np.ndarray:
    """±e_j: the normals of a set that is one point (its normal cone is the whole space)."""
    return np.vstack([np.eye(n), -np.eye(n)])


def project_ellipsoid(v: np.ndarray, weights: np.ndarray, radius: float) -> np.ndarray:
    """Euclidean projection of v onto {x : ‖e∘x‖₂ ≤ radius} (e = `weights` > 0, v's size).
    Outside it, x = v/(1 + λe²) with λ > 0 the root of the secular equation
    Σ e_i²v_i²/(1 + λe_i²)² = radius² (`_secular`). Equal weights: the ball's closed form."""
    return Ellipsoid(weights, radius).project(v)


def _secular(v: np.ndarray, e: np.ndarray, e2: np.ndarray, least: float, radius: float) -> np.ndarray:
    """`project_ellipsoid` with e (max e = 1), e², min e² and the radius over max e. With z = v/e
    and a = 1/e², e∘x = z/(a + λ): the trust-region secular equation (Moré & Sorensen 1983),
    whose 1/‖e∘x(λ)‖ is concave and increasing in λ, so Newton's method on 1/‖e∘x‖ − 1/radius
    from a λ below the root rises monotonically to it. q₀/(1 + λ) ≤ ‖e∘x(λ)‖ ≤ q₀/(1 + λ min e²)
    (q₀ = ‖e∘v‖) brackets the root in [q₀/r − 1, (q₀/r − 1)/min e²]: Newton starts at its low
    end, is kept in it (bisected if it leaves it) and stops at a step below 4 ulps of max(λ, 1)
    (e ≤ 1: a smaller change of λ moves no entry of x by an ulp)."""
    flat = np.ravel(v)
    peak = float(np.max(np.abs(flat), initial=0.0))
    if peak > 0 and not 1e-100 < peak < 1e100:      # e∘v's squares would under/overflow: the
        return peak * _secular(v / peak, e, e2, least, radius / peak)   # projection is homogeneous
    if e[0] == 1.0 and np.all(e == 1.0):             # equal weights: a ball of radius r/max e
        norm = math.sqrt(float(flat @ flat))
        return v if norm <= radius else v * (radius / norm)
    ev = e * flat
    size = math.sqrt(float(ev @ ev))
    if size <= radius:
        return v
    if radius <= 0:
        return np.zeros_like(v)
    ratio, ulps = size / radius - 1.0, 4 * np.finfo(float).eps
    low, high = ratio, ratio / least if least > 0 else np.inf
    lam = low
    for _ in range(100):
        shrunk = ev / (1.0 + lam * e2)
        squares = shrunk * shrunk
        size = math.sqrt(float(squares.sum()))
        if size <= radius:
            high = min(high, lam)
        else:
            low = max(low, lam)
        slope = float(squares @ (e2 / (1.0 + lam * e2)))      # Σ e⁴v²/(1 + λe²)³
        new = lam + (size - radius) * size * size / (radius * slope) if slope > 0 else high
        if not low <= new <= high:
            new = 0.5 * (low + high) if np.isfinite(high) else low
        if abs(new - lam) <= ulps * max(lam, 1.0):
            break
        lam = new
    x = flat / (1.0 + lam * e2)
    size = math.sqrt(float((e * x) @ (e * x)))
    return (x * (radius / size) if size > radius else x).reshape(np.shape(v))


class Ball1(Piece):
    """‖x‖₁ ≤ radius, or Σ e_i|x_i| ≤ radius with `weights` e > 0 (sort-based projection,
    Duchi et al. 2008, weighted); no tangent closed form here."""

    def __init__(self, radius: float, weights: np.ndarray | None = None):
        self.radius, self.weights = float(radius), weights

    def project(self, v):
        return project_l1_ball(v, self.radius, self.weights)

    def tangent(self, x, v, active=ACTIVE):
        return None


class Box(Piece):
    """lower ≤ x ≤ upper entrywise (±inf for no bound)."""

    def __init__(self, lower, upper):
        self.lower, self.upper = np.asarray(lower, float), np.asarray(upper, float)

    def project(self, v):
        return np.clip(v, self.lower, self.upper)

    def tangent(self, x, v, active=ACTIVE):
        scale = active * np.maximum(1.0, np.abs(x))
        out = np.where(x <= self.lower + scale, np.maximum(v, 0.0), v)
        return np.where(x >= self.upper - scale, np.minimum(out, 0.0), out)

    def normals(self, x, active=ACTIVE):
        scale = active * np.maximum(1.0, np.abs(x))
        unit = np.eye(x.size)
        return np.vstack([-unit[x <= self.lower + scale], unit[x >= self.upper - scale]])


class Halfspace(Piece):
    """aᵀx ≤ b (a ≠ 0)."""

    def __init__(self, a: np.ndarray, b: float):
        self.a, self.b = np.asarray(a, float), float(b)
        self.norm2 = float(self.a @ self.a)

    def project(self, v):
        excess = float(self.a @ v) - self.b
        return v if excess <= 0 else v - (excess / self.norm2) * self.a

    def active(self, x, tol: float = ACTIVE) -> bool:
        slack = self.b - float(self.a @ x)
        return slack <= tol * max(abs(self.b), np.sqrt(self.norm2) * float(np.linalg.norm(x)), 1e-300)

    def tangent(self, x, v, active=ACTIVE):
        if not self.active(x, active):
            return v
        return v - (max(0.0, float(self.a @ v)) / self.norm2) * self.a

    def normals(self, x, active=ACTIVE):
        return self.a[None, :] if self.active(x, active) else np.zeros((0, x.size))


class Subspace(Piece):
    """A x = b (A: k × n of full row rank after dropping dependent rows; consistent)."""

    def __init__(self, A: np.ndarray, b: np.ndarray):
        A, b = np.atleast_2d(np.asarray(A, float)), np.ravel(np.asarray(b, float))
        self.rows = A                      # as written: one multiplier per row
        # an orthonormal basis Q of the row space (rank-revealing), and the point of least norm
        u, s, vt = np.linalg.svd(A, full_matrices=False)
        rank = int(np.sum(s > s[0] * max(A.shape) * np.finfo(float).eps)) if s.size and s[0] > 0 else 0
        if rank == 0:
            raise FedModelError("an affine constraint A x = b with A = 0 is not a hyperplane")
        self.Q = vt[:rank]
        self.point = self.Q.T @ ((u[:, :rank].T @ b) / s[:rank])
        if np.max(np.abs(A @ self.point - b), initial=0.0) > 1e-9 * max(1.0, float(np.max(np.abs(b)))):
            raise FedModelError("the equality constraints A x = b on one variable have no solution "
                                "(b is not in the range of A): the model is infeasible")

    def project(self, v):
        return v - self.Q.T @ (self.Q @ (v - self.point))

    def tangent(self, x, v, active=ACTIVE):
        return v - self.Q.T @ (self.Q @ v)

    def normals(self, x, active=ACTIVE):
        return np.vstack([self.Q, -self.Q])      # ±: a free multiplier a row


def dykstra(projections: list, v: np.ndarray, tol: float = DYKSTRA_TOL,
            max_cycles: int = DYKSTRA_CYCLES) -> np.ndarray:
    """The projection of v onto the intersection of the sets whose projections are
    `projections` (callables), by Dykstra's algorithm (see the module docstring)."""
    v = np.asarray(v, float)
    if len(projections) == 1:
        return projections[0](v)
    x = v.copy()
    increments = [np.zeros_like(x) for _ in projections]
    scale = tol * max(1.0, float(np.max(np.abs(v), initial=0.0)))
    for _ in range(max_cycles):
        start, moved = x, 0.0
        for k, project in enumerate(projections):
            shifted = x + increments[k]
            x = project(shifted)
            moved = max(moved, float(np.max(np.abs(shifted - x - increments[k]), initial=0.0)))
            increments[k] = shifted - x
        # x can stand still for dozens of cycles while the increments still move (a ball ∩ a
        # box: the review's case stopped at a point of the box, not the projection): both still
        if max(moved, float(np.max(np.abs(x - start), initial=0.0))) <= scale and \
                all(np.max(np.abs(x - p(x)), initial=0.0) <= scale for p in projections[:-1]):
            break
    return x


def project_intersection(pieces: list[Piece], v: np.ndarray) -> np.ndarray:
    """The projection of v onto ∩ pieces: a box with one hyperplane or halfspace in closed form
    (`box_hyperplane`: a simplex, a budget), else by Dykstra's algorithm."""
    pieces = [p.current() for p in pieces]
    closed = _box_plane(pieces)
    return project_box_hyperplane(v, *closed[:5]) if closed else dykstra([p.project for p in pieces], v)


def _box_plane(pieces: list[Piece]) -> tuple | None:
    """(a, b, lower, upper, equality, plane) where `pieces` are a box and one halfspace or
    one-row subspace (in closed form: `box_hyperplane`), else None."""
    box, plane = (pieces if isinstance(pieces[0], Box) else pieces[::-1]) if len(pieces) == 2 else (None, None)
    if not isinstance(box, Box) or not (isinstance(plane, Halfspace) or (
            isinstance(plane, Subspace) and plane.Q.shape[0] == 1)):
        return None
    a, b = (plane.a, plane.b) if isinstance(plane, Halfspace) else (plane.Q[0], float(plane.Q[0] @ plane.point))
    return a, b, box.lower, box.upper, isinstance(plane, Subspace), plane


def intersection_residual(pieces: list[Piece], x: np.ndarray, g: np.ndarray,
                          active: float = ACTIVE) -> np.ndarray | None:
    """g plus the element of the normal cone of ∩ pieces at x closest to −g: −P_T(−g), T the
    intersection of the pieces' tangent cones at x, a point within `active` (relative) of a
    piece's boundary counting as on it (None when a piece has no tangent form)."""
    pieces = [p.current() for p in pieces]
    if any(p.tangent(x, np.zeros_like(x), active) is None for p in pieces):
        return None
    closed = _box_plane(pieces)
    if closed:      # a box with a plane: its tangent cone is one too, projected in closed form
        a, _, lower, upper, equality, plane = closed
        return box_plane_residual(x, g, lower, upper, a, equality,
                                  equality or plane.active(x, active), active)
    cones = [lambda v, p=p: p.tangent(x, v, active) for p in pieces]
    return -dykstra(cones, -np.asarray(g, float))


def is_empty(pieces: list[Piece]) -> bool:
    """Whether ∩ pieces is empty: its linear part (boxes, halfspaces, subspaces) by a linear
    program; with Euclidean balls, whether the least-norm point of the linear part (or 0) lies
    outside the smallest ball. (ℓ1 balls are not checked.)"""
    pieces = [p.current() for p in pieces]
    linear = [p for p in pieces if isinstance(p, (Box, Halfspace, Subspace))]
    balls = [p for p in pieces if isinstance(p, Ball)]     # (ellipsoids are not checked)
    if not linear:
        return False
    n = next(p.a.size if isinstance(p, Halfspace) else p.Q.shape[1] if isinstance(p, Subspace)
             else p.lower.size for p in linear)
    lower, upper = np.full(n, -np.inf), np.full(n, np.inf)
    rows, limits, equal_rows, equal_limits = [], [], [], []
    for p in linear:
        if isinstance(p, Box):
            lower, upper = np.maximum(lower, p.lower), np.minimum(upper, p.upper)
        elif isinstance(p, Halfspace):
            rows.append(p.a)
            limits.append(p.b)
        else:
            equal_rows.append(p.Q)
            equal_limits.append(p.Q @ p.point)
    if np.any(lower > upper):
        return True
    from scipy.optimize import linprog     # (here: ~0.3 s CPU to import, only for a linear part)
    found = linprog(np.zeros(n), A_ub=np.array(rows) if rows else None, b_ub=limits or None,
                    A_eq=np.vstack(equal_rows) if equal_rows else None,
                    b_eq=np.concatenate(equal_limits) if equal_limits else None,
                    bounds=list(zip(np.where(np.isinf(lower), None, lower),
                                    np.where(np.isinf(upper), None, upper))), method="highs")
    if found.status == 2:
        return True
    if not balls or found.status != 0:
        return False
    radius = min(b.radius for b in balls)
    nearest = project_intersection(linear, np.zeros(n))
    return float(np.linalg.norm(nearest)) > radius * (1 + 1e-9) + 1e-12
