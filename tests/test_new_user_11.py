"""New-user round 11 (federated benchmarks as researchers build them): what it fixed.

A regularization path warm-started as users write it, `w.value = res.value(w)` before the next
solve, was run from 0: the assignment stored the very array the solve had left, and
`compiler.start` tells a user's start from a solve's value by identity (docs/api.md §2)."""
import re
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.compiler.start import user_start


def _ridge_path_model(seed=0):
    rng = np.random.default_rng(seed)
    lam = fm.Parameter(nonneg=True, value=1.0, name="lam")
    w = fm.Variable(4, name="w")
    prob = fm.Problem()
    for rows in (5, 40, 200):                      # quantity skew
        c = prob.add_client()
        X = rng.normal(size=(rows, 4)) * [1.0, 2.0, 0.5, 1.0] + rng.normal(size=4)  # feature skew
        y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.normal(size=rows)
        c.minimize(fm.sum_squares(c.data(X) @ w - c.data(y)) / 245)
    prob.server.minimize(lam * fm.sum_squares(w))
    return prob, w, lam


def test_assigning_a_results_value_is_a_start():
    prob, w, _ = _ridge_path_model()
    res = prob.solve("proxal")
    assert user_start(prob) is None            # a value a solve left is not a start
    w.value = res.value(w)                     # the user's warm start: the same array object
    start = user_start(prob)
    assert start is not None
    np.testing.assert_array_equal(start, res.value(w))


def test_value_assignment_copies():
    w = fm.Variable(3)
    a = np.ones(3)
    w.value = a
    a[0] = 5.0                                  # the user's array stays theirs
    assert w.value[0] == 1.0 and w.value is not a


def _exact(prob, lam):
    """The ridge answer by the normal equations."""
    blocks = [b for b in prob.blocks if b.kind == "client"]
    A = sum(b.data_items[0].value.T @ b.data_items[0].value for b in blocks) / 245
    g = sum(b.data_items[0].value.T @ b.data_items[1].value for b in blocks) / 245
    return np.linalg.solve(A + lam * np.eye(4), g)


@pytest.mark.parametrize("backend", ["proxal", "dald"])   # FedADMM: its duals start at 0
def test_resolve_from_its_answer_takes_fewer_round_trips(backend):
    # before: bit for bit the cold run (27 = 27 round trips; now ProxAL 27 -> 7, DALD 28 -> 19)
    prob, w, _ = _ridge_path_model()
    cold = prob.solve(backend)
    w.value = cold.value(w)
    _fewer_round_trips_same_answer(cold, prob.solve(backend), _exact(prob, 1.0), w)


def test_warm_started_path_fedadmm():
    # lam 1 -> 0.5 from the previous answer: fewer rounds than from 0, the same answer
    prob, w, lam = _ridge_path_model()
    lam.value = 0.5
    cold = prob.solve("fedadmm")
    lam.value = 1.0
    w.value = None
    first = prob.solve("fedadmm")
    w.value = first.value(w)
    lam.value = 0.5
    _fewer_round_trips_same_answer(cold, prob.solve("fedadmm"), _exact(prob, 0.5), w)


def _fewer_round_trips_same_answer(cold, warm, exact, w):
    """Both converged to the closed form (1e-4 relative), the warm start in fewer round trips."""
    assert cold.status == warm.status == "converged"
    assert warm.ledger.round_trips < cold.ledger.round_trips
    for r in (cold, warm):
        assert np.linalg.norm(r.value(w) - exact) <= 1e-4 * np.linalg.norm(exact)


def test_messages_name_the_fix():
    """nu11_names_and_eps_inf.py: a backend name with "_" for "-", `epsilon_total=inf`, and an
    option a longer word for a valid one each say what to write."""
    from fedmodel.errors import FedModelError
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    prob.add_client().minimize(fm.sum_squares(w - 1.0))
    for backend, options, expected in (("dp_admm", {}, "did you mean 'dp-admm'?"),
                                       ("dp-admm", {"epsilon_total": float("inf")}, "DPADMM() runs the non-private"),
                                       ("proxal", {"tolerance": 1e-3}, "did you mean 'tol'?")):
        with pytest.raises(FedModelError, match=re.escape(expected)):
            prob.solve(backend, **options)
