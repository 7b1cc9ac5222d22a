"""ProxAL with the clients' smooth convex constraints held in their local solves
(`ProxAL(client_constraints="local")`, the default; issue 27 item 2): the local constrained
solve against CVXPY, Neyman-Pearson models with active constraints in few round trips and
verified, and honest verdicts where the constraints cannot be met."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import ProxAL
from fedmodel.backends.proxal import FAST_PROXAL
from fedmodel.reproductions import proxal_table1 as table1
from fedmodel.runtime.program import compile_programs
from test_proxal_speed import adult_like


def quiet(prob, backend):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prob.solve(backend)


def np_active(seed: int = 0, n: int = 3, m: int = 300, d: int = 5, margin: float = 0.05):
    """Adult-like NP data with every client's class-1 constraint active at the answer
    (threshold `margin` above the least worst-client class-1 loss): (problem, w)."""
    X, y = adult_like(m=m, d=d, seed=seed)
    _, _, parts = table1.build(X, y, n)
    threshold = table1.smallest_worst_client_loss(X, y, parts) + margin
    prob, w, _ = table1.build(X, y, n, threshold=threshold)
    return prob, w


def one_client(threshold: float, seed: int = 3):
    """A one-client NP problem (class-0 loss, class-1 loss ≤ threshold) and its data."""
    rng = np.random.default_rng(seed)
    X0, X1 = rng.standard_normal((30, 4)) + 0.5, rng.standard_normal((20, 4)) + 0.5
    w = fm.Variable(4, name="w")
    prob = fm.Problem("np-one")
    client = prob.add_client("c0")
    client.minimize(fm.mean(fm.logistic(client.data(X0, name="X0") @ w)))
    client.subject_to((fm.mean(fm.logistic(-(client.data(X1, name="X1") @ w))) <= threshold).named("np"))
    return prob, w, X0, X1


def test_the_local_constrained_solve_matches_cvxpy():
    """(19) with the constraint held: min f(u) + λᵀu + (ρ/2)‖u − a‖² s.t. g(u) ≤ 0, solved by
    the local method of multipliers ("local-al"), equals CVXPY's minimizer and multiplier."""
    import cvxpy as cp
    prob, w, X0, X1 = one_client(threshold=0.4)
    program = compile_programs(prob, client_sets=True, client_constraints=True)["c0"]
    assert program.local_names == ["np"] and program._choose("auto") == "local-al"
    lam, rho, anchor = np.array([0.3, -0.2, 0.1, 0.4]), 0.5, np.array([1.0, -1.0, 0.5, 0.0])
    out = program.solve_local(linear=lam, weight=rho, anchor=anchor, x0=np.zeros(4), tol=1e-10)
    u = cp.Variable(4)
    constraint = cp.sum(cp.logistic(-(X1 @ u))) / len(X1) <= 0.4
    cp.Problem(cp.Minimize(cp.sum(cp.logistic(X0 @ u)) / len(X0) + lam @ u + rho / 2 * cp.sum_squares(u - anchor)),
               [constraint]).solve(solver="CLARABEL")
    assert float(constraint.dual_value) > 0.1          # active: the test means something
    np.testing.assert_allclose(out["x"], u.value, atol=1e-5)    # (CVXPY's exponential cones: ~2e-6)
    nu = float(program.multipliers()["multipliers"]["np"])
    assert nu == pytest.approx(float(constraint.dual_value), rel=1e-4)
    assert "local_failed" not in program.state
    # and its KKT conditions, by hand: ∇f + λ + ρ(x − a) + ν∇g = 0, g = 0 (active)
    x = out["x"]
    s0, s1 = 1 / (1 + np.exp(-(X0 @ x))), 1 / (1 + np.exp(X1 @ x))
    grad_f, grad_g = X0.T @ s0 / len(X0), -X1.T @ s1 / len(X1)
    assert np.max(np.abs(grad_f + lam + rho * (x - anchor) + nu * grad_g)) <= 1e-9
    assert abs(np.mean(np.logaddexp(0.0, -(X1 @ x))) - 0.4) <= 1e-9


def test_a_local_constraint_no_point_meets_is_a_status_not_an_exception():
    """A class-1 loss ≤ 0.1 no w reaches (its least value is 0.2013): the local solve returns
    its least violating point and says so in the node's state (the backend reads it)."""
    prob, _, _, X1 = one_client(threshold=0.1)
    program = compile_programs(prob, client_sets=True, client_constraints=True)["c0"]
    out = program.solve_local(linear=None, weight=1.0, anchor=np.zeros(4), x0=np.zeros(4), tol=1e-8)
    loss = np.mean(np.logaddexp(0.0, -(X1 @ out["x"])))
    assert np.all(np.isfinite(out["x"]))
    assert program.state["local_failed"] == pytest.approx(loss - 0.1, rel=1e-6)
    assert loss == pytest.approx(0.2013, abs=2e-3)


def test_np_with_active_constraints_converges_in_few_round_trips():
    """Three clients, every class-1 constraint active (multipliers 0.61, 4.91, 2.03): held in
    the local solves, ProxAL converges and verifies in 51 round trips (3 outer iterations)
    where the constraints in the augmented Lagrangian take 161 (7 outer; main's default)."""
    prob, w = np_active()
    reference = prob.solve("cvxpy")
    result = quiet(prob, ProxAL())
    assert result.status == "converged"
    assert fm.verify(result, reference).ok
    assert result.info["communication"]["round_trips"] <= 70
    assert "client_constraints" not in result.info        # no fallback to the AL
    for name, mu in reference.multipliers.items():
        assert float(mu) > 0.5
        assert float(result.multipliers[name]) == pytest.approx(float(mu), rel=1e-3)
    np.testing.assert_allclose(result.value(w), reference.value(w), atol=1e-4 * np.max(np.abs(reference.value(w))))
    al = quiet(prob, ProxAL(client_constraints="al"))
    assert al.status == "converged" and al.info["communication"]["round_trips"] >= 2 * result.info["communication"]["round_trips"]


def test_serial_and_batched_executors_agree_with_held_constraints():
    prob, w = np_active(seed=1, n=4, m=400, margin=0.02)
    serial = quiet(prob, ProxAL())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batched = prob.solve(ProxAL(), executor="batched")
    assert serial.status == batched.status == "converged"
    assert serial.iterations == batched.iterations
    np.testing.assert_allclose(batched.value(w), serial.value(w), rtol=1e-8, atol=1e-10)


def jointly_infeasible(threshold: float = 0.3):
    """Two clients whose class-1 rows are opposite (X1 and −X1): each constraint alone is
    met far from 0, both together need logistic(z) + logistic(−z) ≤ 2·threshold < 2 log 2."""
    rng = np.random.default_rng(5)
    X1 = rng.standard_normal((25, 3)) + np.array([2.0, 1.0, 0.0])
    X0 = rng.standard_normal((25, 3))
    w = fm.Variable(3, name="w")
    prob = fm.Problem("np-opposite")
    for i, sign in enumerate((1.0, -1.0)):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(X0, name="X0") @ w)))
        c.subject_to((fm.mean(fm.logistic(-(c.data(sign * X1, name="X1") @ w))) <= threshold).named(f"np[c{i}]"))
    prob.server.minimize(1e-2 * fm.sum_squares(w))
    return prob


@pytest.mark.integration    # (> 2.5 s: the fast suite stays ≤ 3 min)
@pytest.mark.parametrize("case", ["alone", "together"])
def test_constraints_no_point_meets_end_infeasible_naming_them(case):
    """Held constraints that cannot be met — one client's alone (its local solve fails), or
    two clients' only together (the consensus over ∩ X_i does not converge: its residual stays
    while ρ_i rises, `proxal_admm.no_consensus`) — fall back to the augmented Lagrangian,
    whose verdict names them; never "converged"."""
    prob = one_client(threshold=0.1)[0] if case == "alone" else jointly_infeasible()
    assert prob.solve("cvxpy").status == "infeasible"
    backend = ProxAL(inner="admm")      # (Algorithm 2 holds client constraints locally)
    backend.checks_clients_alone = False    # (the client's own check would answer first: the run's verdict here)
    result = quiet(prob, backend)
    assert result.status in ("infeasible", "stalled")
    assert "augmented Lagrangian" in result.info["client_constraints"]
    assert set(result.info["violated"]) >= ({repr(c) for c in prob.constraints} if case == "alone"
                                            else set()) and result.info["violated"]
    assert result.max_violation > 0.05
    if case == "together":      # measured: 481 round trips (8 outer / 464 ADMM); main 974 (9 / 955)
        assert result.info["communication"]["round_trips"] <= 700


def test_the_paper_preset_keeps_constraints_in_the_augmented_lagrangian():
    assert ProxAL.paper().client_constraints == "al"
    assert ProxAL().client_constraints == FAST_PROXAL["client_constraints"] == "local"
    with pytest.raises(fm.FedModelError, match="client_constraints"):
        ProxAL(client_constraints="server")


def test_several_held_constraints_with_several_rows_match_cvxpy():
    """Two held constraints, one of them two rows (A w ≤ b, both rows active), beside the NP
    constraint: the local solve's point and every row's multiplier equal CVXPY's."""
    import cvxpy as cp
    prob, w, X0, X1 = one_client(threshold=0.4)
    A, b = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]]), np.array([0.2, -0.3])
    prob.blocks[-1].subject_to((A @ w <= b).named("rows"))
    program = compile_programs(prob, client_sets=True, client_constraints=True)["c0"]
    assert sorted(program.local_names) == ["np", "rows"]
    lam, rho, anchor = np.array([0.3, -0.2, 0.1, 0.4]), 0.5, np.array([1.0, -1.0, 0.5, 0.0])
    out = program.solve_local(linear=lam, weight=rho, anchor=anchor, x0=np.zeros(4), tol=1e-10)
    u = cp.Variable(4)
    constraints = [cp.sum(cp.logistic(-(X1 @ u))) / len(X1) <= 0.4, A @ u <= b]
    cp.Problem(cp.Minimize(cp.sum(cp.logistic(X0 @ u)) / len(X0) + lam @ u + rho / 2 * cp.sum_squares(u - anchor)),
               constraints).solve(solver="CLARABEL")
    np.testing.assert_allclose(out["x"], u.value, atol=1e-5)
    mu = program.multipliers()["multipliers"]
    assert np.all(constraints[1].dual_value > 0.01)      # both rows active
    np.testing.assert_allclose(np.ravel(mu["rows"]), constraints[1].dual_value, rtol=1e-4, atol=1e-6)
    assert float(mu["np"]) == pytest.approx(float(constraints[0].dual_value), rel=1e-4, abs=1e-6)


@pytest.mark.integration
def test_the_built_in_model_verifies_in_at_most_100_round_trips():
    """`fedmodel run`'s model (WDBC Neyman-Pearson, 5 clients) with the options `fedmodel run`
    passes: 211 round trips with the constraints in the AL, 133 held locally with β raised only
    below a contraction of 0.5; 81 with β raised while the outer steps shrink by less than 10×
    (`proxal_outer.SLOW_CONTRACTION`); 101 once the ball's variable was equilibrated (branch
    setscale) under ε = (1e-6, 1e-7); 92 (5 outer, 82 ADMM iterations) with ProxAL's defaults,
    which `fedmodel run` now passes (their distance test asks 1e-4; 4.7e-5 from CVXPY's point,
    branch pxrounds) — issue 27's ≤ 100."""
    from fedmodel.builtin_models import backend_options, neyman_pearson
    prob, w = neyman_pearson()
    reference = prob.solve("cvxpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve(ProxAL(**backend_options("proxal")))
    report = fm.verify(res, reference)
    assert res.status == "converged" and report.ok
    assert report.solution_distance <= 2e-4          # (measured 4.7e-5: well inside verify's 1e-3)
    assert res.info["communication"]["round_trips"] <= 100
