"""Many features, sparse data (issue 25 item 3): scipy.sparse client data stays sparse (CSR)
through plans, the batched executor and CVXPY; local solves form a dense d × d Newton matrix
only within `solvers.DENSE_NEWTON_FLOATS`, else run Hessian-free (Newton-CG on compiled
Hessian-vector products) — and still reach CVXPY's answer."""
import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm
from fedmodel import backends
from fedmodel.runtime import batched_newton, low_rank, solvers
from fedmodel.runtime.batched_plan import BatchedPlan
from fedmodel.runtime.program import NodeProgram, compile_programs
from conftest import load_data

D = 300


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    """One BLAS thread for these solves: on a machine whose 2 cores are shared, threaded BLAS
    waits for preempted threads (L-BFGS-B's small products were 6× slower at load 8)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:           # (then the library default: slower, the same numbers)
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _sparse_logistic(n=3, m=60, d=D, density=0.03, radius=50.0, ridge=1e-2, seed=0, fmt="csr"):
    """Mean logistic loss over sparse ±1-labelled rows (each client's share weighted so the
    total is the mean over all rows), a ball on every client, a server ridge."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=d)
    w = fm.Variable(d, name="w")
    prob = fm.Problem("sparse-logistic")
    for i in range(n):
        X = sp.random_array((m, d), density=density, format="csr" if fmt == "dense" else fmt,
                            rng=rng, data_sampler=rng.standard_normal)
        X = X.toarray() if fmt == "dense" else X
        y = np.where(X @ truth + 0.5 * rng.normal(size=m) > 0, 1.0, -1.0)
        c = prob.add_client(f"c{i}")
        A = c.data(X, name="X")
        c.minimize(fm.mean(fm.logistic(-y * (A @ w))) / n)
        c.subject_to(fm.norm2(w) <= radius)
    prob.server.minimize(ridge * fm.sum_squares(w))
    return prob, w


def _distance(res, ref, w) -> float:
    return float(np.linalg.norm(res.value(w) - ref.value(w)) / np.linalg.norm(ref.value(w)))


# ---- data stays sparse ------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
def test_client_data_is_kept_as_csr_and_left_unchanged(fmt):
    rng = np.random.default_rng(3)
    X = sp.random_array((20, 1000), density=0.01, format=fmt, rng=rng)
    before = X.toarray()
    prob = fm.Problem()
    A = prob.add_client("c0").data(X, name="X")
    assert sp.issparse(A.value) and A.value.format == "csr" and A.value.shape == (20, 1000)
    assert A.value.nnz == X.nnz                                  # no zeros stored
    np.testing.assert_array_equal(A.value.toarray(), before)
    np.testing.assert_array_equal(X.toarray(), before)           # the user's matrix untouched


def test_non_finite_sparse_entries_are_a_data_error_naming_the_entry():
    X = sp.csr_array((np.array([1.0, np.nan]), (np.array([0, 3]), np.array([2, 7]))), shape=(5, 10))
    prob = fm.Problem()
    with pytest.raises(fm.DataError, match=r"non-finite.*\(3, 7\)"):
        prob.add_client("c0").data(X, name="X")


def test_plans_multiply_sparse_data_as_sparse_and_match_dense():
    """The compiled merit of a client holds its data as a sparse matrix (X @ w and Xᵀ r are
    sparse products), with the values, gradients and Hessian-vector products of the same
    model over the dense copy of the data."""
    sparse_prob, _ = _sparse_logistic(n=1)
    dense_prob, _ = _sparse_logistic(n=1, fmt="dense")
    sparse_program = compile_programs(sparse_prob)["c0"]
    dense_program = compile_programs(dense_prob)["c0"]
    plan = sparse_program.value_grad_plan
    constants = [plan.constant(s) for s in plan.constant_slots]
    assert any(sp.issparse(c) for c in constants)
    assert not any(isinstance(c, np.ndarray) and c.ndim == 2 for c in constants)   # nothing densified
    rng = np.random.default_rng(1)
    z, v = rng.normal(size=D), rng.normal(size=D)
    value, g = sparse_program.value_grad(z, np.zeros(0))
    dense_value, dense_g = dense_program.value_grad(z, np.zeros(0))
    assert value == pytest.approx(dense_value, rel=1e-13)
    np.testing.assert_allclose(g, dense_g, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(sparse_program.hvp(z, v), dense_program.hvp(z, v), rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(sparse_program.hvp(z, v), dense_program.hessian(z) @ v, rtol=1e-9, atol=1e-12)


def test_batched_executor_keeps_sparse_blocks_and_equals_serial():
    prob, w = _sparse_logistic(n=3)
    programs = compile_programs(prob)
    clients = [programs[c.name] for c in prob.clients]
    bp = BatchedPlan([p.value_grad_plan for p in clients])
    assert bp.rules.count("MatMul:block-diagonal") == 2            # X w and Xᵀ r
    assert all(sp.issparse(entry[0]) for entry in bp._bd.values())  # never a dense block matrix
    Z = np.random.default_rng(2).normal(size=(3, D)) * 0.1
    out = bp(Z.ravel())
    for i, p in enumerate(clients):
        value, g = p.value_grad(Z[i], np.zeros(0))
        assert bp.output_segs[0].split(out[0])[i] == pytest.approx(value, rel=1e-13)
        np.testing.assert_allclose(bp.output_segs[1].split(out[1])[i], g, rtol=1e-12, atol=1e-15)
    ref = prob.solve(backends.FedADMM(local_solver="newton"), executor="serial")
    got = prob.solve(backends.FedADMM(local_solver="newton"), executor="batched")
    np.testing.assert_allclose(got.value(w), ref.value(w), rtol=1e-9, atol=1e-12)


# ---- the size rule ----------------------------------------------------------------------------
def test_hessian_beyond_the_budget_is_refused_before_allocating(monkeypatch):
    prob, _ = _sparse_logistic(n=1)
    program = compile_programs(prob)["c0"]
    monkeypatch.setattr(solvers, "DENSE_NEWTON_FLOATS", D * D - 1)
    assert program._choose("auto") == "newton-cg"
    # 60 rows of 300 unknowns: Newton keeps its packed diag + rows form (`low_rank`, O(N r))
    assert program._choose("newton") == "newton" and program._choose("exact") == "exact"
    monkeypatch.setattr(low_rank, "MAX_ROW_FRACTION", 0.1)      # no packed form: Hessian-free
    other = compile_programs(prob)["c0"]
    assert other._choose("newton") == "newton-cg"
    assert other._choose("exact") == "exact-cg"
    assert not batched_newton.stack_fits(1, D)
    with pytest.raises(fm.FedModelError, match="DENSE_NEWTON_FLOATS"):
        program.hessian(np.zeros(D))
    monkeypatch.setattr(solvers, "DENSE_NEWTON_FLOATS", D * D)
    assert program._choose("newton") == "newton" and program.hessian(np.zeros(D)).shape == (D, D)
    assert program._choose("auto") == "lbfgs"          # today's choice within the budget


def test_newton_cg_equals_dense_newton_on_a_client_solve(monkeypatch):
    """The same local problem (19) by dense Newton and by Newton-CG: the same minimizer."""
    prob, _ = _sparse_logistic(n=1)
    program = compile_programs(prob)["c0"]
    program.configure(10.0, 0.0, np.zeros(D))
    rng = np.random.default_rng(4)
    args = dict(linear=0.01 * rng.normal(size=D), weight=0.05, anchor=rng.normal(size=D),
                x0=np.zeros(D), tol=1e-10)
    dense = program.solve_local(method="newton", **args)
    monkeypatch.setattr(solvers, "DENSE_NEWTON_FLOATS", 100)
    program._hessian_cache = program._factor_cache = None
    cg = program.solve_local(method="newton", **args)
    assert cg["grad_norm"] <= 1e-10
    np.testing.assert_allclose(cg["x"], dense["x"], rtol=1e-7, atol=1e-9)


def _no_dense_newton(monkeypatch, budget):
    """Budget `budget` floats; any dense Hessian or Newton factor beyond it fails the test."""
    monkeypatch.setattr(solvers, "DENSE_NEWTON_FLOATS", budget)
    hvps = []
    original_hessian, original_hvp = NodeProgram.hessian, NodeProgram.hvp

    def hessian(self, z):
        assert z.size ** 2 <= budget, f"a {z.size} × {z.size} Hessian beyond the budget"
        return original_hessian(self, z)

    def hvp(self, z, v):
        hvps.append(z.size)
        return original_hvp(self, z, v)
    monkeypatch.setattr(NodeProgram, "hessian", hessian)
    monkeypatch.setattr(NodeProgram, "hvp", hvp)
    return hvps


@pytest.mark.parametrize("executor", ["serial", pytest.param("batched", marks=pytest.mark.integration)])
def test_hessian_free_solves_reach_cvxpy(monkeypatch, executor):
    """With a budget below d², no d × d matrix is formed (the server's quadratic step and the
    Newton-type client steps run on Hessian-vector products) and ProxAL, DALD and FedADMM
    (local solver "newton", which the rule turns into Newton-CG) still reach CVXPY's answer."""
    prob, w = _sparse_logistic()
    ref = prob.solve("cvxpy")
    hvps = _no_dense_newton(monkeypatch, budget=1000)
    for backend in (backends.ProxAL(tol=(1e-6, 1e-6)), backends.DALD(),
                    backends.FedADMM(local_solver="newton")):
        hvps.clear()
        res = prob.solve(backend, executor=executor)
        assert res.status == "converged", type(backend).__name__
        assert hvps and max(hvps) == D                      # Hessian-free steps were taken
        assert _distance(res, ref, w) < 1e-3, type(backend).__name__
        assert res.objective == pytest.approx(ref.objective, rel=1e-6)


def test_jax_executor_refuses_to_densify_beyond_its_limit(monkeypatch):
    pytest.importorskip("jax")
    from fedmodel.compiler import jax_codegen
    prob, _ = _sparse_logistic(n=2)
    programs = compile_programs(prob)
    monkeypatch.setattr(jax_codegen, "JAX_DENSIFY_MAX", 100)
    with pytest.raises(fm.FedModelError, match="executor='batched'"):
        jax_codegen.JaxGroupPlan([programs[c.name].value_grad_plan for c in prob.clients])


# ---- a9a with hashed pairwise features ----------------------------------------------------------
def _a9a_hashed(rows=600, clients=3, buckets=1900, radius=50.0, ridge=1e-2):
    from fedmodel.datasets import hashed_pairs, load_a9a
    data = load_data(load_a9a, sparse=True)
    X = hashed_pairs(data.X[:rows], buckets)
    y = np.where(data.y[:rows] > 0, 1.0, -1.0)
    w = fm.Variable(X.shape[1], name="w")
    prob = fm.Problem("a9a-hashed")
    for i, part in enumerate(np.array_split(np.arange(rows), clients)):
        c = prob.add_client(f"c{i}")
        A = c.data(X[part], name="X")
        c.minimize(len(part) / rows * fm.mean(fm.logistic(-y[part] * (A @ w))))
        c.subject_to(fm.norm2(w) <= radius)
    prob.server.minimize(ridge * fm.sum_squares(w))
    return prob, w


@pytest.mark.integration     # real data, d = 2,023, three backends (~1 min): CI runs it after the fast suite
def test_a9a_hashed_sparse_backends_agree_with_cvxpy(monkeypatch):
    """a9a with hashed pairwise interactions (d = 2,023, ~100 nonzeros a row, CSR), 600 rows
    over 3 clients: ProxAL, DALD and FedADMM with sparse data, the budget below d² (every
    local solve Hessian-free), within 1e-3 of CVXPY's solution."""
    prob, w = _a9a_hashed()
    assert w.size == 2023 and sp.issparse(prob.clients[0].data_items[0].value)
    ref = prob.solve("cvxpy")
    hvps = _no_dense_newton(monkeypatch, budget=w.size ** 2 - 1)
    for backend in (backends.ProxAL(tol=(1e-6, 1e-6)), backends.DALD(),
                    backends.FedADMM(local_solver="newton")):
        res = prob.solve(backend)
        assert _distance(res, ref, w) < 1e-3, (type(backend).__name__, _distance(res, ref, w))
    assert hvps
