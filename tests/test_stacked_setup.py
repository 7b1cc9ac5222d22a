"""The clients' curvature estimate as one group request (issue 16): `backends.common.curvature_rows`
runs the per-client power iteration row by row (the serial `local_curvature` is its one-row
case), the batched executor serves "local_curvature" and FedADMM's "fedadmm_init" with one group
gradient per step, and FedADMM, FedProx (automatic step) and DP-ADMM (automatic ρ floor) give
the serial runs' numbers on a model written as users write it (one objective per client, the
same private name in every client, ragged rows)."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import ProxAL
from fedmodel.backends.fedadmm import FedADMM
from fedmodel.backends.common import curvature_rows, group_curvature, local_curvature
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.batched_group import Group
from fedmodel.runtime.executor import SerialExecutor
from fedmodel.runtime.messages import STACKED
from fedmodel.runtime.program import compile_programs

from test_stacked_rounds_as_users_write import _model as users_model   # (logistic, ragged, private `b`)

# A group's gradients equal each client's own to a few ulps (batched_plan: another summation
# order); the estimate divides a difference of gradients by h = 1e-4·max(1, ‖x‖∞), so its last
# ~5 digits may differ (measured: ≤ 6e-11 relative on these models)
GROUP_RTOL = 1e-9


def reference_curvature(program, x, scale=1.0, iterations=8) -> float:
    """The per-client estimate as it was written before the row form (the numbers to keep)."""
    n = program.n_shared
    g0 = program.value_grad(x[:n], x[n:])[1] / scale
    v = np.cos(np.arange(1, x.size + 1))
    estimate = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(iterations):
            v = v / np.linalg.norm(v)
            h = 1e-4 * max(1.0, float(np.max(np.abs(x), initial=0.0)))
            y = x + h * v
            hv = (program.value_grad(y[:n], y[n:])[1] / scale - g0) / h
            size = float(np.linalg.norm(hv))
            if not np.isfinite(size) or size == 0.0:
                break
            estimate, v = size, hv
    return estimate


@pytest.fixture
def group_and_points():
    prob, _ = users_model(n=12)
    ex = BatchedExecutor().start(compile_programs(prob))
    (group,) = ex.groups
    rng = np.random.default_rng(0)
    for p in group.programs:          # private values away from 0, shared point with ‖z‖∞ > 1
        p.y = rng.normal(size=p.n_private)
    z = 3.0 * rng.normal(size=group.n_x)
    yield group, z
    ex.close()


def test_serial_estimate_keeps_its_numbers_bitwise(group_and_points):
    group, z = group_and_points
    for iterations in (8, 20):
        for p in group.programs:
            x = np.concatenate([z, p.y])
            assert local_curvature(p, x, 0.3, iterations) == reference_curvature(p, x, 0.3, iterations)


def test_rows_are_independent_with_their_own_steps_and_stops():
    """Each row's estimate is bitwise the one-row call's: its own h (‖x‖∞ from 0.5 to 50), its
    own scale, its own stop (a zero size, a non-finite size at the third step)."""
    rng = np.random.default_rng(1)
    k, N = 5, 6
    A = rng.normal(size=(k, N, N))
    A = A @ A.transpose(0, 2, 1)                  # a quadratic per row: exact Hessian-vector products
    A[1] = 0.0                                    # zero curvature: stops at once with 0
    calls = {"blow": 0}

    def gradient_of(rows):
        def gradient(Z):
            G = np.einsum("kij,kj->ki", A[rows], Z)
            if 2 in rows:                         # row 2 turns non-finite from its third step
                calls["blow"] += 1
                if calls["blow"] > 3:
                    G[list(rows).index(2)] = np.inf
            return G
        return gradient

    X = rng.normal(size=(k, N)) * np.array([0.5, 1.0, 5.0, 50.0, 2.0])[:, None]
    scale = np.array([1.0, 2.0, 0.5, 3.0, 1.0])
    together = curvature_rows(gradient_of(np.arange(k)), X, scale, 8)
    alone = []
    for i in range(k):
        calls["blow"] = 0
        alone.append(curvature_rows(gradient_of(np.array([i])), X[i:i + 1], scale[i], 8)[0])
    assert together[1] == 0.0 and 0 < together[2] and np.all(together[[0, 3, 4]] > 0)
    assert together.tolist() == alone
    # the power iteration converges to the largest eigenvalue / scale on a quadratic
    assert together[0] == pytest.approx(np.linalg.eigvalsh(A[0])[-1], rel=0.2)


def test_group_estimate_equals_serial_for_every_row_subset(group_and_points):
    group, z = group_and_points
    serial = np.array([local_curvature(p, np.concatenate([z, p.y]), 1.0, 20) for p in group.programs])
    np.testing.assert_allclose(group_curvature(group, np.arange(group.n), z, iterations=20), serial,
                               rtol=GROUP_RTOL, atol=0)
    some = np.array([7, 2, 11, 4])               # not every client, not in group order
    np.testing.assert_allclose(group_curvature(group, some, z, iterations=20), serial[some],
                               rtol=GROUP_RTOL, atol=0)


@pytest.fixture
def group_gradients(monkeypatch):
    """Counts `Group.grad` calls (a group gradient is one vectorized evaluation)."""
    calls = []
    original = Group.grad

    def counting(self, X, Y):
        calls.append(len(X))
        return original(self, X, Y)
    monkeypatch.setattr(Group, "grad", counting)
    return calls


def test_fedadmm_setup_is_one_group_request_and_the_run_equals_serial(group_gradients, monkeypatch):
    prob, w = users_model(n=12)
    serial = prob.solve("fedadmm", max_rounds=30)
    ex = BatchedExecutor()
    setup = []
    original = STACKED.get("fedadmm_init", lambda *request: None)   # (None: served node by node)

    def spy(group, rows, blocks, common):
        before = len(group_gradients)
        out = original(group, rows, blocks, common)
        if out is not None:
            setup.append(len(group_gradients) - before)
        return out
    monkeypatch.setitem(STACKED, "fedadmm_init", spy)
    batched = prob.solve("fedadmm", executor=ex, max_rounds=30)
    assert ex.stats[("fedadmm_init", "batched")] == 12 and ex.stats[("fedadmm_init", "serial")] == 0
    assert setup == [9]                          # one group request: 8 + 1 group gradients
    assert batched.ledger.messages == serial.ledger.messages
    np.testing.assert_allclose(list(batched.info["final_lr"].values()), list(serial.info["final_lr"].values()),
                               rtol=GROUP_RTOL, atol=0)
    assert batched.status == serial.status
    np.testing.assert_allclose(batched.value(w), serial.value(w), rtol=0, atol=1e-10)


def test_fedprox_automatic_step_is_one_group_request_and_equals_serial():
    prob, w = users_model(n=12)
    serial = prob.solve("fedprox", max_rounds=40)
    ex = BatchedExecutor()
    batched = prob.solve("fedprox", executor=ex, max_rounds=40)
    assert ex.stats[("local_curvature", "batched")] == 12 and ex.stats[("local_curvature", "serial")] == 0
    assert batched.ledger.messages == serial.ledger.messages
    assert batched.info["step"] == pytest.approx(serial.info["step"], rel=GROUP_RTOL)
    np.testing.assert_allclose(batched.value(w), serial.value(w), rtol=0, atol=1e-10)


def test_dp_admm_rho_floor_is_one_group_request_and_equals_serial():
    prob, w = users_model(private=False, n=12)
    serial = prob.solve("dp-admm", seed=3, max_rounds=60)
    ex = BatchedExecutor()
    batched = prob.solve("dp-admm", executor=ex, seed=3, max_rounds=60)
    # (asked in the set-up request `dp_admm_init`: its group form, `backends.dp_admm.setup`)
    assert ex.stats[("dp_admm_init", "batched")] == 12 and ex.stats[("dp_admm_init", "serial")] == 0
    assert "local_curvature" not in batched.ledger.trips
    assert batched.status == serial.status
    np.testing.assert_allclose(batched.value(w), serial.value(w), rtol=0, atol=1e-10)


def test_clients_of_two_structures_are_estimated_group_by_group():
    """A request to clients of two structures is split by group (the per-node form)."""
    prob, w = users_model(n=8)
    rng = np.random.default_rng(3)
    for i in range(4):                             # 4 least-squares clients beside the 8 logistic ones
        c = prob.add_client(f"ls{i}")
        c.variable(name="b")
        A = c.data(rng.normal(size=(int(rng.integers(5, 30)), 4)), name="A")
        c.minimize(fm.sum_squares(A @ w - 1.0) / 10 + fm.sum_squares(c.private_variables[0]))
    programs = compile_programs(prob)
    ex = BatchedExecutor().start(programs)
    z = np.linspace(-1.0, 1.0, ex.model_size)
    estimates = ex.map_stacked("local_curvature", tuple(ex.clients), common={"z": z, "iterations": 8})["L"]
    assert len(ex.groups) == 2 and ex.stats[("local_curvature", "batched")] == 12
    serial = [local_curvature(programs[c], np.concatenate([z, programs[c].y])) for c in ex.clients]
    np.testing.assert_allclose(estimates, serial, rtol=GROUP_RTOL, atol=0)
    ex.close()


def test_proxal_with_fedadmm_inner_keeps_each_clients_beta_on_batched():
    """ProxAL's subproblems by FedADMM-InSa: every subproblem starts with a stacked
    "fedadmm_init" that keeps each client's adapted β_i (β = None) from the batched rounds
    before it; the run equals the serial one."""
    prob, w = users_model(n=6, private=False)
    for c in prob.clients:
        c.subject_to(fm.sum_squares(w) <= 0.5)
    proxal = dict(beta=10.0, rho=1.0, tol=(1e-5, 1e-5), max_outer=15)
    inner = dict(beta=5.0, adaptive=True, local_solver="gd", max_rounds=300)
    serial = prob.solve(ProxAL(**proxal, inner=FedADMM(**inner)))
    ex = BatchedExecutor()
    batched = prob.solve(ProxAL(**proxal, inner=FedADMM(**inner)), executor=ex)
    assert ex.stats[("fedadmm_init", "batched")] == 6 * batched.iterations["outer"]
    assert ex.stats[("fedadmm_round", "batched")] > 0
    assert batched.status == serial.status and batched.iterations == serial.iterations
    np.testing.assert_allclose(batched.value(w), serial.value(w), rtol=0, atol=1e-8)


def test_a_second_run_on_the_same_batched_executor_starts_from_the_adapted_betas():
    """`FedADMM.rounds` twice on one executor, the second keeping each client's β_i (as ProxAL's
    composition does): the stacked init reads the β_i that the batched rounds hold and replaces
    the state they checked, so both runs equal the serial executor's."""
    prob, w = users_model(n=6)
    backend = FedADMM(beta=100.0, adaptive=True, max_rounds=20)
    alpha = np.full(6, 1.0 / 6)
    results = []
    for ex in (SerialExecutor(), BatchedExecutor()):
        ex.start(compile_programs(prob, client_sets=True))
        z = np.zeros(ex.model_size)
        first, _, _, _ = backend.rounds(ex, z, alpha, 20)
        second, history, _, _ = backend.rounds(ex, 0.5 * first, alpha, 20, keep_beta=True)
        results.append((first, second, history[0]["mean_beta"]))
        ex.close()
    (first, second, beta), (first_b, second_b, beta_b) = results
    assert ex.stats[("fedadmm_init", "batched")] == 12 and ex.stats[("fedadmm_round", "serial")] == 0
    assert beta != 100.0 and beta_b == pytest.approx(beta, rel=1e-9)
    np.testing.assert_allclose(first_b, first, rtol=0, atol=1e-10)
    np.testing.assert_allclose(second_b, second, rtol=0, atol=1e-10)
