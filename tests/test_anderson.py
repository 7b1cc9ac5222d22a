"""Anderson acceleration split over clients (backends/anderson.py) against a textbook
centralized Anderson (type II, least squares by numpy) and the closed-form fixed point."""
from __future__ import annotations

import numpy as np
import pytest

from fedmodel.backends.anderson import ClientHistory, ServerMixer


def affine_map(blocks: int, size: int, radius: float, seed: int):
    """x ↦ Ax + b with spectral radius `radius` (A symmetric), split into `blocks` blocks."""
    rng = np.random.default_rng(seed)
    n = blocks * size
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = Q @ np.diag(radius * rng.uniform(-1.0, 1.0, n)) @ Q.T
    b = rng.standard_normal(n)
    return A, b


def centralized_anderson(T, x0, memory, iterations):
    """x_{k+1} = g_k − ΔG γ, γ = argmin ‖f_k − ΔF γ‖₂ over the last memory + 1 iterates."""
    x, outputs, residuals, path = x0.copy(), [], [], []
    for _ in range(iterations):
        g = T(x)
        outputs.append(g)
        residuals.append(g - x)
        outputs, residuals = outputs[-memory - 1:], residuals[-memory - 1:]
        if len(outputs) == 1:
            x = g
        else:
            dF = np.diff(np.array(residuals), axis=0).T
            dG = np.diff(np.array(outputs), axis=0).T
            gamma = np.linalg.lstsq(dF, residuals[-1], rcond=None)[0]
            x = g - dG @ gamma
        path.append(x)
    return path


def federated_anderson(T, x0, blocks, memory, iterations, **mixer_options):
    """The same iteration with the state split over `blocks` clients: each keeps its history,
    the server sums the inner products and mixes the points it was sent (here: the outputs)."""
    size = x0.size // blocks
    names = [f"c{i}" for i in range(blocks)]
    histories = {c: ClientHistory(memory) for c in names}
    mixer = ServerMixer(memory, **mixer_options)
    x = {c: x0[i * size:(i + 1) * size].copy() for i, c in enumerate(names)}
    restart, path, server_points = False, [], []
    for _ in range(iterations):
        if restart:
            for h in histories.values():
                h.clear()
        g = T(np.concatenate([x[c] for c in names]))
        g = {c: g[i * size:(i + 1) * size] for i, c in enumerate(names)}
        products = sum(histories[c].push(g[c], x[c]) for c in names)
        gamma, restart, points = mixer.step(g, products, changed=False)
        # the clients' next states: mixed, or the plain outputs (as ProxAL's u_i, λ_i are)
        x = {c: histories[c].mix(gamma) for c in names} if len(gamma) else g
        for c in names:
            np.testing.assert_allclose(x[c], points[c], rtol=1e-12, atol=1e-12)
        server_points.append(np.concatenate([points[c] for c in names]))
        path.append(server_points[-1])
    return path, mixer


def test_split_anderson_equals_centralized_anderson_iterate_by_iterate():
    A, b = affine_map(blocks=3, size=4, radius=0.97, seed=0)
    x0 = np.zeros(12)
    T = lambda x: A @ x + b   # noqa: E731
    central = centralized_anderson(T, x0, memory=4, iterations=8)
    split, mixer = federated_anderson(T, x0, blocks=3, memory=4, iterations=8)
    assert mixer.mixed == 7 and mixer.restarts == 0
    for k, (a, s) in enumerate(zip(central, split)):
        np.testing.assert_allclose(s, a, rtol=1e-6, atol=1e-9, err_msg=f"iterate {k}")


def test_anderson_solves_a_linear_fixed_point_in_few_iterations():
    """On an affine contraction of dimension 12 with memory ≥ 12, Anderson II is GMRES in
    disguise: it reaches the fixed point (I − A)⁻¹b in about 12 iterations, while the plain
    iteration with spectral radius 0.97 needs hundreds."""
    A, b = affine_map(blocks=3, size=4, radius=0.97, seed=1)
    exact = np.linalg.solve(np.eye(12) - A, b)
    T = lambda x: A @ x + b   # noqa: E731
    path, _ = federated_anderson(T, np.zeros(12), blocks=3, memory=15, iterations=16)
    assert np.max(np.abs(path[-1] - exact)) <= 1e-8 * np.max(np.abs(exact))
    x = np.zeros(12)
    for _ in range(16):
        x = T(x)
    assert np.max(np.abs(x - exact)) > 1e-2 * np.max(np.abs(exact))


def test_restarts_on_growth_and_falls_back_to_plain_iteration():
    mixer = ServerMixer(memory=3, restarts=2, growth=10.0)
    points = {"c0": np.ones(2)}
    gamma, restart, _ = mixer.step(points, np.array([1.0]), changed=False)
    assert len(gamma) == 0 and not restart
    gamma, restart, _ = mixer.step(points, np.array([0.5, 1.0]), changed=False)
    assert len(gamma) == 1 and not restart
    # the residual norm jumps 100× above the best: restart, memory cleared on both sides
    gamma, restart, out = mixer.step(points, np.array([0.0, 0.0, 1e4]), changed=False)
    assert restart and len(gamma) == 0 and out is points and mixer.points == []
    # a changed map (new ρ) restarts without using up a restart
    _, restart, _ = mixer.step(points, np.array([1.0]), changed=True)
    assert restart and mixer.restarts_left == 1
    mixer.step(points, np.array([1.0]), changed=False)
    _, restart, _ = mixer.step(points, np.array([0.0, 1e6]), changed=False)
    assert restart and mixer.restarts_left == 0
    # no restarts left: plain iteration from now on
    for products in (np.array([1.0]), np.array([0.5, 1.0])):
        gamma, restart, _ = mixer.step(points, products, changed=False)
        assert len(gamma) == 0 and not restart


def test_client_history_keeps_memory_plus_one_and_returns_inner_products():
    h = ClientHistory(memory=2)
    rng = np.random.default_rng(0)
    states = [rng.standard_normal(3) for _ in range(5)]
    outputs = [rng.standard_normal(3) for _ in range(5)]
    for x, g in zip(states, outputs):
        products = h.push(g, x)
    assert len(h.outputs) == 3
    kept = [outputs[k] - states[k] for k in (2, 3, 4)]
    np.testing.assert_allclose(products, [kept[-1] @ r for r in kept])
    np.testing.assert_allclose(h.mix(np.array([0.5, -1.0])),
                               outputs[4] - 0.5 * (outputs[3] - outputs[2]) + (outputs[4] - outputs[3]))


@pytest.mark.parametrize("memory", [-1, 16])
def test_proxal_rejects_a_bad_memory(memory):
    import fedmodel as fm
    from fedmodel.backends import ProxAL
    with pytest.raises(fm.FedModelError, match="anderson"):
        ProxAL(anderson=memory)


def test_a_residual_that_stands_still_is_not_extrapolated_to_overflow():
    """Two residuals equal to 11 digits (ProxAL's ADMM on the contradictory lasso of
    test_infeasible, as written: ‖f‖ = 5.2e-7 twice) make ΔFᵀΔF = 0 in floating point; the
    Tikhonov term reg·‖ΔF‖² alone gave γ = −2.4e286 (iterates 1e278). With the per-column
    round-off floor ROUNDOFF·(‖f_j‖² + ‖f_{j+1}‖²) γ = ΔFᵀf / floor = −4.5."""
    mixer = ServerMixer(memory=5)
    points = {"c0": np.ones(2)}
    mixer.step(points, np.array([2.6714468305336348e-13]), changed=False)
    gamma, restart, _ = mixer.step(points, np.array([2.6714468305095292e-13, 2.6714468304854237e-13]),
                                   changed=False)
    assert not restart and gamma == pytest.approx([-2.4105569779636755e-24 / (1e-12 * 5.342893661019e-13)],
                                                  rel=1e-6)
    assert gamma == pytest.approx([-4.51], abs=0.01)
    # well above round-off the floor is not felt: the split Anderson still equals the textbook
    # one (test_split_anderson_equals_centralized_anderson_iterate_by_iterate)
