"""Clients' (and the server's) sets with no common point are "infeasible" before any backend runs
(issue 25, item 4; compiler/feasibility.py). The independent answer is CVXPY's status and, for
the feasible neighbours, CVXPY's solution or a closed form (sets that touch in one point)."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.compiler.feasibility import sets_apart
from test_infeasible import least_squares as _least_squares, quiet_solve as quiet

ALL = ["proxal", "cproxal", "dald", "fedadmm", "fedprox", "fedavg", "dgd", "dp-admm", "auto"]


def least_squares(n: int = 4, d: int = 3):
    return _least_squares(n, d)


@pytest.fixture(scope="module")
def two_boxes():
    """c0: w ≤ −1, c1: w ≥ 1 (newuser2's item 3), and CVXPY's verdict on it."""
    prob, w = least_squares()
    prob.clients[0].subject_to(w <= -1)
    prob.clients[1].subject_to(w >= 1)
    reference = prob.solve("cvxpy")
    assert reference.status == "infeasible"
    return prob, w, reference


@pytest.mark.parametrize("backend", ALL)
def test_two_client_boxes_apart_are_infeasible_under_every_backend(two_boxes, backend):
    prob, w, reference = two_boxes
    result, warned = quiet(prob, backend)
    assert result.status == "infeasible"
    assert result.info["sets_apart"] == ["c0.con0", "c1.con0"]
    message = result.info["infeasible"]
    assert "'c0.con0' of c0" in message and "'c1.con0' of c1" in message
    assert any("no common point" in m for m in warned)
    assert result.values == {} and not any(result.iterations.values()) and result.ledger.round_trips == 0
    with pytest.raises(fm.FedModelError, match="without a point"):
        result.value(w)
    report = fm.verify(result, reference)
    assert report.ok and "both say the model is infeasible" in str(report)


@pytest.mark.parametrize("backend", ["proxal", "dald"])
def test_a_feasible_neighbour_still_solves(backend):
    """w ≤ 1 in c0, w ≥ −1 in c1: a box around the unconstrained answer."""
    prob, w = least_squares()
    prob.clients[0].subject_to(w <= 1)
    prob.clients[1].subject_to(w >= -1)
    result, warned = quiet(prob, backend)
    assert result.status == "converged" and not warned
    assert fm.verify(result, prob.solve("cvxpy")).ok


def test_boxes_that_touch_are_not_apart():
    for low, high in ((0.0, 0.0), (1.0, 1.0), (-1e-9, 1e-9), (1e9, 1e9)):
        prob, w = least_squares()
        prob.clients[0].subject_to(w <= high)
        prob.clients[1].subject_to(w >= low)
        assert sets_apart(prob) is None
    prob.clients[2].subject_to(w <= 1e9 * (1 - 1e-5))   # apart by 1e-5 relative: beyond the margin
    assert sets_apart(prob).names == ["c1.con0", "c2.con0"]


@pytest.mark.integration      # ~2 s each: the ADMM crawls to a point intersection
@pytest.mark.parametrize("backend", ["proxal", "dald"])
def test_boxes_that_touch_in_one_point_still_solve(backend):
    """w ≤ 1 in c0, w ≥ 1 in c1: the intersection is the point (1, 1, 1), the answer. (At the
    point 0 verify's relative distance has no scale: the same runs fail it there, as before.)"""
    prob, w = least_squares()
    prob.clients[0].subject_to(w <= 1)
    prob.clients[1].subject_to(w >= 1)
    assert sets_apart(prob) is None
    result, _ = quiet(prob, backend)
    assert result.status == "converged"
    np.testing.assert_allclose(result.value(w), 1.0, atol=1e-5)
    assert fm.verify(result, prob.solve("cvxpy")).ok


def test_a_ball_and_a_tangent_halfspace_meet_in_one_point():
    # ‖w‖ ≤ 1 on the server, sum(w) ≥ 2 in c0 (d = 4): the halfspace is 2/‖1‖ = 1 from 0, so
    # the sets meet at w = (½, ½, ½, ½) only; sum(w) ≥ 2.01 misses the ball
    for bound, apart in ((2.0, False), (2.01, True)):
        prob, w = least_squares(d=4)
        prob.server.subject_to((fm.norm2(w) <= 1).named("ball"))
        prob.clients[0].subject_to((fm.sum(w) >= bound).named("half"))
        found = sets_apart(prob)
        assert (found is not None) == apart
        if apart:
            assert found.names == ["ball", "half"]
    result, _ = quiet(prob, "fedadmm")
    assert result.status == "infeasible" and prob.solve("cvxpy").status == "infeasible"


def test_round_off_in_the_constants_is_not_apart():
    prob, w = least_squares()
    prob.clients[0].subject_to(w <= 0.3)
    prob.clients[1].subject_to(w >= 0.1 * 3)      # 0.30000000000000004 > 0.3
    assert sets_apart(prob) is None


def test_a_shifted_ball_apart_from_a_halfspace():
    # ‖w − (3, 0, 0)‖ ≤ 1 in c0, w₀ ≤ 1.5 on c1 (distance 1.5 from the centre); w₀ ≤ 2 touches it
    for bound, apart in ((1.5, True), (2.0, False)):
        prob, w = least_squares()
        prob.clients[0].subject_to(fm.norm2(w - np.array([3.0, 0.0, 0.0])) <= 1)
        prob.clients[1].subject_to(np.array([1.0, 0.0, 0.0]) @ w <= bound)
        assert (sets_apart(prob) is not None) == apart
    prob.clients[2].subject_to(fm.norm2(2 * w + np.array([0.0, 0.0, 8.0])) <= 2)   # ‖w + 4e₂‖ ≤ 1
    assert sets_apart(prob).names == ["c0.con0", "c2.con0"]          # 5 apart, radii 1 + 1
    result, _ = quiet(prob, "proxal")
    assert result.status == "infeasible" and prob.solve("cvxpy").status == "infeasible"


def test_a_server_ball_apart_from_a_client_box_names_only_those_two():
    prob, w = least_squares(d=4)
    prob.server.subject_to((fm.norm2(w) <= 1.5).named("ball"))   # w ≥ 1's nearest point has norm 2
    prob.clients[0].subject_to((w <= 5).named("wide"))           # meets both: not named
    prob.clients[2].subject_to((w >= 1).named("box"))
    result, _ = quiet(prob, "dald")
    assert result.status == "infeasible" and result.info["sets_apart"] == ["ball", "box"]
    assert prob.solve("cvxpy").status == "infeasible"


def test_sets_that_read_client_data_are_not_looked_at():
    # a·w ≤ −1 with a a client's data and sum(w) ≥ 1 are apart (a = 1), but the server may not
    # learn client data: the run decides it, as before
    prob, w = least_squares()
    c0 = prob.clients[0]
    c0.subject_to(c0.data(np.ones(3), name="a") @ w <= -1)
    prob.clients[1].subject_to(fm.sum(w) >= 1)
    assert sets_apart(prob) is None


def ball_and_box(radius: float):
    """Server ‖w‖ ≤ r (a Parameter), c0's w ≥ ½ (d = 4: its least-norm point has norm 1)."""
    prob, w = least_squares(d=4)
    r = fm.Parameter(name="r", nonneg=True, value=radius)
    prob.server.subject_to((fm.norm2(w) <= r).named("ball"))
    prob.clients[0].subject_to((w >= 0.5).named("box"))
    return prob, r


def test_a_parameter_radius_is_read_at_each_check():
    prob, r = ball_and_box(2.0)
    found = []
    for radius in (2.0, 0.9, 1.0, 1.2):      # 1.0: the ball touches the box at (½, ½, ½, ½)
        r.value = radius
        found.append(sets_apart(prob))
    assert [f is None for f in found] == [True, False, True, True]
    assert found[1].names == ["ball", "box"]
    r.value = 0.9
    result, _ = quiet(prob, "proxal")
    assert result.status == "infeasible" and prob.solve("cvxpy").status == "infeasible"


@pytest.mark.integration     # three ProxAL and three CVXPY solves (~2 s)
def test_a_parameter_radius_changed_between_solves():
    prob, r = ball_and_box(2.0)
    statuses = []
    for radius in (2.0, 0.9, 1.2):
        r.value = radius
        result, _ = quiet(prob, "proxal")
        reference = prob.solve("cvxpy")
        statuses.append((result.status, reference.status))
        assert fm.verify(result, reference).ok
    assert statuses == [("converged", "converged"), ("infeasible", "infeasible"), ("converged", "converged")]


def test_affine_subspaces_apart_and_one_that_meets():
    prob, w = least_squares()
    a = np.array([1.0, 1.0, 0.0])
    prob.server.subject_to((a @ w == 1).named("one"))
    prob.clients[3].subject_to((w[2] == 5).named("third"))          # meets the plane
    assert sets_apart(prob) is None
    prob.clients[1].subject_to((2 * (a @ w) == 3).named("one and a half"))
    result, _ = quiet(prob, "dald")
    assert result.status == "infeasible" and result.info["sets_apart"] == ["one", "one and a half"]
    assert prob.solve("cvxpy").status == "infeasible"
