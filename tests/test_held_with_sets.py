"""A client that holds a data constraint (a·w ≤ b, held in its local solves) and projects on a
set (w ≥ l) at once: the certificate reads the normal cone of their intersection (the sum of the
cones, `local_al.remainder_rows` with `set_normals`), not one cone after the other. Before, a
client holding only constraints (no objective) with both active left ProxAL's certificate (22)
at 0.19: every ADMM run ended at its stall limit, 100 outer runs of 100 iterations (minutes),
where CVXPY takes 0.03 s (newuser9's reproducer nu9_constraint_only_client_proxal_hang.py)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.optimize import nnls

import fedmodel as fm
from fedmodel.backends import ProxAL
from fedmodel.compiler.projection import Ball, Box, Ellipsoid, Halfspace, Subspace


def _model(scale: float = 1.0):
    rng = np.random.default_rng(4)
    truth = rng.normal(size=4)
    w = fm.Variable(4, name="w")
    prob = fm.Problem()
    for i, n in enumerate((8, 20, 50)):
        X = rng.normal(loc=0.3 * i, size=(n, 4)) * scale
        y = X @ truth + 0.1 * scale * rng.normal(size=n)
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)) / 78)
    c = prob.add_client("c3")                # constraints only, no objective
    c.subject_to(w >= -0.2, c.data(np.array([1.0, 2.0, 0.5, 1.0])) @ w <= c.data(np.array(0.5)))
    prob.server.minimize(1e-3 * scale ** 2 * fm.sum_squares(w))
    return prob, w


@pytest.mark.parametrize("executor, scale", [("serial", 1.0), ("batched", 1.0), ("serial", 1e-3), ("serial", 1e3)])
def test_a_client_of_constraints_only_converges(executor, scale):
    """ProxAL converges within 5 outer iterations to CVXPY's answer (w0 = w1 = −0.2 and
    a·w = 0.5 all active), also with the least-squares data in other units (the answer is the
    same); before: max_iterations at 5 outer × 100 ADMM iterations."""
    prob, w = _model(scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = prob.solve("cvxpy").value(w)
        res = prob.solve(ProxAL(max_outer=5), executor=executor)
    assert res.status == "converged"
    assert res.iterations["inner"] < 150
    np.testing.assert_allclose(res.value(w), ref, atol=1e-5 * np.max(np.abs(ref)))
    assert ref[0] == pytest.approx(-0.2, abs=1e-6) and ref[1] == pytest.approx(-0.2, abs=1e-6)


def _moreau(piece, x, v):
    """v − P_N(v), N the cone of the piece's normals at x (nonnegative least squares)."""
    normals = piece.normals(x)
    if not len(normals):
        return v
    coefficients, _ = nnls(normals.T, v)
    return v - normals.T @ coefficients


@pytest.mark.parametrize("seed", range(5))
def test_piece_normals_span_the_normal_cone(seed):
    """Moreau: v = P_T(v) + P_N(v) with T the tangent cone (`Piece.tangent`, projected in closed
    form) and N = cone(normals): the normals' cone is the polar of the tangent cone, for points
    on each piece's boundary, inside it, and on several faces of a box."""
    rng = np.random.default_rng(seed)
    n = 5
    x = rng.normal(size=n)
    e = rng.uniform(0.5, 3.0, size=n)
    a = rng.normal(size=n)
    lower, upper = x - np.r_[0.0, 0.0, rng.uniform(0.1, 1, n - 2)], x + np.r_[rng.uniform(0.1, 1, 2), 0.0, 0.0, 1.0]
    pieces = [Ball(np.linalg.norm(x)), Ball(2 * np.linalg.norm(x)), Ellipsoid(e, np.linalg.norm(e * x)),
              Box(lower, upper), Halfspace(a, float(a @ x)), Halfspace(a, float(a @ x) + 1.0),
              Subspace(rng.normal(size=(2, n)), rng.normal(size=2))]
    pieces[-1] = Subspace(pieces[-1].rows, pieces[-1].rows @ x)       # x on it
    for piece in pieces:
        for _ in range(3):
            v = rng.normal(size=n)
            np.testing.assert_allclose(_moreau(piece, x, v), piece.tangent(x, v), atol=1e-9)
