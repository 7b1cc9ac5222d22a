"""Variables held in projected sets are equilibrated too (issue 25, item 1;
`compiler/scaling.py`): a ball's variable gets one scalar δ (‖δv‖ ≤ r is the ball ‖v‖ ≤ r/δ), a
bounded one per-column scales (u ÷ D), and the scaled constraint is still recognized as the same
set (`sets.simple_set`), with the radius and bounds of the units v. Before, such a variable kept
w = v, and a ball sized in other units with the data (or a box beside columns in units 1e-4 …
1e5) left the backends in the user's units: stalled, capped, or 8e-4 off at "converged"."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.compiler.canonical import reformulate
from fedmodel.compiler.codegen import Plan
from fedmodel.compiler.scaling import equilibrate
from fedmodel.compiler.sets import simple_set

COLUMNS = np.array([1e-3, 1.0, 1e3])     # the units of a researcher's raw table


def _least_squares(scale: float = 1.0, columns=np.ones(3), seed: int = 0):
    """Two clients' least squares, features ×`scale` (the answer ×1/`scale`), columns in units
    `columns`."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    for i in range(2):
        A = rng.normal(size=(12, 3)) * columns
        b = A @ (np.array([2.0, -1.0, 1.0]) / columns) + 0.1 * rng.normal(size=12)
        client = prob.add_client(f"c{i}")
        client.minimize(fm.sum_squares(client.data(scale * A) @ w - client.data(b)))
    return prob, w


def _scaled_set(prob, name: str):
    """(the set the scaled copy's constraint `name` is recognized as, w's factors D)."""
    model = equilibrate(prob)
    constraint = next(c for c in model.problem.constraints if c.name == name)
    w = model.original.variables()[0]
    return simple_set(constraint, affine=True), model.scaling.variables[w.uid]


RADIUS = fm.Parameter(nonneg=True, value=0.25, name="radius")
BALLS = {   # how users write ‖w‖ ≤ 0.25: (constraint, kind, radius)
    "norm2": (lambda w: fm.norm2(w) <= 0.25, "ball2", 0.25),
    "2·norm2": (lambda w: 2 * fm.norm2(w) <= 0.5, "ball2", 0.25),
    "r >= norm2": (lambda w: 0.25 >= fm.norm2(w), "ball2", 0.25),
    "sum_squares": (lambda w: fm.sum_squares(w) <= 0.0625, "ball2", 0.25),
    "quad_form": (lambda w: fm.quad_form(w, np.eye(3)) <= 0.0625, "ball2", 0.25),
    "parameter": (lambda w: fm.norm2(w) <= RADIUS, "ball2", 0.25),
    "norm1": (lambda w: fm.norm1(w) <= 0.25, "ball1", 0.25),
    "norm_inf": (lambda w: fm.norm_inf(w) <= 0.25, "ballinf", 0.25)}


@pytest.mark.parametrize("writing", list(BALLS))
def test_a_scaled_ball_is_the_ball_of_radius_r_over_delta(writing):
    build, kind, radius = BALLS[writing]
    for scale in (1e-3, 1e3):
        prob, w = _least_squares(scale)
        prob.clients[0].subject_to(build(w))
        found, D = _scaled_set(prob, "c0.con0")
        assert np.all(D == D.flat[0]) and D.flat[0] != 1.0      # one δ for the ball's variable
        assert found is not None and found.kind == kind, (writing, found)
        piece = found.pieces[0].current()
        got = piece.upper[0] if kind == "ballinf" else piece.radius
        assert got == pytest.approx(radius / D.flat[0], rel=1e-12)


def test_scaled_bounds_are_bounds_over_the_column_scales_and_halfspaces_stay():
    prob, w = _least_squares(columns=COLUMNS)
    upper = 0.5 / COLUMNS
    prob.server.subject_to(w <= upper, w >= -upper, COLUMNS @ w <= 0.0)
    model = equilibrate(prob)
    D = model.scaling.variables[w.uid]
    assert 1e-7 < D[2] / D[0] < 1e-5               # per-column scales (≈ 1e-6), as if free
    found = {c.name: simple_set(c, affine=True) for c in model.problem.constraints}
    assert found["server.con0"].kind == "upper" and found["server.con1"].kind == "lower"
    np.testing.assert_allclose(found["server.con0"].box[1], upper / D, rtol=1e-12)
    np.testing.assert_allclose(found["server.con1"].box[0], -upper / D, rtol=1e-12)
    assert found["server.con2"].kind == "halfspace"


def test_the_scaled_ball_does_not_change_with_the_data_units():
    # the sets a backend sees (projected, or made smooth for the augmented Lagrangian) are the
    # same at data ×10^k with the radius ×10^−k: DALD's clients' smooth form (‖δv‖² − r²)/2r
    # was ∝ 10^−k (43 rounds at k = −6 where k = 0 took 24, stalled 17 off at k = 6)
    v = np.array([0.3, -0.2, 0.1])
    forms = []
    for k in (-6, 0, 6):
        prob, w = _least_squares(10.0 ** k)
        prob.clients[0].subject_to(fm.norm2(w) <= 10.0 ** -k)
        constraint = equilibrate(prob).problem.clients[0].constraints[0]
        smooth = reformulate(constraint)[0].expr
        forms.append([simple_set(constraint).pieces[0].radius,
                      float(Plan([smooth], smooth.variables())(v)[0])])
    np.testing.assert_allclose(forms[0], forms[1], rtol=1e-9)
    np.testing.assert_allclose(forms[2], forms[1], rtol=1e-9)


def test_answers_and_multipliers_of_scaled_sets_are_in_the_users_units():
    # CVXPY on the equilibrated copy (the default) against CVXPY on the model as written: the
    # same point and the same multipliers of the bounds and the halfspace (columns in units
    # 1e-3 … 1e3: r per row), and of a ball (data ×1e3)
    boxed, w = _least_squares(columns=COLUMNS)
    boxed.server.subject_to(w <= 0.1 / COLUMNS, COLUMNS @ w >= -1.0)
    ball, u = _least_squares(1e3)
    ball.clients[0].subject_to(fm.norm2(u) <= 1e-3)
    for prob, var, units in ((boxed, w, COLUMNS), (ball, u, 1e3)):
        scaled, plain = prob.solve("cvxpy"), prob.solve("cvxpy", scaling=False)
        factors = scaled.info["scaling"]["constraints"]     # (halfspaces keep r = 1)
        assert all(r != 1.0 for name, r in factors.items() if name != "server.con1"), factors
        np.testing.assert_allclose(units * scaled.value(var), units * plain.value(var), atol=1e-6)
        assert set(scaled.multipliers) == set(plain.multipliers)
        for name, mu in plain.multipliers.items():
            assert np.max(np.abs(mu)) > 1e-3 or name == "server.con1"    # active sets
            np.testing.assert_allclose(scaled.multipliers[name], mu,
                                       atol=1e-6 * max(1.0, float(np.max(np.abs(mu)))))
