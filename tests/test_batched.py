"""The batched executor: same answers as the serial one (iterates, history, multipliers, ledger,
to 1e-12), with the hot paths really served in batch, and `BatchedPlan` against the
per-client compiled plans atom by atom."""
import numpy as np
import pytest

from fedmodel import backends
import fedmodel as fm
from fedmodel.backends.proxal import ProxAL
from fedmodel.runtime.batched import BatchedExecutor, NumpyEngine
from fedmodel.runtime.batched_group import Group, program_signature
from fedmodel.runtime.batched_plan import BatchedPlan
from fedmodel.runtime.segments import block_diag
from fedmodel.runtime.executor import SerialExecutor
from fedmodel.runtime.program import compile_programs

D = 5
TOL = 1e-12


def _data(rng, m, sparse=True):
    X = rng.normal(size=(m, D))
    if sparse:
        X *= rng.random((m, D)) < 0.6          # many zeros, like MNIST pixels
    return X


def _least_squares(n=5, seed=0, sizes=None):
    rng = np.random.default_rng(seed)
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i in range(n):
        m = sizes[i] if sizes else 12
        c = prob.add_client(f"c{i}")
        X = _data(rng, m)
        c.minimize(fm.sum_squares(c.data(X, name="X") @ w - c.data(rng.normal(size=m), name="b")) / m)
    return prob, w


def _logistic(n=6, seed=1, l1_on="server", lam=0.01, ragged=True, constraint=False, two_kinds=False):
    """L1-logistic regression (the DALD Table II model); ragged = unequal client sizes."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i in range(n):
        m = 8 + (i % 3 if ragged else 0)
        c = prob.add_client(f"c{i}")
        X, y = c.data(_data(rng, m), name="X"), c.data(np.sign(rng.normal(size=m)), name="y")
        if two_kinds and i % 2:     # a second structure: squared hinge-like smooth loss
            c.minimize(fm.sum_squares(fm.pos(1 - fm.multiply(y, X @ w))) / m)
        else:
            c.minimize(fm.sum(fm.logistic(-fm.multiply(y, X @ w))) / m)
        if l1_on == "clients":
            c.minimize(lam * fm.norm1(w))
        if constraint:
            c.subject_to(fm.sum(w) >= 1.0)
    if l1_on == "server":
        prob.server.minimize(lam * fm.norm1(w))
    return prob, w


def _solve_both(prob, backend):
    serial = prob.solve(backend, executor="serial")
    ex = BatchedExecutor()
    batched = prob.solve(backend, executor=ex)
    return serial, batched, ex


def _assert_same(serial, batched):
    assert serial.status == batched.status
    assert serial.iterations == batched.iterations
    assert serial.values.keys() == batched.values.keys()
    for uid in serial.values:
        np.testing.assert_allclose(batched.values[uid], serial.values[uid], rtol=0, atol=TOL)
    assert len(serial.history) == len(batched.history)
    for a, b in zip(serial.history, batched.history):
        assert a.keys() == b.keys()
        for key in a:
            if key != "time":
                _close(b[key], a[key], key)
    assert serial.multipliers.keys() == batched.multipliers.keys()
    for name in serial.multipliers:
        np.testing.assert_allclose(batched.multipliers[name], serial.multipliers[name], atol=TOL)
    assert serial.ledger.messages == batched.ledger.messages
    assert serial.ledger.floats == batched.ledger.floats
    assert serial.ledger.rounds == batched.ledger.rounds
    for key in ("consensus_multipliers", "client_values"):
        for node, value in serial.info.get(key, {}).items():
            np.testing.assert_allclose(batched.info[key][node], value, atol=TOL)


def _close(got, want, what, tol=TOL):
    """got == want: dicts key by key, strings and None exactly, numbers to `tol`."""
    if isinstance(want, dict):
        assert got.keys() == want.keys(), what
        for k in want:
            _close(got[k], want[k], f"{what}[{k}]", tol)
    elif isinstance(want, str) or want is None:
        assert got == want, what
    elif isinstance(want, (list, tuple)) and any(isinstance(v, (str, type(None))) for v in want):
        assert list(got) == list(want), what
    else:
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)


def _batched(ex, kind):
    return ex.stats[(kind, "batched")]


# ---- whole runs: batched == serial -------------------------------------------------------------
@pytest.mark.parametrize("l1_on", ["server", "clients"])
def test_dald_cc_prox_grad_l1_logistic_matches_serial(l1_on):
    prob, _ = _logistic(l1_on=l1_on)
    serial, batched, ex = _solve_both(prob, backends.DALD(solver="prox-grad", step=0.2, max_iterations=40))
    _assert_same(serial, batched)
    # Step 2 travels with the next solve (DALD(one_message)): sent alone once, at the end
    assert _batched(ex, "dald_cc_solve") == 6 * 40 and _batched(ex, "dald_cc_dual") == 6
    assert _batched(ex, "report") == 6 * 40
    assert serial.history[-1]["objective"] < serial.history[0]["objective"]   # it did move


def test_dald_cc_gd_with_several_local_steps_matches_serial():
    prob, _ = _least_squares(sizes=[10, 12, 15, 10, 11])
    serial, batched, ex = _solve_both(prob, backends.DALD(solver="gd", step=0.05, local_steps=3,
                                                           max_iterations=30))
    _assert_same(serial, batched)
    assert _batched(ex, "dald_cc_solve") == 5 * 30


def test_dald_cc_exact_solver_is_one_batched_solve_and_matches_serial(solve_counts):
    """solver="exact": the group's step (13) is one batched Newton solve of the clients' local
    problems (`Group.solve_local`), with the serial numbers; the serial run solves per client."""
    prob, _ = _least_squares()
    counts = solve_counts
    serial = prob.solve(backends.DALD(solver="exact", max_iterations=15), executor="serial")
    assert counts["batched"] == 0 < counts["own"]
    counts.update(batched=0, own=0)
    ex = BatchedExecutor()
    batched = prob.solve(backends.DALD(solver="exact", max_iterations=15), executor=ex)
    _assert_same(serial, batched)
    assert _batched(ex, "dald_cc_solve") == 5 * 15 and ex.stats[("dald_cc_solve", "serial")] == 0
    assert counts["batched"] == 15            # one per round; the clients' own solver never
    assert _batched(ex, "dald_cc_dual") > 0


def test_fedprox_and_fedavg_match_serial():
    prob, _ = _logistic(l1_on=None, ragged=True)
    for backend in (backends.FedProx(mu=0.5, step=0.1, local_steps=2, max_rounds=25),
                    backends.FedProx(step=0.1, max_rounds=25, warm_start=True),
                    backends.FedAvg(step=0.2, local_steps=3, max_rounds=25)):
        serial, batched, ex = _solve_both(prob, backend)
        _assert_same(serial, batched)
        assert _batched(ex, "dald_cc_solve") == 6 * 25


def test_local_constraint_model_matches_serial():
    """Local constraints keep their AL multipliers (updated client by client) in sync."""
    prob, _ = _logistic(l1_on="server", constraint=True)
    # step 0.2 in the model's units (equilibrated, 30 iterations leave the constraint inactive)
    backend = backends.DALD(solver="prox-grad", step=0.2, max_iterations=30)
    backend.scaling = False
    serial, batched, ex = _solve_both(prob, backend)
    _assert_same(serial, batched)
    assert _batched(ex, "dald_cc_solve") > 0
    assert any(np.any(v != 0) for v in serial.multipliers.values())      # constraint active


def _private_variables_problem(sparse=True):
    """4 least-squares clients, each with a private variable s_i tied to w[:2]."""
    rng = np.random.default_rng(4)
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i in range(4):
        m = 9 + i
        c = prob.add_client(f"c{i}")
        s = c.variable(2, name=f"s{i}")
        X, b = c.data(_data(rng, m, sparse), name="X"), c.data(rng.normal(size=m), name="b")
        c.minimize(fm.sum_squares(X @ w - b) / m + fm.sum_squares(s - w[:2]) + 0.1 * fm.sum_squares(s))
    return prob


def test_private_variables_match_serial():
    """Clients with private variables y_i (re-centred proximal term every local solve)."""
    prob = _private_variables_problem()
    for backend in (backends.DALD(solver="prox-grad", step=0.05, max_iterations=20),
                    backends.DALD(solver="gd", step=0.05, local_steps=2, max_iterations=20)):
        serial, batched, ex = _solve_both(prob, backend)
        _assert_same(serial, batched)
        assert _batched(ex, "dald_cc_solve") == 4 * 20


def test_two_structures_form_two_groups():
    prob, _ = _logistic(two_kinds=True, l1_on="server")
    serial, batched, ex = _solve_both(prob, backends.DALD(solver="prox-grad", step=0.2, max_iterations=20))
    _assert_same(serial, batched)
    assert sorted(len(g.names) for g in ex.groups) == [3, 3]
    assert _batched(ex, "dald_cc_solve") == 6 * 20


@pytest.mark.parametrize("few", [False, True])
def test_client_dropout_under_partial_participation_matches_serial(few, monkeypatch):
    """`few`: every partial round counts as "a few clients of a large group" (Group.STRAGGLERS),
    which `local.local_argmin` serves row by row on each client's own plans: the same numbers."""
    if few:
        from fedmodel.runtime.batched_group import Group
        monkeypatch.setattr(Group, "STRAGGLERS", 1.0)
    prob, _ = _logistic(n=8, l1_on="server")
    backend = backends.DALD(solver="prox-grad", step=0.2, max_iterations=40, coordination="partial",
                            participation=0.6, seed=3)
    serial, batched, ex = _solve_both(prob, backend)
    _assert_same(serial, batched)
    assert 0 < _batched(ex, "dald_cc_solve") < 8 * 40         # some clients dropped out


def test_proxal_runs_on_the_batched_executor_by_the_serial_path():
    prob, _ = _least_squares(n=3)
    serial, batched, ex = _solve_both(prob, ProxAL(beta=10.0, max_outer=20))
    _assert_same(serial, batched)


def test_singleton_groups_and_min_group_take_the_serial_path():
    prob, _ = _logistic(n=4)
    backend = backends.DALD(solver="prox-grad", step=0.2, max_iterations=10)
    ex = BatchedExecutor(min_group=5)
    batched = prob.solve(backend, executor=ex)
    _assert_same(prob.solve(backend, executor="serial"), batched)
    assert ex.groups == [] and _batched(ex, "dald_cc_solve") == 0



# ---- engines: one executor, the engine builds its groups --------------------------------------
class _CountingEngine(NumpyEngine):
    """An engine as a user would add one: numpy's groups, counting the groups it builds and the
    group gradients they evaluate."""
    name = "counting"

    def __init__(self):
        super().__init__()
        self.built, self.gradients = [], 0

    def group(self, names, programs):
        engine = self

        class Counted(Group):
            def grad(self, X, Y):
                engine.gradients += 1
                return super().grad(X, Y)
        self.built.append(Counted(names, programs))
        return self.built[-1]


def test_the_engine_builds_each_group_once_and_gives_the_serial_numbers():
    """`BatchedExecutor(engine=...)`: numpy by default; an engine instance builds every group of
    the run exactly once (the executor's groups are the ones it built) and the run equals the
    serial one; the numpy engine reports no fallbacks and counts no JAX calls."""
    assert BatchedExecutor().engine.name == BatchedExecutor(engine="numpy").engine.name == "numpy"
    prob, _ = _logistic(two_kinds=True)         # two structures: two groups
    backend = backends.DALD(solver="gd", step=0.1, local_steps=2, max_iterations=15)
    engine = _CountingEngine()
    ex = BatchedExecutor(engine=engine)
    _assert_same(prob.solve(backend, executor="serial"), prob.solve(backend, executor=ex))
    assert ex.engine is engine and len(ex.groups) == 2
    assert [id(g) for g in ex.groups] == [id(g) for g in engine.built]     # built once, kept
    assert engine.gradients == 2 * 2 * 15           # 2 groups × 2 local steps × 15 iterations
    assert _batched(ex, "dald_cc_solve") == 6 * 15
    numpy = BatchedExecutor()
    prob.solve(backend, executor=numpy)
    assert numpy.fallbacks == [] and not numpy.jax_calls
    assert all(type(g) is Group for g in numpy.groups)


@pytest.mark.parametrize("engine, shown", [("torch", "'torch'"), (3, "3"), (None, "None")])
def test_an_unknown_engine_is_refused_naming_the_choices(engine, shown):
    with pytest.raises(fm.FedModelError, match=rf"unknown engine {shown}; use one of \['jax', 'numpy'\] "
                                               "or an Engine instance"):
        BatchedExecutor(engine=engine)

# ---- state consistency: switching executors midway ----------------------------------------------
def _drive(ex_steps, programs, d):
    """Init, then alternate solve/dual rounds, each on the executor listed in `ex_steps` (which
    takes the programs over from the one before: `Executor.take_over`)."""
    clients = [n for n, p in programs.items() if p.role == "client"]
    executors = {"serial": SerialExecutor().start(programs), "batched": BatchedExecutor().start(programs)}
    executors["serial"].take_over().map("dald_cc_init", {c: {"x0": np.zeros(d), "beta": 2.0, "rho": np.ones(d)}
                                                         for c in clients})
    xhat = np.full(d, 0.1)
    trace = []
    for which in ex_steps:
        ex = executors[which].take_over()
        opts = {"tol": -1.0, "solver": "prox-grad", "step": 0.2, "local_steps": 2, "warm": 1.0}
        xs = ex.map("dald_cc_solve", {c: {"xhat": xhat, **opts} for c in clients})
        xhat = np.mean([r["x"] for r in xs.values()], axis=0)
        ex.map("dald_cc_dual", {c: {"xhat": xhat, "consensus": 1.0} for c in clients})
        trace.append(xhat.copy())
    mus = executors["serial"].take_over().map("dald_state", {c: {} for c in clients})
    return np.array(trace), np.array([mus[c]["mu"] for c in clients])


def test_switching_executors_midway_keeps_client_state():
    prob, _ = _logistic(l1_on="clients")
    reference = _drive(["serial"] * 6, compile_programs(prob), D)
    mixed = _drive(["batched", "batched", "serial", "batched", "serial", "batched"],
                   compile_programs(prob), D)
    np.testing.assert_allclose(mixed[0], reference[0], atol=TOL)
    np.testing.assert_allclose(mixed[1], reference[1], atol=TOL)


def test_bad_payload_is_refused_like_the_serial_executor():
    prob, _ = _logistic()
    ex = BatchedExecutor().start(compile_programs(prob))
    clients = ex.clients
    with pytest.raises(fm.FedModelError, match="numbers but is declared"):
        ex.map("report", {c: {"x": np.zeros(D + 1)} for c in clients})
    with pytest.raises(fm.FedModelError, match="undeclared field"):
        ex.map("report", {c: {"x": np.zeros(D), "X": np.zeros((3, D))} for c in clients})
    with pytest.raises(fm.FedModelError, match="no node program"):
        ex.map("report", {"nobody": {"x": np.zeros(D)}, **{c: {"x": np.zeros(D)} for c in clients}})


# ---- BatchedPlan against the per-client plans -------------------------------------------------
def _client_programs(build, n=4, seed=0):
    rng = np.random.default_rng(seed)
    prob = fm.Problem()
    w = fm.Variable(D, name="w")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        build(c, w, rng, 6 + i)          # ragged: client i has 6 + i rows
    programs = compile_programs(prob)
    return [programs[f"c{i}"] for i in range(n)]


MODELS = {
    "least squares": lambda c, w, rng, m: c.minimize(
        fm.sum_squares(c.data(_data(rng, m), name="X") @ w - c.data(rng.normal(size=m), name="b"))),
    "logistic mean": lambda c, w, rng, m: c.minimize(
        fm.mean(fm.logistic(c.data(_data(rng, m), name="X") @ w))),
    "log_sum_exp + huber": lambda c, w, rng, m: c.minimize(
        fm.log_sum_exp(c.data(_data(rng, m), name="X") @ w) + fm.sum(fm.huber(w - 0.3))),
    "vector data, exp, power": lambda c, w, rng, m: c.minimize(
        fm.exp(c.data(rng.normal(size=D), name="a") @ w / 4) + fm.sum(fm.power(w, 2)) * (1 + m)),
    "w @ A, index, constraint": lambda c, w, rng, m: (
        c.minimize(fm.sum_squares(w @ c.data(_data(rng, D).T @ _data(rng, D), name="A")) + w[1] * m),
        c.subject_to(fm.sum_squares(w) <= 1.0 + m)),
    "axis mean, broadcast (uniform)": lambda c, w, rng, m: c.minimize(
        fm.sum_squares(fm.mean(fm.multiply(c.data(_data(rng, 4), name="X"), w), axis=0)) + m * fm.sum(w)),
    "shared matrix": lambda c, w, rng, m: c.minimize(
        fm.sum_squares(np.arange(D * D, dtype=float).reshape(D, D) @ w) + m * fm.sum(w)),
}


def _assert_value_grad_per_client(group, programs, X):
    """The group's P_i and ∇P_i at the rows of X equal each client's own plan's (to TOL)."""
    values, G = group.value_grad(X, np.zeros((len(programs), 0)))
    for i, p in enumerate(programs):
        value, g = p.value_grad(X[i], p.y)
        assert values[i] == pytest.approx(value, rel=TOL, abs=TOL)
        np.testing.assert_allclose(G[i], g, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("name", list(MODELS))
def test_batched_plan_equals_per_client_plans(name):
    programs = _client_programs(MODELS[name])
    for p in programs:
        p.merit_ir.beta.value = 3.0
        p.merit_ir.prox_weight.value = 0.5
        for mu in p.merit_ir.multipliers.values():
            mu.value = np.full(mu.shape, 0.7)
    assert len({program_signature(p) for p in programs}) == 1
    group = Group([p.name for p in programs], programs)
    X = np.random.default_rng(5).normal(size=(len(programs), D))
    _assert_value_grad_per_client(group, programs, X)
    objective = group.objective(X, np.zeros((len(programs), 0)))
    for i, p in enumerate(programs):
        assert objective[i] == pytest.approx(float(p.objective_plan(X[i])[0]), rel=TOL, abs=TOL)


def test_batched_plan_uses_block_diagonal_products_for_data():
    programs = _client_programs(MODELS["logistic mean"])
    plan = BatchedPlan([p.value_grad_plan for p in programs])
    assert plan.rules.count("MatMul:block-diagonal") == 2         # X w and Xᵀ r
    assert "loop" not in " ".join(plan.rules)


def test_batched_plan_refuses_different_structures():
    a = _client_programs(MODELS["least squares"], n=2)
    b = _client_programs(MODELS["logistic mean"], n=2)
    with pytest.raises(fm.FedModelError, match="same structure"):
        BatchedPlan([a[0].value_grad_plan, b[0].value_grad_plan])


def test_block_diagonal_matches_scipy_for_ragged_blocks():
    import scipy.linalg
    rng = np.random.default_rng(2)
    cases = [[_data(rng, m) for m in (2, 4, 0, 3)],              # X_i, ragged heights, an empty one
             [_data(rng, m).T for m in (2, 4, 1, 3)],            # X_iᵀ, ragged widths
             [rng.normal(size=(m, k)) for m, k in ((2, 1), (4, 3))],
             [rng.normal(size=3), rng.normal(size=2)]]           # vectors as rows
    for blocks in cases:
        dense = scipy.linalg.block_diag(*[b.reshape(1, -1) if b.ndim == 1 else b for b in blocks])
        got = block_diag(blocks)
        assert got.nnz == np.count_nonzero(dense)
        np.testing.assert_array_equal(got.toarray(), dense)
