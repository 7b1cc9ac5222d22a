"""ProxAL's client steps vectorized (backends/proxal_nodes.py: one step over rows of clients) on `executor="batched"` and
`executor="jax"`: the same run as the serial executor to 1e-8 (history with every ADMM
certificate, multipliers, final values, ledger), with the forms really serving the rounds
(`stats[(kind, "batched")]`, `jax_calls`) and no JaxFallbackWarning for them; the batched
Newton / exact local solve (`Group.solve_newton`) against each client's own
`NodeProgram.solve_local`, and the batched Hessians against the clients' Hessian plans.

The models are chosen where ProxAL is well-conditioned: the serial run itself moves by less
than 1e-8 when w⁰ is perturbed by 1e-14 (checked below). On slow, near-degenerate runs
(hundreds of Anderson-accelerated ADMM steps, e.g. a linear constraint active at the
solution) a 1e-14 perturbation of w⁰ changes the serial run by 1e-5, and the vectorized
arithmetic (sparse block products, stacked inverse Newton matrices) by as much: no executor can match there
beyond the rounding the iteration amplifies. Two of ProxAL's own decisions read numbers at
rounding level once the clients' local solves stop moving (0 Newton steps while ε_t falls):
residual balancing compares the primal residual with ρ‖w − w_prev‖∞, which is then rounding
noise, and Anderson fits γ to residuals near rounding level. Another executor's last bits flip
them (on this model: from the second outer iteration, ρ_i halved instead of doubled), so
adaptive ρ and Anderson (the defaults) are tested over one outer iteration, and β growth over
six with fixed ρ_i and no Anderson."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends.proxal import ProxAL
from fedmodel.errors import FedModelError
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.batched_group import Group
from fedmodel.runtime.program import compile_programs
from test_batched import D as D_LS, _least_squares, _private_variables_problem

jax_executor = pytest.importorskip("fedmodel.runtime.jax_executor", exc_type=ImportError)
pytest.importorskip("jax")
from fedmodel.runtime.jax_executor import JaxExecutor, JaxFallbackWarning, JaxGroup  # noqa: E402
from test_jax_executor import assert_same_run  # noqa: E402

pytestmark = pytest.mark.integration     # JAX equivalence (compiles per shape): CI runs it after the fast suite

D = 4
STEP_KINDS = ("proxal_admm_init", "proxal_admm_step", "update_multipliers")


def _ball_logistic(n: int = 5, seed: int = 3, ragged: bool = True, two_kinds: bool = False) -> fm.Problem:
    """Logistic regression, each client with its own ball ‖w − c_i‖² ≤ 1 (an AL term);
    `two_kinds`: every other client a least-squares client instead (a second group)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i in range(n):
        m = 6 + 3 * (i % 3) if ragged else 8
        c = prob.add_client(f"c{i}")
        X, y = c.data(rng.normal(size=(m, D)), name="X"), c.data(np.sign(rng.normal(size=m)), name="y")
        if two_kinds and i % 2:
            c.minimize(fm.sum_squares(X @ w - y) / m)
        else:
            c.minimize(fm.sum(fm.logistic(-fm.multiply(y, X @ w))) / m)
        c.subject_to(fm.sum_squares(w - 0.1 * rng.normal(size=D)) <= 1.0)
    return prob


def _run(prob, make, executor):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", JaxFallbackWarning)
        res = prob.solve(make(), executor=executor)
    named = [str(w.message) for w in caught if issubclass(w.category, JaxFallbackWarning)]
    return res, named


def _check_vectorized(prob, make, method: str):
    """serial == batched == jax (to 1e-8), every client step served by the forms."""
    serial = prob.solve(make(), executor="serial")
    executors = (BatchedExecutor(), JaxExecutor())
    for ex in executors:
        run, named = _run(prob, make, ex)
        assert_same_run(serial, run)
        assert not [m for m in named if any(f"'{k}'" in m for k in STEP_KINDS)], named
        steps = serial.iterations["inner"] * len(ex.clients)
        assert ex.stats[("proxal_admm_step", "batched")] == steps
        assert ex.stats[("proxal_admm_step", "serial")] == 0
        assert ex.stats[("proxal_admm_init", "batched")] == serial.iterations["outer"] * len(ex.clients)
        assert ex.stats[("update_multipliers", "serial")] == serial.iterations["outer"]   # the server
        assert ex.groups[0].local_method("auto") == method
        if isinstance(ex, JaxExecutor):
            assert ex.jax_calls["value_grad"] > serial.iterations["inner"]
            assert ex.jax_calls["hessian"] > 0
    return serial, executors


# (client_constraints="al": the constraints in P_i, solved by Newton; held in the clients'
# solves they take the local method of multipliers, "local-al")
@pytest.mark.parametrize("make", [lambda **k: ProxAL(max_outer=1, client_constraints="al", **k),
                                  lambda **k: ProxAL(anderson=0, adaptive_rho=False, max_outer=6,
                                                     client_constraints="al", **k),
                                  lambda **k: ProxAL.paper(max_outer=2, **k)],
                         ids=["defaults", "fixed-rho", "paper"])
def test_constrained_logistic_newton_matches_serial(make):
    """Defaults (Anderson, adaptive ρ_i; one outer iteration), β growth with fixed ρ_i and no
    Anderson, and the paper's fixed setting: Newton local solves with the chord Hessian, ragged
    clients (6, 9, 12 rows)."""
    prob = _ball_logistic()
    serial, _ = _check_vectorized(prob, make, "newton")
    assert serial.iterations["inner"] >= 5        # (defaults: 9 ADMM steps since ρ is batched)
    perturbed = prob.solve(make(w0=np.full(D, 1e-14)), executor="serial")    # a well-conditioned run
    assert_same_run(serial, perturbed)


def test_least_squares_exact_matches_serial():
    """A quadratic merit: "exact" (one Newton step and one refinement on the cached Hessian),
    ragged clients; with the true-residual check (request "merit") at every outer iteration."""
    prob, _ = _least_squares(n=4, sizes=[5, 9, 12, 7])
    serial, executors = _check_vectorized(prob, lambda: ProxAL(max_outer=4, check_certificate=True, inner="admm"), "exact")
    assert all(r["true_residual"] is not None for r in serial.history)
    for ex in executors:          # the certificate's check: every client's ∇P_i by one group call
        assert ex.stats[("merit", "batched")] == len(ex.clients) * serial.iterations["outer"]


def test_private_variables_exact_matches_serial():
    """Clients with private variables s_i (z = (w, s_i): the Hessian and the Newton solve run
    over both, the proximal weight on w only)."""
    _check_vectorized(_private_variables_problem(), lambda: ProxAL(anderson=0, adaptive_rho=False,
                                                                   max_outer=2), "exact")


def test_two_structures_are_two_vectorized_groups():
    """Logistic and least-squares clients (each with its ball): two groups, each one vectorized."""
    prob = _ball_logistic(n=6, two_kinds=True)
    make = lambda: ProxAL(anderson=0, adaptive_rho=False, max_outer=3)     # noqa: E731
    serial = prob.solve(make(), executor="serial")
    for ex in (BatchedExecutor(), JaxExecutor()):
        run, named = _run(prob, make, ex)
        assert_same_run(serial, run)
        assert not named and len(ex.groups) == 2
        assert ex.stats[("proxal_admm_step", "batched")] == 6 * serial.iterations["inner"]


def test_groups_with_too_large_hessian_stacks_solve_per_client(monkeypatch, solve_counts):
    """Above MAX_HESSIAN_FLOATS (k·N² floats per stack) the group's step solves client by
    client (each client's own Newton solve): the same numbers, no batched solve."""
    import fedmodel.runtime.batched_newton as batched_newton
    prob, _ = _least_squares(n=3)
    serial = prob.solve(ProxAL(max_outer=2, inner="admm"), executor="serial")
    monkeypatch.setattr(batched_newton, "MAX_HESSIAN_FLOATS", 3 * D_LS ** 2 - 1)
    counts = solve_counts
    ex = BatchedExecutor()
    assert_same_run(serial, prob.solve(ProxAL(max_outer=2, inner="admm"), executor=ex))
    assert ex.stats[("proxal_admm_step", "serial")] == 0 < ex.stats[("proxal_admm_step", "batched")]
    assert counts["batched"] == 0 < counts["own"]


def test_lbfgs_solves_per_client_with_the_same_numbers(solve_counts):
    """local_solver="lbfgs" (scipy's L-BFGS-B runs one client at a time): the group's step runs
    each client's own solver, with the serial numbers."""
    prob = _ball_logistic(n=3)
    make = lambda: ProxAL(max_outer=2, local_solver="lbfgs")     # noqa: E731
    serial = prob.solve(make(), executor="serial")
    counts = solve_counts
    ex = JaxExecutor()
    run, _ = _run(prob, make, ex)
    assert_same_run(serial, run)
    assert ex.stats[("proxal_admm_step", "serial")] == 0 < ex.stats[("proxal_admm_step", "batched")]
    assert counts["batched"] == 0 < counts["own"]


# ---- the batched Newton solve and Hessians, against each client's own -------------------------
def _group(prob, cls=Group, beta=30.0):
    programs = compile_programs(prob)
    names = [n for n, p in programs.items() if p.role == "client"]
    clients = [programs[n] for n in names]
    for p in clients:
        p.configure(beta, 0.01, np.full(p.n_shared, 0.2))
    return cls(names, clients), clients


@pytest.mark.parametrize("cls", [Group, JaxGroup])
def test_hessians_equal_each_clients_hessian_plan(cls):
    group, clients = _group(_ball_logistic(n=6))
    X = np.random.default_rng(0).normal(size=(6, D))
    H = group.hessian(X, np.zeros((6, 0)), np.array([4, 1, 2]))
    for k, i in enumerate([4, 1, 2]):
        np.testing.assert_allclose(H[k], clients[i].hessian(X[i]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", [Group, JaxGroup])
@pytest.mark.parametrize("method", ["newton", "exact"])
@pytest.mark.parametrize("stragglers", [Group.STRAGGLERS, 1.0])
def test_solve_newton_equals_each_clients_solve_local(cls, method, stragglers):
    """Group.solve_newton for members 0, 2, 3 equals every client's own solve_local (point,
    steps, residual) twice in a row (the second from the chord Hessians the first kept, which
    must be the ones the serial solve keeps); stragglers = 1: every line-search evaluation
    by the clients' own programs instead of the group's."""
    prob = _ball_logistic(n=5) if method == "newton" else _least_squares(n=5, sizes=[5, 9, 12, 7, 6])[0]
    d = D if method == "newton" else D_LS
    group, clients = _group(prob, cls)
    group.STRAGGLERS = stragglers
    _, serial = _group(prob)
    rng = np.random.default_rng(1)
    rows = np.array([0, 2, 3])
    for tol in (1e-4, 1e-9):
        linear, rho = rng.normal(size=(3, d)), np.array([0.1, 1.0, 5.0])
        anchor, Z0 = rng.normal(size=d), rng.normal(size=(3, d))
        Z, steps, residual = group.solve_newton(Z0, rows, linear, rho, anchor, tol, method)
        for k, i in enumerate(rows):
            want = serial[i].solve_local(linear[k], rho[k], anchor, Z0[k], tol, method=method)
            np.testing.assert_allclose(Z[k], want["x"], rtol=1e-10, atol=1e-10)
            assert steps[k] == want["steps"]
            np.testing.assert_allclose(residual[k], want["grad_norm"], rtol=1e-6, atol=1e-12)
            np.testing.assert_allclose(clients[i]._hessian_cache, serial[i]._hessian_cache, atol=1e-10)
        assert steps.max() > 0
    assert clients[1]._hessian_cache is None           # a non-member keeps its state


@pytest.mark.parametrize("cls", [Group, JaxGroup])
def test_solve_newton_factors_each_newton_matrix_once_per_change(cls, monkeypatch):
    """The stacked factors of ∇²P_i + diag(ρ_i) outlive a solve: "exact" inverts each member's
    matrix once, then none while Hessians and weights stay, only the client whose ρ_i
    changed, only the client whose program replaced its Hessian, none for fewer members;
    "newton" one per Hessian evaluated (chord refreshes), none per step. Serial numbers."""
    import fedmodel.runtime.batched_newton as batched_newton
    inverted, evaluated = [], []
    invert, hessian = batched_newton._invert, cls.hessian
    monkeypatch.setattr(batched_newton, "_invert", lambda A: inverted.append(len(A)) or invert(A))
    monkeypatch.setattr(cls, "hessian", lambda g, X, Y, r: evaluated.append(len(r)) or hessian(g, X, Y, r))
    rng = np.random.default_rng(2)
    rho = np.array([0.1, 0.5, 1.0, 5.0, 2.0])     # per client

    def solve(group: Group, serial: list, rows: list[int], method: str = "exact") -> tuple[int, int]:
        """A solve of clients `rows` (checked against serial): matrices inverted, Newton steps."""
        inverted.clear()
        k, d = len(rows), group.n_x
        linear, anchor, Z0 = rng.normal(size=(k, d)), rng.normal(size=d), rng.normal(size=(k, d))
        Z, steps, _ = group.solve_newton(Z0, np.array(rows), linear, rho[rows], anchor, 1e-9, method)
        for j, i in enumerate(rows):
            want = serial[i].solve_local(linear[j], rho[i], anchor, Z0[j], 1e-9, method=method)
            np.testing.assert_allclose(Z[j], want["x"], rtol=1e-10, atol=1e-10)
            assert steps[j] == want["steps"]
        return sum(inverted), int(steps.sum())

    prob = _least_squares(n=5, sizes=[5, 9, 12, 7, 6])[0]
    group, clients = _group(prob, cls)
    _, serial = _group(prob)
    assert solve(group, serial, [0, 2, 3]) == (3, 6)
    assert solve(group, serial, [0, 2, 3])[0] == 0
    rho[2] = 2.0
    assert solve(group, serial, [0, 2, 3])[0] == 1
    for programs in (clients, serial):     # a serial solve's refresh: a new Hessian object
        programs[3]._hessian_cache = programs[3]._hessian_cache.copy()
    assert solve(group, serial, [0, 2, 3])[0] == 1
    assert solve(group, serial, [2, 3])[0] == 0

    prob = _ball_logistic(n=5)
    (group, _), (_, serial) = _group(prob, cls), _group(prob)
    evaluated.clear()
    counts = [solve(group, serial, [0, 2, 3], "newton") for _ in range(3)]
    assert sum(c[0] for c in counts) == sum(evaluated) < sum(c[1] for c in counts)


def test_solve_newton_refuses_other_methods():
    group, _ = _group(_ball_logistic(n=3))
    with pytest.raises(FedModelError, match="lbfgs"):
        group.solve_newton(np.zeros((3, D)), np.arange(3), np.zeros((3, D)), np.ones(3),
                           np.zeros(D), 1e-6, "lbfgs")


@pytest.mark.parametrize("executor", ["batched", "jax"])
def test_a_users_model_with_defaults_is_solved_or_refused_as_on_serial(executor):
    """As a user writes it: `prob.solve("proxal", executor=...)`, default options, run to the
    end. A feasible model reaches CVXPY's answer (the path may differ from serial's, see the
    module docstring; the answer may not); an infeasible one — every client's ball cannot hold
    sum(w) ≥ 10 — says "infeasible", with a warning, on the vectorized executor too."""
    prob = _ball_logistic(n=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JaxFallbackWarning)
        result = prob.solve("proxal", executor=executor)
    assert result.status == "converged" and fm.verify(result).ok
    for client in prob.clients:
        client.subject_to(fm.sum(prob.variables()[0]) >= 10.0)
    assert prob.solve("cvxpy").status == "infeasible"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = prob.solve("proxal", executor=executor)
    assert result.status == "infeasible"
    assert any("infeasible" in str(w.message) for w in caught if not issubclass(w.category, JaxFallbackWarning))
