"""Client constraints held in the local solves ("local-al"), for rows of clients at once
(issue 27 item 3): the batched executor solves a group's method of multipliers as one stack
(`Group._solve_held`: each round one batched Newton solve) and reads the certificate's
normal cones for the whole group (`Group.constraint_remainder`), with the serial run's
iterates; the JAX engine the same; the held constraints' Jacobian rows (`LocalPlans.select`:
θ written only when the row changes) are never read at another row or point."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import ProxAL
from fedmodel.runtime import local_al
from fedmodel.runtime.batched_group import Group
from fedmodel.runtime.program import compile_programs
from test_proxal_local import np_active

TOL = 1e-8


def quiet_solve(prob, executor, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prob.solve(ProxAL(**{"inner": "admm", **options}), executor=executor)   # (Algorithm 2's held solves)


@pytest.fixture
def stacked(monkeypatch) -> dict:
    """Every group of ≥ 2 clients solves "local-al" as one stack (`Group.HELD_ROWS` = 2: the
    test models are small); counts the stacked solves and their rows."""
    monkeypatch.setattr(Group, "HELD_ROWS", 2)
    counts = {"solves": 0, "rows": 0}
    solve = Group._solve_held

    def counted(self, Z0, rows, *args, **kwargs):
        counts["solves"] += 1
        counts["rows"] += len(rows)
        return solve(self, Z0, rows, *args, **kwargs)
    monkeypatch.setattr(Group, "_solve_held", counted)
    return counts


def assert_same_iterates(serial, other, w, certificates: float = 1e-6):
    """Same iterations, values to TOL, each ADMM step's certificate to `certificates` relative
    (an inexact local solve's last bits move the certificate more than the iterates)."""
    assert (serial.status, serial.iterations) == (other.status, other.iterations)
    np.testing.assert_allclose(other.value(w), serial.value(w), rtol=TOL, atol=TOL)
    for a, b in zip(serial.history, other.history):
        np.testing.assert_allclose(b["inner_certificates"], a["inner_certificates"], rtol=certificates, atol=TOL)
        assert b["objective"] == pytest.approx(a["objective"], rel=TOL)
    for name, mu in serial.multipliers.items():
        np.testing.assert_allclose(other.multipliers[name], mu, rtol=1e-6, atol=TOL)
    assert serial.ledger == other.ledger


def test_batched_held_solves_are_one_stack_with_the_serial_iterates(stacked):
    prob, w = np_active(seed=1, n=4, m=400, margin=0.02)
    serial = quiet_solve(prob, "serial")
    batched = quiet_solve(prob, "batched")
    assert serial.status == "converged" and "client_constraints" not in serial.info
    assert_same_iterates(serial, batched, w)
    steps = int(batched.iterations["inner"])
    assert stacked["solves"] == steps and stacked["rows"] == 4 * steps     # every step, all 4


def test_below_held_rows_each_client_solves_alone(monkeypatch):
    """A group smaller than `Group.HELD_ROWS` (stacked evaluations cost more than the
    clients' own at n = 10) takes each client's own "local-al" solve."""
    prob, w = np_active(seed=1, n=4, m=400, margin=0.02)
    calls = []
    monkeypatch.setattr(Group, "_solve_held", lambda self, *a, **k: calls.append(1))
    quiet_solve(prob, "batched", max_outer=1)
    assert Group.HELD_ROWS > 4 and not calls


def test_a_client_back_in_the_al_is_served_alone(stacked):
    """One member told to put its constraint back in the AL (`hold_locally(False)`): the
    group does not stack "local-al" (its members do not all hold theirs)."""
    prob, _ = np_active(seed=1, n=4, m=400, margin=0.02)
    programs = [p for p in compile_programs(prob, client_constraints=True).values() if p.role == "client"]
    group = Group([p.name for p in programs], programs)
    rows = np.arange(4)
    assert group._held_rest(rows) == "newton"
    programs[2].hold_locally(False)
    assert group._held_rest(rows) is None


@pytest.mark.integration     # JAX equivalence (~6 s with JAX's import): CI's integration run
def test_jax_with_held_constraints_matches_serial(stacked):
    """Issue 27 item 3: ProxAL with `client_constraints="local"` on the JAX engine (its
    merits vmapped, the held constraints' rounds stacked) gives the serial iterates."""
    pytest.importorskip("jax")
    from fedmodel.runtime.jax_executor import JaxExecutor
    prob, w = np_active(seed=1, n=4, m=400, margin=0.02)
    serial = quiet_solve(prob, "serial", client_constraints="local")
    ex = JaxExecutor()
    run = quiet_solve(prob, ex, client_constraints="local")
    assert serial.status == "converged" and "client_constraints" not in run.info
    # (JAX's gradients differ from the plans' in the last bits; the rounds' Newton solves stop
    # within tolerance at points that differ by ~1e-7: certificates measured 3.7e-5 apart)
    assert_same_iterates(serial, run, w, certificates=1e-4)
    assert stacked["solves"] == int(run.iterations["inner"])
    assert sum(g.calls["value_grad"] for g in ex.groups) > 0       # the merits evaluated by JAX


def two_row_clients(n: int = 3, seed: int = 4):
    """Clients with a vector constraint of two rows on w (two NP-style losses ≤ levels)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(3, name="w")
    prob = fm.Problem("two-rows")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        X0, A = rng.standard_normal((12, 3)), rng.standard_normal((2, 3))
        c.minimize(fm.mean(fm.logistic(c.data(X0, name="X0") @ w)))
        c.subject_to((fm.exp(c.data(A, name="A") @ w) <= np.array([2.0, 3.0])).named(f"two[{i}]"))
    return prob, w


def central_jacobian(program, plans, x):
    """∇ₓg by central differences of `LocalPlans.values` (an independent answer)."""
    step, rows = 1e-6, []
    for j in range(x.size):
        e = np.zeros(x.size)
        e[j] = step
        rows.append((plans.values(program, x + e, program.y) - plans.values(program, x - e, program.y)) / (2 * step))
    return np.array(rows).T


def test_jacobian_rows_are_read_at_their_row_and_point():
    prob, _ = two_row_clients()
    programs = [p for p in compile_programs(prob, client_constraints=True).values() if p.role == "client"]
    program, plans = programs[0], local_al.local_plans(programs[0])
    assert plans.rows == 2
    x1, x2 = np.array([0.1, -0.2, 0.3]), np.array([-0.5, 0.4, 0.2])
    J1 = plans.jacobian(program, x1, program.y)
    np.testing.assert_allclose(J1, central_jacobian(program, plans, x1), rtol=1e-7, atol=1e-8)
    assert J1[0] @ J1[1] != pytest.approx(J1[0] @ J1[0])       # two different rows
    # θ left at row 1: the next point's Jacobian starts from row 0 again, at that point
    J2 = plans.jacobian(program, x2, program.y)
    np.testing.assert_allclose(J2, central_jacobian(program, plans, x2), rtol=1e-7, atol=1e-8)
    # the group's stacked Jacobians select each member's rows; the member's own stay right after
    group = Group([p.name for p in programs], programs)
    X = np.array([x1, x2, x1 + x2])
    values, jacobians = group.held_constraints(X, np.zeros((3, 0)))
    for i, p in enumerate(programs):
        lp = local_al.local_plans(p)
        np.testing.assert_allclose(values[i], lp.values(p, X[i], p.y), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(jacobians[i], central_jacobian(p, lp, X[i]), rtol=1e-7, atol=1e-8)
        np.testing.assert_allclose(lp.jacobian(p, X[i], p.y), jacobians[i], rtol=1e-12, atol=1e-14)


def test_remainder_rows_closed_form_is_the_bounded_least_squares():
    """One near-active row: ν = max(0, −aᵀr/aᵀa) in closed form, the bounded least squares'
    minimizer (scipy's `lsq_linear`, to its tolerance); a group's remainders equal each
    client's own (`local_remainder`)."""
    from scipy.optimize import lsq_linear
    prob, w = np_active(seed=1, n=4, m=400, margin=0.02)
    programs = [p for p in compile_programs(prob, client_constraints=True).values() if p.role == "client"]
    group = Group([p.name for p in programs], programs)
    rng = np.random.default_rng(0)
    # a point on each client's constraint boundary along a ray (g = 0: the row is active)
    X = np.empty((4, programs[0].n_shared))
    for i, p in enumerate(programs):
        lp, direction = local_al.local_plans(p), rng.standard_normal(p.n_shared)
        lo, hi = 0.0, 1.0
        while lp.values(p, hi * direction, p.y)[0] < 0:
            hi *= 2
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if lp.values(p, mid * direction, p.y)[0] < 0 else (lo, mid)
        X[i] = hi * direction
    G = rng.standard_normal(X.shape)
    values, jacobians = group.held_constraints(X, np.zeros((4, 0)))
    out = local_al.remainder_rows(programs, X, G, values, jacobians)
    for i, p in enumerate(programs):
        mu, sigma = local_al.local_plans(p).penalty_weights(p)
        r = G[i] - jacobians[i].T @ np.maximum(mu + sigma * values[i], 0.0)
        nu = lsq_linear(jacobians[i].T, -r, bounds=(0.0, np.inf), tol=1e-12).x
        np.testing.assert_allclose(out[i], r + jacobians[i].T @ nu, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(local_al.local_remainder(p, X[i], G[i]), out[i], rtol=1e-10, atol=1e-12)
    # the group's form of (22)'s remainder at one common point
    x = X[0]
    np.testing.assert_allclose(group.constraint_remainder(np.arange(4), x, G),
                               [p.constraint_remainder(x, g) for p, g in zip(programs, G)],
                               rtol=1e-10, atol=1e-12)


def test_an_unchanged_penalty_keeps_the_memo_a_changed_one_forgets_it():
    prob, _ = np_active(seed=1, n=2, m=200, margin=0.02)
    program = compile_programs(prob, client_constraints=True)["c0"]
    x = np.full(program.n_shared, 0.3)
    before = program.value_grad(x, program.y)[0]
    program._sync_penalties(1e4)
    after = program.value_grad(x, program.y)[0]
    assert after != before
    fresh = compile_programs(prob, client_constraints=True)["c0"]
    fresh._sync_penalties(1e4)
    assert after == fresh.value_grad(x, fresh.y)[0]
    program._sync_penalties(1e4)            # the same σ: nothing written
    assert program.value_grad(x, program.y)[0] == after
