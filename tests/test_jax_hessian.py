"""`JaxGroup.hessian` (issue 16): the Hessians come from the lowered merit `value_grad` uses,
on its device data (no second lowering, no second copy of the clients' data), and only the
clients asked for are evaluated; the numbers equal each client's own Hessian plan."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime.program import compile_programs

pytest.importorskip("jax")
from fedmodel.runtime import jax_executor  # noqa: E402
from fedmodel.runtime.jax_executor import JaxGroup  # noqa: E402

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


def _record_hessian_calls(fn, monkeypatch) -> list:
    """Wraps fn's jitted Hessian functions: per bucket evaluated, (bucket, clients evaluated,
    its arguments)."""
    calls = []
    everyone, per_bucket = fn._hessian_functions()

    def all_clients(X, Y, arguments):
        calls.extend((b, len(g), arguments[b]) for b, g in enumerate(fn.groups))
        return everyone(X, Y, arguments)

    def bucket(b):
        def call(X, Y, take, arguments):
            calls.append((b, X.shape[0], arguments))
            return per_bucket[b](X, Y, take, arguments)
        return call
    monkeypatch.setattr(fn, "_hessians", (all_clients, [bucket(b) for b in range(len(per_bucket))]))
    return calls


def test_hessians_of_a_few_clients_evaluate_only_their_buckets_and_equal_their_plans(
        group_and_clients, monkeypatch):
    group, clients = group_and_clients
    fn = group._function("value_grad_plan")
    assert len(fn.groups) > 2
    X, Y = _points()
    rows = np.array([37, 3, 3, 20])       # any order, a repeat
    calls = _record_hessian_calls(fn, monkeypatch)
    H = group.hessian(X, Y, rows)
    assert {b for b, _, _ in calls} == set(fn.bucket_of[rows].tolist())
    assert sum(k for _, k, _ in calls) <= 2 * len(rows)       # chunks of a power of two
    for k, i in enumerate(rows):
        np.testing.assert_allclose(H[k], clients[i].hessian(X[i]), rtol=1e-10, atol=1e-12)


def test_hessians_of_all_clients_equal_the_subset_path_and_their_plans(group_and_clients):
    group, clients = group_and_clients
    X, Y = _points(1)
    everyone = group.hessian(X, Y)
    assert everyone.flags.writeable          # the caller's own array, not a view of JAX's buffer
    rows = np.arange(0, N_CLIENTS, 7)
    np.testing.assert_allclose(group.hessian(X, Y, rows), everyone[rows], rtol=1e-12, atol=1e-14)
    for i in range(N_CLIENTS):
        np.testing.assert_allclose(everyone[i], clients[i].hessian(X[i]), rtol=1e-10, atol=1e-12)


def test_any_subsets_compile_two_shapes_per_bucket_and_equal_the_full_stack(group_and_clients):
    """A Newton solve asks for different clients each time: one compiled function for all
    clients, one shape per bucket for fewer, and each subset's Hessians are the full stack's rows."""
    group, _ = group_and_clients
    fn = group._function("value_grad_plan")
    X, Y = _points(3)
    everyone = group.hessian(X, Y)
    rng = np.random.default_rng(4)
    for k in (1, 2, 3, 5, 8, 13, 21, N_CLIENTS):
        rows = rng.choice(N_CLIENTS, k, replace=False)
        np.testing.assert_allclose(group.hessian(X, Y, rows), everyone[rows], rtol=1e-12, atol=1e-14)
    everyone_fn, per_bucket = fn._hessians
    assert everyone_fn._cache_size() == 1 and max(run._cache_size() for run in per_bucket) == 1


def test_hessians_reuse_the_lowered_merit_and_its_device_data(monkeypatch):
    """value_grad then hessian lower each bucket's plans once (no second JaxGroupPlan, i.e. no
    second stacking and transfer of the data), and the Hessians read the very device arrays
    value_grad holds."""
    made = []

    class Counting(jax_executor.JaxGroupPlan):
        def __init__(self, plans):
            made.append(len(plans))
            super().__init__(plans)
    monkeypatch.setattr(jax_executor, "JaxGroupPlan", Counting)
    group, _ = _ragged_group()
    X, Y = _points(2)
    group.value_grad(X, Y)
    fn = group._function("value_grad_plan")
    assert sum(made) == N_CLIENTS == sum(len(g) for g in fn.groups)
    group.hessian(X, Y)
    assert sum(made) == N_CLIENTS and group.calls["hessian"] == 1
    calls = _record_hessian_calls(fn, monkeypatch)
    group.hessian(X, Y)
    group.hessian(X, Y, np.array([5]))
    assert sum(made) == N_CLIENTS and len(calls) == len(fn.groups) + 1 and calls[-1][1] == fn.chunk[calls[-1][0]]
    for bucket, _, arguments in calls:
        held = fn.plans[bucket].constants()
        assert all(a is b for a, b in zip(arguments[1:], held))
        assert all(a is b for a, b in zip(arguments[1], held[0]))
