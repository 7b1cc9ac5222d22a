"""The closed-form projection onto a box ∩ one hyperplane / halfspace (`compiler.box_hyperplane`,
used by `projection.project_intersection` in place of Dykstra's algorithm there) against CVXPY's
projection, and on the simplex: exact zeros, the sum to round-off."""
import cvxpy as cp
import numpy as np
import pytest

from fedmodel.compiler.projection import (Box, Halfspace, Subspace, dykstra, intersection_residual,
                                          project_intersection)


def _case(seed: int):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 12))
    v = rng.normal(size=d) * 10.0 ** rng.uniform(-3, 3)
    a = rng.normal(size=d) * (rng.random(d) > 0.2)
    a[0] = a[0] or 1.0
    lower = np.where(rng.random(d) < 0.3, -np.inf, rng.normal(size=d) - 1)
    upper = np.where(rng.random(d) < 0.3, np.inf, np.maximum(lower, -3) + 3 * rng.random(d))
    b = float(a @ np.clip(rng.normal(size=d), lower, upper))     # a point of the box: not empty
    equality = seed % 2 == 0
    return v, a, b - (0 if equality else 0.3 * abs(b)), lower, upper, equality


@pytest.mark.parametrize("seed", range(24))
def test_the_projection_is_cvxpy_s(seed):
    v, a, b, lower, upper, equality = _case(seed)
    plane = Subspace(a[None, :], [b]) if equality else Halfspace(a, b)
    x = project_intersection([Box(lower, upper), plane], v)
    z = cp.Variable(v.size)
    sets = [a @ z == b if equality else a @ z <= b]
    sets += [z[i] >= lower[i] for i in range(v.size) if np.isfinite(lower[i])]
    sets += [z[i] <= upper[i] for i in range(v.size) if np.isfinite(upper[i])]
    cp.Problem(cp.Minimize(cp.sum_squares(z - v)), sets).solve(
        solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    assert np.max(np.abs(x - z.value)) <= 1e-7 * max(1.0, np.max(np.abs(v)))
    assert np.all(x >= lower) and np.all(x <= upper)
    assert (abs(a @ x - b) if equality else max(a @ x - b, 0.0)) <= 1e-12 * max(1.0, abs(b), np.abs(a) @ np.abs(x))


def test_the_simplex_exactly_where_dykstra_is_only_near():
    v = np.random.default_rng(0).normal(size=5)
    pieces = [Box(np.zeros(5), np.full(5, np.inf)), Subspace(np.ones((1, 5)), [1.0])]
    x = project_intersection(pieces, v)
    near = dykstra([p.project for p in pieces], v)
    assert np.min(x) == 0.0 and np.all(near[x == 0] != 0)    # Dykstra's zeros: ~1e-13 off
    assert abs(x.sum() - 1.0) <= 1e-15 and np.max(np.abs(x - near)) <= 1e-12


@pytest.mark.parametrize("seed", range(12))
def test_the_optimality_residual_is_dykstra_s_on_the_tangent_cones(seed):
    """At the projection x of v (some bounds active), the residual of a gradient g: the closed
    form on the tangent cone (itself a box ∩ plane) against Dykstra's on the pieces' cones."""
    v, a, b, lower, upper, equality = _case(seed)
    plane = Subspace(a[None, :], [b]) if equality else Halfspace(a, b)
    pieces = [Box(lower, upper), plane]
    x = project_intersection(pieces, v)
    g = np.random.default_rng(seed + 100).normal(size=v.size)
    cones = [lambda u, p=p: p.tangent(x, u) for p in pieces]
    expected = -dykstra(cones, -g)
    np.testing.assert_allclose(intersection_residual(pieces, x, g), expected, rtol=0, atol=1e-9)


def test_dykstra_goes_on_while_its_increments_move():
    """The review: on a ball ∩ a box, Dykstra's x stood still for dozens of cycles while its
    increments moved, and the stop took it: [0.0924]*4, a point of the box, not the projection
    (here the ball's own projection, inside the box)."""
    from fedmodel.compiler.projection import Ball
    v = np.array([0.8627, 0.9139, 0.9762, 0.8661])
    x = project_intersection([Box(np.full(4, -np.inf), np.full(4, 0.1108)), Ball(0.1847)], v)
    np.testing.assert_allclose(x, 0.1847 * v / np.linalg.norm(v), atol=1e-9)
