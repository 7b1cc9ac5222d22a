"""Per-solve overheads of the default path on small models (issue 27 item 3, helper adult50).

Few unknowns (N < `low_rank.MIN_UNKNOWNS`): a client with few data rows keeps the dense Newton
system (N × N costs microseconds there): the batched executor's summed Hessians and local
solves take the group at once, not one client after another through the packed (Woodbury) form. The answer, status and round
trips are those of the packed form, and CVXPY's."""
import numpy as np
import pytest

import fedmodel as fm
import fedmodel.backends  # noqa: F401  (registers the backends)
from fedmodel.runtime import low_rank


def _few_rows(n: int = 32, d: int = 12, rows: int = 3, seed: int = 3):
    rng = np.random.default_rng(seed)
    prob, w = fm.Problem(name="few-rows"), fm.Variable(d, name="w")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        Z = rng.standard_normal((rows, d))
        c.minimize(fm.mean(fm.logistic(c.data(Z, name="Z") @ w)) / n)
        c.subject_to(fm.norm2(w) <= 2.0)
    prob.server.minimize(1e-2 * fm.sum_squares(w))
    return prob, w


def _solve_counting(monkeypatch, prob, minimum: int):
    monkeypatch.setattr(low_rank, "MIN_UNKNOWNS", minimum)
    each = []
    original = low_rank.hessian
    monkeypatch.setattr(low_rank, "hessian", lambda *a: each.append(1) or original(*a))
    res = prob.solve()
    monkeypatch.undo()
    return res, len(each)


@pytest.mark.integration       # ~3 s: three solves of 32 clients
def test_few_unknowns_keep_the_dense_path_and_the_same_solve(monkeypatch):
    prob, w0 = _few_rows()
    packed, packed_each = _solve_counting(monkeypatch, prob, 0)       # main's choice at d = 12
    prob, w = _few_rows()
    dense, dense_each = _solve_counting(monkeypatch, prob, low_rank.MIN_UNKNOWNS)
    assert packed_each > 0 and dense_each == 0       # per-client packed Hessians before
    assert dense.status == packed.status == "converged"
    assert dense.ledger.rounds == packed.ledger.rounds
    np.testing.assert_allclose(dense.value(w), packed.value(w0), atol=1e-7)
    ref = prob.solve("cvxpy")
    assert abs(dense.objective - ref.objective) <= 1e-6 * max(1.0, abs(ref.objective))
    np.testing.assert_allclose(dense.value(w), ref.value(w), atol=1e-4)


@pytest.mark.parametrize("d, applies", [(12, False), (63, False), (64, True)])
def test_the_size_threshold(d, applies):
    from fedmodel.backends import ProxAL
    from fedmodel.backends.proxal_newton import NewtonInner
    from fedmodel.runtime.batched import BatchedExecutor
    from fedmodel.runtime.executor import open_executor
    prob, _ = _few_rows(n=3, d=d)
    backend = ProxAL(inner=NewtonInner())
    with open_executor(BatchedExecutor(), backend.compile(prob), backend.procedures) as ex:
        assert low_rank.applies(ex.groups[0].programs[0]) == applies
