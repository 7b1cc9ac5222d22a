"""Gram products Rᵀ diag(t) R by the way a client's data allows (`runtime/gram_products.py`,
issue 25 item 3): dense rows over their nonzero columns, CSR rows densified a chunk at a time,
scipy.sparse's product, one GEMM — each equal to the plain dense product to 1e-12 relative,
on sparse-ish dense arrays, CSR, 1-row clients, all-zero columns and d = 1; the symmetric
matrix of an upper triangle by blocks equal to the plain sum.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm
from fedmodel.runtime import gram_hessian, gram_products
from fedmodel.runtime.gram_products import GramRows
from fedmodel.runtime.program import compile_programs


def _formed(rows: GramRows, t: np.ndarray, times: int = 1) -> np.ndarray:
    """`times` × Rᵀ diag(t) R as gram_hessian assembles it (the first into a fresh upper
    triangle, the others added): the upper triangle made symmetric, plus the full matrices a
    sparse or narrow product returns."""
    n = rows.shape[1]
    upper = np.zeros((n, n), order="F")
    M = rows.add_weighted(upper, t, fresh=True)
    for _ in range(times - 1):
        more = rows.add_weighted(upper, t)
        M = None if more is None else M + more
    assert np.all(np.tril(upper, -1) == 0)            # the strict lower triangle stays zero
    H = upper.T + upper
    H[np.diag_indices(n)] = np.diagonal(upper)
    return H if M is None else H + 0.5 * (M + M.T)


def _close(H, reference):
    scale = max(np.max(np.abs(reference)), 1e-300)
    assert np.max(np.abs(H - reference)) <= 1e-12 * scale


def _sparse_ish(rng, m, n, density, zero_columns=()):
    X = rng.standard_normal((m, n)) * (rng.random((m, n)) < density)
    X[:, list(zero_columns)] = 0.0
    return X


CASES = [  # (m, n, density, zero columns)
    (300, 100, 0.2, range(0, 40)),       # 40 % of the columns zero: compacted
    (300, 100, 0.9, ()),                 # dense: every column kept
    (1, 100, 0.3, range(50, 100)),       # a 1-row client
    (50, 80, 0.02, ()),                  # very sparse
    (40, 70, 1.0, range(70)),            # all columns zero
    (7, 1, 1.0, ()),                     # d = 1
    (1, 1, 1.0, ()),
    (0, 80, 0.5, ()),                    # no rows
]


@pytest.mark.parametrize("m, n, density, zeros", CASES)
@pytest.mark.parametrize("csr", [False, True])
@pytest.mark.parametrize("narrow", [0, 10 ** 9])
def test_every_way_is_the_dense_product(m, n, density, zeros, csr, narrow):
    rng = np.random.default_rng(m * n)
    X = _sparse_ish(rng, m, n, density, zeros)
    t = rng.uniform(-1.0, 2.0, m)                      # both signs: both rank-k updates
    rows = GramRows(sp.csr_matrix(X) if csr else X, narrow)
    _close(_formed(rows, t), X.T @ (t[:, None] * X))
    _close(_formed(rows, t, times=2), 2 * X.T @ (t[:, None] * X))      # added, not assigned
    p = rng.standard_normal(m)
    np.testing.assert_allclose(rows.transpose_times(p), X.T @ p, rtol=1e-13, atol=1e-13 * np.abs(X).sum())


def test_the_way_is_read_from_the_data():
    rng = np.random.default_rng(0)
    zero = _sparse_ish(rng, 200, 100, 0.3, range(30))
    rows = GramRows(zero, 64)
    assert rows.kind == "syrk" and rows.columns.size == 70 and rows.rows is zero   # (not copied)
    assert GramRows(_sparse_ish(rng, 200, 100, 0.3, range(5)), 64).columns is None   # 95 % kept
    dense_csr = GramRows(sp.csr_matrix(zero), 64)
    assert dense_csr.kind == "chunks" and dense_csr.columns.size == 70
    assert sp.issparse(dense_csr.rows)                 # (kept sparse; dense a chunk at a time)
    assert GramRows(sp.random(200, 100, density=0.01, random_state=1, format="csr"), 64).kind == "sparse"
    assert GramRows(zero, 10 ** 9).kind == "gemm"


@pytest.mark.parametrize("csr", [False, True])
def test_chunks_bound_the_dense_scratch_and_give_the_same_numbers(csr, monkeypatch):
    """Rows a chunk at a time (CSR made dense, dense gathered over the nonzero columns): at
    most n² floats of scratch when CHUNK_FLOATS is below it, the same numbers."""
    monkeypatch.setattr(gram_products, "CHUNK_FLOATS", 0)
    rng = np.random.default_rng(3)
    X = _sparse_ish(rng, 500, 70, 0.3, range(10))
    rows = GramRows(sp.csr_matrix(X) if csr else X, 0)
    assert rows.kind == ("chunks" if csr else "syrk") and rows.columns.size == 60
    assert rows.chunk * 60 <= 70 * 70 and rows.chunk < 500
    t = rng.uniform(-1.0, 1.0, 500)
    _close(_formed(rows, t), X.T @ (t[:, None] * X))
    t = rng.uniform(0.1, 1.0, 500)                     # one sign: the scratch scaled in place
    _close(_formed(rows, t), X.T @ (t[:, None] * X))
    assert np.array_equal(rows.rows.toarray() if csr else rows.rows, X[:, rows.columns] if csr else X)


def test_a_client_hessian_over_its_nonzero_columns_is_todays():
    """A logistic client on pixel-like data (a third of the columns zero, as MNIST's borders)
    with a ball: the Gram Hessian equals the Hessian-vector plan's on the unit directions."""
    rng = np.random.default_rng(5)
    d, m = 96, 150
    X = np.abs(_sparse_ish(rng, m, d, 0.4, list(range(16)) + list(range(80, 96))))
    y = np.sign(rng.standard_normal(m))
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    client = prob.add_client("c0")
    A = client.data(X, name="X")
    client.minimize(fm.mean(fm.logistic(-y * (A @ w))))
    client.subject_to(fm.norm2(w) <= 1.0)
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    program = compile_programs(prob)["c0"]
    program.configure(7.0, 0.1, rng.standard_normal(d))
    for scale in (0.01, 1.0):                          # the ball inactive, then active
        z = scale * rng.standard_normal(d)
        H = program.hessian(z)
        found = gram_hessian.structure(program.compiled)
        data_terms = [t.rows for t in found.terms if t.rows is not None]
        assert [(r.kind, r.columns.size) for r in data_terms] == [("syrk", 64)]
        program.compiled._gram = None
        try:
            today = program.hessian(z)
        finally:
            program.compiled._gram = found
        assert np.array_equal(H, H.T)
        _close(H, today)


@pytest.mark.parametrize("n", [1, 129, 256, 257, 300, 784])
def test_symmetric_by_blocks_is_the_plain_sum(n):
    upper = np.asfortranarray(np.triu(np.random.default_rng(n).standard_normal((n, n))))
    lower = upper.T
    plain = lower + lower.T
    plain[np.diag_indices(n)] = np.diagonal(lower)
    H = gram_products.symmetric(upper)
    assert np.array_equal(H, plain) and np.array_equal(H, H.T) and H.flags.c_contiguous


@pytest.mark.parametrize("make", [sp.csc_array, lambda X: sp.csr_array(X.astype(np.int64))],
                         ids=["csc", "integer-csr"])
def test_other_sparse_inputs_are_read_as_float_csr(make):
    """CSC read as CSR would take its row indices for columns (29.75 off), integer CSR failed the
    in-place weighting (review16); the model hands float64 CSR, other callers may not."""
    rng = np.random.default_rng(0)
    X = (rng.random((50, 300)) < 0.1) * rng.integers(1, 5, (50, 300))
    t = rng.random(50)
    rows = GramRows(make(X), 64)
    upper = np.zeros((300, 300), order="F")
    out = rows.add_weighted(upper, t, fresh=True)
    full = out if out is not None else np.triu(upper) + np.triu(upper, 1).T
    np.testing.assert_allclose(full, X.T @ (t[:, None] * X), rtol=1e-12, atol=1e-12)
