"""ProxAL's distance test on the objective's own curvature modulo its flat directions
(backends/proxal_flat.py `curved`, issue 27 items 2–3, branch monksstop): the nodes' Hessians
∇²f_i(w_k) by differences of their gradients (`_curvature`), against the closed form, and the
stop they allow on a run whose step ratios read no curvature."""
from __future__ import annotations

import types

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import proxal_flat, proxal_outer
from fedmodel.backends.outcome import Status
from fedmodel.runtime.program import compile_programs

from test_monks import BACKEND, Nodes, drifting


@pytest.mark.parametrize("repeated", [False, True])
def test_a_node_s_least_curvature_is_the_logistic_closed_form(repeated):
    """mean logistic(−y ⊙ Xw) has ∇² = Xᵀ diag(p(1 − p)) X / m, p = σ(y ⊙ Xw); with a repeated
    column its flat direction (e₁ − e₂)/√2 is left out: the least eigenvalue on the rest."""
    rng = np.random.default_rng(4)
    X, y = rng.normal(size=(30, 4)), np.sign(rng.normal(size=30))
    if repeated:
        X[:, 1] = X[:, 0]
    w = fm.Variable(4, name="w")
    prob = fm.Problem("logit")
    client = prob.add_client("c0")
    client.minimize(fm.mean(fm.logistic(-y * (client.data(X, name="X") @ w))))
    program = compile_programs(prob)["c0"]
    x = rng.normal(size=4)
    p = 1 / (1 + np.exp(-y * (X @ x)))
    hessian = X.T @ (X * (p * (1 - p))[:, None]) / len(y)
    flat = np.array([[1.0], [-1.0], [0.0], [0.0]]) / np.sqrt(2) if repeated else np.zeros((4, 0))
    rest = np.linalg.svd(np.eye(4) - flat @ flat.T)[0][:, :4 - flat.shape[1]]
    expected = np.linalg.eigvalsh(rest.T @ hessian @ rest)[0]
    assert expected > 1e-3 * np.linalg.eigvalsh(hessian)[-1]       # (not the 0 along the flat direction)
    reply = proxal_flat._curvature(program, x)
    assert reply["least"] == pytest.approx(expected, rel=1e-6) and reply["flat"] == flat.shape[1]


def test_a_node_with_private_variables_sends_no_hessian():
    rng = np.random.default_rng(3)
    w = fm.Variable(3, name="w")
    prob = fm.Problem("lad")
    client = prob.add_client("c0")
    s = client.variable(8, name="s")
    r = client.data(rng.normal(size=(8, 3)), name="X") @ w - client.data(rng.normal(size=8), name="b")
    client.minimize(fm.sum(s) / 8)
    client.subject_to(r <= s, -r <= s)
    assert proxal_flat._curvature(compile_programs(prob)["c0"], np.zeros(3))["least"] is None


PROXAL = types.SimpleNamespace(**vars(BACKEND), procedures=proxal_flat.PROCEDURES)


def stop_at(least, backend=PROXAL, flat=np.array([[0.0], [0.0], [1.0]]), server=None, moving=0.0):
    """The outer iteration (1-based) at which the stop says converged, or None, on `drifting`'s
    run of 2-iteration ADMM runs at a loosened τ_k (where the step ratios and the standstill
    test never stop it: tests/test_monks.py), each client's λ_i `least` (flat along e₃), the
    multipliers' outer step `moving`."""
    history, xs = drifting()
    for record in history:
        record["inner"], record["multiplier_change"] = proxal_outer.SHORT, moving
    ex, run = Nodes(flat, server=server, least=least), []
    for k in range(len(history)):
        run.append(history[k])
        if proxal_outer.outer_stop(backend, run, ex, xs[k], {}) == Status.CONVERGED:
            return k + 1, ex
    return None, ex


def test_the_objective_s_curvature_modulo_the_flat_directions_stops_the_run():
    # λ_i = 1/2 on (e₁, e₂) at both clients: μ = 1/2, (‖Δw mod N‖/β + √3 τ)/μ ≈ 3.5e-7 ≤ 1e-4 ×
    # ‖(1, −2)‖₂ at the first test; N asked once with the λ_i
    found, ex = stop_at(0.5)
    assert found == 2 and ex.curvatures == 1 and ex.asked == [["c0", "c1", "server"]]
    # λ_i = 2.5e-5: μ = 2.5e-5, the bound 7e-3 is above 2.2e-4 — no stop, whatever the drift
    assert stop_at(2.5e-5)[0] is None
    # no curvature off N (λ_i = 0), or no reading: no stop; a refusal is not asked again
    assert stop_at(0.0)[0] is None
    found, ex = stop_at(None)
    assert found is None and ex.curvatures == 1
    # no node with a flat direction (a server ridge, clients that see every direction): no
    # round trip for N; μ = 1/2 along e₃ too, where the drift is a stationarity of 5e-7 only
    found, ex = stop_at(0.5, flat=np.zeros((3, 0)), server=np.zeros((3, 0)))
    assert found == 2 and ex.asked == [] and ex.curvatures == 1
    # multipliers still moving (by 0.05, as examples/centralized_form.py's where it stopped 1.2e-3
    # from CVXPY's w): their error moves the minimizer by up to d·0.05/μ — no stop
    assert stop_at(0.5, moving=0.05)[0] is None
    # a backend that does not install the procedure (cProx-AL) asks for none
    found, ex = stop_at(0.5, backend=BACKEND)
    assert found is None and ex.curvatures == 0
