"""`executor="jax"` (the batched executor with its JAX engine, fedmodel/runtime/jax_engine.py): the same iterates as the serial executor
(to 1e-8: values, history, multipliers, ledger) for Fed-DALD-CC, FedProx, FedAvg and
Fed-DALD-DC on ragged clients, with the clients' merits really evaluated by JAX (vmap over the
client axis) and the local steps run in JAX's fused loop; what has no JAX form falls back to
the per-node path and says so (JaxFallbackWarning, `fallbacks`)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("jax")

from fedmodel import backends
import fedmodel as fm
from fedmodel import topologies
from fedmodel.backends.proxal import ProxAL
from fedmodel import registry
from fedmodel.runtime.jax_executor import JaxExecutor, JaxFallbackWarning
from test_batched import D, _least_squares, _logistic, _private_variables_problem

TOL = 1e-8
# set-up steps (dald_cc_init, …) go node by node and say so; the tests that check the warnings
# catch them themselves
# JAX equivalence (compiles per shape): integration, CI runs it after the fast suite
pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("ignore::fedmodel.runtime.jax_executor.JaxFallbackWarning")]


def _close(got, want, what):
    if isinstance(want, dict):
        assert got.keys() == want.keys(), what
        for k in want:
            _close(got[k], want[k], f"{what}[{k}]")
    elif isinstance(want, str) or want is None or \
            isinstance(want, (list, tuple)) and any(isinstance(v, str) for v in want):
        assert got == want, what
    else:
        np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL, err_msg=what)


def assert_same_run(serial, other):
    """The serial run's iterates, history, multipliers and ledger, to TOL."""
    assert (serial.status, serial.iterations) == (other.status, other.iterations)
    assert serial.values.keys() == other.values.keys()
    for uid in serial.values:
        np.testing.assert_allclose(other.values[uid], serial.values[uid], rtol=0, atol=TOL)
    assert len(serial.history) == len(other.history)
    for a, b in zip(serial.history, other.history):
        _close({k: v for k, v in b.items() if k != "time"}, {k: v for k, v in a.items() if k != "time"},
               "history")
    _close(other.multipliers, serial.multipliers, "multipliers")
    assert serial.ledger == other.ledger


def _solve_both(prob, make_backend, **kw):
    serial = prob.solve(make_backend(), executor="serial", **kw)
    ex = JaxExecutor()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", JaxFallbackWarning)
        jax_run = prob.solve(make_backend(), executor=ex, **kw)
    reported = [str(w.message) for w in caught if issubclass(w.category, JaxFallbackWarning)]
    assert reported == [f"executor 'jax': {f}" for f in ex.fallbacks]
    # set-up steps (init, links) may go node by node; the steps of every round may not
    assert not [f for f in ex.fallbacks if any(f"'{k}'" in f for k in HOT)], ex.fallbacks
    return serial, jax_run, ex


HOT = ("dald_cc_solve", "dald_cc_dual", "dald_dc_sweep", "dald_dc_dual", "solve_local", "report")


def test_jax_is_a_registered_executor():
    assert "jax" in registry.names("executor")
    assert registry.lookup("executor", "jax") is JaxExecutor


@pytest.mark.parametrize("l1_on", ["server", "clients"])
def test_dald_cc_prox_grad_matches_serial(l1_on):
    prob, _ = _logistic(l1_on=l1_on)          # ragged: 8, 9, 10 rows
    serial, run, ex = _solve_both(prob, lambda: backends.DALD(solver="prox-grad", step=0.2,
                                                              local_steps=2, max_iterations=30))
    assert_same_run(serial, run)
    assert serial.history[-1]["objective"] < serial.history[0]["objective"]     # it moved
    assert ex.stats[("dald_cc_solve", "batched")] == 6 * 30
    assert ex.jax_calls["local_steps"] == 2 * 30     # every local step inside JAX's loop
    assert ex.jax_calls["objective"] == 30           # the reports' objectives too
    assert ex.fallbacks == []          # (the set-up travels in the first solve, in its group form)


def test_fedprox_and_fedavg_match_serial():
    prob, _ = _logistic(l1_on=None, ragged=True, two_kinds=True)     # two groups
    for make in (lambda: backends.FedProx(mu=0.5, step=0.1, local_steps=2, max_rounds=20),
                 lambda: backends.FedAvg(step=0.2, local_steps=3, max_rounds=20)):
        serial, run, ex = _solve_both(prob, make)
        assert_same_run(serial, run)
        assert len(ex.groups) == 2 and ex.stats[("dald_cc_solve", "batched")] == 6 * 20
        assert all(g.calls["local_steps"] > 0 for g in ex.groups)


def test_dald_cc_gd_least_squares_with_a_local_constraint_matches_serial():
    prob, w = _least_squares(sizes=[10, 12, 15, 10, 11])
    for c in prob.clients:
        c.subject_to(fm.sum(w) <= 0.5)
    serial, run, ex = _solve_both(prob, lambda: backends.DALD(solver="gd", step=0.05, local_steps=3,
                                                              max_iterations=25))
    assert_same_run(serial, run)
    assert ex.jax_calls["local_steps"] == 3 * 25


@pytest.mark.parametrize("topology", ["path", "ring"])
def test_dald_dc_sweep_matches_serial(topology):
    prob, _ = _logistic(n=7, l1_on="clients")
    G = getattr(topologies, topology)(prob)
    serial, run, ex = _solve_both(prob, lambda: backends.DALD(step=0.05, max_iterations=25, eps_primal=0.0,
                                                              eps_dual=0.0, solver="prox-grad"),
                                  topology=G)
    assert_same_run(serial, run)
    assert ex.stats[("dald_dc_sweep", "batched")] > 0 and ex.jax_calls["value_grad"] > 0


def test_proxal_with_lbfgs_runs_inside_the_jax_group_step():
    """ProxAL's client step with local L-BFGS-B (scipy's solver runs one client at a time) is
    served by the group's step (backends/proxal_nodes.py, since issue 26 one form over rows of
    clients): each client's own solver inside it, the serial numbers, no kind reported as
    served node by node. (Before the one-step form this request fell back node by node with a
    JaxFallbackWarning; the fallback report is checked by the DALD tests' set-up steps.)"""
    prob, _ = _logistic(n=4, l1_on=None, constraint=True)
    serial = prob.solve(ProxAL(beta=10.0, max_outer=5, local_solver="lbfgs"), executor="serial")
    ex = JaxExecutor()
    run = prob.solve(ProxAL(beta=10.0, max_outer=5, local_solver="lbfgs"), executor=ex)
    assert_same_run(serial, run)
    assert ex.stats[("proxal_admm_step", "serial")] == 0 < ex.stats[("proxal_admm_step", "batched")]
    assert not [f for f in ex.fallbacks if "'proxal_admm_step'" in f], ex.fallbacks


def test_one_executor_two_engines(monkeypatch):
    """`executor="jax"` is the batched executor with its JAX engine: `BatchedExecutor(engine=
    "jax")` gives `JaxExecutor()`'s run bit for bit (and the serial one to TOL), its groups are
    `JaxGroup`s, each built once at start (no numpy group built and replaced), and it reports
    and counts as the JAX executor does."""
    from fedmodel.runtime.batched import BatchedExecutor
    from fedmodel.runtime.batched_group import Group
    from fedmodel.runtime.jax_engine import JaxEngine, JaxGroup
    built = []
    init = Group.__init__

    def counted(self, names, programs, *args, **kwargs):
        built.append(type(self))
        init(self, names, programs, *args, **kwargs)
    monkeypatch.setattr(Group, "__init__", counted)
    prob, _ = _logistic(l1_on=None, ragged=True, two_kinds=True)      # two groups
    make = lambda: backends.FedAvg(step=0.2, local_steps=3, max_rounds=12)    # noqa: E731
    serial = prob.solve(make(), executor="serial")
    runs = {}
    for name, ex in (("named", JaxExecutor()), ("engine", BatchedExecutor(engine="jax"))):
        assert type(ex.engine) is JaxEngine and ex.engine.name == "jax"
        built.clear()
        runs[name] = prob.solve(make(), executor=ex)
        assert built == [JaxGroup, JaxGroup] and all(type(g) is JaxGroup for g in ex.groups)
        assert ex.stats[("dald_cc_solve", "batched")] == 6 * 12
        assert ex.jax_calls["local_steps"] == 2 * 3 * 12         # 2 groups × W × rounds, in JAX
        assert not [f for f in ex.fallbacks if any(f"'{k}'" in f for k in HOT)], ex.fallbacks
    assert_same_run(serial, runs["engine"])
    for uid in runs["named"].values:
        np.testing.assert_array_equal(runs["engine"].values[uid], runs["named"].values[uid])
    assert isinstance(JaxExecutor(), BatchedExecutor) and JaxExecutor(min_group=5).min_group == 5


def test_group_the_lowering_refuses_runs_on_numpy_and_says_so(monkeypatch):
    """A group whose plans the JAX lowering refuses (here: no rule for the logistic atom, as
    for a future atom without one) keeps numpy's batched plans: same numbers, a warning."""
    from fedmodel.compiler import jax_codegen
    rule = jax_codegen._rule

    def no_logistic(node, K, jnp):
        if type(node).__name__ == "Logistic":
            raise fm.FedModelError("the JAX lowering has no rule for the atom Logistic")
        return rule(node, K, jnp)
    monkeypatch.setattr(jax_codegen, "_rule", no_logistic)
    prob, _ = _logistic(n=4, l1_on=None)
    serial = prob.solve(backends.FedAvg(step=0.1, local_steps=2, max_rounds=10), executor="serial")
    ex = JaxExecutor()
    with pytest.warns(JaxFallbackWarning, match="on numpy: the JAX lowering has no rule"):
        run = prob.solve(backends.FedAvg(step=0.1, local_steps=2, max_rounds=10), executor=ex)
    assert_same_run(serial, run)
    assert ex.groups[0].lowering_error and not ex.jax_calls
    assert ex.stats[("dald_cc_solve", "batched")] == 4 * 10      # still batched, by numpy


def test_solve_local_gd_generic_form_runs_in_jax():
    """The runtime's generic `solve_local` (method "gd") through map: every client's local
    gradient descent in JAX's loop, equal to the serial solver's."""
    from fedmodel.runtime.executor import SerialExecutor
    from fedmodel.runtime.program import compile_programs
    prob, _ = _logistic(n=5, l1_on=None)
    payload = dict(linear=np.full(D, 0.1), weight=0.5, anchor=np.zeros(D), x0=np.full(D, 0.2),
                   tol=1e-8, method="gd", max_steps=7, lr=0.3)
    replies = []
    for ex in (SerialExecutor(), JaxExecutor()):
        ex.start(compile_programs(prob))
        replies.append(ex.map("solve_local", {c: payload for c in ex.clients}))
        if isinstance(ex, JaxExecutor):
            assert ex.jax_calls["local_steps"] == 7 and ex.stats[("solve_local", "batched")] == 5
        ex.close()
    for node, want in replies[0].items():
        _close(replies[1][node], want, node)


def test_clients_of_very_different_sizes_run_in_buckets_and_match_serial():
    """20 clients with 3 … 60 rows: the group is evaluated in several padded buckets (one vmap
    each, rows permuted in and out of bucket order) and still gives the serial iterates."""
    rng = np.random.default_rng(6)
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    sizes = rng.permutation(np.geomspace(3, 60, 20).astype(int))
    for i, m in enumerate(sizes):
        c = prob.add_client(f"c{i}")
        X, y = c.data(rng.normal(size=(m, D)), name="X"), c.data(np.sign(rng.normal(size=m)), name="y")
        c.minimize(fm.sum(fm.logistic(-fm.multiply(y, X @ w))) / 400 + 0.01 * fm.norm1(w))
    serial, run, ex = _solve_both(prob, lambda: backends.DALD(solver="prox-grad", step=0.3, local_steps=3,
                                                              max_iterations=15, eps_primal=0.0,
                                                              eps_dual=0.0))
    assert_same_run(serial, run)
    (group,) = ex.groups
    buckets = group._function("value_grad_plan").groups
    assert len(buckets) > 2 and sorted(np.concatenate(buckets).tolist()) == list(range(20))
    assert ex.jax_calls["local_steps"] == 3 * 15


def test_state_handed_between_jax_and_serial_executors_midway():
    """Rounds on the JAX executor, then a serial executor takes the programs over, then the JAX
    executor takes them back: the clients' x_i, μ_i and every round's x̂ equal an all-serial
    run's (the stacked state is written back at each hand-over)."""
    from fedmodel.runtime.executor import SerialExecutor
    from fedmodel.runtime.program import compile_programs
    from test_batched_sync import _cc_dicts, _cc_init, _cc_rounds
    prob, _ = _logistic(l1_on="clients")
    programs = compile_programs(prob)
    jax_ex, serial = JaxExecutor().start(programs), SerialExecutor().start(programs)
    jax_ex.take_over()
    reference = SerialExecutor().start(compile_programs(prob))
    clients = jax_ex.clients
    _cc_init(jax_ex, clients)
    _cc_init(reference, clients)
    xhat = np.linspace(-0.5, 0.5, D)
    got = [_cc_rounds(jax_ex, clients, xhat, 3)]
    serial.take_over()
    got.append(_cc_rounds(serial, clients, got[-1][-1], 2))
    jax_ex.take_over()
    got.append(_cc_rounds(jax_ex, clients, got[-1][-1], 3))
    want = _cc_rounds(reference, clients, xhat, 8)
    np.testing.assert_allclose(np.concatenate(got), want, rtol=0, atol=TOL)
    jax_ex.close()
    for mine, theirs in zip(_cc_dicts(programs, clients), _cc_dicts(reference.programs, clients)):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=TOL)
    assert jax_ex.jax_calls["local_steps"] == 2 * 6       # its rounds' local steps ran in JAX


def test_private_variables_and_partial_participation_match_serial():
    """Clients with private variables y_i (the vmapped plan takes x and y; the fused loop steps
    both), and clients dropping out of rounds (partial participation)."""
    prob = _private_variables_problem(sparse=False)
    serial, run, ex = _solve_both(prob, lambda: backends.DALD(solver="gd", step=0.05, local_steps=2,
                                                              max_iterations=20))
    assert_same_run(serial, run)
    assert ex.groups[0].n_y == 2 and ex.jax_calls["local_steps"] == 2 * 20
    prob, _ = _logistic(n=8, l1_on="server")
    serial, run, ex = _solve_both(prob, lambda: backends.DALD(solver="prox-grad", step=0.2, max_iterations=30,
                                                              coordination="partial", participation=0.6,
                                                              seed=3))
    assert_same_run(serial, run)
    assert 0 < ex.stats[("dald_cc_solve", "batched")] < 8 * 30 and ex.jax_calls["local_steps"] > 0


FEDADMM = {"InSa (defaults)": dict(max_rounds=25),
           "vanilla, E = 5": dict(inexact=False, adaptive=False, local_steps=5, max_rounds=25),
           "criterion (3.7), safeguard halves eta": dict(reference="u", lr=40.0, max_rounds=25),
           "partial participation": dict(participation=0.5, seed=2, max_rounds=25)}


@pytest.mark.parametrize("name, executor", [(name, "jax") for name in FEDADMM]
                         + [("criterion (3.7), safeguard halves eta", "batched")])   # (same form)
def test_fedadmm_rounds_are_vectorized_and_match_serial(name, executor):
    """FedADMM's client round (backends/fedadmm/client.py) for whole groups: per-client
    step counts (criterion), η_i halved by the safeguard, adaptive β_i, dropped-out clients."""
    from fedmodel.backends.fedadmm import FedADMM
    from fedmodel.runtime.batched import BatchedExecutor
    prob, _ = _logistic(n=8, l1_on=None)
    serial = prob.solve(FedADMM(**FEDADMM[name]), executor="serial")
    ex = JaxExecutor() if executor == "jax" else BatchedExecutor()
    run = prob.solve(FedADMM(**FEDADMM[name]), executor=ex)
    assert_same_run(serial, run)
    assert ex.stats[("fedadmm_round", "serial")] == 0 and ex.stats[("fedadmm_round", "batched")] > 0
    if executor == "jax":
        assert ex.jax_calls["value_grad"] > serial.iterations["rounds"]
    if "safeguard" in name:
        lrs = [p.state["fedadmm"]["lr"] for p in ex.programs.values() if p.role == "client"]
        assert min(lrs) < 40.0 and serial.iterations["local_steps"] < 8 * 25 * 50


FEDADMM_KINDS = {"l1 clients (proximal steps)": ("clients", dict(max_rounds=15), "value_grad"),
                 "node's Newton solver": (None, dict(local_solver="newton", max_rounds=15), "hessian")}


@pytest.mark.parametrize("name", FEDADMM_KINDS)
def test_fedadmm_rounds_of_prox_clients_and_newton_solves_run_in_jax(name):
    """λ‖w‖₁ clients (each row's prox by its program) and the node's Newton solver (one
    batched solve, Hessians by one vmap) inside the group's round on `executor="jax"`."""
    from fedmodel.backends.fedadmm import FedADMM
    l1_on, options, evaluation = FEDADMM_KINDS[name]
    prob, _ = _logistic(n=8, l1_on=l1_on)
    serial = prob.solve(FedADMM(**options), executor="serial")
    ex = JaxExecutor()
    assert_same_run(serial, prob.solve(FedADMM(**options), executor=ex))
    assert ex.stats[("fedadmm_round", "serial")] == 0 < ex.stats[("fedadmm_round", "batched")]
    assert ex.jax_calls[evaluation] > 0


def test_buckets_split_clients_by_data_size_on_a_geometric_grid():
    """1–40 rows per client: 8 buckets whose largest client is at most 40^(1/8) ≈ 1.59 times
    the smallest one's data (padding within a bucket stays small), covering every client
    once; equal sizes (or few clients): one bucket."""
    from fedmodel.runtime.jax_executor import buckets
    from fedmodel.runtime.program import compile_programs
    rng = np.random.default_rng(8)
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    rows = rng.permutation(np.arange(1, 41))
    for i, m in enumerate(rows):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(rng.normal(size=(m, 3)), name="X") @ w))
    programs = [p for p in compile_programs(prob).values() if p.role == "client"]
    split = buckets(programs, "value_grad_plan")
    assert len(split) == 8 and sorted(np.concatenate(split).tolist()) == list(range(40))
    for b in split:
        assert rows[b].max() <= 1.59 * rows[b].min() + 1
    assert len(buckets(programs[:10], "value_grad_plan")) == 1
