"""Set-up at many clients (issue 16): compiling the node programs and the final objective and
KKT certificate run with Python's cyclic collector paused (`codegen.collection_paused`), and
give the same numbers as the same evaluations with it running."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import fedmodel as fm
from backends.base import objective_and_violation
from fedmodel import backends
from fedmodel.compiler.codegen import collection_paused
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
