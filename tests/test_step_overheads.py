"""The cheap paths of a held-constraint client step (issue 27 item 3, branch `perf`), each against
a closed form: a group plan's parameters re-gathered after a write (one np.array for values of
one shape), its per-client scalar × vector step without broadcasting, a per-client scalar's
sum of squares as v², and the held constraints' (ν, σ) read through Parameters looked up once
(the certificate's use of them: tests/test_held_rows.py, against scipy's bounded least squares)."""
from __future__ import annotations

import numpy as np

import fedmodel as fm
from fedmodel.compiler.codegen import Plan
from fedmodel.compiler.differentiate import grad
from fedmodel.runtime import local_al
from fedmodel.runtime.batched_plan import BatchedPlan
from fedmodel.runtime.program import compile_programs
from test_proxal_local import one_client

N, D = 4, 3


def _group(make) -> tuple[BatchedPlan, list]:
    """A BatchedPlan of N clients' [f_i, ∇f_i] over w (D,), f_i = make(w, i) -> (expr, extras)."""
    w = fm.Variable(D, name="w")
    built = [make(w, i) for i in range(N)]
    return BatchedPlan([Plan([f, grad(f, w)], [w]) for f, _ in built]), [extra for _, extra in built]


def test_group_plan_reads_each_clients_parameters_after_every_write():
    def make(w, i):
        p = fm.Parameter((), name="p", value=1.0 + i)
        c = fm.Parameter((D,), name="c", value=np.arange(D) - i)
        return p * fm.sum_squares(w - c), (p, c)
    plan, params = _group(make)
    assert "Multiply:stacked" in plan.rules           # p_i (a client's scalar) × (w − c_i)
    W = np.linspace(-1.0, 1.0, N * D)

    def check():
        value, gradient = plan(W)
        for i, (p, c) in enumerate(params):
            r = W[i * D:(i + 1) * D] - c.value
            np.testing.assert_allclose(value[i], p.value * (r @ r), rtol=1e-14)
            np.testing.assert_allclose(gradient[i * D:(i + 1) * D], 2.0 * p.value * r, rtol=1e-14)
    check()
    params[2][1].value = np.array([5.0, -4.0, 0.5])     # one client's vector, another's scalar
    params[0][0].value = 0.25
    check()
    params[3][1].value = params[3][1].value            # rewritten as it was: the same numbers
    check()


def test_sum_of_squares_of_a_client_scalar_is_its_square():
    rng = np.random.default_rng(3)

    def make(w, i):
        a, b = rng.standard_normal(D), float(rng.standard_normal())
        return fm.sum_squares(fm.Constant(a) @ w - b), (a, b)
    plan, data = _group(make)
    assert "SumSquares:elementwise" in plan.rules and "loop" not in " ".join(plan.rules)
    W = rng.standard_normal(N * D)
    value, gradient = plan(W)
    for i, (a, b) in enumerate(data):
        r = a @ W[i * D:(i + 1) * D] - b
        np.testing.assert_allclose(value[i], r * r, rtol=1e-13)
        np.testing.assert_allclose(gradient[i * D:(i + 1) * D], 2.0 * r * a, rtol=1e-13, atol=1e-15)


def test_penalty_weights_follow_the_multiplier_and_penalty_writes():
    prob = one_client(threshold=0.5)[0]
    program = compile_programs(prob, client_constraints=True)["c0"]
    plans = local_al.local_plans(program)
    mu, sigma = plans.penalty_weights(program)
    assert mu.shape == sigma.shape == (plans.rows,)
    new = np.arange(1.0, plans.rows + 1.0)
    program.set_multipliers(plans.unflatten(new), checked=False)
    program._sync_penalties(1234.0)
    mu, sigma = plans.penalty_weights(program)
    np.testing.assert_array_equal(mu, new)
    np.testing.assert_array_equal(sigma, np.full(plans.rows, 1234.0))
    program.set_multipliers(plans.unflatten(2.0 * new))         # the checked setter too
    program._sync_penalties()                                   # back at its resting value
    mu, sigma = plans.penalty_weights(program)
    np.testing.assert_array_equal(mu, 2.0 * new)
    np.testing.assert_array_equal(sigma, np.full(plans.rows, float(local_al.LOCAL_PENALTY)))
