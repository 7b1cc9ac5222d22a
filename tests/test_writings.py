"""Writings and errors (issue 25, item 5): a ball is a ball however it is written; halfspaces,
hyperplanes, boxes and intersections of them are projected in FedADMM's and DP-ADMM's server and
client steps (closed forms; intersections by Dykstra's algorithm, fedmodel/compiler/projection.py)
and their answers are CVXPY's; a Parameter declared nonneg/nonpos keeps a model convex and is
checked on assignment; a misspelt backend option names the closest one; an unwritable checkpoint
directory is refused before the run."""
from __future__ import annotations

import os
import tempfile
import warnings

import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel import backends
from fedmodel.compiler.canonical import PROJECT_ALL, canonical_constraints
from fedmodel.compiler.projection import (Ball, Box, Halfspace, Subspace, intersection_residual,
                                          project_intersection)
from fedmodel.compiler.sets import simple_set
from fedmodel.runtime.checkpoint import CheckpointError
from fedmodel.runtime.program import compile_programs

TRUTH = np.array([1.0, -2.0, 0.5, 1.5])
A_ROW = np.ones(4)


def least_squares(n: int = 3, seed: int = 0):
    """Σ_i ‖A_i w − b_i‖²/20 over n clients; unconstrained minimizer ≈ TRUTH (Σ TRUTH = 1)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(4, name="w")
    prob = fm.Problem(name="lsq")
    for i in range(n):
        client = prob.add_client(f"c{i}")
        A = rng.standard_normal((20, 4))
        b = A @ TRUTH + 0.1 * rng.standard_normal(20)
        client.minimize(fm.sum_squares(client.data(A, name="A") @ w - client.data(b, name="b")) / 20)
    return prob, w


def relative_distance(x: np.ndarray, reference: np.ndarray) -> float:
    return float(np.max(np.abs(x - reference)) / np.max(np.abs(reference)))


def solve_quietly(prob, backend):
    """A solve that must not warn (a "not a solution" or divergence warning fails the test)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return prob.solve(backend)


# ---- 1. a ball is a ball however written -----------------------------------------------------
BALLS = {
    "norm2(w) <= r": lambda w: fm.norm2(w) <= 1.2,
    "sum_squares(w) <= r**2": lambda w: fm.sum_squares(w) <= 1.2 ** 2,
    "quad_form(w, I) <= r**2": lambda w: fm.quad_form(w, np.eye(4)) <= 1.2 ** 2,
    "quad_form(w, 2I) <= 2r**2": lambda w: fm.quad_form(w, 2 * np.eye(4)) <= 2 * 1.2 ** 2,
    "norm2(w)**2 <= r**2": lambda w: fm.norm2(w) ** 2 <= 1.2 ** 2,
    "r >= norm2(w)": lambda w: 1.2 >= fm.norm2(w),
    "2*norm2(w) <= 2r": lambda w: 2 * fm.norm2(w) <= 2.4,
}


@pytest.mark.parametrize("writing", list(BALLS))
def test_a_ball_is_recognised_however_written(writing):
    w = fm.Variable(4, name="w")
    term = simple_set(BALLS[writing](w))
    assert term is not None and term.kind == "ball2" and term.variable is w
    v = np.array([3.0, -1.0, 2.0, 0.5])
    np.testing.assert_allclose(term.prox(v, 1.0), 1.2 * v / np.linalg.norm(v), rtol=1e-14)
    prob, w = least_squares()          # wherever sets are recognised: ProxAL's server projects it
    prob.server.subject_to(BALLS[writing](w))
    server = compile_programs(prob)["server"]
    assert [t.kind for t in server.merit_ir.prox_terms] == ["ball2"] and not server.constraints


@pytest.mark.parametrize("writing", list(BALLS))
def test_a_ball_however_written_solves_under_fedadmm(writing):
    """The server ball is active (‖TRUTH‖ ≈ 2.7 > 1.2): FedADMM (which refused sum_squares and
    quad_form before) projects on it and lands on CVXPY's answer."""
    prob, w = least_squares()
    prob.server.subject_to(BALLS[writing](w))
    reference = prob.solve("cvxpy")
    result = solve_quietly(prob, backends.FedADMM())
    assert result.status == "converged"
    assert relative_distance(result.value(w), reference.value(w)) <= 1e-4
    assert np.linalg.norm(result.value(w)) == pytest.approx(1.2, rel=1e-8)
    assert fm.verify(result, reference).ok


# ---- 2. halfspaces, hyperplanes, boxes and intersections, projected --------------------------
SETS = {
    "halfspace": lambda w: [A_ROW @ w <= 0.5],
    "hyperplane": lambda w: [A_ROW @ w == 0.5],
    "box": lambda w: [w >= -1.0, w <= np.array([0.5, 1.0, 0.2, 1.0])],
    "ball-and-halfspace": lambda w: [fm.sum_squares(w) <= 2.0, A_ROW @ w <= 0.5],
    "two-halfspaces": lambda w: [A_ROW @ w <= 0.5, w[0] - w[1] <= 2.0],
}


@pytest.mark.parametrize("backend", ["fedadmm", "dp-admm"])
@pytest.mark.parametrize("kind", list(SETS))
def test_server_sets_are_projected_and_solve_to_cvxpy(kind, backend):
    """Every set is active at the solution (the unconstrained minimizer has Σw ≈ 1, w₀ − w₁ ≈ 3
    and entries beyond the box); FedADMM and DP-ADMM (non-private default) refused all but the
    box before."""
    prob, w = least_squares()
    prob.server.subject_to(*SETS[kind](w))
    reference = prob.solve("cvxpy")
    result = solve_quietly(prob, backend)
    assert result.status == "converged"
    assert relative_distance(result.value(w), reference.value(w)) <= 1e-4
    assert result.max_violation <= 1e-8
    assert fm.verify(result, reference).ok
    assert result.certificate.stationarity <= 1e-6
    affine = {"box": (), "ball-and-halfspace": ("server.con1",)}.get(kind, tuple(reference.multipliers))
    for name in affine:            # reported for the projected affine sets (bounds, balls: not needed)
        mu = reference.multipliers[name]
        np.testing.assert_allclose(result.multipliers[name], mu, atol=1e-5 * max(1.0, np.max(np.abs(mu))))


@pytest.mark.parametrize("backend", ["fedadmm", "dp-admm"])
@pytest.mark.parametrize("kind", ["halfspace", "hyperplane", "ball-and-halfspace"])
def test_client_sets_are_projected_and_solve_to_cvxpy(kind, backend):
    prob, w = least_squares()
    prob.clients[1].subject_to(*SETS[kind](w))
    reference = prob.solve("cvxpy")
    result = solve_quietly(prob, backend)
    assert result.status == "converged"
    assert relative_distance(result.value(w), reference.value(w)) <= 1e-4
    assert fm.verify(result, reference).ok
    assert result.certificate.stationarity <= 1e-6
    for name, mu in reference.multipliers.items():
        if kind != "ball-and-halfspace" or name.endswith("con1"):
            np.testing.assert_allclose(result.multipliers[name], mu, atol=1e-5 * max(1.0, np.max(np.abs(mu))))


def test_ball_and_bounds_on_one_client_are_their_intersection():
    """Before: refused ("one norm ball per variable"), since projecting on each in turn is not
    the projection onto both; now one intersection, projected by Dykstra's algorithm."""
    prob, w = least_squares()
    prob.clients[0].subject_to(fm.norm2(w) <= 1.5, w >= -0.8)
    reference = prob.solve("cvxpy")
    result = solve_quietly(prob, backends.FedADMM())
    assert result.status == "converged"
    assert relative_distance(result.value(w), reference.value(w)) <= 1e-4
    # both active, to FedADMM's tolerance (1e-8, in the equilibrated model's units)
    assert result.value(w).min() == pytest.approx(-0.8, abs=1e-8)
    assert np.linalg.norm(result.value(w)) == pytest.approx(1.5, rel=1e-8)


@pytest.mark.parametrize("backend", ["proxal", "dald"])
def test_server_ball_and_bounds_are_projected_as_their_intersection(backend):
    """ProxAL's and DALD's server projections: before, the ball's then the bounds' projection in
    turn, and both backends "converged" 11-12 % away from CVXPY's answer."""
    prob, w = least_squares()
    prob.server.subject_to(fm.norm2(w) <= 1.5, w >= -0.8)
    reference = prob.solve("cvxpy")
    result = solve_quietly(prob, backend)
    assert result.status == "converged"
    assert relative_distance(result.value(w), reference.value(w)) <= 1e-4
    assert fm.verify(result, reference).ok


def cvxpy_projection(v: np.ndarray, constraints) -> np.ndarray:
    x = cp.Variable(v.size)
    cp.Problem(cp.Minimize(cp.sum_squares(x - v)), constraints(x)).solve(solver=cp.CLARABEL)
    return x.value


@pytest.mark.parametrize("seed", range(5))
def test_dykstra_projects_onto_the_intersection(seed):
    """Ball ∩ two halfspaces ∩ box ∩ hyperplane: Dykstra's point is CVXPY's projection (Clarabel
    is ~1e-5 off on this cone program), and exactly the projection: in every set (1e-10) and the
    normal-cone residual of x − v (the projection's optimality condition) is 0 (1e-8)."""
    rng = np.random.default_rng(seed)
    a1, a2, c = rng.standard_normal(5), rng.standard_normal(5), rng.standard_normal(5)
    pieces = [Ball(1.0), Halfspace(a1, 0.1), Halfspace(a2, -0.2), Box(np.full(5, -0.6), np.full(5, 0.7)),
              Subspace(c[None, :], np.array([0.05]))]
    v = 3 * rng.standard_normal(5)
    x = project_intersection(pieces, v)
    reference = cvxpy_projection(v, lambda y: [cp.norm(y, 2) <= 1.0, a1 @ y <= 0.1, a2 @ y <= -0.2,
                                               y >= -0.6, y <= 0.7, c @ y == 0.05])
    np.testing.assert_allclose(x, reference, atol=1e-4)
    assert max(p.distance(x) for p in pieces) <= 1e-10
    assert np.max(np.abs(intersection_residual(pieces, x, x - v))) <= 1e-8


def test_two_inconsistent_halfspaces_are_infeasible_before_the_run():
    # (they were a FedModelError when FedADMM / DP-ADMM compiled them, and ProxAL's run said
    # "infeasible": now every backend says so before the run, compiler/feasibility.py)
    prob, w = least_squares()
    prob.server.subject_to((fm.sum(w) >= 1).named("lo"), (fm.sum(w) <= -1).named("hi"))
    for backend in ("fedadmm", "dp-admm", "proxal"):
        with pytest.warns(RuntimeWarning, match=r"'lo' of server.*'hi' of server.*no common point"):
            assert prob.solve(backend).status == "infeasible"
    with pytest.raises(fm.FedModelError, match=r"'lo', 'hi'.*no feasible point"):   # compiling still refuses
        canonical_constraints(prob.server.constraints, project="all")
    canonical = canonical_constraints(prob.server.constraints, project=True)
    assert not canonical.sets       # ProxAL / DALD keep halfspaces in their AL (and say "infeasible")


def test_affine_sets_are_projected_only_where_asked():
    w = fm.Variable(4, name="w")
    halfspace = A_ROW @ w <= 0.5
    assert canonical_constraints([halfspace], project=True).smooth == [halfspace]
    assert [t.kind for t in canonical_constraints([halfspace], project=PROJECT_ALL).sets] == ["halfspace"]
    data = fm.Problem().add_client("c0").data(A_ROW, name="a")
    assert simple_set(data @ w <= 0.5, affine=True) is None      # a client's data: not projected


def test_norm1_term_with_a_halfspace_is_refused():
    """λ‖w‖₁'s prox followed by a halfspace's projection is not the prox of their sum."""
    prob, w = least_squares()
    prob.server.minimize(0.1 * fm.norm1(w))
    prob.server.subject_to(A_ROW @ w <= 0.5)
    with pytest.raises(fm.FedModelError, match="not the prox of their sum"):
        prob.solve(backends.FedADMM())


def test_certificate_of_a_ball_and_a_box_is_exact():
    """The normal cones of a ball and bounds on one variable scored as one (their intersection's):
    applied in turn they charged CVXPY's own solution a stationarity of ~1. (CVXPY solves the
    equilibrated model, σ ≈ 0.13 here: its multipliers' last digits scale by 1/σ, ~4e-6.)"""
    prob, w = least_squares()
    prob.server.subject_to(fm.norm2(w) <= 1.5, w >= -0.8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        reference = prob.solve("cvxpy")
    assert reference.certificate.stationarity <= 1e-5


# ---- 3. Parameters with a sign --------------------------------------------------------------
def test_nonneg_parameter_weight_keeps_the_model_convex():
    prob, w = least_squares()
    lam = fm.Parameter(nonneg=True, value=0.1, name="lam")
    prob.server.minimize(lam * fm.sum_squares(w))
    assert (lam * fm.sum_squares(w)).is_convex() and prob.is_convex()
    assert (fm.Parameter(nonpos=True) * fm.sum_squares(w)).is_concave()
    assert not (fm.Parameter() * fm.sum_squares(w)).is_convex()      # no sign: as in CVXPY
    lowered = prob.to_cvxpy()
    assert [p.attributes["nonneg"] for p in lowered.parameters()] == [True]
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # no "not convex" warning
        reference = prob.solve("cvxpy")
        result = prob.solve("proxal")
    assert fm.verify(result, reference).ok
    assert relative_distance(result.value(w), reference.value(w)) <= 1e-4
    # the closed form of the ridge problem: (Σ AᵢᵀAᵢ/20 + λI) w = Σ Aᵢᵀbᵢ/20
    H = sum(c.data_items[0].value.T @ c.data_items[0].value for c in prob.clients) / 20
    g = sum(c.data_items[0].value.T @ c.data_items[1].value for c in prob.clients) / 20
    np.testing.assert_allclose(reference.value(w), np.linalg.solve(H + 0.1 * np.eye(4), g), atol=1e-6)
    lam.value = 1.0                               # a new value, no rebuild
    np.testing.assert_allclose(prob.solve("cvxpy").value(w), np.linalg.solve(H + np.eye(4), g), atol=1e-6)


def test_parameter_sign_is_checked_on_assignment():
    lam = fm.Parameter(nonneg=True, name="lam")
    with pytest.raises(fm.DataError, match=r"'lam'.*nonneg.*-0.5"):
        lam.value = -0.5
    with pytest.raises(fm.DataError, match="'lam'"):
        fm.Parameter(nonneg=True, value=np.array([1.0, -1.0]), name="lam", shape=2)
    negative = fm.Parameter(2, nonpos=True, name="neg")
    negative.value = [-1.0, 0.0]
    with pytest.raises(fm.DataError, match="'neg'.*nonpos"):
        negative.value = [-1.0, 2.0]
    np.testing.assert_array_equal(negative.value, [-1.0, 0.0])     # the old value is kept


# ---- 4. errors --------------------------------------------------------------------------------
def test_unknown_backend_option_names_the_closest():
    prob, w = least_squares()
    message = "unknown option 'betta' for backend 'proxal'; did you mean 'beta'?"
    with pytest.raises(fm.FedModelError) as by_name:
        prob.solve("proxal", betta=3)
    assert str(by_name.value) == message
    with pytest.raises(fm.FedModelError) as direct:
        backends.ProxAL(betta=3)
    assert str(direct.value) == message
    with pytest.raises(fm.FedModelError, match="'lr0' for backend 'fedadmm'; did you mean 'lr'"):
        backends.FedADMM(lr0=0.1)
    with pytest.raises(fm.FedModelError, match="'epsilon_totl'.*did you mean 'epsilon_total'"):
        prob.solve("dp-admm", epsilon_totl=1.0)
    with pytest.raises(fm.FedModelError, match="'zzz' for backend 'dald'; its options are"):
        backends.DALD(zzz=1)
    assert backends.ProxAL(beta=3).beta == 3.0                  # good options still work


def unwritable_directory(tmp_path) -> str:
    """A directory this process cannot create files in: a read-only one, or /sys for root (who
    ignores permission bits)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    for candidate in (str(folder), "/sys"):
        if not os.path.isdir(candidate):
            continue
        try:
            fd, probe = tempfile.mkstemp(dir=candidate)
        except OSError:
            return candidate
        os.close(fd)
        os.unlink(probe)
    pytest.skip("no unwritable directory on this machine")


def test_unwritable_checkpoint_directory_is_refused_before_the_run(tmp_path):
    prob, w = least_squares()
    calls = []
    path = os.path.join(unwritable_directory(tmp_path), "run.ckpt")
    with pytest.raises(CheckpointError, match="cannot write checkpoint.*writable directory"):
        prob.solve("proxal", checkpoint=path, callback=calls.append)
    assert calls == []           # before the first iteration, not at the first write
