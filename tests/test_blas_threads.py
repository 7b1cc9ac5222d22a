"""A run limits BLAS/LAPACK to one thread (fedmodel/runtime/blas.py) and gives the caller its
setting back; `FEDMODEL_BLAS_THREADS` changes the count (0: leave BLAS alone)."""
from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import fedmodel as fm


def blas_threads() -> set[int]:
    return set(per_library())


def small_model() -> fm.Problem:
    rng = np.random.default_rng(0)
    w = fm.Variable(4, name="w")
    prob = fm.Problem()
    for i in range(2):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(rng.standard_normal((6, 4)), name="A") @ w - 1.0))
    return prob


def threads_seen_by_callback(prob, **options) -> set[int]:
    seen: set[int] = set()
    prob.solve("fedadmm", max_rounds=3, callback=lambda record: seen.update(blas_threads()), **options)
    return seen


def per_library() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def test_a_run_uses_one_blas_thread_and_restores_the_callers():
    with threadpool_limits(limits=2, user_api="blas"):
        before = per_library()
        assert threads_seen_by_callback(small_model()) == {1}
        assert per_library() == before


def test_the_environment_sets_the_count(monkeypatch):
    with threadpool_limits(limits=2, user_api="blas"):
        before = per_library()
        monkeypatch.setenv("FEDMODEL_BLAS_THREADS", "0")       # leave BLAS as it is
        assert threads_seen_by_callback(small_model()) == set(before)
        monkeypatch.setenv("FEDMODEL_BLAS_THREADS", "2")
        assert threads_seen_by_callback(small_model()) == set(before)
        monkeypatch.setenv("FEDMODEL_BLAS_THREADS", "two")
        with pytest.raises(fm.FedModelError, match="FEDMODEL_BLAS_THREADS must be a whole number"):
            small_model().solve("fedadmm", max_rounds=3)
