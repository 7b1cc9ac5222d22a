"""A batched group whose clients' Hessians come in two forms (newuser13): clients with few data
rows pack theirs for a Woodbury solve (`low_rank`), the others keep dense ones; the group's
Newton stack checked only its first client's form and read the packed Hessians the others'
own solves had cached: DALD on 50 a9a clients of 2 … 821 rows with client balls crashed with
numpy's "inhomogeneous shape" ValueError on the default (batched) executor. Now a group with
any such client solves each by its own solver, as the serial executor does."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm

from conftest import load_data


@pytest.mark.integration       # ~7 s
def test_dald_on_clients_of_many_and_few_rows_runs_batched_as_serial():
    from fedmodel.datasets import load_a9a
    data = load_data(load_a9a)
    rows = np.random.default_rng(7).permutation(len(data.y))[:4000]
    X = np.hstack([np.ones((4000, 1)), np.asarray(data.X, float)[rows]])
    X = X[:, np.r_[True, X[:, 1:].std(0) > 0]]
    s = np.where(np.asarray(data.y)[rows] > 0, 1.0, -1.0)
    rng = np.random.default_rng(2)           # Pareto sizes: 2 … 821 rows over 50 clients
    sizes = np.maximum(1, (rng.pareto(1.2, 50) * 20).astype(int))
    sizes = np.maximum(np.round(sizes / sizes.sum() * 4000).astype(int), 1)
    sizes[-1] = 4000 - sizes[:-1].sum()
    parts = np.split(rng.permutation(4000), np.cumsum(sizes)[:-1])
    w = fm.Variable(X.shape[1], name="w")
    prob = fm.Problem()
    for p in parts:
        c = prob.add_client()
        c.minimize(fm.sum(fm.logistic(-fm.multiply(c.data(s[p]), c.data(X[p]) @ w))) / 4000)
        c.subject_to(fm.norm2(w) <= 1.5)
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    warnings.simplefilter("ignore")
    serial = prob.solve("dald", executor="serial")
    batched = prob.solve("dald", executor="batched")
    assert batched.status == serial.status == "converged"
    np.testing.assert_allclose(batched.value(w), serial.value(w), atol=1e-8)
