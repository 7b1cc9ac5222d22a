"""`JaxGroup.hessian` (issue 16): the Hessians come from the lowered merit `value_grad` uses,
on its device data (no second lowering, no second copy of the clients' data); a few clients
take their own Hessian plans; the numbers equal each client's own Hessian plan."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime.program import compile_programs

pytest.importorskip("jax")
from fedmodel.runtime import jax_engine  # noqa: E402
from fedmodel.runtime.jax_executor import JaxGroup  # noqa: E402

pytestmark = pytest.mark.integration     # JAX equivalence (compiles per shape): CI runs it after the fast suite

D = 3
N_CLIENTS = 40


def _ragged_group() -> tuple[JaxGroup, list]:
    """40 logistic clients of 3 … 90 rows (several buckets), each with its own ball term."""
    rng = np.random.default_rng(11)
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i, m in enumerate(rng.permutation(np.geomspace(3, 90, N_CLIENTS).astype(int))):
        c = prob.add_client(f"c{i}")
        X, y = c.data(rng.normal(size=(m, D)), name="X"), c.data(np.sign(rng.normal(size=m)), name="y")
        c.minimize(fm.sum(fm.logistic(-fm.multiply(y, X @ w))) / m)
        c.subject_to(fm.sum_squares(w - 0.1 * rng.normal(size=D)) <= 1.0)
    programs = compile_programs(prob)
    clients = [p for p in programs.values() if p.role == "client"]
    for p in clients:
        p.configure(30.0, 0.01, np.full(p.n_shared, 0.2))
    return JaxGroup([p.name for p in clients], clients), clients


@pytest.fixture(scope="module")
def group_and_clients():
    return _ragged_group()


def _points(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return np.random.default_rng(seed).normal(size=(N_CLIENTS, D)), np.zeros((N_CLIENTS, 0))


def test_hessians_of_all_clients_equal_their_plans_and_are_the_callers_array(group_and_clients):
    group, clients = group_and_clients
    X, Y = _points(1)
    before = group.calls["hessian"]
    everyone = group.hessian(X, Y)
    assert group.calls["hessian"] == before + 1          # one jitted call for the group
    assert everyone.flags.writeable          # the caller's own array, not a view of JAX's buffer
    for i in range(N_CLIENTS):
        np.testing.assert_allclose(everyone[i], clients[i].hessian(X[i]), rtol=1e-10, atol=1e-12)
    rows = np.arange(0, N_CLIENTS, 3)                   # more than STRAGGLERS · n: the group call
    np.testing.assert_allclose(group.hessian(X, Y, rows), everyone[rows], rtol=1e-12, atol=1e-14)
    assert group.calls["hessian"] == before + 2


def test_a_few_clients_use_their_own_plans_without_a_jitted_call(group_and_clients):
    """At most STRAGGLERS · n clients (a Newton solve's last refreshes): each client's Hessian
    plan, no second compiled function, the same numbers as the group call."""
    group, clients = group_and_clients
    X, Y = _points(3)
    everyone = group.hessian(X, Y)
    before = group.calls["hessian"]
    rows = np.array([37, 3])                             # any order; 2 ≤ 40 / 16
    H = group.hessian(X, Y, rows)
    assert group.calls["hessian"] == before
    for k, i in enumerate(rows):
        np.testing.assert_allclose(H[k], clients[i].hessian(X[i]), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(H[k], everyone[i], rtol=1e-10, atol=1e-12)


def test_hessians_reuse_the_lowered_merit_and_its_device_data(monkeypatch):
    """value_grad then hessian lower each bucket's plans once (no second JaxGroupPlan, i.e. no
    second stacking and transfer of the data), and the Hessians read the very device arrays
    value_grad holds."""
    made = []

    class Counting(jax_engine.JaxGroupPlan):
        def __init__(self, plans):
            made.append(len(plans))
            super().__init__(plans)
    monkeypatch.setattr(jax_engine, "JaxGroupPlan", Counting)
    group, _ = _ragged_group()
    X, Y = _points(2)
    group.value_grad(X, Y)
    fn = group._function("value_grad_plan")
    assert sum(made) == N_CLIENTS == sum(len(g) for g in fn.groups)
    held = fn.arguments()
    seen = []
    monkeypatch.setattr(fn, "arguments", lambda: seen.append(1) or held)
    group.hessian(X, Y)
    assert sum(made) == N_CLIENTS and group.calls["hessian"] == 1 and seen    # read value_grad's arguments
    for bucket, arguments in enumerate(held):        # ... which are the bucket plans' device arrays
        constants = fn.plans[bucket].constants()
        assert all(a is b for a, b in zip(arguments[1:], constants))
