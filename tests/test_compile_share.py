"""Compile once per structure (`compiler.shared_structure`): clients whose expressions are the
same up to their data share the derived gradients and compiled plans of the first client of
their structure, each bound to its own data — its values, gradients, Hessians and
Hessian-vector products are its own (against numpy), bit for bit those of the client compiled
alone; other structures (another atom, another shape, dense against sparse data, a plain
constant array) do not share."""
import gc
import pickle
import weakref

import numpy as np
import pytest
import scipy.sparse as sp

import fedmodel as fm
from fedmodel.compiler import shared_structure
from fedmodel.runtime.program import compile_programs


@pytest.fixture(autouse=True)
def _fresh_cache():
    shared_structure.clear()
    yield
    shared_structure.clear()


def _least_squares(datasets, kind=("square",) * 99):
    """One client per (X, y), ‖X w − y‖² / m (or a logistic loss where `kind` says so)."""
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    for (X, y), k in zip(datasets, kind):
        c = prob.add_client()
        Xd, yd = c.data(X), c.data(y)
        if k == "square":
            c.minimize(fm.sum_squares(Xd @ w - yd) / X.shape[0])
        else:
            c.minimize(fm.sum(fm.logistic(-fm.multiply(yd, Xd @ w))) / X.shape[0])
    prob.server.minimize(1e-2 * fm.sum_squares(w))
    return prob


def _data(seed, m=4, sparse=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(m, 3))
    if sparse:
        X[rng.random(X.shape) < 0.4] = 0.0
        X = sp.csr_array(X)
    return X, rng.normal(size=m)


def _clients(programs):
    return [p for name, p in programs.items() if name != "server"]


def _check_against_numpy(program, X, y):
    """P_i (β, ω at their defaults: no proximal term), ∇P_i, ∇²P_i and ∇²P_i v of a
    least-squares client against the closed forms of its own data."""
    Xd = X.toarray() if sp.issparse(X) else X
    m = Xd.shape[0]
    rng = np.random.default_rng(7)
    x, v = rng.normal(size=3), rng.normal(size=3)
    value, g = program.value_grad(x, np.zeros(0))
    r = Xd @ x - y
    assert value == pytest.approx(r @ r / m, rel=1e-12)
    np.testing.assert_allclose(g, 2 * Xd.T @ r / m, rtol=1e-12, atol=1e-14)
    H = 2 * Xd.T @ Xd / m
    np.testing.assert_allclose(program.hessian(x), H, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(program.hvp(x, v), H @ v, rtol=1e-12, atol=1e-14)


def test_same_structure_shares_the_plans_and_binds_each_clients_data():
    datasets = [_data(s) for s in range(4)]
    programs = compile_programs(_least_squares(datasets))
    clients = _clients(programs)
    bindings = [p.compiled._share for p in clients]
    family = bindings[0].family
    assert all(b.family is family for b in bindings) and bindings[0].is_template
    assert not any(b.is_template for b in bindings[1:])
    # one generated plan per structure: the clients' plans are the first one's, re-bound
    keys = {id(p.value_grad_plan.structure_key) for p in clients}
    assert len(keys) == 1
    assert clients[1].value_grad_plan is not clients[0].value_grad_plan
    for program, (X, y) in zip(clients, datasets):
        _check_against_numpy(program, X, y)
    # every derivation and plan the clients used was re-bound (and checked once), none compiled
    # again: the gradients, the value + gradient and objective plans, the Hessian-vector
    # product's expressions and its plans over one and over many directions
    assert {"gradients", "value_grad", "objective", "hvp", "direction"} <= {name for _, name in family.records}
    assert all(r.shared and r.checked for r in family.records.values())
    assert family.rebound == 3 * len(family.records)
    # each client's plans read its own data leaves, never the first client's
    for program in clients[1:]:
        mine = {leaf.uid for e in program.value_grad_plan.outputs for leaf in e.leaves()}
        first = {leaf.uid for e in clients[0].value_grad_plan.outputs for leaf in e.leaves()
                 if isinstance(leaf, fm.expression.Data)}
        assert not mine & first


def test_a_shared_client_computes_bit_for_bit_what_it_computes_alone():
    datasets = [_data(s) for s in range(3)]
    prob = _least_squares(datasets, kind=("logistic",) * 3)
    programs = compile_programs(prob)       # (held: a family lives as long as its first program)
    shared = _clients(programs)[2]
    assert not shared.compiled._share.is_template
    shared_structure.clear()
    alone = _clients(compile_programs(_least_squares(datasets[2:], kind=("logistic",))))[0]
    assert alone.compiled._share.is_template
    rng = np.random.default_rng(3)
    for _ in range(3):
        x, v = rng.normal(size=3), rng.normal(size=3)
        for program in (shared, alone):
            program.configure(beta=2.0, prox_weight=0.5, center=np.ones(3))
        a, b = shared.value_grad(x, np.zeros(0)), alone.value_grad(x, np.zeros(0))
        assert a[0] == b[0] and np.array_equal(a[1], b[1])
        assert np.array_equal(shared.hessian(x), alone.hessian(x))
        assert np.array_equal(shared.hvp(x, v), alone.hvp(x, v))
        assert np.array_equal(shared.gradient(x), alone.gradient(x))
    # a logistic client's gradient against central differences of its own value
    x, h = rng.normal(size=3), 1e-6
    fd = [(shared.value_grad(x + h * e, np.zeros(0))[0] - shared.value_grad(x - h * e, np.zeros(0))[0])
          / (2 * h) for e in np.eye(3)]
    np.testing.assert_allclose(shared.value_grad(x, np.zeros(0))[1], fd, rtol=1e-6, atol=1e-8)


def test_sparse_patterns_share_code_not_data():
    datasets = [_data(s, m=6, sparse=True) for s in range(3)]
    assert datasets[0][0].nnz != datasets[1][0].nnz or \
        not np.array_equal(datasets[0][0].indices, datasets[1][0].indices)
    clients = _clients(compile_programs(_least_squares(datasets)))
    assert len({id(p.compiled._share.family) for p in clients}) == 1
    for program, (X, y) in zip(clients, datasets):
        _check_against_numpy(program, X, y)


@pytest.mark.parametrize("other", ["atom", "shape", "sparse", "plain constant"])
def test_other_structures_do_not_share(other):
    first = _data(0)
    if other == "shape":
        second = _data(1, m=5)
    elif other == "sparse":
        second = _data(1, sparse=True)
    else:
        second = _data(1)
    kind = ("square", "logistic") if other == "atom" else ("square", "square")
    if other == "plain constant":     # a numpy array, not c.data: `neg` folds its values
        w = fm.Variable(3, name="w")
        prob = fm.Problem()
        for X, y in (first, second):
            prob.add_client().minimize(fm.sum_squares(X @ w - y) / 4)
        prob.server.minimize(1e-2 * fm.sum_squares(w))
    else:
        prob = _least_squares([first, second], kind=kind)
    a, b = _clients(compile_programs(prob))
    assert a.compiled._share.family is not b.compiled._share.family
    assert a.compiled._share.is_template and b.compiled._share.is_template
    if other != "atom":
        for program, (X, y) in zip((a, b), (first, second)):
            _check_against_numpy(program, X, y)


def test_a_pickled_program_carries_no_other_clients_data():
    datasets = [_data(s) for s in range(2)]
    programs = compile_programs(_least_squares(datasets))
    first, second = _clients(programs)
    assert not second.compiled._share.is_template
    payload = pickle.dumps(second)
    assert datasets[0][0].tobytes() not in payload and datasets[1][0].tobytes() in payload
    copy = pickle.loads(payload)
    _check_against_numpy(copy, *datasets[1])


def test_a_family_lives_as_long_as_its_first_program():
    datasets = [_data(s) for s in range(2)]
    programs = compile_programs(_least_squares(datasets))
    key = _clients(programs)[0].compiled._share.key
    assert key in shared_structure._FAMILIES
    del programs
    gc.collect()
    assert key not in shared_structure._FAMILIES


def test_a_derivation_whose_clone_differs_is_not_shared():
    """The first re-binding is checked against the program's own derivation: a difference
    (here, made by hand) stops the sharing of that derivation, and the program keeps its own."""
    datasets = [_data(s) for s in range(3)]
    clients = _clients(compile_programs(_least_squares(datasets)))
    record = clients[0].compiled._share.family.records["derive", "gradients"]
    assert record.shared and record.checked
    one = fm.Constant(np.ones(3))
    assert not shared_structure._same_graphs([one], [fm.Constant(np.zeros(3))])
    assert shared_structure._same_graphs([one], [fm.Constant(np.ones(3))])


def _constrained(seeds):
    """Clients with a private variable, an inequality and an equality (their multipliers, the
    residual plans) and a logistic loss."""
    w = fm.Variable(4, name="w")
    prob = fm.Problem()
    for seed in seeds:
        rng = np.random.default_rng(seed)
        c = prob.add_client(f"c{seed}")
        A = c.data(rng.normal(size=(6, 4)), name="A")
        s = c.variable(name="s")
        c.minimize(fm.mean(fm.logistic(A @ w)) + fm.square(s - 0.5))
        c.subject_to((fm.sum_squares(w) <= 0.5).named(f"disk{seed}"))
        c.subject_to((w[0] + s == 0.2).named(f"link{seed}"))
    return prob


def test_private_variables_and_constraints_share_and_match_the_client_alone():
    programs = compile_programs(_constrained([0, 1, 2]))
    shared = programs["c2"]
    assert not shared.compiled._share.is_template
    shared_structure.clear()
    alone = compile_programs(_constrained([2]))["c2"]
    assert alone.compiled._share.is_template
    rng = np.random.default_rng(5)
    for program in (shared, alone):
        program.configure(beta=3.0, prox_weight=0.2, center=np.full(4, 0.1))
        program.set_multipliers({"disk2": np.array(0.7), "link2": np.array(-0.3)})
    for _ in range(3):
        x, y = rng.normal(size=4), rng.normal(size=1)
        a, b = shared.value_grad(x, y), alone.value_grad(x, y)
        assert a[0] == b[0] and np.array_equal(a[1], b[1])
        z = np.concatenate([x, y])
        assert np.array_equal(shared.hessian(z), alone.hessian(z))
        shared.y, alone.y = y, y
        assert shared.report(x) == alone.report(x)
        assert shared.violations(x) == alone.violations(x)


def test_the_first_programs_graphs_go_with_it():
    """Freed, the first program of a structure takes its graphs (its data) along: the family's
    records go, and the next program that needs a derivation leads a new family."""
    datasets = [_data(s) for s in range(3)]
    programs = compile_programs(_least_squares(datasets))
    first, second, third = _clients(programs)
    old = weakref.ref(second.compiled._share.family)
    graphs = weakref.ref(old().records["derive", "gradients"].result[0])
    del programs, first
    gc.collect()
    assert old() is None and graphs() is None
    _check_against_numpy(third, *datasets[2])      # (its Hessian: derived in a new family)
    assert third.compiled._share.is_template


@pytest.mark.parametrize("zeros_first", [0, 2])
def test_a_derivation_that_folds_data_into_a_new_constant_is_not_shared(zeros_first):
    """quad_form's derivative folds its fixed P into a new constant P + Pᵀ: that derivation is
    each client's own (not shared), and each client's gradient is (P + Pᵀ) w of its own P —
    also where the first clients' P + Pᵀ is all zeros (review15: a zero array was taken for a
    structural one, passed the one check of the second client and went to the third, whose
    gradient lost its quad_form term)."""
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    Ps = []
    for seed in range(3):
        B = np.random.default_rng(seed).normal(size=(3, 3))
        Ps.append(np.zeros((3, 3)) if seed < zeros_first else B @ B.T + np.eye(3))
        c = prob.add_client()
        c.minimize(fm.quad_form(w, c.data(Ps[-1])) + fm.sum_squares(w - 1.0))
    prob.server.minimize(1e-2 * fm.sum_squares(w))
    programs = compile_programs(prob)
    clients = _clients(programs)
    assert len({id(p.compiled._share.family) for p in clients}) == 1
    record = clients[0].compiled._share.family.records["derive", "gradients"]
    assert not record.shared and not record.checked     # refused when recorded, before any check
    x = np.array([0.3, -1.0, 2.0])
    for program, P in zip(clients, Ps):
        value, g = program.value_grad(x, np.zeros(0))
        assert value == pytest.approx(x @ P @ x + np.sum((x - 1) ** 2), rel=1e-12)
        np.testing.assert_allclose(g, (P + P.T) @ x + 2 * (x - 1), rtol=1e-12)


@pytest.mark.integration      # ~1–3 s each (CVXPY's reference)
@pytest.mark.parametrize("units", [1e-3, 1e3])
def test_a_user_model_of_many_uneven_sparse_clients_solves_to_cvxpys_answer(units):
    """As a user writes it: 40 clients of 1–30 rows of sparse features (d = 30, ~20 % filled) in
    other units, one objective each (mean logistic loss), a client ball and a server ridge, the
    default `prob.solve()`. The clients share compiled plans (fewer structures than clients) and
    the answer is CVXPY's, verified."""
    rng = np.random.default_rng(3)
    d = 30
    w_true = rng.normal(size=d)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    for m in rng.integers(1, 31, size=40):
        X = sp.random(m, d, density=0.2, random_state=rng, format="csr") * units
        labels = np.where(X @ w_true / units + 0.3 * rng.normal(size=m) > 0, 1.0, -1.0)
        c = prob.add_client()
        c.minimize(fm.sum(fm.logistic(-fm.multiply(c.data(labels), c.data(X) @ w))) / m)
        c.subject_to(fm.norm2(w) <= 5.0 / units)
    prob.server.minimize(1e-3 * units ** 2 * fm.sum_squares(w))
    families = {id(p.compiled._share.family) for p in _clients(compile_programs(prob))}
    assert len(families) < 40
    res, ref = prob.solve(), prob.solve("cvxpy")
    assert res.status == "converged" and ref.status == "converged"
    np.testing.assert_allclose(res.value(w), ref.value(w), rtol=1e-4, atol=1e-4 * np.linalg.norm(ref.value(w)))
    assert fm.verify(res, ref).ok
