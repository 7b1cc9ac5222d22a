"""Newton steps for many clients (issue 27 item 2): `map_sum` sums the replies as they come, a
group's summed form adds its members' Hessians one at a time (`hessian_sum`), the dense
budget counts what a step holds, and the sets the server projects report their multipliers."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import ProxAL
from fedmodel.backends.auto import Auto
from fedmodel.backends.proxal_inner import newton_reading
from fedmodel.backends.proxal_newton import NewtonInner
from fedmodel.backends.proxal_newton_model import SERVER_MATRICES, matrices_held
from fedmodel.runtime import low_rank
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.executor import SerialExecutor, open_executor
from fedmodel.runtime.hessian_sum import hessian_sum

from test_proxal_newton import logistic_ball


def logistic(n: int, d: int, rows: int, seed: int = 0):
    """n clients' mean logistic losses (`rows` rows each, d features) and a server ridge."""
    rng = np.random.default_rng(seed)
    prob, w = fm.Problem(name="logistic"), fm.Variable(d, name="w")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(rng.standard_normal((rows, d)), name="Z") @ w)) / n)
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    return prob, w


def _opened(prob, executor):
    backend = ProxAL(inner=NewtonInner())
    return open_executor(executor, backend.compile(prob), backend.procedures)


@pytest.mark.parametrize("executor", [SerialExecutor, BatchedExecutor])
@pytest.mark.parametrize("rows", [3, 40])       # few rows: low-rank Hessians; many: dense ones
def test_map_sum_is_the_sum_of_the_replies_and_books_them(executor, rows):
    prob, _ = logistic(n=6, d=12, rows=rows)
    z = np.linspace(-0.5, 0.5, 12)
    request = {"x": z, "direction": np.ones(12), "offsets": np.array([-0.5, -0.25])}
    fields = ("value", "grad", "hessian", "values")
    with _opened(prob, executor()) as ex:
        replies = ex.map("proxal_newton_eval", {c: dict(request) for c in ex.clients})
        by_map = dict(ex.ledger.floats)
        total = ex.map_sum("proxal_newton_eval", ex.clients, common=request, fields=fields)
        booked = {k: v - by_map.get(k, 0) for k, v in ex.ledger.floats.items()}
        if executor is BatchedExecutor:       # the group's summed form served it
            assert ex.stats[("proxal_newton_eval", "batched")] == 2 * 6, ex.stats
    for field in fields:
        expected = np.sum([np.asarray(replies[c][field], float) for c in replies], axis=0)
        np.testing.assert_allclose(total[field], expected, rtol=1e-12, atol=1e-12)
    assert booked == by_map      # the same messages and floats each way as `map`'s


@pytest.mark.parametrize("rows", [3, 40])
def test_hessian_sum_equals_the_dense_sum(rows, monkeypatch):
    monkeypatch.setattr(low_rank, "MIN_UNKNOWNS", 0)      # the packed form at d = 12
    prob, _ = logistic(n=5, d=12, rows=rows, seed=1)
    with _opened(prob, BatchedExecutor()) as ex:
        group = ex.groups[0]
        assert low_rank.applies(group.programs[0]) == (rows == 3)
        X = np.tile(np.linspace(-1, 1, 12), (group.n, 1))
        Y = np.zeros((group.n, 0))
        total = hessian_sum(group, X, Y, [0, 2, 3, 4])
        dense = sum(group.programs[r].hessian(X[r]) for r in (0, 2, 3, 4))
    np.testing.assert_allclose(total, dense, rtol=1e-12, atol=1e-12 * np.abs(dense).max())


def _wide(n: int, d: int = 784):
    """n clients with one row each at d = 784 (MNIST's width), a client ball: nothing solved."""
    rng = np.random.default_rng(0)
    prob, w = fm.Problem(name="wide"), fm.Variable(d, name="w")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(rng.standard_normal((1, d)), name="Z") @ w)))
        c.subject_to(fm.norm2(w) <= 5.0)
    return prob


class _Gathering(SerialExecutor):
    """An executor that gathers every reply before summing (as Ray's and Flower's do)."""
    streams_sums = False


def test_the_budget_counts_a_step_not_the_clients():
    """d = 784: 40 and 200 clients fit (their replies are summed as they come), not where an
    executor gathers them (main refused n = 40: 41 Hessians)."""
    assert matrices_held(200, True) == SERVER_MATRICES and matrices_held(40, False) == SERVER_MATRICES + 40
    for n in (40, 200):
        prob = _wide(n)
        fits, why = newton_reading(prob)
        assert fits and "fit the dense budget" in why
        assert not newton_reading(prob, _Gathering)[0]
        for executor in (None, "serial", "batched", "auto", SerialExecutor()):
            assert Auto().choose(prob, executor=executor).inner == "newton", executor
        assert Auto().choose(prob, executor=_Gathering).inner != "newton"      # (FedADMM: clients hold sets)


def test_the_run_time_check_reads_the_executor():
    prob = _wide(40)
    backend = ProxAL(inner=NewtonInner())
    with open_executor(SerialExecutor(), backend.compile(prob), backend.procedures) as ex:
        assert NewtonInner().refusal(ex) == ""
    with open_executor(_Gathering(), backend.compile(prob), backend.procedures) as ex:
        assert "54 dense 784 × 784 matrices (40 clients)" in NewtonInner().refusal(ex)


@pytest.mark.integration      # (~1.5 s: CVXPY's exponential cone and a Newton run)
def test_the_moved_balls_report_cvxpys_multipliers():
    """Under Newton the clients' balls are the server's sets; their multipliers (split equally
    among the clients that hold the same ball) are CVXPY's duals."""
    prob, w = logistic_ball(n=5)
    ref = prob.solve("cvxpy")
    res = prob.solve(ProxAL(inner=NewtonInner()))
    assert res.status == "converged"
    names = [c.name for block in prob.clients for c in block.constraints]
    mine = np.array([float(np.sum(res.multipliers[k])) for k in names])
    theirs = np.array([float(np.sum(ref.multipliers[k])) for k in names])
    assert theirs.min() > 1e-3          # (every ball active)
    np.testing.assert_allclose(mine, theirs, rtol=1e-4)


def test_equal_client_balls_are_one_piece_of_the_servers_intersection():
    """n clients' equal balls moved to the server: Dykstra projects on one (it projected on each
    of them every FISTA iteration: half of a Newton run at n = 200); other sets stay."""
    prob, w = logistic_ball(n=5)
    prob.clients[0].subject_to(fm.norm2(w) <= 2.0)          # another ball: kept
    prob.clients[1].subject_to(w >= -3.0)                   # a bound: the box piece
    (term,) = ProxAL(inner=NewtonInner()).compile(prob)["server"].merit_ir.prox_terms
    assert len(term.members) == 7
    assert sorted(type(p).__name__ + str(getattr(p, "radius", "")) for p in term.pieces) == \
        ["Ball1.0", "Ball2.0", "Box"]
    v = np.full(8, 3.0)
    np.testing.assert_allclose(term.prox(v, 1.0), v / np.linalg.norm(v), rtol=1e-9)


def test_equal_ellipsoids_are_one_piece_too():
    """The review: an ellipsoid (a ball on column-scaled data) holds a tuple cache, which made
    its key fail: five equal ones were five pieces."""
    from fedmodel.compiler.intersections import _distinct
    from fedmodel.compiler.projection import Ball, Ellipsoid
    assert len(_distinct([Ellipsoid([1.0, 2.0, 3.0], 1.0)] * 5 + [Ellipsoid([1.0, 2.0, 4.0], 1.0)])) == 2
    assert len(_distinct([Ball(1.0)] * 5)) == 1


def test_the_batched_executor_streams_the_nodes_outside_its_groups(monkeypatch):
    """The review: nodes in no group (here every client has its own structure) went through the
    gathering `Executor._summed` (n Hessians held at once) although the batched executor says it
    streams; now one node at a time, the same sums."""
    import fedmodel as fm
    from fedmodel.runtime.batched import BatchedExecutor
    from fedmodel.runtime.executor import Executor
    rng = np.random.default_rng(0)
    w, prob = fm.Variable(5, name="w"), fm.Problem()
    for i in range(6):
        c = prob.add_client()
        X, y = rng.normal(size=(10 + i, 5)), rng.normal(size=10 + i)
        c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)) + (i % 2) * 0.1 * fm.sum(fm.logistic(c.data(X) @ w))
                   + (i % 3 == 0) * fm.sum(fm.exp(0.01 * w)))
    gathered = []
    original = Executor._summed

    def spy(self, kind, payloads, fields):
        gathered.append(len(payloads))
        yield from original(self, kind, payloads, fields)
    monkeypatch.setattr(Executor, "_summed", spy)
    batched = prob.solve(executor=BatchedExecutor(min_group=50))
    serial = prob.solve(executor="serial")
    assert gathered == [] and batched.status == serial.status == "converged"
    np.testing.assert_allclose(batched.value(w), serial.value(w), rtol=0, atol=1e-12)
