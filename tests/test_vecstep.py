"""A client ball's local solve by Newton inside the ball (`runtime/ball_newton.py`), written
once over a stack of clients: k = 1 on the serial executor, a group's rows on the batched one
(issue 27 item 3; main took FISTA, ~35 evaluations a solve, client by client)."""
import cvxpy as cp
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime import ball_newton, local_solvers
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.batched_group import Group
from fedmodel.runtime.executor import SerialExecutor
from fedmodel.runtime.program import compile_programs

D = 12


def test_the_model_step_is_the_quadratic_s_minimizer_on_the_ball():
    """Each row's z + d minimizes ½uᵀAu + (g − Az)ᵀu on ‖u‖ ≤ r (CVXPY's answer): a ball active
    at the answer, one inactive, a tiny ball, the point {0}."""
    rng = np.random.default_rng(0)
    k = 4
    M = rng.normal(size=(k, D, D))
    A = M @ M.transpose(0, 2, 1) / D + 0.05 * np.eye(D)
    lam, V = np.linalg.eigh(A)
    r = np.array([1.0, 1e4, 1e-3, 0.0])
    Z = rng.normal(size=(k, D))
    Z = ball_newton.project(Z, r)
    G = 3.0 * rng.normal(size=(k, D))
    D_, regular = ball_newton.model_steps(Z, G, lam, V, r)
    assert regular.all()
    for j in range(k):
        u = cp.Variable(D)
        c = G[j] - A[j] @ Z[j]
        cp.Problem(cp.Minimize(0.5 * cp.quad_form(u, cp.psd_wrap(A[j])) + c @ u), [cp.norm(u, 2) <= r[j]]
                   ).solve(solver=cp.CLARABEL)
        mine = Z[j] + D_[j]
        np.testing.assert_allclose(mine, u.value, rtol=0, atol=5e-3 * max(r[j], 1e-3))  # (CVXPY: ~1e-5)

        def model(v):
            return 0.5 * v @ A[j] @ v + c @ v
        assert model(mine) <= model(u.value) + 1e-12 * max(1.0, abs(model(mine)))   # no worse
        assert np.linalg.norm(mine) <= r[j] * (1 + 1e-12)
        if r[j] > 0:    # KKT to round-off: A u + c + μ u = 0, μ ≥ 0, μ (‖u‖ − r) = 0
            mu = -mine @ (A[j] @ mine + c) / (mine @ mine)
            assert np.linalg.norm(A[j] @ mine + c + mu * mine) <= 1e-10 * np.linalg.norm(c)
            assert mu >= -1e-12 and (mu <= 1e-12 or abs(np.linalg.norm(mine) - r[j]) <= 1e-12 * r[j])
    assert np.linalg.norm(Z[1] + D_[1]) < 1e4      # inactive: the plain Newton step
    np.testing.assert_allclose(Z[1] + D_[1], -np.linalg.solve(A[1], G[1] - A[1] @ Z[1]), rtol=1e-10)


def _clients(n: int, radius: float = 0.3, scale: float = 2.0, seed: int = 0):
    """n logistic clients with the ball ‖w‖₂ ≤ radius (active: the labels' model is larger)
    and a server ridge; the ProxAL model of bench_rounds' logistic-ball."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=D)
    prob, w = fm.Problem(name="ball"), fm.Variable(D, name="w")
    for i in range(n):
        X = rng.normal(size=(40, D)) * scale
        y = np.where(X @ truth + 0.3 * rng.normal(size=40) > 0, 1.0, -1.0)
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(-(c.data(X * y[:, None], name="Z") @ w))) / n)
        c.subject_to(fm.norm2(w) <= radius)
    prob.server.minimize(0.005 * fm.sum_squares(w))
    return prob, w


def _program(radius: float):
    prob, _ = _clients(1, radius=radius)
    program = compile_programs(prob, client_sets=True)["c0"]
    program.configure(beta=300.0, prox_weight=1e-4, center=np.zeros(D))
    return program


def _local(program, x0, tol, method="auto"):
    return program.solve_local(linear=np.linspace(-1e-2, 1e-2, D), weight=0.5, anchor=np.full(D, 0.1),
                               x0=x0, tol=tol, method=method)


@pytest.mark.parametrize("radius", [0.3, 100.0])
def test_a_ball_s_local_solve_takes_few_evaluations_and_fista_s_answer(radius, monkeypatch):
    """Active ball (r = 0.3) and inactive (r = 100): Newton inside the ball, ≤ 12 evaluations
    (main's FISTA with the ball active: 107 at tol 1e-10), the prox residual ≤ tol, the point FISTA
    reaches at tol 1e-13 to 1e-9, and the ball's boundary when active."""
    program = _program(radius)
    calls, inner = [], program.compiled.value_grad
    monkeypatch.setattr(program.compiled, "value_grad", lambda x, y: calls.append(1) or inner(x, y))
    out = _local(program, np.zeros(D), 1e-10)
    assert out["grad_norm"] <= 1e-10
    assert len(calls) <= 12, len(calls)
    reference = _local(_program(radius), np.zeros(D), 1e-13, method="fista")["x"]
    np.testing.assert_allclose(out["x"], reference, rtol=0, atol=1e-9)
    if radius < 1:
        assert abs(np.linalg.norm(out["x"]) - radius) <= 1e-12
    else:
        assert np.linalg.norm(out["x"]) < radius


def test_remainder_is_the_ball_term_s_residual():
    """`ball_newton.remainder` row by row equals the program's `prox_remainder` (the ball
    term's): inside, on the sphere with the gradient out and in, at 0 for r = 0."""
    program = _program(0.3)
    rng = np.random.default_rng(1)
    G = rng.normal(size=(4, D))
    unit = G / np.linalg.norm(G, axis=1)[:, None]     # Z_j along ±G_j: −G_j points out at −r unit_j
    Z = np.array([0.1 * unit[0], -0.3 * unit[1], 0.3 * unit[2], -0.3 * unit[3] * (1 - 1e-7)])
    R = ball_newton.remainder(Z, G, np.full(4, 0.3))
    for j in range(4):
        np.testing.assert_allclose(R[j], program.prox_remainder(Z[j], G[j]), rtol=1e-14, atol=1e-15)
    assert np.abs(R[1]).max() < 1e-12 and np.abs(R[3]).max() < 1e-6     # the normal cone counted
    np.testing.assert_array_equal(R[[0, 2]], G[[0, 2]])
    np.testing.assert_array_equal(ball_newton.remainder(np.zeros((1, D)), G[:1], np.zeros(1)), 0.0)


def _run(executor, n=6, **kw):
    prob, w = _clients(n)
    return prob.solve("proxal", executor=executor, inner="admm", **kw), w


@pytest.mark.integration
def test_the_batched_executor_solves_a_group_s_balls_in_one_stack_as_serial(monkeypatch):
    """ProxAL (inner ADMM) on 6 ball clients: the batched executor's local solves are stacked
    (no client's own solver: main served each by `_solve_each`, FISTA), and the run is the
    serial one: status, iterations, answer to 1e-12; converged and verified against CVXPY."""
    serial, w = _run(SerialExecutor())
    own = []
    inner = Group._solve_each
    monkeypatch.setattr(Group, "_solve_each", lambda self, *a, **k: own.append(1) or inner(self, *a, **k))
    batched, w2 = _run(BatchedExecutor())
    assert own == []
    assert serial.status == batched.status == "converged"
    assert serial.iterations == batched.iterations
    np.testing.assert_allclose(batched.value(w2), serial.value(w), rtol=0, atol=1e-12)   # (docs/executors.md)
    report = fm.verify(batched)
    assert report.ok, report


def test_unsettled_rows_are_finished_by_fista_as_on_one_node():
    """Rows the stacked Newton does not settle (here: max_steps = 1) are finished by each
    client's FISTA: the group's answer is each program's own solve's, to the tolerance."""
    prob, _ = _clients(3)
    programs = compile_programs(prob, client_sets=True)
    names = [f"c{i}" for i in range(3)]
    group = Group(names, [programs[m] for m in names])
    for p in group.programs:
        p.configure(beta=300.0, prox_weight=1e-4, center=np.zeros(D))
    Z0 = np.zeros((3, D))
    rows = np.arange(3)
    Z, steps, residual = group.solve_local(Z0, rows, np.zeros(D), np.array([0.5, 1.0, 2.0]), np.full(D, 0.1),
                                           1e-10, "prox", max_steps=1)
    assert np.all(residual <= 1e-10) and np.all(steps > 1)
    for j, m in enumerate(names):
        alone = programs[m].solve_local(linear=np.zeros(D), weight=[0.5, 1.0, 2.0][j], anchor=np.full(D, 0.1),
                                        x0=np.zeros(D), tol=1e-12)["x"]
        np.testing.assert_allclose(Z[j], alone, rtol=0, atol=1e-8)
    assert local_solvers.choose(programs["c0"], "fista") == "fista"


def test_a_ball_group_s_certificate_is_stacked_and_each_client_s(monkeypatch):
    """The normal cones in the certificate (22) of ball clients at the server's w: one stacked
    computation (main: each client's `constraint_remainder`), each row the client's own to
    round-off — w on the sphere (the cone counts) and inside it."""
    from fedmodel.runtime.program import NodeProgram
    prob, _ = _clients(4)
    programs = compile_programs(prob, client_sets=True)
    names = [f"c{i}" for i in range(4)]
    group = Group(names, [programs[m] for m in names])
    R = np.random.default_rng(2).normal(size=(4, D))
    for x, cone in ((-0.3 * R[0] / np.linalg.norm(R[0]), True), (np.full(D, 0.01), False)):
        want = np.array([programs[m].constraint_remainder(x, R[j]) for j, m in enumerate(names)])
        with monkeypatch.context() as patched:
            patched.setattr(NodeProgram, "constraint_remainder", lambda *a: pytest.fail("per client"))
            got = group.constraint_remainder(np.arange(4), x, R)
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
        assert np.array_equal(got, R) != cone
