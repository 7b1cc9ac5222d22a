"""Issue 27 item 3 (cheap rounds): what one serial ProxAL ADMM step evaluates, counted (never
timed). ProxAL's test (22) needs only ∇P_i at the server's w: on one node (`NodeRows.grad`, the
serial, Ray and Flower executors) it runs the gradient plan, as the batched `Group.grad` does,
not the value-and-gradient plan, whose loss values (a logistic's log1p pass) it would discard.
On main the serial step evaluated P_i there too: `gradient_plan` was never called."""
from __future__ import annotations

import numpy as np

from fedmodel.builtin_models import neyman_pearson
from fedmodel.runtime import compiled_merit
from fedmodel.runtime.client_step import NodeRows
from fedmodel.runtime.program import compile_programs


def _counting(run, role: str, counts: dict):
    """`run`, counting its calls in counts[role]."""
    def counted(*values):
        counts[role] += 1
        return run(*values)
    return counted


def _count_plans(monkeypatch):
    """Count calls of each client's value-gradient and gradient plans (by plan role)."""
    counts = {"value_grad": 0, "gradient": 0}
    built = compiled_merit.CompiledMerit.__init__

    def init(self, *args, **kwargs):
        built(self, *args, **kwargs)
        if self.name == "server":
            return
        for role, plan in (("value_grad", self.value_grad_plan), ("gradient", self.gradient_plan)):
            plan._run = _counting(plan._run, role, counts)
    monkeypatch.setattr(compiled_merit.CompiledMerit, "__init__", init)
    return counts


def test_serial_proxal_step_takes_the_gradient_plan_for_its_certificate(monkeypatch):
    counts = _count_plans(monkeypatch)
    prob, _ = neyman_pearson(3)
    res = prob.solve("proxal", max_outer=2, inner="admm")    # (Algorithm 2's ADMM steps)
    steps = 3 * int(res.iterations["inner"])          # client steps (3 clients)
    # (22): one gradient evaluation per client step, by the gradient plan
    assert counts["gradient"] == steps
    # the local Newton solves: from ~1 to ~7 value-gradient evaluations a step (the start, one
    # per Newton step; a start the last solve ended at is memoized), never the (22) one; 6.8
    # since the clients solve (19) to ε/n (proxal.py), 5.65 before
    per_step = counts["value_grad"] / steps
    assert 1.0 <= per_step <= 8.0, per_step


def test_node_rows_gradient_is_the_value_gradient_plans_bitwise():
    """The gradient plan's ∇P_i (z = (x, y)) equals the value-gradient plan's bit for bit (the
    serial iterates are unchanged by the switch)."""
    prob, w = neyman_pearson(3)
    programs = compile_programs(prob)
    program = programs["c0"]
    program.configure(300.0, 0.1, np.full(program.n_shared, 0.05))
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = rng.standard_normal(program.n_shared)
        fast = NodeRows(program).grad(x[None, :], np.zeros((1, program.n_private)))
        program.compiled.forget()
        _, full = program.value_grad(x, program.y)
        assert fast.shape == (1, program.n_shared + program.n_private)
        assert np.array_equal(fast[0], full)
    # a memoized evaluation is reused as it is
    assert np.array_equal(NodeRows(program).grad(x[None, :], np.zeros((1, 0)))[0], full)


def test_one_vector_layout_passes_the_point_itself():
    """A client with one vector variable and nothing private hands z to its plans as it is
    (no unpacking per evaluation); the values are those of the general layout."""
    prob, w = neyman_pearson(3)
    program = compile_programs(prob)["c0"]
    merit = program.compiled
    assert merit._one_vector
    x = np.linspace(-1.0, 1.0, program.n_shared)
    (only,) = merit.values(x, program.y)
    assert only is x
    assert [np.array_equal(a, b) for a, b in
            zip(merit.values(x, program.y), merit.shared.unpack(x) + merit.private.unpack(program.y))] == [True]
