"""Dense Hessians of losses of data products as Gram products (`runtime/gram_hessian.py`,
issue 25 item 3 / issue 27 item 3): Aᵀ diag(t) A by syrk (or one GEMM, or scipy.sparse),
never the Hessian-vector plan on the unit directions. Each matrix is checked against today's
path (the same program with the form switched off) to 1e-12 relative, bitwise symmetric.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm
from fedmodel.runtime import gram_hessian
from fedmodel.runtime.program import compile_programs


def _today(program, z):
    """The Hessian by today's path: the batched Hessian-vector plan on the unit directions."""
    kept = program.compiled.__dict__.get("_gram")
    program.compiled._gram = None
    try:
        return program.hessian(z)
    finally:
        program.compiled._gram = kept


def _agrees(H, reference):
    assert np.array_equal(H, H.T)
    assert np.max(np.abs(H - reference)) <= 1e-12 * np.max(np.abs(reference))


def _client(build, d, seed=0):
    """The program of client c0 of a one-client model `build(client, w)`, configured (β = 7,
    proximal weight 0.1, a random center)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    client = prob.add_client("c0")
    build(client, w, rng)
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    program = compile_programs(prob)["c0"]
    program.configure(7.0, 0.1, rng.standard_normal(d))
    return program, rng


def _losses(kind):
    def build(client, w, rng):
        m, d = 60, w.size
        X = sp.random(m, d, density=0.3, random_state=1, format="csr") if kind == "csr" \
            else rng.standard_normal((m, d))
        y = np.sign(rng.standard_normal(m))
        A = client.data(X, name="X")
        client.minimize(fm.mean(fm.logistic(-y * (A @ w))) + fm.sum_squares(A @ w - 1.0) / m)
        client.subject_to(A[0:3, :] @ w <= 0.5)                  # an AL term on rows of the data
        client.subject_to(fm.mean(fm.logistic(A @ w)) <= 0.3)    # NP's: its rank-one square
        client.subject_to(fm.norm2(w) <= 2.0)                    # no data: the rest's rank one
    return build


@pytest.mark.parametrize("kind", ["dense", "csr"])
@pytest.mark.parametrize("syrk", [True, False])
def test_gram_hessian_is_todays_on_logistic_least_squares_and_al_terms(kind, syrk, monkeypatch):
    monkeypatch.setattr(gram_hessian, "MIN_FLOPS", 0)
    monkeypatch.setattr(gram_hessian, "MIN_COLUMNS", 0)
    monkeypatch.setattr(gram_hessian, "SYRK_MIN_COLUMNS", 0 if syrk else 10 ** 9)
    program, rng = _client(_losses(kind), 8)
    for scale in (0.1, 3.0):          # the AL terms inactive, then active (step(·) = 1)
        z = scale * rng.standard_normal(8)
        H = program.hessian(z)
        found = gram_hessian.structure(program.compiled)
        assert found is not None and found.rest is None
        rows = sorted(t.rows.shape[0] for t in found.terms if t.rows is not None)
        assert rows == [3, 60]        # the slice and the data (logistic, squares, NP: one term)
        assert sum(len(t.pairs) for t in found.terms) == 2     # NP's rank one, the ball's
        if scale == 0.1:                                       # (before today's, below)
            assert "_hessian_plan" not in program.compiled.__dict__     # no plan on unit directions
        _agrees(H, _today(program, z))


def test_negative_and_mixed_weights_take_both_rank_k_updates():
    """Weights of both signs in one matrix (a nonconvex loss) and a negative term: √|t| rows
    by sign, subtracted; the default thresholds (d = 70: syrk)."""
    def build(client, w, rng):
        c = rng.uniform(-1.0, 1.0, 100)
        A = client.data(rng.standard_normal((100, 70)), name="A")
        B = client.data(rng.standard_normal((80, 70)), name="B")
        client.minimize(fm.sum(fm.multiply(c, fm.square(A @ w))) - 0.3 * fm.sum_squares(B @ w))
    program, rng = _client(build, 70, seed=2)
    z = rng.standard_normal(70)
    H = program.hessian(z)
    found = gram_hessian.structure(program.compiled)
    assert found is not None and len([t for t in found.terms if t.rows is not None]) == 2
    reference = _today(program, z)
    _agrees(H, reference)
    assert np.linalg.eigvalsh(reference)[0] < 0        # indefinite: the signs matter


def test_structures_that_do_not_fit_keep_todays_path(monkeypatch):
    monkeypatch.setattr(gram_hessian, "MIN_FLOPS", 0)
    monkeypatch.setattr(gram_hessian, "MIN_COLUMNS", 0)

    def cross_only(client, w, rng):     # (A w) ∘ (B w): no Aᵀ M A term
        A, B = (client.data(rng.standard_normal((30, 5)), name=n) for n in "AB")
        client.minimize(fm.sum(fm.multiply(A @ w, B @ w)) + fm.sum_squares(w))

    def private(client, w, rng):
        A = client.data(rng.standard_normal((30, 5)), name="A")
        s = client.variable(name="s")
        client.minimize(fm.mean(fm.logistic(A @ w)) + fm.square(s - 0.3))
        client.subject_to(fm.sum_squares(w) + s <= 0.5)

    for build in (cross_only, private):
        program, rng = _client(build, 5)
        z = rng.standard_normal(program.compiled._layout.size)
        H = program.hessian(z)
        assert gram_hessian.structure(program.compiled) is None
        np.testing.assert_array_equal(H, _today(program, z))


def test_a_cross_term_beside_a_gram_term_stays_on_the_plan(monkeypatch):
    """logistic(A w) read as a Gram term; (A w) ∘ (B w) in the rest, by today's plan over
    the unit directions."""
    monkeypatch.setattr(gram_hessian, "MIN_FLOPS", 0)
    monkeypatch.setattr(gram_hessian, "MIN_COLUMNS", 0)

    def build(client, w, rng):
        A, B = (client.data(rng.standard_normal((30, 5)), name=n) for n in "AB")
        client.minimize(fm.mean(fm.logistic(A @ w)) + 0.1 * fm.sum(fm.multiply(A @ w, B @ w)))
    program, rng = _client(build, 5)
    z = rng.standard_normal(5)
    H = program.hessian(z)
    found = gram_hessian.structure(program.compiled)
    assert found is not None and found.rest is not None
    _agrees(H, _today(program, z))


@pytest.mark.integration     # (~1.3 s)
def test_a_pair_beside_the_data_under_a_vector_scale_is_kept(monkeypatch):
    """Columns in units 1e0 … 1e5 (a vector column scale s) and a binding budget sum(w) ≤ 1 in
    the same merit (cProx-AL's one program): s ∘ (Σ Xᵀ(·) + c (sᵀv)) keeps its rank-one s sᵀ beside the
    Gram terms once they are taken out (it was dropped, and the first check, at an inactive
    budget, passed: cProx-AL on house prices ended max_iterations)."""
    from backends.cproxal import CentralizedProxAL
    from fedmodel.runtime import compiled_merit
    monkeypatch.setattr(gram_hessian, "MIN_FLOPS", 0)
    monkeypatch.setattr(gram_hessian, "MIN_COLUMNS", 0)
    rng = np.random.default_rng(0)
    units = np.array([1e0, 1e2, 1e4, 1e5, 1.0])
    w = fm.Variable(5, name="w")
    prob = fm.Problem()
    for i in range(2):
        X = rng.standard_normal((120, 5)) * units + units
        prob.add_client(f"c{i}").minimize(fm.sum_squares(X @ w - 1e3 * rng.standard_normal(120)) / 240)
    prob.server.subject_to(fm.sum(w) <= 1.0)       # binds (unconstrained: sum 73)
    seen = []
    original = compiled_merit.CompiledMerit.hessian

    def hessian(self, z):
        H = original(self, z)
        found = gram_hessian.structure(self)
        seen.append(found is not None and [len(t.pairs) for t in found.terms if t.rows is None])
        return H
    monkeypatch.setattr(compiled_merit.CompiledMerit, "hessian", hessian)
    res = prob.solve(CentralizedProxAL())
    assert res.status == "converged" and seen and all(s == [1] for s in seen)
    reference = prob.solve("cvxpy").value(w)
    assert np.max(np.abs(res.value(w) - reference)) <= 1e-4 * np.max(np.abs(reference))


def test_a_form_that_fails_its_check_is_dropped_for_good(monkeypatch):
    monkeypatch.setattr(gram_hessian, "MIN_FLOPS", 0)
    monkeypatch.setattr(gram_hessian, "MIN_COLUMNS", 0)
    program, rng = _client(_losses("dense"), 8)
    z = rng.standard_normal(8)
    monkeypatch.setattr(gram_hessian, "_add_term", lambda term, outputs, upper, M, n, fresh: M)
    H = program.hessian(z)              # the data terms left out: the check refuses it
    assert program.compiled._gram is None
    np.testing.assert_array_equal(H, _today(program, z))


def test_a_server_without_data_is_its_diagonal_and_pairs():
    """A ridge, a proximal term and a ball's AL term (rank one through w): no data, no plan on
    the unit directions (N = 400: the default thresholds)."""
    w = fm.Variable(400, name="w")
    prob = fm.Problem()
    prob.add_client("c0").minimize(fm.sum_squares(w - 1.0))
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    prob.server.subject_to(fm.norm2(w) <= 0.5)
    program = compile_programs(prob)["server"]
    program.configure(7.0, 0.1, np.zeros(400))
    z = np.random.default_rng(0).standard_normal(400)
    H = program.hessian(z)
    found = gram_hessian.structure(program.compiled)
    assert found is not None and found.rest is None and [t.rows for t in found.terms] == [None]
    assert "_hessian_plan" not in program.compiled.__dict__
    _agrees(H, _today(program, z))


def test_the_servers_unpacking_by_mask_is_the_index_pairs():
    """`proxal_newton_model.unpack_symmetric` by the boolean mask: the matrix the index pairs
    gave, bit for bit, and the mask packs in their order."""
    from backends.proxal_newton_model import unpack_symmetric, upper_mask
    A = np.random.default_rng(0).standard_normal((9, 9))
    A = A + A.T
    np.testing.assert_array_equal(A[upper_mask(9)], A[np.triu_indices(9)])
    np.testing.assert_array_equal(unpack_symmetric(A[np.triu_indices(9)], 9), A)
