"""A warm re-solve reuses what has not changed (issue 27 item 3, helper adult17).

`prob.solve()` again on the same Problem reuses its equilibrated copy, its compiled node programs
and the clients' own-constraint answers (`runtime.solve_cache`), keyed by the model's content:
data changed in place, a Parameter's new value or a new constraint make the solve compute them
again. Every result is bitwise a fresh Problem's, and the fresh Problem's answer is CVXPY's."""
import warnings

import numpy as np
import pytest

import fedmodel as fm
import fedmodel.backends  # noqa: F401  (registers the backends)
from fedmodel.backends import base
from fedmodel.runtime import own_constraints, program, solve_cache


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    X0 = rng.standard_normal((40, 4)) + 0.5
    X1 = rng.standard_normal((30, 4)) - 0.5
    return [(X0[i::2].copy(), X1[i::2].copy()) for i in range(2)]


def _model(data, lam: float = 1e-2, bound: float = 0.6, extra: bool = False):
    """A Neyman-Pearson logistic model: class-0 loss, class-1 loss ≤ bound per client, a
    ridge whose weight is a Parameter."""
    w, prob = fm.Variable(4, name="w"), fm.Problem(name="np")
    weight = fm.Parameter(nonneg=True, value=lam, name="lam")
    for i, (X0, X1) in enumerate(data):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(X0, name="X0") @ w)))
        c.subject_to((fm.mean(fm.logistic(-(c.data(X1, name="X1") @ w))) <= bound).named(f"np[c{i}]"))
    prob.server.minimize(weight * fm.sum_squares(w))
    if extra:
        prob.server.subject_to((fm.norm2(w) <= 0.5).named("ball"))
    return prob, w, weight


class Counts:
    """Calls of the set-up a warm re-solve skips: programs built, equilibrations, own-constraint
    checks (each client's phase-one solve)."""

    def __init__(self, monkeypatch):
        self.built = self.equilibrated = self.checked = 0
        init, equilibrate, least = program.NodeProgram.__init__, base.equilibrate, \
            own_constraints.least_violation

        def built(*a, **k):
            self.built += 1
            return init(*a, **k)

        def equilibrated(*a, **k):
            self.equilibrated += 1
            return equilibrate(*a, **k)

        def checked(*a, **k):
            self.checked += 1
            return least(*a, **k)
        monkeypatch.setattr(program.NodeProgram, "__init__", built)
        monkeypatch.setattr(base, "equilibrate", equilibrated)
        monkeypatch.setattr(own_constraints, "least_violation", checked)

    def take(self) -> tuple[int, int, int]:
        out = (self.built, self.equilibrated, self.checked)
        self.built = self.equilibrated = self.checked = 0
        return out


def _same(res, fresh, w, w_fresh) -> None:
    assert res.status == fresh.status
    assert res.ledger.rounds == fresh.ledger.rounds
    assert res.objective == fresh.objective
    assert np.array_equal(res.value(w), fresh.value(w_fresh))


def _solve(prob, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prob.solve(*args, **kwargs)


def test_an_unchanged_model_is_not_set_up_again(monkeypatch):
    counts = Counts(monkeypatch)
    data = _data()
    prob, w, _ = _model(data)
    first = _solve(prob)
    assert first.status == "converged"
    assert counts.take() == (3, 1, 2)          # 3 programs, 1 equilibration, 2 clients checked
    again = _solve(prob)
    assert counts.take() == (0, 0, 0)          # main: (3, 1, 2)
    fresh_prob, w_fresh, _ = _model(data)
    fresh = _solve(fresh_prob)
    _same(first, fresh, w, w_fresh)
    _same(again, fresh, w, w_fresh)


@pytest.mark.integration      # ~2 s: CVXPY's answers
def test_a_change_of_data_parameter_or_constraint_is_seen(monkeypatch):
    counts = Counts(monkeypatch)
    data = _data()
    prob, w, lam = _model(data)
    _solve(prob)
    counts.take()

    def in_place():
        data[0][1][:3] *= -1.0                  # the user's array changed in place
        return {}

    def parameter():
        lam.value = 0.05                        # a Parameter's new value
        return dict(lam=0.05)

    def constraint():
        prob.server.subject_to((fm.norm2(w) <= 0.5).named("ball"))      # a constraint added
        return dict(lam=0.05, extra=True)

    for change in (in_place, parameter, constraint):
        case = change()
        res = _solve(prob)
        assert counts.take() == (3, 1, 2)      # set up again
        fresh_prob, w_fresh, _ = _model(data, **case)
        _same(res, _solve(fresh_prob), w, w_fresh)
        assert res.status == "converged" and fm.verify(res, _solve(fresh_prob, "cvxpy")).ok
        counts.take()


def test_data_changed_in_place_to_infeasible_is_read_again(monkeypatch):
    """The client's own-constraint answer is not kept past a change of its data (lead16's case
    on a model whose programs are kept): "infeasible" before the run, in one round trip."""
    data = _data()
    prob, w, _ = _model(data)
    assert _solve(prob).status == "converged"
    X1 = data[1][1]
    X1[:] = np.vstack([X1[:8], -X1[:7]])       # ±rows: its class-1 loss is ≥ log 2 > 0.6
    res = _solve(prob)
    assert res.status == "infeasible" and res.info["communication"]["round_trips"] == 1


def test_other_backends_and_settings_on_a_kept_model_equal_a_fresh_one():
    """Runs of other backends and settings between two default solves share nothing they
    should not: each equals the same run on a fresh Problem."""
    data = _data(1)
    prob, w, _ = _model(data, extra=True)
    runs = [((), {}), (("proxal",), {"inner": "admm"}), (("proxal",), {"scaling": False}), (("dald",), {}),
            ((), {})]
    for args, kwargs in runs:
        res = _solve(prob, *args, **kwargs)
        fresh_prob, w_fresh, _ = _model(data, extra=True)
        _same(res, _solve(fresh_prob, *args, **kwargs), w, w_fresh)


def test_a_solve_inside_a_callback_compiles_its_own():
    """A solve of the same Problem while its kept programs run (a callback's) shares none of
    them: both equal a fresh Problem's solve."""
    data = _data()
    prob, w, _ = _model(data)
    _solve(prob)
    inner = []

    def callback(record):
        if not inner:
            inner.append(_solve(prob))
    outer = _solve(prob, callback=callback)
    fresh_prob, w_fresh, _ = _model(data)
    fresh = _solve(fresh_prob)
    assert inner and inner[0].status == "converged"
    _same(outer, fresh, w, w_fresh)
    assert inner[0].objective == fresh.objective and inner[0].ledger.rounds == fresh.ledger.rounds


def test_a_fall_back_within_one_solve_equals_a_fresh_problems(monkeypatch):
    """ProxAL's default falls back to Algorithm 2 when Newton steps are refused at the first
    subproblem (forced here): the second run of the solve gets its programs restarted."""
    from fedmodel.backends.proxal_newton import NewtonInner
    monkeypatch.setattr(NewtonInner, "refusal", lambda self, ex: "forced by the test")
    data = _data()
    prob, w, _ = _model(data)
    runs = [_solve(prob, "proxal") for _ in range(2)]
    fresh_prob, w_fresh, _ = _model(data)
    fresh = _solve(fresh_prob, "proxal")
    assert fresh.info["inner"]["name"] == "admm"
    for res in runs:
        _same(res, fresh, w, w_fresh)


def test_a_kept_program_is_restarted_when_handed_to_the_next_run(monkeypatch):
    """Between solves a kept program holds its run's state (as an executor's programs do for
    the caller who holds it); the next solve gets it back at its compile's state."""
    prob, _, _ = _model(_data())
    _solve(prob)
    cache = prob.__dict__[solve_cache._ATTRIBUTE]
    programs = [p for kept in cache.programs.values() for p in kept.values()]
    assert len(programs) == 3 and all(solve_cache.kept(p) for p in programs)
    assert all(p.node_state.beta is not None for p in programs if p.role == "client")
    restarted = []
    restart = solve_cache.restart

    def spy(program, state):
        restart(program, state)
        restarted.append(program.node_state.beta is None and program.node_state.hessian is None
                         and not program.node_state.procedures)
    monkeypatch.setattr(solve_cache, "restart", spy)
    _solve(prob)
    assert restarted == [True] * 3


def test_the_content_key_reads_values_not_identities():
    data = _data()
    prob, w, lam = _model(data)
    key = solve_cache.content_key(prob)
    assert solve_cache.content_key(prob) == key
    data[0][0][0, 0] += 1e-12
    changed = solve_cache.content_key(prob)
    assert changed != key
    data[0][0][0, 0] -= 1e-12
    lam.value = 2e-2
    assert solve_cache.content_key(prob) not in (key, changed)
