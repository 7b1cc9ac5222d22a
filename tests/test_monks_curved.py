"""ProxAL's distance test on the objective's own curvature modulo its flat directions
(backends/proxal_flat.py `curved`, issue 27 items 2–3, branch monksstop): the nodes' Hessians
∇²f_i(w_k) by differences of their gradients (`_curvature`), against the closed form, and the
stop they allow on a run whose step ratios read no curvature."""
from __future__ import annotations

import types

import numpy as np

import fedmodel as fm
from fedmodel.backends import proxal_flat, proxal_outer
from fedmodel.backends.outcome import Status
from fedmodel.runtime.program import compile_programs

from test_monks import BACKEND, Nodes, drifting


def test_a_node_s_hessian_is_the_logistic_closed_form():
    """mean logistic(−y ⊙ Xw) has ∇² = Xᵀ diag(p(1 − p)) X / m, p = σ(y ⊙ Xw)."""
    rng = np.random.default_rng(4)
    X, y = rng.normal(size=(30, 4)), np.sign(rng.normal(size=30))
    w = fm.Variable(4, name="w")
    prob = fm.Problem("logit")
    client = prob.add_client("c0")
    client.minimize(fm.mean(fm.logistic(-y * (client.data(X, name="X") @ w))))
    program = compile_programs(prob)["c0"]
    x = rng.normal(size=4)
    hessian = np.asarray(proxal_flat._curvature(program, x)["hessian"])
    p = 1 / (1 + np.exp(-y * (X @ x)))
    expected = X.T @ (X * (p * (1 - p))[:, None]) / len(y)
    assert hessian.shape == (4, 4)
    np.testing.assert_allclose(hessian, expected, rtol=1e-6, atol=1e-9 * np.abs(expected).max())


def test_a_node_with_private_variables_sends_no_hessian():
    rng = np.random.default_rng(3)
    w = fm.Variable(3, name="w")
    prob = fm.Problem("lad")
    client = prob.add_client("c0")
    s = client.variable(8, name="s")
    r = client.data(rng.normal(size=(8, 3)), name="X") @ w - client.data(rng.normal(size=8), name="b")
    client.minimize(fm.sum(s) / 8)
    client.subject_to(r <= s, -r <= s)
    assert proxal_flat._curvature(compile_programs(prob)["c0"], np.zeros(3))["hessian"] is None


PROXAL = types.SimpleNamespace(**vars(BACKEND), procedures=proxal_flat.PROCEDURES)


def stop_at(hessian, backend=PROXAL):
    """The outer iteration (1-based) at which the stop says converged, or None, on `drifting`'s
    run of 2-iteration ADMM runs at a loosened τ_k (where the step ratios and the standstill
    test never stop it: tests/test_monks.py), with the nodes' Hessians summing to `hessian`."""
    history, xs = drifting()
    for record in history:
        record["inner"] = proxal_outer.SHORT
    ex, run = Nodes(np.array([[0.0], [0.0], [1.0]]), hessian=hessian), []
    for k in range(len(history)):
        run.append(history[k])
        if proxal_outer.outer_stop(backend, run, ex, xs[k], {}) == Status.CONVERGED:
            return k + 1, ex
    return None, ex


def test_the_objective_s_curvature_modulo_the_flat_directions_stops_the_run():
    # μ = 1/2 on (e₁, e₂): (‖Δw mod N‖/β + √3 τ)/μ ≈ 3.5e-7 ≤ 1e-4 × ‖(1, −2)‖₂
    found, ex = stop_at(np.diag([1.0, 1.0, 0.0]))
    assert found == 3 and ex.curvatures == 2      # (N is asked with three points kept)
    # μ = 5e-5: the bound 3.5e-3 is above 2.2e-4 — no stop, whatever the drift along e₃
    assert stop_at(np.diag([1e-4, 1e-4, 0.0]))[0] is None
    # the objective flat along e₂ too, but e₂ is not in the nodes' common flat directions (N =
    # e₃): no curvature there, no stop
    assert stop_at(np.diag([1.0, 0.0, 0.0]))[0] is None
    # without the nodes' Hessians the stop is as it was; a backend that does not install the
    # procedure (cProx-AL) asks for none
    assert stop_at(None)[0] is None
    found, ex = stop_at(np.diag([1.0, 1.0, 0.0]), backend=BACKEND)
    assert found is None and ex.curvatures == 0
