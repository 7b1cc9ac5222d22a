"""DP-ADMM's client step (backends/dp_admm/client.py, written once over rows of clients) on the
batched and JAX executors: a seeded run gives the serial run's iterates, history, privacy
accounting and noise draws (to 1e-8; the draws exactly) for ObjP with per-record clipping (the
default), OutP, ObjT and ε̄ = ∞, with ragged clients; the step really ran on the group; clients
with local constraints in their Lagrangian are served by the group step too. The group's
per-record terms (fedmodel/runtime/batched_records.py) are checked against each node's own
`RecordGradients`."""
from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends.dp_admm import DPADMM
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.batched_records import group_record_gradients
from fedmodel.runtime.client_step import NodeRows
from fedmodel.runtime.privacy import _record_gradients, record_sensitivity
from fedmodel.runtime.program import compile_programs
from test_batched import D, _close, _logistic

pytestmark = pytest.mark.integration     # JAX equivalence (compiles per shape): CI runs it after the fast suite

TOL = 1e-8
SETTINGS = {
    "ObjP clip (default)": dict(epsilon=1.0, clip=0.05),        # small C: most records clipped
    "OutP": dict(epsilon=1.0, variant="outP"),
    "no mechanism": dict(),                                     # ε̄ = ∞: IADMM
    "ObjT, paper sensitivity, 2-norm region": dict(epsilon=2.0, variant="objT", sensitivity="paper",
                                                   trust_norm="2"),
}


def _executor(name):
    if name == "batched":
        return BatchedExecutor()
    pytest.importorskip("jax")
    from fedmodel.runtime.jax_executor import JaxExecutor
    return JaxExecutor()


def _run(prob, executor, **kw):
    kw = {"seed": 7, "max_rounds": 12, "record_noise": True, "tol": 0.0, **kw}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = prob.solve(DPADMM(**kw), executor=executor)
    return result, [str(w.message) for w in caught]


def _same(got, want, what):
    _close(got, want, what, TOL)


@pytest.mark.parametrize("executor", ["batched", "jax"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_seeded_dp_admm_matches_serial(setting, executor):
    prob, _ = _logistic(n=6, l1_on=None)               # ragged: 8, 9, 10 rows
    serial, _ = _run(prob, "serial", **SETTINGS[setting])
    ex = _executor(executor)
    run, messages = _run(prob, ex, **SETTINGS[setting])
    assert ex.stats[("dp_admm_step", "batched")] == 6 * 12 and ex.stats[("dp_admm_step", "serial")] == 0
    assert not [m for m in messages if "dp_admm_step" in m], messages
    if executor == "jax":                       # ∇f_p of the group by the vmapped JAX merit
        assert ex.jax_calls["value_grad"] >= 12
    assert run.status == serial.status and run.iterations == serial.iterations
    for uid in serial.values:
        np.testing.assert_allclose(run.values[uid], serial.values[uid], rtol=0, atol=TOL)
    assert len(run.history) == len(serial.history) == 12
    for a, b in zip(serial.history, run.history):
        _same({k: v for k, v in b.items() if k != "time"}, {k: v for k, v in a.items() if k != "time"},
              "history")
    for key in ("client_values", "dual_variables", "privacy", "records"):
        _same(run.info[key], serial.info[key], key)
    scales = "noise_std" if setting == "OutP" else "sensitivity"
    _same(run.info[scales], serial.info[scales], scales)
    assert run.ledger == serial.ledger
    if "epsilon" in SETTINGS[setting]:          # the same draws from each client's own generator
        for c, drawn in serial.info["noise"].items():
            assert drawn.shape == (12, D)
            if SETTINGS[setting].get("sensitivity") == "paper":   # Δ̄ (20) from z^t: to ulps
                np.testing.assert_allclose(run.info["noise"][c], drawn, rtol=1e-12, atol=0)
            else:                                   # a data-independent scale: bit for bit
                np.testing.assert_array_equal(run.info["noise"][c], drawn)
        assert np.isfinite(serial.info["privacy"]["basic"][0])
    else:
        assert all(len(n) == 0 for n in serial.info["noise"].values())


def test_the_clipped_setting_clips_and_the_step_uses_the_clipped_gradient():
    """With C = 0.05 the group's clipping changes the gradient of every client (so the
    equality above covers the clipping), and equals each node's own correction; on a group of
    one (`NodeRows`, the step on one client) the terms are the program's own, bit for bit."""
    prob, _ = _logistic(n=6, l1_on=None)
    ex = BatchedExecutor().start(compile_programs(prob, client_sets=True))
    try:
        group = ex.groups[0]
        records = group_record_gradients(group)
        X = np.random.default_rng(0).normal(size=(group.n, group.n_x))
        bound = np.array([0.05 / (8 + i % 3) for i in range(group.n)])
        correction, clipped = records.clipping_correction(X, bound)
        assert clipped.all()
        for i, program in enumerate(group.programs):
            own = _record_gradients(program).clipping_correction(program.shared.unpack(X[i]), bound[i])
            np.testing.assert_allclose(correction[i], program.shared.pack(own), rtol=1e-12, atol=1e-15)
            assert np.linalg.norm(correction[i]) > 1e-3
            one = group_record_gradients(NodeRows(program))
            mine, clipped_one = one.clipping_correction(X[i:i + 1], bound[i:i + 1])
            np.testing.assert_array_equal(mine, program.shared.pack(own)[None, :])
            assert clipped_one.tolist() == [True]
            assert one.max_l1(X[i:i + 1]).tolist() == [record_sensitivity(program, X[i])]
        # a bound no term reaches: nothing clipped, no correction (as the per-node `None`)
        correction, clipped = records.clipping_correction(X, 1e6)
        assert not clipped.any() and not correction.any()
        correction, clipped = group_record_gradients(NodeRows(group.programs[0])).clipping_correction(X[:1], 1e6)
        assert correction.shape == (1, group.n_x) and not clipped.any() and not correction.any()
    finally:
        ex.close()


def test_group_record_terms_match_a_hand_computed_softmax_model():
    """Matrix-valued w (softmax regression, S = A @ W of shape (m, k)) and two data products
    with one row count (one record each row, norms added): the group's max_l1 and clipping
    against the formula ‖a_i‖₁‖u_i‖₁ computed by hand, client by client."""
    rng = np.random.default_rng(3)
    d, k = 4, 3
    W = fm.Variable((d, k), name="W")
    prob, raw = fm.Problem(), []
    for i in range(4):
        m = 5 + i
        A, B, Y = rng.normal(size=(m, d)), rng.normal(size=(m, d)), np.eye(k)[rng.integers(0, k, m)]
        raw.append((A, B, Y))
        c = prob.add_client(f"c{i}")
        Ad, Bd, Yd = c.data(A, name="A"), c.data(B, name="B"), c.data(Y, name="Y")
        logits = Ad @ W + 0.5 * (Bd @ W)
        c.minimize((fm.sum(fm.log_sum_exp(logits, axis=1)) - fm.sum(fm.multiply(Yd, logits))) / m)
    ex = BatchedExecutor().start(compile_programs(prob, client_sets=True))
    try:
        group = ex.groups[0]
        assert group.n == 4
        records = group_record_gradients(group)
        X = rng.normal(size=(4, d * k))
        bound = 0.2
        correction, clipped = records.clipping_correction(X, bound)
        max_l1 = records.max_l1(X)
        for i, (A, B, Y) in enumerate(raw):
            Wi = X[i].reshape(d, k)
            L = A @ Wi + 0.5 * (B @ Wi)
            P = np.exp(L - L.max(axis=1, keepdims=True))
            P /= P.sum(axis=1, keepdims=True)
            U = (P - Y) / len(A)                           # ∂f/∂logits, per record
            norms = np.abs(A).sum(1) * np.abs(U).sum(1) + np.abs(0.5 * B).sum(1) * np.abs(U).sum(1)
            assert max_l1[i] == pytest.approx(norms.max(), rel=1e-12)
            s = np.minimum(1.0, bound / norms) - 1.0
            want = A.T @ (s[:, None] * U) + 0.5 * B.T @ (s[:, None] * U)
            assert clipped[i] == bool((norms > bound).any())
            np.testing.assert_allclose(correction[i].reshape(d, k), want, rtol=1e-10, atol=1e-14)
    finally:
        ex.close()


@pytest.mark.parametrize("executor", ["batched", "jax"])
@pytest.mark.parametrize("epsilon", [1.0, float("inf")])
def test_clients_with_only_sets_and_prox_terms_are_vectorized_and_match_serial(executor, epsilon):
    """λ‖w‖₁ and bounds on every client: the group's prox after the vectorized step (no
    multipliers, nothing released), as the per-node `LocalConstraints.project`."""
    prob, w = _logistic(n=6, l1_on="clients", lam=0.05)
    for c in prob.clients:
        c.subject_to(w <= 0.1)
        c.subject_to(w >= -0.1)
    options = {"epsilon": epsilon, "max_rounds": 10}
    serial, _ = _run(prob, "serial", **options)
    ex = _executor(executor)
    run, messages = _run(prob, ex, **options)
    _assert_group_step_like_serial(ex, messages, serial, run, 60, ("client_values", "dual_variables", "privacy"))
    z = np.array(list(serial.info["client_values"].values()))
    assert np.isclose(np.abs(z).max(), 0.1) and (z == 0).any()     # the bounds and λ‖w‖₁ acted


def _assert_group_step_like_serial(ex, messages, serial, run, steps: int, keys: tuple) -> None:
    """`dp_admm_step` served `steps` times by the group's step (never node by node, no fallback
    message), with the serial run's values, history and `info[key]` for `keys`."""
    assert ex.stats[("dp_admm_step", "batched")] == steps and ex.stats[("dp_admm_step", "serial")] == 0
    assert not [m for m in messages if "dp_admm_step" in m], messages
    for uid in serial.values:
        np.testing.assert_allclose(run.values[uid], serial.values[uid], rtol=0, atol=TOL)
    for a, b in zip(serial.history, run.history):
        _same({k: v for k, v in b.items() if k != "time"}, {k: v for k, v in a.items() if k != "time"},
              "history")
    for key in keys:
        _same(run.info[key], serial.info[key], key)


class _Spy(BatchedExecutor):
    """Counts the kinds sent per node (`map`) and as group requests (`map_stacked`)."""

    def start(self, programs):
        self.per_node, self.grouped, self.riders = Counter(), Counter(), Counter()
        return super().start(programs)

    def _count(self, counter, kind, rider, send):
        # (a request with a rider is served as the same request sent again without it, in
        # this process: count it once)
        resent, self._resend = getattr(self, "_resend", None) == (id(counter), kind), None
        if not resent:
            counter[kind] += 1
            self.riders[rider and rider.kind] += rider is not None
        if rider is not None:
            self._resend = (id(counter), kind)
        return send()

    def map(self, kind, payloads, missing="raise", rider=None):
        return self._count(self.per_node, kind, rider,
                           lambda: super(_Spy, self).map(kind, payloads, missing, rider))

    def map_stacked(self, kind, nodes, rows=None, common=None, split=True, rider=None):
        return self._count(self.grouped, kind, rider, lambda: super(_Spy, self).map_stacked(
            kind, nodes, rows, common, split, rider))


@pytest.mark.parametrize("setting", ["ObjP clip (default)", "OutP"])
def test_a_round_is_one_group_request_served_as_a_block(setting):
    """The server sends each round's client step and report as one group request (λ_p, and
    OutP's per-client 1/η̂ and σ, as blocks), which the stacked form serves without per-node
    payloads; the numbers are the serial ones."""
    prob, _ = _logistic(n=6, l1_on=None)
    serial, _ = _run(prob, "serial", **SETTINGS[setting])
    ex = _Spy()
    run, _ = _run(prob, ex, **SETTINGS[setting])
    # (ObjP's report at w^{t+1} rides on the step that carries it; OutP's step carries w^t, so
    # its report rides on the next round's step, the last one's alone)
    rides = setting != "OutP"
    assert ex.grouped["dp_admm_step"] == 12
    assert (ex.grouped["report"], ex.riders["report"]) == ((0, 12) if rides else (1, 11))
    assert ex.per_node["dp_admm_step"] == ex.per_node["report"] == 0
    assert ex.stats[("dp_admm_step", "batched")] == 6 * 12
    _same(run.info["client_values"], serial.info["client_values"], "client_values")
    _same(run.info["dual_variables"], serial.info["dual_variables"], "dual_variables")
    assert run.ledger == serial.ledger


def test_clients_of_two_groups_and_a_server_term_match_serial():
    """A group request over two groups (two client structures) is split into per-node messages
    and served by each group's per-member form; the server's term enters (4a) and the report."""
    prob, _ = _logistic(n=6, l1_on="server", two_kinds=True)
    serial, _ = _run(prob, "serial", epsilon=1.0, sensitivity=1.0)
    ex = _Spy()
    run, _ = _run(prob, ex, epsilon=1.0, sensitivity=1.0)
    assert len(ex.groups) == 2 and ex.stats[("dp_admm_step", "batched")] == 6 * 12
    assert ex.per_node["dp_admm_step"] == 12                # each group request split
    for a, b in zip(serial.history, run.history):
        _same({k: v for k, v in b.items() if k != "time"}, {k: v for k, v in a.items() if k != "time"},
              "history")
    _same(run.info["client_values"], serial.info["client_values"], "client_values")
    assert run.ledger == serial.ledger


@pytest.mark.parametrize("executor", ["batched", "jax"])
@pytest.mark.parametrize("constraint", ["exact", "released"])
def test_clients_with_constraints_in_their_lagrangian_are_served_by_the_group_step(executor, constraint):
    """Clients with local constraints in the Lagrangian (`state["local"]` with multipliers): the
    group step serves them — each row's Lagrangian gradient and multipliers' step by its own
    plans inside the step; a constraint that reads data ("released": Neyman-Pearson's class-1
    loss) has its value released with noise from the client's generator — and nothing is served
    node by node (once the per-node path). The numbers, noise draws and multipliers are the
    serial ones. (A halfspace such as sum(w) >= 1 is a projection, a prox term: test below.)"""
    if constraint == "exact":
        prob, w = _logistic(n=4, l1_on=None)
        for client in prob.clients:
            client.subject_to(fm.sum(fm.exp(w)) <= 20.0)
    else:
        from test_dp_constraints import _np_model
        prob, w = _np_model(n=4)
    serial, _ = _run(prob, "serial", epsilon=1.0, max_rounds=4)
    ex = _executor(executor)
    run, messages = _run(prob, ex, epsilon=1.0, max_rounds=4)
    assert len(ex.groups) == 1
    _assert_group_step_like_serial(ex, messages, serial, run, 16, ("client_values", "privacy", "sensitivity"))
    assert run.multipliers.keys() == serial.multipliers.keys()
    for name, mu in serial.multipliers.items():
        np.testing.assert_allclose(run.multipliers[name], mu, rtol=0, atol=TOL)
    for c, drawn in serial.info["noise"].items():
        np.testing.assert_array_equal(run.info["noise"][c], drawn)
    if constraint == "released":        # the multipliers moved: their step and releases ran
        assert max(abs(float(mu)) for mu in serial.multipliers.values()) > 0.0
        assert serial.info["privacy"]["round_shares"][1] > 0.0


@pytest.mark.parametrize("executor", ["batched", "jax"])
@pytest.mark.parametrize("rate", [1.0, 0.5])
def test_the_sampled_gaussian_knob_is_served_by_the_group_step(executor, rate):
    """`DPADMM(epsilon_total=E)` (issue 28's subsampled Gaussian layer, backends/dp_admm/
    sampled.py): the group step serves it — each row's Poisson sample, L2 clipping and noise by
    the layer itself, from the client's own generator — with the serial numbers and the same
    draws bit for bit (once served node by node)."""
    prob, _ = _logistic(n=6, l1_on=None)
    options = {"epsilon_total": 4.0, "sample_rate": rate}
    serial, _ = _run(prob, "serial", **options)
    ex = _executor(executor)
    run, messages = _run(prob, ex, **options)
    _assert_group_step_like_serial(ex, messages, serial, run, 6 * 12, ("client_values", "privacy", "sensitivity"))
    for c, drawn in serial.info["noise"].items():
        assert drawn.shape == (12, D)
        np.testing.assert_array_equal(run.info["noise"][c], drawn)


@pytest.mark.parametrize("executor", ["batched", "jax"])
def test_a_projected_halfspace_keeps_the_group_step(executor):
    """sum(w) >= 1 on every client is projected (a prox term after the step): the group step
    serves it, with the serial numbers."""
    prob, _ = _logistic(n=4, l1_on=None, constraint=True)
    serial, _ = _run(prob, "serial", epsilon=1.0, max_rounds=4)
    ex = _executor(executor)
    run, _ = _run(prob, ex, epsilon=1.0, max_rounds=4)
    assert ex.stats[("dp_admm_step", "batched")] == 16 and ex.stats[("dp_admm_step", "serial")] == 0
    for uid in serial.values:
        np.testing.assert_allclose(run.values[uid], serial.values[uid], rtol=0, atol=TOL)
    _same(run.info["privacy"], serial.info["privacy"], "privacy")


def test_checkpoint_taken_on_the_batched_executor_resumes_like_the_uninterrupted_run(tmp_path):
    """The vectorized step keeps z_p as a group stack handed to the clients' state on demand:
    a checkpoint taken mid-run (generators, noise logs, z_p) resumes bitwise like the run
    without interruption (`test_checkpoint._check_resume`)."""
    from test_checkpoint import _check_resume
    prob, _ = _logistic(n=6, l1_on=None)
    make = lambda: DPADMM(epsilon=1.0, clip=0.05, seed=4, max_rounds=10, tol=0.0)  # noqa: E731
    ref = _check_resume(tmp_path, prob, make, stop_at=6, every=2, executor="batched")
    assert np.ptp([r["noise_magnitude"] for r in ref.history]) > 0


def test_a_checkpoint_from_before_the_stacks_resumes(tmp_path):
    """Checkpoints written before the server kept z_p, λ_p as stacks hold them as {client: row}:
    such a file resumes like the uninterrupted run."""
    from conftest import StopRun as Stop, stop_after as _stop_after
    from test_checkpoint import _same
    from fedmodel.runtime import checkpoint as ck
    prob, _ = _logistic(n=4, l1_on=None)
    make = lambda: DPADMM(epsilon=1.0, clip=0.05, seed=4, max_rounds=8, tol=0.0)  # noqa: E731
    reference = prob.solve(make())
    path = tmp_path / "run.ckpt"
    with pytest.raises(Stop):
        prob.solve(make(), checkpoint=path, checkpoint_every=2, callback=_stop_after(5))
    data = ck.read(path)
    clients = [c.name for c in prob.clients]
    for key in ("z", "lam"):                        # the old layout
        data["loop"][key] = {c: row.copy() for c, row in zip(clients, data["loop"][key])}
    ck.atomic_write(path, data)
    _same(prob.solve(make(), checkpoint=path, resume=True), reference)
