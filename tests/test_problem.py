"""The problem layer end to end: federated models solved with `prob.solve("cvxpy")` against
hand-built CVXPY problems, multipliers and their sign convention, the KKT certificate, and the
`Result` fields of docs/api.md §5."""
from __future__ import annotations

import numpy as np
import pytest

import cvxpy as cp
import fedmodel as fm

TIGHT = {"solver": "CLARABEL", "tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10}


# ---- a random federated model, written twice: in fedmodel and by hand in CVXPY ---------------
def random_model(seed: int, n_clients: int = 3, d: int = 5, k: int = 2, lam: float = 0.3):
    """Clients with private data, a private variable, local inequality and equality
    constraints; the server with λ·norm1(w), a norm ball, a data inequality and an equality.

    Returns (prob, w, privates, reference) where `reference` is the same model in CVXPY:
    (cvxpy problem, cvxpy w, cvxpy privates, {constraint name: cvxpy constraint}).
    """
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=d) * 0.3      # a feasible point: right-hand sides are set from it
    w0 += (0.2 - w0.sum()) / d
    w = fm.Variable(d, name="w")
    cw = cp.Variable(d)
    prob = fm.Problem(name=f"random{seed}")
    objective, constraints, privates, cprivates = [], {}, [], []
    for i in range(n_clients):
        m = int(rng.integers(6, 12))
        X, y = rng.normal(size=(m, d)), rng.normal(size=m)
        B = rng.normal(size=(k, d))
        a, e = rng.normal(size=d), float(rng.uniform(-1.5, 1.5))
        t = float(np.mean(X @ w0) + rng.uniform(0.0, 0.3))
        client = prob.add_client(f"c{i}")
        Xd, yd, Bd = client.data(X, name=f"X{i}"), client.data(y, name=f"y{i}"), client.data(B, name=f"B{i}")
        ad = client.data(a, name=f"a{i}")
        u = client.variable(k, name=f"u{i}")
        client.minimize(fm.sum_squares(Xd @ w - yd) / m)
        client.minimize(fm.sum_squares(u - Bd @ w))
        client.subject_to((fm.mean(Xd @ w) <= t).named(f"mean[{i}]"),
                          (fm.norm2(u) <= 2.0).named(f"unorm[{i}]"),
                          (fm.sum(u) == e).named(f"usum[{i}]"))
        if i == 0:  # a data equality on the shared variable
            client.subject_to((ad @ w == float(a @ w0)).named("aeq"))
        cu = cp.Variable(k)
        privates.append(u)
        cprivates.append(cu)
        objective += [cp.sum_squares(X @ cw - y) / m, cp.sum_squares(cu - B @ cw)]
        constraints[f"mean[{i}]"] = cp.sum(X @ cw) / m <= t
        constraints[f"unorm[{i}]"] = cp.norm(cu, 2) <= 2.0
        constraints[f"usum[{i}]"] = cp.sum(cu) == e
        if i == 0:
            constraints["aeq"] = a @ cw == float(a @ w0)
    G = rng.normal(size=(2, d))
    g = G @ w0 + 0.1
    Gd = prob.server.data(G, name="G")
    prob.server.minimize(lam * fm.norm1(w))
    prob.server.subject_to((fm.norm2(w) <= 3.0).named("ball"),
                           (Gd @ w <= g).named("Gw"),
                           (fm.sum(w) == 0.2).named("wsum"))
    objective.append(lam * cp.norm1(cw))
    constraints["ball"] = cp.norm(cw, 2) <= 3.0
    constraints["Gw"] = G @ cw <= g
    constraints["wsum"] = cp.sum(cw) == 0.2
    reference = cp.Problem(cp.Minimize(cp.sum(objective)), list(constraints.values()))
    return prob, w, privates, (reference, cw, cprivates, constraints)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_federated_model_matches_hand_built_cvxpy(seed):
    prob, w, privates, (reference, cw, cprivates, cons) = random_model(seed, n_clients=2 + seed % 3)
    reference.solve(**TIGHT)
    assert reference.status == "optimal"
    res = prob.solve("cvxpy")

    assert res.status == "converged"
    assert res.backend == "cvxpy"
    assert abs(res.objective - reference.value) <= 1e-6 * max(1.0, abs(reference.value))
    np.testing.assert_allclose(res.value(w), cw.value, atol=1e-5)
    for u, cu in zip(privates, cprivates):
        np.testing.assert_allclose(res.value(u), cu.value, atol=1e-5)
    # the variables carry the solution, like CVXPY's
    np.testing.assert_array_equal(w.value, res.value(w))
    np.testing.assert_array_equal(privates[0].value, res.value(privates[0]))
    # expressions evaluate at the solution
    assert fm.sum(w).value == pytest.approx(0.2, abs=1e-7)
    assert prob.objective.value == pytest.approx(res.objective, rel=1e-12)

    # multipliers: one per constraint, by name; ours use L = f + Σ μ_j c_j with c canonical
    assert set(res.multipliers) == {c.name for c in prob.constraints}
    for constraint in prob.constraints:
        mu = np.asarray(res.multipliers[constraint.name])
        assert mu.shape == constraint.shape
        if isinstance(constraint, fm.Inequality):
            assert np.all(mu >= 0)
    for name in ("mean[0]", "Gw", "wsum", "aeq", "usum[0]"):
        np.testing.assert_allclose(res.multipliers[name], cons[name].dual_value, atol=1e-5)

    # feasibility, the KKT certificate, timing
    assert 0.0 <= res.max_violation <= 1e-7
    assert res.certificate is not None
    assert res.certificate.stationarity <= 1e-5
    assert res.certificate.feasibility <= 1e-5
    assert isinstance(res.wall_time, float) and res.wall_time > 0
    assert res.info["solver"]


def test_prob_to_cvxpy_has_the_same_optimum():
    prob, w, _, (reference, *_rest) = random_model(7)
    reference.solve(**TIGHT)
    centralized = prob.to_cvxpy()
    assert isinstance(centralized, cp.Problem)
    centralized.solve(**TIGHT)
    assert centralized.value == pytest.approx(reference.value, rel=1e-7)
    assert prob.is_convex()


def _sensitivity_model(r: float, s: float = 3.5):
    """min ‖w − z‖² + ‖w‖₁/10 s.t. sum(w) == r (client), w0 − w1 ≥ s (server, active)."""
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    client = prob.add_client("alice")
    z = client.data(np.array([1.0, -2.0, 0.5]), name="z")
    client.minimize(fm.sum_squares(w - z))
    client.subject_to((fm.sum(w) == r).named("budget"))
    prob.server.minimize(0.1 * fm.norm1(w))
    prob.server.subject_to((w[0] - w[1] >= s).named("gap"))
    return prob


def test_multiplier_signs_match_sensitivities():
    """With L = f + Σ μ_j c_j (c canonical: a − b), d p*/d r = −μ for `g == r`; `g >= s` is
    s − g <= 0, so d p*/d s = +μ ≥ 0."""
    h = 1e-4
    base = _sensitivity_model(0.7).solve("cvxpy")
    assert float(base.multipliers["gap"]) > 0.1        # active inequality
    assert base.certificate.stationarity <= 1e-6
    slope = (_sensitivity_model(0.7 + h).solve("cvxpy").objective
             - _sensitivity_model(0.7 - h).solve("cvxpy").objective) / (2 * h)
    assert slope == pytest.approx(-float(base.multipliers["budget"]), abs=1e-4)
    slope_gap = (_sensitivity_model(0.7, 3.5 + h).solve("cvxpy").objective
                 - _sensitivity_model(0.7, 3.5 - h).solve("cvxpy").objective) / (2 * h)
    assert slope_gap == pytest.approx(float(base.multipliers["gap"]), abs=1e-4)


def test_matrix_variable_and_vector_constraint():
    rng = np.random.default_rng(4)
    W = fm.Variable((3, 2), name="W")
    prob = fm.Problem()
    cw = cp.Variable((3, 2))
    objective, constraints = [], []
    for i in range(2):
        X, Y = rng.normal(size=(8, 3)), rng.normal(size=(8, 2))
        client = prob.add_client()
        client.minimize(fm.sum_squares(client.data(X) @ W - client.data(Y)))
        objective.append(cp.sum_squares(X @ cw - Y))
    prob.server.subject_to((W[0, :] >= 0.5).named("row0"))
    constraints.append(cw[0, :] >= 0.5)
    reference = cp.Problem(cp.Minimize(cp.sum(objective)), constraints)
    reference.solve(**TIGHT)
    res = prob.solve("cvxpy")
    assert [c.name for c in prob.clients] == ["c0", "c1"]
    assert res.value(W).shape == (3, 2)
    np.testing.assert_allclose(res.value(W), cw.value, atol=1e-6)
    assert res.objective == pytest.approx(reference.value, rel=1e-7)
    assert res.multipliers["row0"].shape == (2,)
    np.testing.assert_allclose(res.multipliers["row0"], constraints[0].dual_value, atol=1e-6)
    assert res.certificate.stationarity <= 1e-6


def test_problem_structure_and_views():
    w = fm.Variable(2, name="w")
    prob = fm.Problem(name="views")
    assert prob.name == "views" and prob.clients == [] and prob.server.name == "server"
    a = prob.add_client()
    b = prob.add_client("bob", weight=2.0)
    c = prob.add_client()
    assert [x.name for x in prob.clients] == ["c0", "bob", "c2"]
    assert b.weight == 2.0 and a.weight is None
    assert prob.block("bob") is b and prob.block("server") is prob.server
    assert prob.blocks == [prob.server, a, b, c]
    z = a.data([1.0, 2.0], name="z")
    assert isinstance(z, fm.Data) and z.owner == "c0"
    a.minimize(fm.sum_squares(w - z))
    a.minimize(fm.sum(w))                       # several terms add up
    assert len(a.terms) == 2
    b.subject_to(w >= -5, w <= 5)               # unnamed constraints get unique names
    c.subject_to([fm.sum(w) <= 10])             # lists are flattened
    names = [con.name for con in prob.constraints]
    assert len(set(names)) == 3 and all(n.startswith(("bob.", "c2.")) for n in names)
    assert all(con.owner in ("bob", "c2") for con in prob.constraints)
    w.value = np.array([0.5, -1.0])
    assert prob.objective.value == pytest.approx((0.5 - 1) ** 2 + (-1 - 2) ** 2 - 0.5)
    res = prob.solve("cvxpy")
    np.testing.assert_allclose(res.value(w), [0.5, 1.5], atol=1e-7)
    assert res.objective == pytest.approx(2.5, abs=1e-8)
    assert "cvxpy" in str(res) and "objective" in str(res)


def test_server_only_model_and_scalar_variable():
    t = fm.Variable(name="t")
    prob = fm.Problem()
    prob.server.minimize(fm.square(t - 3) + fm.abs(t))
    res = prob.solve("cvxpy")
    assert res.value(t).shape == ()
    assert float(res.value(t)) == pytest.approx(2.5, abs=1e-7)
    assert res.objective == pytest.approx(0.25 + 2.5, abs=1e-7)


def test_infeasible_model_clears_values():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    client = prob.add_client("c")
    client.minimize(fm.sum_squares(w - client.data([1.0, 1.0], name="d")))
    client.subject_to((fm.sum(w) >= 3).named("lo"))
    prob.server.subject_to((fm.sum(w) <= 1).named("hi"))
    w.value = np.zeros(2)
    res = prob.solve("cvxpy")
    assert res.status == "infeasible"
    assert res.values == {} and w.value is None
    assert np.isnan(res.objective)
    assert "infeasible" in str(res)
    with pytest.raises(fm.FedModelError, match="ended 'infeasible' without a point"):
        res.value(w)


def test_solver_choice_and_options():
    prob, w, _, (reference, cw, *_rest) = random_model(11)
    reference.solve(**TIGHT)
    res = prob.solve("cvxpy", solver="SCS", eps=1e-9, max_iters=100_000)
    assert res.info["solver"] == "SCS"
    np.testing.assert_allclose(res.value(w), cw.value, atol=1e-4)
    from fedmodel.backends import CVXPY
    res2 = prob.solve(CVXPY(solver="clarabel"))
    assert res2.info["solver"] == "CLARABEL"
    np.testing.assert_allclose(res2.value(w), cw.value, atol=1e-5)


def test_parameter_values_are_used_and_can_change():
    w = fm.Variable(2, name="w")
    target = fm.Parameter(2, name="target", value=[1.0, 2.0])
    prob = fm.Problem()
    client = prob.add_client()
    client.minimize(fm.sum_squares(w - target))
    np.testing.assert_allclose(prob.solve("cvxpy").value(w), [1.0, 2.0], atol=1e-7)
    target.value = [-1.0, 0.5]
    np.testing.assert_allclose(prob.solve("cvxpy").value(w), [-1.0, 0.5], atol=1e-7)


class _Given:
    """A backend that returns a given point and multipliers (to probe the certificate)."""

    def __new__(cls, values, multipliers):
        from fedmodel.backends.base import Backend

        class Given(Backend):
            name = "given"
            scaling = False   # the point and multipliers are given in the model's own units
            checks_sets_meet = False   # it returns the given point, whatever the sets

            def run(self, problem, **_):
                return {"status": "converged", "values": values, "multipliers": multipliers,
                        "iterations": {"outer": 1}}
        return Given()


def test_certificate_flags_wrong_signs_and_wrong_points():
    prob = _sensitivity_model(0.7)
    exact = prob.solve("cvxpy")
    same = prob.solve(_Given(exact.values, exact.multipliers))
    assert same.certificate.stationarity <= 1e-6
    assert same.objective == pytest.approx(exact.objective, rel=1e-12)
    flipped = {**exact.multipliers, "budget": -exact.multipliers["budget"]}
    assert prob.solve(_Given(exact.values, flipped)).certificate.stationarity > 0.1
    dropped = {k: v for k, v in exact.multipliers.items() if k != "gap"}
    assert prob.solve(_Given(exact.values, dropped)).certificate.stationarity > 0.1
    w = prob.variables()[0]
    moved = {w.uid: exact.values[w.uid] + np.array([0.0, 0.0, 0.1])}
    bad = prob.solve(_Given(moved, exact.multipliers))
    assert bad.certificate.feasibility == pytest.approx(0.1, rel=1e-6)   # sum(w) == 0.7 broken
    assert bad.max_violation == pytest.approx(0.1, rel=1e-6)
    assert bad.certificate.stationarity > 0.1
    np.testing.assert_allclose(w.value, moved[w.uid])     # the variables hold the last result


# ---- verify ----------------------------------------------------------------------------------
def test_verify_a_good_result_against_a_fresh_cvxpy_solve():
    prob, w, privates, _ = random_model(5)
    exact = prob.solve("cvxpy")
    shifted = {uid: value + 1e-6 for uid, value in exact.values.items()}
    near = prob.solve(_Given(shifted, exact.multipliers))
    np.testing.assert_allclose(w.value, shifted[w.uid])
    report = fm.verify(near)                           # default reference: CVXPY, fresh
    np.testing.assert_allclose(w.value, shifted[w.uid])   # verify leaves the variables alone
    assert report.reference is not None and report.reference.backend == "cvxpy"
    assert report.ok
    # each measure on its own scale (docs/api.md §5): the gap to the objective's scale at the
    # reference, the distance per variable to its own size (the smallest one is the worst)
    scale = report.reference.certificate.objective_scale
    assert abs(exact.objective) <= scale * (1 + 1e-12)
    expected_gap = abs(near.objective - exact.objective) / scale
    assert report.objective_gap == pytest.approx(expected_gap, rel=1e-2, abs=1e-9)
    assert 0 < report.objective_gap < 1e-4
    smallest = min(float(np.max(np.abs(exact.values[v.uid]))) for v in [w] + privates)
    assert report.solution_distance == pytest.approx(1e-6 / smallest, rel=0.05)
    assert report.max_violation == near.max_violation
    assert report.kkt is near.certificate
    text = str(report)
    assert "objective gap" in text and f"{report.objective_gap:.2e}" in text
    assert "verdict" in text and "OK" in text and "NOT OK" not in text
    # a given reference is used as is
    assert fm.verify(exact, exact).objective_gap == 0.0


def test_verify_flags_a_bad_result():
    prob, w, _, _ = random_model(6)
    exact = prob.solve("cvxpy")
    far = {uid: value * 0.5 for uid, value in exact.values.items()}
    report = fm.verify(prob.solve(_Given(far, exact.multipliers)), exact)
    assert not report.ok
    assert report.objective_gap > 1e-3
    assert report.solution_distance > 1e-2
    assert "NOT OK" in str(report)
    # rtol decides (a point 1e-4 off reads a relative stationarity of 2e-3: "stalled" by
    # finish_result's 1e-3, so the slight error here is 1e-6)
    slightly = {uid: value + 1e-6 for uid, value in exact.values.items()}
    result = prob.solve(_Given(slightly, exact.multipliers))
    assert not fm.verify(result, exact, rtol=1e-9).ok
    assert fm.verify(result, exact, rtol=1e-2).ok


def test_verify_nonconvex_model_reports_kkt_only():
    w = fm.Variable(2, name="w")
    prob = fm.Problem(name="nonconvex")
    client = prob.add_client("bob")
    client.minimize(fm.sum_squares(w - client.data([2.0, 0.0], name="y")))
    client.subject_to((fm.sum_squares(w) >= 1).named("outside"))
    assert not prob.is_convex()
    result = prob.solve(_Given({w.uid: np.array([2.0, 0.0])}, {"outside": 0.0}))
    with pytest.warns(UserWarning, match="nonconvex"):
        report = fm.verify(result)
    assert report.reference is None
    assert np.isnan(report.objective_gap) and np.isnan(report.solution_distance)
    assert report.kkt.stationarity == 0.0 and report.ok
    assert "not convex" in str(report) and "objective gap" in str(report)
    bad = prob.solve(_Given({w.uid: np.array([1.0, 0.0])}, {"outside": 0.0}))
    with pytest.warns(UserWarning):
        assert not fm.verify(bad).ok                    # gradient 2(w − y) ≠ 0


def test_verify_infeasible_model_shows_the_reference_status():
    w = fm.Variable(2, name="w")
    prob = fm.Problem(name="infeasible")
    client = prob.add_client("c")
    client.minimize(fm.sum_squares(w - client.data([1.0, 1.0], name="d")))
    client.subject_to((fm.sum(w) >= 3).named("lo"))
    prob.server.subject_to((fm.sum(w) <= 1).named("hi"))
    result = prob.solve(_Given({w.uid: np.array([1.0, 1.0])}, {}))
    assert result.max_violation == pytest.approx(1.0)
    report = fm.verify(result)
    assert report.reference.status == "infeasible"
    assert not report.ok
    text = str(report)
    assert "infeasible" in text and "NOT OK" in text
