"""Issue 25: a status that lies is the worst defect. Random small models of the shapes users write
(benchmarks/bench_verdicts.py: Neyman-Pearson with per-client class constraints, least squares
and logistic with client balls and a server ridge, lasso with client boxes, infeasible ones) under
default ProxAL: "converged" must verify against CVXPY, "infeasible" needs CVXPY to say so too.
Also the regressions the sweep found (docs/BENCHMARKS.md, "Verdicts on random small models")."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from benchmarks.bench_verdicts import classify, random_model


def _two_balls():
    """Least squares over 2 clients, client balls of radii 1 (active: the fit has norm ≈ 2.7) and
    3, the smallest model where the certificate meets an intersection of client sets."""
    rng = np.random.default_rng(0)
    truth = np.array([2.0, -1.5, 1.0, 0.5])
    w = fm.Variable(4, name="w")
    prob = fm.Problem("two-balls")
    for i, radius in enumerate((1.0, 3.0)):
        c = prob.add_client(f"c{i}")
        A = rng.standard_normal((12, 4))
        c.minimize(fm.sum_squares(c.data(A, name="A") @ w - A @ truth) / 24)
        c.subject_to(fm.norm2(w) <= radius)
    return prob, w


@pytest.mark.parametrize("inside", [4e-7, 1e-6, 5e-6])
def test_a_point_just_inside_one_of_several_client_balls_is_on_its_boundary(inside):
    """The sweep's first WRONG (ls-ball seed 0): ProxAL "converged" 1.9e-6 from CVXPY's point
    (objective gap 2e-7) with CVXPY's multiplier, 4.2e-7 (relative) inside the active one of 5
    client balls, and verify said NOT OK: KKT stationarity 0.27. A single ball reads a point
    within the certificate's ACTIVE = 1e-5 of its boundary as on it (compiler/sets.py); an
    intersection of balls (one per client: how users write it) read it with the projections'
    1e-7, so the multiplier had no normal to act on. On main: 0.475 here at each `inside`."""
    prob, w = _two_balls()
    ref = prob.solve("cvxpy")
    assert ref.multipliers["c0.con0"] == pytest.approx(3.1127, rel=1e-3)     # active
    x = ref.value(w) * (1.0 - inside) / np.linalg.norm(ref.value(w))
    certificate = prob.kkt_certificate({w.uid: x}, ref.multipliers)
    assert certificate.relative_stationarity < 1e-5
    # an interior point well away from the boundary still has the whole gradient left
    assert prob.kkt_certificate({w.uid: 0.9 * x}, ref.multipliers).relative_stationarity > 0.1


def test_the_sweep_classifies_each_claim_against_cvxpy():
    assert classify("converged", "ok", "converged", True) == "OK"
    assert classify("converged", "ok", "converged", False) == "WRONG"
    assert classify("infeasible", "ok", "converged", False) == "WRONG"
    assert classify("diverged", "ok", "converged", False) == "WRONG"
    assert classify("max_iterations", "ok", "converged", False) == "UNSOLVED"
    assert classify("converged", "ok", "infeasible", False) == "WRONG"
    assert classify("infeasible", "ok", "infeasible", True) == "OK"
    assert classify(None, "refused: no", "converged", None) == "REFUSED"
