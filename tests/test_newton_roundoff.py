"""Newton at round-off level stops instead of taking `max_steps` steps that change nothing.

Found in ProxAL's local solves on tests/test_stalled_not_solution.py's mixed-units box (box in
the augmented Lagrangian at β = 1e6): ‖∇‖∞ stood at 8.58e-15 against a tolerance of 1.3e-15,
each Newton direction was below the resolution of x, Armijo's test accepted the step (the value
equal to the last bit), and a solve took its 1,000 steps at ~4 evaluations each. The model
here: f(x) = ½H‖x‖² − bᵀx with H = 1e6, its gradient read with an error of up to 1e-12 that
depends on x (as round-off does: `NOISE`), so ‖∇f‖∞ cannot reach 1e-14, the directions near
x* = b/H (closed form) are below x's resolution and the values do not resolve the steps."""
from __future__ import annotations

import numpy as np

from fedmodel.runtime import solvers
from fedmodel.runtime.batched_newton import newton_batched

H = 1e6
B = H * np.array([1.0 / 3.0, 2.0 / 7.0])
NOISE = 1e-12


def fun_grad(x):
    return 0.5 * H * float(x @ x) - float(B @ x), H * x - B + NOISE * np.cos(1e17 * x)


def test_newton_stops_when_a_fresh_step_gains_nothing():
    x, steps, residual = solvers.newton(fun_grad, lambda x, fresh: H * np.eye(2), np.zeros(2), 1e-14,
                                        max_steps=100)
    assert np.allclose(x, B / H, rtol=0, atol=1e-15)        # at the answer to x's resolution
    assert residual > 1e-14                                 # (the tolerance is out of reach)
    assert residual == solvers.norm_inf(fun_grad(x)[1])
    assert steps <= 4                                       # was 100 (max_steps), values equal


def test_batched_newton_takes_the_same_decisions():
    def stack_fun_grad(Z, active):
        values, grads = zip(*(fun_grad(z) for z in Z))
        return np.array(values), np.array(grads)

    def direction(Z, G, active, fresh):
        return -G / H
    Z0 = np.array([[0.0, 0.0], [1.0, -1.0]])
    Z, steps, residual = newton_batched(stack_fun_grad, direction, Z0, 1e-14, 100)
    for z0, z, s, r in zip(Z0, Z, steps, residual):
        x, serial_steps, serial_residual = solvers.newton(fun_grad, lambda x, fresh: H * np.eye(2), z0,
                                                          1e-14, max_steps=100)
        assert np.array_equal(z, x) and s == serial_steps and r == serial_residual
        assert s <= 4
