"""Scoped names (issue 13, point 2): a client's private variables and data are named within
that client. Three clients each declaring `s = c.variable(name="s")` solve to the same answer
as the model with distinct names; each `s` keeps its own value and displays as `c0.s`, `c1.s`…;
only shared variables need problem-wide names."""
import numpy as np
import pytest

import fedmodel as fm

N_CLIENTS, ROWS, DIM = 3, 6, 3


def _model(same_names: bool, seed: int = 0):
    """Epigraph form: client i minimizes s_i subject to s_i ≥ ‖A_i w − b_i‖²/ROWS, so at the
    optimum s_i is client i's own loss (different per client), plus a ridge term on the server."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(DIM, name="w")
    prob = fm.Problem(name="epigraph")
    slacks, data = [], []
    for i in range(N_CLIENTS):
        c = prob.add_client()
        A_i, b_i = rng.standard_normal((ROWS, DIM)), rng.standard_normal(ROWS) + i
        A, b = c.data(A_i, name="A"), c.data(b_i, name="b")
        s = c.variable((), name="s" if same_names else f"s{i}")
        c.minimize(s)
        c.subject_to(s >= fm.sum_squares(A @ w - b) / ROWS)
        slacks.append(s)
        data.append((A_i, b_i))
    prob.server.minimize(0.1 * fm.sum_squares(w))
    return prob, w, slacks, data


@pytest.fixture(scope="module")
def reference():
    """The same model with distinct names, solved by CVXPY: the independent answer."""
    prob, w, slacks, _ = _model(same_names=False)
    res = prob.solve("cvxpy")
    assert res.status == "converged"
    return res.objective, res.value(w), [float(res.value(s)) for s in slacks]


@pytest.mark.parametrize("backend, tol", [("cvxpy", 1e-6), ("proxal", 1e-3), ("cproxal", 1e-3)])
def test_same_private_names_solve_like_distinct_names(reference, backend, tol):
    objective, w_ref, s_ref = reference
    assert len(set(np.round(s_ref, 3))) == N_CLIENTS     # the clients' s differ: a mix-up shows
    prob, w, slacks, data = _model(same_names=True)
    res = prob.solve(backend)
    assert res.status == "converged"
    assert res.objective == pytest.approx(objective, rel=tol)
    np.testing.assert_allclose(res.value(w), w_ref, atol=tol)
    for s, s_star, (A, b) in zip(slacks, s_ref, data):
        assert float(res.value(s)) == pytest.approx(s_star, abs=tol)
        # each s is its own client's loss at the solution (closed form from w)
        loss = float(np.sum((A @ res.value(w) - b) ** 2) / ROWS)
        assert float(res.value(s)) == pytest.approx(loss, abs=5 * tol)
        assert float(s.value) == float(res.value(s))        # .value is set per object too


def test_values_are_keyed_by_object_and_shown_by_label():
    prob, w, slacks, _ = _model(same_names=True)
    res = prob.solve("cvxpy")
    by_label = res.values_by_label()
    assert set(by_label) == {"w", "c0.s", "c1.s", "c2.s"}
    for i, s in enumerate(slacks):
        assert s.name == "s" and s.label == f"c{i}.s"
        assert by_label[s.label] is res.value(s)
        assert prob.variable_by_label(f"c{i}.s") is s
    assert prob.variable_by_label("w") is w
    with pytest.raises(fm.FedModelError, match="c7.s"):
        prob.variable_by_label("c7.s")
    stranger = fm.Variable(2, name="v")
    with pytest.raises(fm.FedModelError, match="'v' is not part of the problem"):
        res.value(stranger)


def test_render_shows_client_qualified_names():
    prob, w, slacks, _ = _model(same_names=True)
    text = fm.render(prob)
    for i in range(N_CLIENTS):
        assert f"variable c{i}.s" in text and f"private to client 'c{i}'" in text
        assert f"client c{i}" in text and f"<= c{i}.s" in text
    assert "variable w" in text and "(shared)" in text
    assert str(slacks[1] + w[0]) == "(c1.s + w[0])"
    assert fm.render(slacks[2]) == "c2.s"
    with pytest.raises(fm.FedModelError, match="fm.render takes"):
        fm.render(42)


def test_lowerings_never_merge_two_clients_names():
    prob, w, slacks, _ = _model(same_names=True)
    cvx = prob.to_cvxpy()
    assert sorted(v.name() for v in cvx.variables()) == ["c0.s", "c1.s", "c2.s", "w"]
    # sympy merges symbols of equal name: two clients' `s` and data `A` must stay distinct
    constraint_sum = prob.constraints[0].expr + prob.constraints[1].expr
    names = {str(s) for s in fm.to_sympy(constraint_sum).free_symbols}
    assert {"c0.s", "c1.s", "c0.A", "c1.A", "c0.b", "c1.b", "w"} <= names
    # explicit form: d/ds of c0.s + 2·c1.s is 1 and 2, not one merged symbol with derivative 3
    explicit = fm.to_sympy(slacks[0] + 2 * slacks[1], explicit=True).item()
    symbols = sorted(explicit.free_symbols, key=str)
    assert [str(x) for x in symbols] == ["c0.s", "c1.s"]
    assert [float(explicit.diff(x)) for x in symbols] == [1.0, 2.0]
    # a lone expression keeps the names it reads like (single data `A` stays `A`)
    assert {str(s) for s in fm.to_sympy(prob.clients[0].constraints[0].expr).free_symbols} \
        == {"A", "b", "w", "c0.s"}


def test_centrally_written_model_with_same_private_names():
    """prob.minimize / prob.subject_to route each `s` to its owner by the object, not the name."""
    blocks, w, slacks, _ = _model(same_names=True)
    central = fm.Problem(name="central")
    rng = np.random.default_rng(0)
    ss = []
    for i in range(N_CLIENTS):
        c = central.add_client()
        A = c.data(rng.standard_normal((ROWS, DIM)), name="A")     # same draws as _model
        b = c.data(rng.standard_normal(ROWS) + i, name="b")
        s = c.variable((), name="s")
        central.subject_to(s >= fm.sum_squares(A @ w - b) / ROWS)
        ss.append(s)
    central.minimize(ss[0] + ss[1] + ss[2] + 0.1 * fm.sum_squares(w))
    assert [len(c.constraints) for c in central.clients] == [1, 1, 1]
    got = central.solve("cvxpy")
    want = blocks.solve("cvxpy")
    assert got.objective == pytest.approx(want.objective, rel=1e-6)
    for a, b in zip(ss, slacks):
        assert float(got.value(a)) == pytest.approx(float(want.value(b)), abs=1e-6)


def test_duplicate_shared_names_still_refused():
    prob = fm.Problem(name="dup")
    w, other_w = fm.Variable(2, name="w"), fm.Variable(2, name="w")
    a, b = prob.add_client("alice"), prob.add_client("bob")
    a.minimize(fm.sum_squares(w - 1))
    b.minimize(fm.sum_squares(other_w + 1))
    with pytest.raises(fm.FedModelError,
                       match=r"two different shared variables are named 'w'.*'alice'.*'bob'.*"
                             r"problem-wide unique names"):
        prob.solve("cvxpy")


def test_private_name_equal_to_a_shared_name_is_refused():
    """Decision: refused, since inside the client `w` would mean two things."""
    prob = fm.Problem()
    w = fm.Variable(2, name="w")
    c = prob.add_client("carol")
    u = c.variable(2, name="w")
    c.minimize(fm.sum_squares(u - w) + fm.sum_squares(w - 1))
    with pytest.raises(fm.FedModelError, match=r"'carol.w'.*shared variable 'w'.*ambiguous"):
        prob.solve("cvxpy")


def test_same_private_name_twice_in_one_client_is_refused():
    c = fm.Problem().add_client("dave")
    c.variable(name="s")
    with pytest.raises(fm.FedModelError, match="client 'dave' already has a private variable named 's'"):
        c.variable(name="s")


def test_shared_name_equal_to_a_private_label_is_refused():
    """A shared variable named "c0.s" would be shown like client c0's private `s`."""
    prob = fm.Problem()
    c = prob.add_client("c0")
    s, fake = c.variable(name="s"), fm.Variable(name="c0.s")
    c.minimize(fm.square(s - 1) + fm.square(fake))
    with pytest.raises(fm.FedModelError, match=r"shared variable 'c0.s'.*client 'c0'"):
        prob.solve("cvxpy")


def _intercept_model(same_names: bool):
    """Unconstrained clients, each with a private intercept `s`: min Σ_i ‖A_i w + s_i − b_i‖²/8
    + 0.05 s_i² + 0.05‖w‖² (the model DALD and FedADMM accept)."""
    rng = np.random.default_rng(1)
    w = fm.Variable(DIM, name="w")
    prob, slacks = fm.Problem(name="intercepts"), []
    for i in range(N_CLIENTS):
        c = prob.add_client()
        A, b = c.data(rng.standard_normal((8, DIM)), name="A"), c.data(rng.standard_normal(8) + 2 * i, name="b")
        s = c.variable((), name="s" if same_names else f"s{i}")
        c.minimize(fm.sum_squares(A @ w + s - b) / 8 + 0.05 * fm.square(s))
        slacks.append(s)
    prob.server.minimize(0.05 * fm.sum_squares(w))
    return prob, w, slacks


@pytest.mark.parametrize("backend", ["proxal", "dald", "fedadmm"])
def test_same_private_names_under_consensus_backends(backend):
    prob, w, slacks = _intercept_model(same_names=False)
    ref = prob.solve("cvxpy")
    s_ref = [float(ref.value(s)) for s in slacks]
    assert min(abs(a - b) for a in s_ref for b in s_ref if a != b) > 0.5   # distinct intercepts
    prob, v, same = _intercept_model(same_names=True)
    res = prob.solve(backend)
    assert res.status == "converged"
    assert res.objective == pytest.approx(ref.objective, rel=1e-5)
    np.testing.assert_allclose(res.value(v), ref.value(w), atol=1e-4)
    np.testing.assert_allclose([float(res.value(s)) for s in same], s_ref, atol=1e-4)


class _Stop(Exception):
    pass


@pytest.mark.integration     # checkpoint, resume and batched runs: CI runs it after the fast suite
def test_checkpoint_resume_and_batched_keep_each_clients_s(tmp_path):
    """Checkpoints store values by position in problem.variables() and the batched executor
    stacks clients: neither may mix up the three `s`."""
    prob, w, slacks, _ = _model(same_names=True)
    make = lambda: fm.backends.ProxAL(max_outer=40)      # noqa: E731
    reference = prob.solve(make())
    batched = prob.solve(make(), executor="batched")
    calls = [0]

    def stop_after_two(record):
        calls[0] += 1
        if calls[0] == 2:
            raise _Stop

    path = tmp_path / "run.ckpt"
    with pytest.raises(_Stop):
        prob.solve(make(), checkpoint=path, checkpoint_every=1, callback=stop_after_two)
    resumed = prob.solve(make(), checkpoint=path, resume=True)
    # the batched executor's vectorized ProxAL steps (backends/proxal_nodes.py) round
    # differently from the serial ones, and this run amplifies rounding (Anderson, adaptive ρ:
    # serial from w⁰ + 1e-14 moves the answer by 2e-6, the batched run by 3e-6); a mix-up of
    # the clients' s would be O(1); with ProxAL's tighter default ε1 (1e-5) it runs longer and
    # the batched run lands 1.0e-5 away
    for res, atol in ((batched, 3e-5), (resumed, 1e-12)):
        assert res.status == reference.status
        for var in [w, *slacks]:
            np.testing.assert_allclose(res.value(var), reference.value(var), rtol=0, atol=atol)
    assert len({round(float(reference.value(s)), 3) for s in slacks}) == N_CLIENTS
