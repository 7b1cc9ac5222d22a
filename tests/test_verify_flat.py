"""`fm.verify` on models whose minimizers are not a point (fedmodel/solution_set.py): a point
moved from CVXPY's answer along directions the model cannot see (the null space of the maps
through which the variables enter) is another minimizer and passes; a move across them fails
by its own size, as before."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import solution_set
from fedmodel.backends.base import finish_result

RTOL = 1e-3
MOVE = 1e-2


def one_hot_model(constrained: bool = True):
    """Logistic loss on one-hot rows (two groups of 3 columns: rank 5 of 6, so the minimizers
    are w* + t·(1,1,1,−1,−1,−1)) over 3 clients, and a bound on the first weight (its map sees
    that direction: only the objective's null space is flat, the constraint checked at z)."""
    rng = np.random.default_rng(3)
    w = fm.Variable(6, name="w")
    prob = fm.Problem(name="one-hot")
    for i in range(3):
        rows = np.zeros((40, 6))
        rows[np.arange(40), rng.integers(0, 3, 40)] = 1.0
        rows[np.arange(40), 3 + rng.integers(0, 3, 40)] = 1.0
        labels = np.where(rng.random(40) < 0.5 + 0.3 * rows[:, 0] - 0.3 * rows[:, 4], 1.0, -1.0)
        client = prob.add_client(f"c{i}")
        client.minimize(fm.mean(fm.logistic(-(client.data(labels[:, None] * rows, name="Z") @ w))) / 3)
    if constrained:
        prob.server.subject_to((w[0] <= 5.0).named("cap"))
    return prob, w


FLAT = np.array([1.0, 1.0, 1.0, -1.0, -1.0, -1.0]) / np.sqrt(6)


def moved(reference: fm.Result, w, step: np.ndarray) -> fm.Result:
    """`reference` at w* + step, evaluated again as a backend would report it, "converged"."""
    values = dict(reference.values)
    values[w.uid] = reference.values[w.uid] + step
    outcome = {"status": "converged", "values": values, "multipliers": reference.multipliers,
               "iterations": {}, "history": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        point = finish_result(reference.problem, "moved", outcome, 0.0)
    return dataclasses.replace(reference, backend="moved", status="converged", values=point.values,
                               objective=point.objective, max_violation=point.max_violation,
                               certificate=point.certificate)


@pytest.fixture(scope="module")
def solved():
    prob, w = one_hot_model()
    reference = prob.solve("cvxpy")
    assert reference.status == "converged"
    return prob, w, reference


def test_the_null_space_is_the_one_hot_groups_direction(solved):
    prob, w, _ = solved
    objective = [m for term in prob.objective_terms for m in solution_set.maps(term)]
    N = solution_set.null_space(solution_set.jacobian(objective, prob.variables()), 6)
    assert N.shape == (6, 1)
    assert abs(float(N[:, 0] @ FLAT)) == pytest.approx(1.0, abs=1e-9)
    # with the bound's map (w[0]) stacked too, no direction is left
    every = objective + solution_set.maps(prob.constraints[0].expr)
    assert solution_set.null_space(solution_set.jacobian(every, prob.variables()), 6).shape == (6, 0)


@pytest.mark.parametrize("seed", range(4))
def test_a_move_along_the_null_space_passes_and_one_across_it_fails(solved, seed):
    prob, w, reference = solved
    size = float(np.max(np.abs(reference.values[w.uid])))
    rng = np.random.default_rng(seed)
    across = rng.uniform(-1.0, 1.0, 6)
    across -= (across @ FLAT) * FLAT                   # orthogonal to the flat direction
    across *= MOVE * size / np.max(np.abs(across))
    along = -(0.5 + rng.random()) * size * FLAT         # far (~size/2 in the ∞-norm), w[0] lower

    good = fm.verify(moved(reference, w, along), reference, rtol=RTOL)
    assert good.ok, str(good)
    assert good.solution_distance <= 1e-9
    assert "solution set not a point: distance measured modulo a 1-dimensional subspace" in str(good)

    bad = fm.verify(moved(reference, w, along + across), reference, rtol=RTOL)
    assert not bad.ok and "solution distance" in bad.failed, str(bad)
    # measured from the minimizer along the flat direction: the across part's own size
    assert bad.solution_distance == pytest.approx(MOVE, rel=1e-6)


def test_a_minimizer_past_the_bound_is_not_taken(solved):
    """Along the flat direction far enough that w[0] passes its cap: z would violate the
    bound (checked at z, not assumed), so the distance is measured from CVXPY's point and the
    result — itself infeasible — fails."""
    prob, w, reference = solved
    step = (5.0 - reference.values[w.uid][0] + 1.0) * np.sqrt(6) * FLAT   # w[0] = 6 > 5
    report = fm.verify(moved(reference, w, step), reference, rtol=RTOL)
    assert not report.ok
    assert {"solution distance", "feasibility"} <= set(report.failed), str(report)
    assert report.solution_distance > 0.1
    assert "solution set not a point" not in str(report)


def test_without_a_constraint_the_whole_model_null_space_is_the_objective_s():
    prob, w = one_hot_model(constrained=False)
    reference = prob.solve("cvxpy")
    size = float(np.max(np.abs(reference.values[w.uid])))
    report = fm.verify(moved(reference, w, 3 * size * FLAT), reference, rtol=RTOL)
    assert report.ok and report.solution_distance <= 1e-9, str(report)


def test_a_term_on_w_itself_leaves_no_flat_direction():
    """A server ridge sees every direction (its map is the identity): the minimizer is a point
    and a move along the one-hot direction fails as any other."""
    prob, w = one_hot_model()
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    reference = prob.solve("cvxpy")
    size = float(np.max(np.abs(reference.values[w.uid])))
    report = fm.verify(moved(reference, w, MOVE * size * np.sqrt(6) * FLAT), reference, rtol=RTOL)
    assert not report.ok and report.failed == ["solution distance"], str(report)
    assert report.solution_distance == pytest.approx(MOVE, rel=1e-6)
    assert "solution set not a point" not in str(report)


def test_the_jacobian_without_direction_rules_is_the_same(solved, monkeypatch):
    """The per-column fallback (an affine atom with no rule for many directions) gives the
    batched Jacobian's numbers."""
    prob, _, _ = solved
    objective = [m for term in prob.objective_terms for m in solution_set.maps(term)]
    batched = solution_set.jacobian(objective, prob.variables())

    class NoDirections(solution_set.Plan):
        def __init__(self, outputs, inputs, batched=()):
            if batched:
                raise solution_set.Unbatchable("no rule")
            super().__init__(outputs, inputs)

    monkeypatch.setattr(solution_set, "Plan", NoDirections)
    by_column = solution_set.jacobian(objective, prob.variables())
    np.testing.assert_allclose(by_column, batched, rtol=0, atol=1e-14)
    assert batched.shape == (120, 6)
