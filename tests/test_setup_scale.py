"""Set-up at many clients (issue 16): compiling the node programs and the final objective and
KKT certificate run with Python's cyclic collector paused (`collector.collection_paused`), and
give the same numbers as the same evaluations with it running; what they build is freed by
reference counting alone (no reference cycles: cyclic garbage waits for a full collection over
the whole heap, 1.6 GB of it at 10⁵ clients); the node programs are frozen (`gc.freeze`) for
the run of a `Problem.solve`, so the collector does not rescan them."""
from __future__ import annotations

import collections
import gc
from typing import Callable

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends.base import objective_and_violation
from fedmodel import backends
from fedmodel.collector import collection_paused
from fedmodel.runtime import program as program_module
from fedmodel.runtime.program import compile_programs


def mixed_problem(n: int = 6, d: int = 3, seed: int = 0) -> fm.Problem:
    """Clients of three structures: logistic, least squares, least squares with a ball."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name="mixed")
    for i in range(n):
        m = int(rng.integers(4, 9))
        X = rng.normal(size=(m, d))
        c = prob.add_client(f"c{i}")
        Xd = c.data(X, name="X")
        if i % 3 == 0:
            b = np.sign(rng.normal(size=m))
            c.minimize(fm.sum(fm.logistic(-fm.multiply(c.data(b, name="b"), Xd @ w))))
        else:
            c.minimize(fm.sum_squares(Xd @ w - c.data(rng.normal(size=m), name="y")))
            if i % 3 == 2:
                c.subject_to(fm.sum_squares(w) <= 4.0)
    return prob


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_collection_paused_restores_and_nests(collector_on):
    with collection_paused():
        assert not gc.isenabled()
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()      # the inner block does not switch it back on
    assert gc.isenabled()
    gc.disable()
    with collection_paused():
        pass
    assert not gc.isenabled()          # left off when it was off
    gc.enable()
    with pytest.raises(ValueError):
        with collection_paused():
            raise ValueError
    assert gc.isenabled()


def test_programs_compile_with_the_collector_paused(collector_on, monkeypatch):
    seen = []
    build = program_module.ProgramSpec.build

    def spy(self):
        seen.append(gc.isenabled())
        return build(self)
    monkeypatch.setattr(program_module.ProgramSpec, "build", spy)
    prob = mixed_problem()
    paused = compile_programs(prob)
    assert seen and not any(seen) and gc.isenabled()
    monkeypatch.setattr(program_module.ProgramSpec, "build", build)
    reference = compile_programs(prob)
    x = np.linspace(-1.0, 1.0, 3)
    for name, node in paused.items():
        assert node.value_grad_plan.structure_key == reference[name].value_grad_plan.structure_key
        for got, want in zip(node.value_grad_plan(x), reference[name].value_grad_plan(x)):
            np.testing.assert_array_equal(got, want)


def test_final_objective_and_certificate_unchanged(collector_on, monkeypatch):
    prob = mixed_problem()
    seen = []
    certificate = fm.Problem.kkt_certificate

    def spy(self, values, multipliers):
        seen.append(gc.isenabled())
        return certificate(self, values, multipliers)
    monkeypatch.setattr(fm.Problem, "kkt_certificate", spy)
    result = prob.solve(backends.DALD(solver="gd", step=0.05, max_iterations=5, eps_primal=0.0,
                                      eps_dual=0.0), executor="batched")
    assert seen == [False] and gc.isenabled()
    monkeypatch.setattr(fm.Problem, "kkt_certificate", certificate)
    objective, violation = objective_and_violation(prob, result.values)
    assert result.objective == objective and result.max_violation == violation
    again = prob.kkt_certificate(result.values, result.multipliers)
    assert result.certificate == again
    assert np.isfinite(again.stationarity) and again.stationarity > 0


def cyclic_garbage(work: Callable[[], None]) -> collections.Counter:
    """Type names of the objects that `work()` leaves in unreachable reference cycles (with the
    collector off meanwhile: what only a collection would free)."""
    was = gc.isenabled()
    gc.disable()
    gc.collect()
    try:
        work()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return collections.Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()
        if was:
            gc.enable()


@pytest.mark.integration     # gc over many programs: CI runs it after the fast suite
def test_dropped_programs_leave_no_cycles():
    prob = mixed_problem(n=300)
    compile_programs(mixed_problem(n=3))      # one-time set-up (caches, imports) left out
    x = np.linspace(-1.0, 1.0, 3)

    def build_and_drop():
        programs = compile_programs(prob)
        for node in programs.values():        # the plans compiled on demand too
            node.gradient_plan(x)
            node.hessian(x)
    found = cyclic_garbage(build_and_drop)
    assert sum(found.values()) < 10, found   # before: 3600 (a dict and a function per plan)


@pytest.mark.integration     # gc over a full run: CI runs it after the fast suite
def test_final_objective_and_certificate_leave_no_cycles():
    prob = mixed_problem(n=30)
    result = prob.solve(backends.DALD(solver="gd", step=0.05, max_iterations=2, eps_primal=0.0,
                                      eps_dual=0.0))

    def evaluate():
        objective_and_violation(prob, result.values)
        prob.kkt_certificate(result.values, result.multipliers)
    assert not cyclic_garbage(evaluate)


def test_plans_of_one_structure_share_their_key():
    programs = compile_programs(mixed_problem(n=6))
    first, fourth = programs["c0"].value_grad_plan, programs["c3"].value_grad_plan   # logistic
    assert first.structure_key == fourth.structure_key
    assert first.structure_key is fourth.structure_key     # one object for all (memory, gc)


def test_residual_plans_compiled_on_first_use():
    programs = compile_programs(mixed_problem(n=3))
    free, ball = programs["c0"], programs["c2"]               # no constraint; ‖w‖² ≤ 4
    assert "residuals" not in vars(free.compiled) and "all_residuals" not in vars(free.compiled)
    x = np.full(3, 2.0)
    assert free.violations(x) == {} and free.report(x)["violation"] == 0.0
    assert ball.report(x)["violation"] == pytest.approx(8.0)
    assert list(ball.violations(x).values()) == [pytest.approx(8.0)]


def short_dald() -> backends.DALD:
    return backends.DALD(solver="gd", step=0.05, max_iterations=3, eps_primal=0.0, eps_dual=0.0)


@pytest.fixture
def nothing_frozen(collector_on):
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


def test_programs_frozen_for_the_run(nothing_frozen):
    prob, during = mixed_problem(), []
    prob.solve(short_dald(), executor="batched",
               callback=lambda record: during.append(gc.get_freeze_count()))
    assert during and min(during) > 0          # the model and programs, not rescanned
    assert gc.get_freeze_count() == 0 and gc.isenabled()

    def fail(record):
        raise RuntimeError("stop")
    with pytest.raises(RuntimeError):
        prob.solve(short_dald(), callback=fail)
    assert gc.get_freeze_count() == 0          # unfrozen after a failed run too


def test_an_application_freeze_is_left_alone(nothing_frozen):
    prob, during = mixed_problem(), []
    gc.freeze()                                # e.g. before forking workers
    frozen = gc.get_freeze_count()
    prob.solve(short_dald(), callback=lambda record: during.append(gc.get_freeze_count()))
    # (the count falls as frozen objects are freed: nothing added, nothing unfrozen)
    assert during and max(during) <= frozen and 0 < gc.get_freeze_count() <= frozen
    gc.unfreeze()
    gc.disable()                               # the collector off: nothing to spare it
    prob.solve(short_dald(), callback=lambda record: during.append(gc.get_freeze_count()))
    assert gc.get_freeze_count() == 0 and 0 in during


@pytest.mark.integration     # gc over a batched run: CI runs it after the fast suite
def test_a_batched_run_leaves_no_cycles_of_its_plans():
    prob = mixed_problem(n=30)
    prob.solve(short_dald(), executor="batched")     # one-time set-up (numba, caches) left out

    def run():
        prob.solve(short_dald(), executor="batched")
    found = cyclic_garbage(run)
    ours = {name: count for name, count in found.items()
            if name in {"Plan", "BatchedPlan", "Multiply", "MatMul", "Parameter"}}
    assert not ours, ours      # (a networkx graph's own cycles, one dict a client, not counted)
