"""A ball on columns in different units, written as a user writes it (issue 25 item 1; branches
ellball, stepcost): least squares over heterogeneous clients (1, 6 and 300 rows; one of them
sparse), columns in units 1e-3 … 1e3, one objective per client, a server ridge and a server ball,
default options, data ×1e-3 and ×1e3 — the answer against CVXPY's, and `fm.verify` flags the
same answer moved 1 %."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm


def _model(scale: float, radius_factor: float):
    rng = np.random.default_rng(4)
    units = np.array([1e-3, 1.0, 1e3, 3e1, 2e-2])
    truth = rng.normal(size=5) / units
    w = fm.Variable(5, name="w")
    prob = fm.Problem()
    for i, rows in enumerate((1, 6, 300)):
        X = rng.normal(size=(rows, 5)) * units * scale
        y = X @ truth + 0.05 * scale * rng.normal(size=rows)
        c = prob.add_client(f"c{i}")
        data = sp.csr_matrix(X) if rows == 300 else X
        c.minimize(fm.sum_squares(c.data(data, name="X") @ w - c.data(y, name="y")) / 307)
    prob.server.minimize(1e-4 * scale ** 2 * fm.sum_squares(fm.multiply(units, w)))
    free = np.linalg.norm(truth)
    prob.server.subject_to(fm.norm2(w) <= radius_factor * free)
    return prob, w


@pytest.mark.parametrize("scale", [1e-3, 1e3])
@pytest.mark.parametrize("radius_factor", [0.5, 5.0])     # the ball active, inactive
def test_default_solve_matches_cvxpy_in_other_units(scale, radius_factor):
    prob, w = _model(scale, radius_factor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = prob.solve("cvxpy")
        res = prob.solve()
    assert res.status == "converged"
    top = np.max(np.abs(reference.value(w)))
    np.testing.assert_allclose(res.value(w), reference.value(w), rtol=0, atol=1e-4 * top)
    assert fm.verify(res, reference).ok
    moved = dict(res.values)
    moved[w.uid] = res.value(w) * 1.01
    assert not fm.verify(dataclasses.replace(res, values=moved), reference).ok
