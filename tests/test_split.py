"""The owner-split pass (fedmodel/compiler/split.py): a model written centrally with
`prob.minimize` / `prob.subject_to` is assigned block by block, data-coupled constraints are
decoupled with slacks (paper 1, eqs. 3–4), and the decoupled model has the optimum of the
coupled one."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import cvxpy as cp
import fedmodel as fm

TIGHT = {"solver": "CLARABEL", "tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10}


def solve_reference(problem: cp.Problem) -> None:
    """Clarabel with tight tolerances, or its defaults when those cannot be met (it then
    reports "optimal_inaccurate" on some of these models while its answer is good to ~1e-10)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problem.solve(**TIGHT)
        if problem.status != "optimal":
            problem.solve(solver="CLARABEL")
    assert problem.status in ("optimal", "optimal_inaccurate")


def _logistic(z):
    return np.logaddexp(0.0, z)


def central_model(seed: int = 0, n_clients: int = 3, d: int = 4, relation: str = "<="):
    """Σ_i f_i(w; Z_i) + server terms, one data-coupled constraint Σ_i c_i(w; Z_i) (rel) r."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=f"central{seed}")
    clients = [prob.add_client(f"k{i}") for i in range(n_clients)]
    arrays = [rng.normal(size=(int(rng.integers(5, 9)), d)) for _ in clients]
    Z = [c.data(A, name=f"Z{i}") for i, (c, A) in enumerate(zip(clients, arrays))]
    S = rng.normal(size=d)
    Sd = prob.server.data(S, name="S")
    objective = fm.sum_squares(w) + 1.5 + fm.sum(fm.multiply(Sd, w))
    for i, Zi in enumerate(Z):
        objective = objective + fm.mean(fm.logistic(Zi @ w)) / n_clients
    prob.minimize(objective)
    lhs = fm.sum(fm.square(Z[0] @ w)) / len(arrays[0])
    for i in range(1, n_clients):
        lhs = lhs + fm.sum(fm.square(Z[i] @ w)) / len(arrays[i])
    if relation == "==":     # an equality must be affine: Σ_i mean(Z_i w) == r
        lhs = fm.mean(Z[0] @ w)
        for i in range(1, n_clients):
            lhs = lhs + fm.mean(Z[i] @ w)
    r = 0.3 * float(n_clients)
    con = (lhs <= r) if relation == "<=" else (lhs == r)
    prob.subject_to(con.named("energy"))

    cw = cp.Variable(d)
    cobj = cp.sum_squares(cw) + 1.5 + S @ cw + sum(cp.sum(cp.logistic(A @ cw)) / len(A) / n_clients
                                                   for A in arrays)
    if relation == "<=":
        clhs = sum(cp.sum_squares(A @ cw) / len(A) for A in arrays)
    else:
        clhs = sum(cp.sum(A @ cw) / len(A) for A in arrays)
    ccon = (clhs <= r) if relation == "<=" else (clhs == r)
    reference = cp.Problem(cp.Minimize(cobj), [ccon])
    return prob, w, arrays, S, reference, cw


def test_terms_go_to_the_block_whose_data_they_read():
    prob, w, arrays, S, *_ = central_model(0)
    server, k0, k1, k2 = prob.blocks
    for i, block in enumerate((k0, k1, k2)):
        assert len(block.terms) == 1
        assert block.terms[0].data_owners() == {block.name}
    assert len(server.terms) == 1
    assert server.terms[0].data_owners() == {"server"}
    # the split terms are the original ones: check their values at a point
    x = np.random.default_rng(5).normal(size=4)
    w.value = x
    for i, block in enumerate((k0, k1, k2)):
        assert block.objective.value == pytest.approx(np.mean(_logistic(arrays[i] @ x)) / 3)
    assert server.objective.value == pytest.approx(x @ x + 1.5 + S @ x)


def test_coupled_constraint_is_decoupled_with_slacks():
    prob, w, arrays, *_ = central_model(0)
    names = {block.name: [c.name for c in block.constraints] for block in prob.blocks}
    assert names == {"server": ["energy"], "k0": ["energy[k0]"], "k1": ["energy[k1]"],
                     "k2": ["energy[k2]"]}
    assert [s.name for s in prob.slacks] == ["energy_slack_k0", "energy_slack_k1", "energy_slack_k2"]
    assert all(s.owner is None and s.shape == () for s in prob.slacks)     # slacks are shared
    glob = prob.server.constraints[0]
    assert isinstance(glob, fm.Inequality) and glob.owner == "server"
    assert glob.expr.data_owners() == set()                                # Σ s_i − r: no data
    assert {v.name for v in glob.expr.variables()} == {s.name for s in prob.slacks}
    for i, client in enumerate(prob.clients):
        local = client.constraints[0]
        assert local.owner == client.name and local.expr.data_owners() == {client.name}
        assert {v.name for v in local.expr.variables()} == {"w", f"energy_slack_{client.name}"}
    # Σ_i (c_i − s_i) + (Σ s_i − r) is the original constraint function, at any point
    rng = np.random.default_rng(1)
    x = rng.normal(size=4)
    w.value = x
    for s in prob.slacks:
        s.value = rng.normal()
    total = sum(c.expr.value for c in prob.constraints)
    expected = sum(np.sum((A @ x) ** 2) / len(A) for A in arrays) - 0.9
    assert total == pytest.approx(expected, rel=1e-12)
    names_of_vars = [v.name for v in prob.variables()]
    assert names_of_vars[0] == "w" and set(names_of_vars[1:]) == {s.name for s in prob.slacks}


@pytest.mark.parametrize("relation", ["<=", "=="])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decoupled_model_has_the_coupled_optimum(seed, relation):
    prob, w, arrays, S, reference, cw = central_model(seed, n_clients=2 + seed, relation=relation)
    solve_reference(reference)
    res = prob.solve("cvxpy")
    assert res.status == "converged"
    assert res.objective == pytest.approx(reference.value, rel=1e-6)
    np.testing.assert_allclose(res.value(w), cw.value, atol=1e-5)
    relation_cls = fm.Inequality if relation == "<=" else fm.Equality
    assert all(isinstance(c, relation_cls) for c in prob.constraints)
    # the local values c_i(w) sum to the coupled left-hand side; slacks carry them
    x = res.value(w)
    if relation == "==":
        assert sum(np.mean(A @ x) for A in arrays) == pytest.approx(0.3 * len(arrays), abs=1e-7)
        for client, slack in zip(prob.clients, prob.slacks):
            A = arrays[int(client.name[1:])]
            assert float(res.value(slack)) == pytest.approx(np.mean(A @ x), abs=1e-7)
    else:
        assert sum(np.sum((A @ x) ** 2) / len(A) for A in arrays) <= 0.3 * len(arrays) + 1e-7
    assert set(res.multipliers) == {c.name for c in prob.constraints}
    assert res.certificate.stationarity <= 1e-4
    # one multiplier for the coupled constraint: every local copy gets the global one
    mu = float(res.multipliers["energy"])
    for client in prob.clients:
        assert float(res.multipliers[f"energy[{client.name}]"]) == pytest.approx(mu, abs=1e-5)


def test_constant_and_server_terms_go_to_the_server():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    a = prob.add_client("a")
    Z = a.data(np.array([[1.0, 2.0], [0.0, 1.0]]), name="Z")
    G = prob.server.data(np.array([1.0, -1.0]), name="G")
    prob.minimize(3.0 + fm.sum_squares(w) + G @ w + fm.sum_squares(Z @ w - 1) - 2 * fm.norm1(w) / 4)
    assert len(prob.server.terms) == 1 and len(a.terms) == 1
    assert a.terms[0].data_owners() == {"a"}
    w.value = np.array([0.5, -1.0])
    assert prob.server.objective.value == pytest.approx(3 + 1.25 + 1.5 - 0.75)
    # constraints without client data: server; with one client's data: that client, unchanged
    only_w = (fm.sum(w) <= 1).named("only_w")
    server_data = (G @ w >= -4).named("server_data")
    one_client = (fm.sum(Z @ w) <= 5).named("one_client")
    prob.subject_to(only_w, server_data, one_client)
    assert prob.server.constraints == [only_w, server_data]
    assert a.constraints == [one_client] and one_client.owner == "a"
    assert prob.slacks == []


def test_private_variables_and_server_data_in_a_coupled_constraint():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    a, b = prob.add_client("a"), prob.add_client("b")
    u = a.variable(2, name="u")
    Zb = b.data(np.array([[1.0, 0.0], [1.0, 1.0]]), name="Zb")
    G = prob.server.data(np.array([2.0, 1.0]), name="G")
    prob.minimize(fm.sum_squares(u - 1) + fm.sum_squares(w))          # u's term goes to a
    assert len(a.terms) == 1 and len(prob.server.terms) == 1 and b.terms == []
    # u (private to a) + Zb (b's data) + G (server data) + w (no owner): three parties
    prob.subject_to((fm.sum(u) + fm.sum(Zb @ w) + G @ w + fm.sum(w) >= 2).named("mix"))
    assert [s.name for s in prob.slacks] == ["mix_slack_a", "mix_slack_b"]
    glob = prob.server.constraints[0]
    assert glob.expr.data_owners() == {"server"}
    assert {v.name for v in glob.expr.variables()} == {"w", "mix_slack_a", "mix_slack_b"}
    res = prob.solve("cvxpy")
    cu, cw = cp.Variable(2), cp.Variable(2)
    ref = cp.Problem(cp.Minimize(cp.sum_squares(cu - 1) + cp.sum_squares(cw)),
                     [cp.sum(cu) + cp.sum(np.array([[1.0, 0.0], [1.0, 1.0]]) @ cw)
                      + np.array([2.0, 1.0]) @ cw + cp.sum(cw) >= 2])
    solve_reference(ref)
    assert res.objective == pytest.approx(ref.value, rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(res.value(u), cu.value, atol=1e-5)


def test_vector_coupled_constraint_and_scaled_sums():
    rng = np.random.default_rng(3)
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    arrays = [rng.normal(size=(2, 3)) for _ in range(2)]
    Z = [prob.add_client().data(A, name=f"Z{i}") for i, A in enumerate(arrays)]
    prob.minimize(fm.sum_squares(w - 1))
    prob.minimize(0.5 * (fm.sum_squares(Z[0] @ w) + fm.sum_squares(Z[1] @ w)))   # scaled sum
    prob.subject_to((0.5 * (Z[0] @ w + Z[1] @ w) <= np.array([0.1, -0.2])).named("vec"))
    assert [len(c.terms) for c in prob.clients] == [1, 1]
    assert [s.shape for s in prob.slacks] == [(2,), (2,)]
    assert prob.server.constraints[0].shape == (2,)
    res = prob.solve("cvxpy")
    cw = cp.Variable(3)
    ref = cp.Problem(cp.Minimize(cp.sum_squares(cw - 1) + 0.5 * sum(cp.sum_squares(A @ cw) for A in arrays)),
                     [0.5 * (arrays[0] @ cw + arrays[1] @ cw) <= np.array([0.1, -0.2])])
    solve_reference(ref)
    assert res.objective == pytest.approx(ref.value, rel=1e-6)
    np.testing.assert_allclose(res.value(w), cw.value, atol=1e-5)
    assert res.multipliers["vec"].shape == (2,)


def test_sum_and_mean_of_per_client_expressions_split():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    Z0 = prob.add_client("a").data(np.eye(2), name="Z0")
    Z1 = prob.add_client("b").data(2 * np.eye(2), name="Z1")
    prob.minimize(fm.sum(Z0 @ w + Z1 @ w) + fm.mean(fm.square(Z0 @ w) + fm.square(Z1 @ w)))
    assert [len(c.terms) for c in prob.clients] == [1, 1]     # one term per owner and call
    w.value = np.array([1.0, -3.0])
    assert prob.block("a").objective.value == pytest.approx(-2 + 5)
    assert prob.block("b").objective.value == pytest.approx(-4 + 20)


@pytest.mark.parametrize("build", [
    lambda Z0, Z1, w: fm.sum(fm.multiply(Z0 @ w, Z1 @ w)),
    lambda Z0, Z1, w: fm.sum(fm.logistic(Z0 @ w + Z1 @ w)),
    lambda Z0, Z1, w: fm.norm2(Z0 @ w - Z1 @ w),
    lambda Z0, Z1, w: fm.square(fm.sum(Z0 @ w) + fm.sum(Z1 @ w)),
], ids=["multiply", "logistic", "norm2", "square-of-sum"])
def test_a_term_mixing_two_clients_data_is_rejected(build):
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    Z0 = prob.add_client("alice").data(np.eye(2), name="Z0")
    Z1 = prob.add_client("bob").data(np.ones((2, 2)), name="Z1")
    prob.minimize(fm.sum_squares(w) + fm.sum(Z0 @ w))
    before = [len(b.terms) for b in prob.blocks]
    with pytest.raises(fm.FedModelError) as err:
        prob.minimize(fm.sum_squares(w) + build(Z0, Z1, w))
    assert "'alice'" in str(err.value) and "'bob'" in str(err.value)
    assert [len(b.terms) for b in prob.blocks] == before     # nothing was added
    with pytest.raises(fm.FedModelError) as err:
        prob.subject_to((build(Z0, Z1, w) <= 1).named("bad"))
    assert "'alice'" in str(err.value) and "'bob'" in str(err.value)
    assert prob.constraints == [] and prob.slacks == []


def test_a_term_mixing_a_private_variable_with_other_data_is_rejected():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    u = prob.add_client("alice").variable(2, name="u")
    Z1 = prob.add_client("bob").data(np.ones((2, 2)), name="Z1")
    with pytest.raises(fm.FedModelError, match="'alice'.*'bob'"):
        prob.minimize(fm.sum(fm.multiply(u, Z1 @ w)))


def test_failed_coupled_constraint_leaves_the_model_unchanged():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    Z0 = prob.add_client("a").data(np.eye(2), name="Z0")
    Z1 = prob.add_client("b").data(np.eye(2), name="Z1")
    prob.server.subject_to((fm.sum(w) <= 1).named("c"))
    with pytest.raises(fm.FedModelError, match="'c'"):
        prob.subject_to((fm.sum(Z0 @ w) + fm.sum(Z1 @ w) <= 1).named("c"))
    assert prob.slacks == [] and len(prob.constraints) == 1
    prob.subject_to((fm.sum(Z0 @ w) + fm.sum(Z1 @ w) <= 1).named("c2"))
    assert len(prob.slacks) == 2 and len(prob.constraints) == 4


def test_unnamed_coupled_constraints_get_fresh_names():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    Z0 = prob.add_client("a").data(np.eye(2), name="Z0")
    Z1 = prob.add_client("b").data(np.eye(2), name="Z1")
    prob.subject_to(fm.sum(Z0 @ w) + fm.sum(Z1 @ w) <= 1, fm.sum(Z0 @ w) - fm.sum(Z1 @ w) >= -1)
    names = [c.name for c in prob.constraints]
    assert len(names) == len(set(names)) == 6
    assert len(prob.slacks) == 4 and len({s.name for s in prob.slacks}) == 4
