"""Data in other units give the same answer (issue 25, item 1): every backend solves the
equilibrated model (fedmodel/compiler/scaling.py), so multiplying the data by 10^k changes
neither the answer (mapped to the new units) nor the run.

Before equilibration, least squares over 3 clients with the data ×1e-3 came back "converged"
40 % off under ProxAL, FedADMM was exactly 0 at ×1e-5, and at ×1e3 ProxAL, DALD and FedADMM
ran to their caps; a constrained logistic model stalled the same way."""
from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import fedmodel as fm
from conftest import load_data
from fedmodel import backends, topologies

SCALES = range(-6, 7)
# The fast suite runs the extremes and the unit run; CI's integration run the other scales (with
# the unit run, the reference of every comparison): together every scale of the sweep
FAST_SCALES = (-6, 0, 6)


def _split(scales, fast=FAST_SCALES) -> list:
    """`scales` as two parametrize cases: the fast ones, and the rest plus 0 (integration)."""
    rest = tuple(k for k in scales if k == 0 or k not in fast)
    return [pytest.param(tuple(k for k in scales if k in fast), id="fast-scales"),
            pytest.param(rest, id="other-scales", marks=pytest.mark.integration)]


def least_squares(scale: float, clients: int = 3):
    """Σ_i ‖A_i w − b_i‖² with A, b in units ×`scale`: the solution does not change."""
    rng = np.random.default_rng(0)
    truth = np.array([1.0, -2.0, 0.5])
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    for _ in range(clients):
        A = rng.normal(size=(20, 3))
        b = A @ truth + 0.1 * rng.normal(size=20)
        c = prob.add_client()
        c.minimize(fm.sum_squares(c.data(A * scale, name="A") @ w - c.data(b * scale, name="b")))
    return prob, w, 1.0


def constrained_logistic(scale: float):
    """Mean logistic loss with a Neyman-Pearson constraint per client, features ×`scale`: the
    solution scales as 1/`scale` (returned as the factor that maps it back)."""
    rng = np.random.default_rng(1)
    d = 4
    truth = rng.normal(size=d)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    for _ in range(3):
        X = rng.normal(size=(40, d))
        y = np.where(X @ truth + 1.5 * rng.normal(size=40) > 0, 1.0, -1.0)
        c = prob.add_client()
        c.minimize(fm.mean(fm.logistic(-(c.data(y[:, None] * X * scale, name="A") @ w))))
        X1 = rng.normal(size=(10, d)) + 0.5
        c.subject_to(fm.mean(fm.logistic(-(c.data(X1 * scale, name="X1") @ w))) <= 0.6)   # active (2 of 3)
    return prob, w, 1.0 / scale


def ball_lasso(scale: float):
    """The ball-lasso (also tests/test_infeasible.py's far-from-KKT model; 12 clients: mean
    squares + λ‖w‖₁, each with ‖w‖₂ ≤ 2), data ×`scale` and λ ×`scale`² (the same model with
    its objective in other units): the solution does not change. The ball keeps its units (a projected set: row scale 1)."""
    rng = np.random.default_rng(3)
    w = fm.Variable(8, name="w")
    prob = fm.Problem(name="ball-lasso")
    for i in range(12):
        client = prob.add_client(f"c{i}")
        m = int(rng.integers(10, 30))
        A = rng.standard_normal((m, 8))
        b = A @ np.ones(8) + 0.1 * rng.standard_normal(m)
        client.minimize(fm.sum_squares(client.data(A * scale, name="A") @ w - client.data(b * scale, name="b")) / m
                        + 0.05 * scale ** 2 * fm.norm1(w))
        client.subject_to(fm.norm2(w) <= 2.0)
    return prob, w, 1.0


def _runs(model, backend: str, topology=None, scales=SCALES) -> dict:
    """{k: (result, answer mapped back to unit data)} over `scales`."""
    out = {}
    for k in scales:
        prob, w, back = model(10.0 ** k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = prob.solve(backend, topology=topology(prob) if topology else None)
        out[k] = (res, res.value(w) / back if res.values else None)
    return out


def _assert_invariant(runs, name, answer_tol=1e-6):
    """Every scale: the unit run's status, at most 1.5× its iterations, its answer to 1e-6."""
    unit, unit_w = runs[0]
    for k, (res, value) in runs.items():
        assert res.status == unit.status, (name, k, res.status, unit.status)
        for key, count in unit.iterations.items():
            if key != "solver":     # CVXPY's own iteration count is not ours
                assert res.iterations[key] <= 1.5 * count + 1, (name, k, res.iterations)
        if unit_w is not None:
            error = np.max(np.abs(value - unit_w)) / np.max(np.abs(unit_w))
            assert error <= answer_tol, (name, k, error)


# name: (backend, topology, clients); pa is DALD with one client
LEAST_SQUARES = {"proxal": ("proxal", None, 3), "cproxal": ("cproxal", None, 3),
                 "dald": ("dald", None, 3), "dald-ring": ("dald", topologies.ring, 3),
                 "fedadmm": ("fedadmm", None, 3), "fedprox": ("fedprox", None, 3),
                 "fedavg": ("fedavg", None, 3), "dgd": ("dgd", None, 3), "pa": ("pa", None, 1),
                 "dp-admm": ("dp-admm", None, 3), "cvxpy": ("cvxpy", None, 3),
                 "auto": ("auto", None, 3)}     # (Newton steps: what `prob.solve()` runs)


@pytest.mark.parametrize("scales", _split(SCALES))
@pytest.mark.parametrize("name", list(LEAST_SQUARES))
def test_least_squares_in_any_units(name, scales):
    backend, topology, clients = LEAST_SQUARES[name]
    model = functools.partial(least_squares, clients=clients)
    runs = _runs(model, backend, topology, scales=scales)
    # CVXPY too: the lowering moves σ inside the sum of squares (fedmodel/lowering/to_cvxpy.py
    # `_weighted`); with σ outside, Clarabel's cone kept the 10^k-sized residual: 3.4e-6 at k = 6
    _assert_invariant(runs, name)
    unit, unit_w = runs[0]
    if unit.status == "converged":
        prob, w, _ = model(1.0)
        assert np.max(np.abs(unit_w - prob.solve("cvxpy").value(w))) <= 1e-4, name


@pytest.mark.parametrize("scales", _split((-6, -2, 0, 3, 6)))
@pytest.mark.parametrize("name", ["proxal", "cproxal", "dald", "cvxpy", "auto"])
def test_constrained_logistic_in_any_units(name, scales):
    """Five of the scales (the slowest models of the sweep; least squares runs all 13); the
    unit run verified against CVXPY where it converged."""
    runs = _runs(constrained_logistic, name, scales=scales)
    _assert_invariant(runs, name)
    unit, _ = runs[0]
    if unit.status == "converged":
        assert fm.verify(unit).ok, name


@pytest.mark.parametrize("scales", _split((-6, -1, 0, 3, 6), fast=(-1, 0, 6)))
@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_fedavg_with_client_balls_in_any_units(name, scales):
    """FedAvg / FedProx equilibrate as the other backends, with client constraints. Before, they
    solved the model as written because equilibrated they diverged here at round 13: the ball's
    penalty β = 2 (the ball keeps row scale 1 while σ = 0.026 shrinks the objective) met the
    step 1/L̂ (step·β = 14 > 2); as written the same happened at data ×0.1. β follows L̂ now, and
    the server projects on the clients' (data-free) balls: 36 rounds at every scale, to CVXPY's
    answer (it stopped at a biased fixed point 3.2e-3 away, "stalled", before branch fedavgcons)."""
    runs = _runs(ball_lasso, name, scales=scales)
    _assert_invariant(runs, name)
    unit, unit_w = runs[0]
    assert unit.status == "converged" and "not_stationary" not in unit.info, (unit.status, unit.info.keys())
    assert "scaling" in unit.info
    assert unit.iterations["rounds"] <= 40, unit.iterations
    prob, w, _ = ball_lasso(1.0)
    assert np.max(np.abs(unit_w - prob.solve("cvxpy").value(w))) <= 1e-5


@pytest.mark.integration     # (5–12 s: CI's integration run keeps the fast suite under 3 minutes)
@pytest.mark.parametrize("options", [{"local_steps": 5}, {"warm_start": True}])
def test_fedprox_local_steps_see_the_proximal_term(options):
    """The automatic step is 1/(L̂ + μ) once FedProx's local steps see μ‖x − x̂‖²/2 (several
    steps, or warm starts): with 1/L̂, step·μ = 4.2 on equilibrated least squares and 2.4 on the
    constrained logistic model as written, and both diverged."""
    for model, scaling in ((least_squares, True), (constrained_logistic, False)):
        prob, _, _ = model(1.0)
        res = prob.solve(backends.FedProx(**options), scaling=scaling)
        assert res.status == ("converged" if model is least_squares else "stalled"), \
            (model.__name__, res.status)       # stalled: client constraints (a biased fixed point)
        assert res.info["step"] * 2.0 < 1.0, res.info["step"]      # μ = 2: step·μ < 1


def test_data_too_small_for_double_precision_is_refused():
    """×1e-300: every squared residual underflows to 0, so every backend (CVXPY too) returned
    w = 0 "converged"; now a DataError names the data."""
    prob, _, _ = least_squares(1e-300)
    for backend in ("proxal", "cvxpy"):
        with pytest.raises(fm.DataError, match=r"data '(c0\.)?A' of block 'c0'.*underflow"):
            prob.solve(backend)


def test_factors_are_reported_and_presets_solve_the_model_as_written():
    prob, w, _ = least_squares(1e-3)
    res = prob.solve("proxal")
    unit = least_squares(1.0)[0].solve("proxal")
    # the objective of data ×1e-3 is 1e-6 of the unit one: its factor is 1e6 times larger
    assert res.info["scaling"]["objective"] == pytest.approx(1e6 * unit.info["scaling"]["objective"],
                                                             rel=1e-9)
    paper = prob.solve(backends.ProxAL.paper())
    assert "scaling" not in paper.info
    assert "scaling" not in prob.solve("proxal", scaling=False).info


@pytest.mark.integration     # real data, 1,500 rows: CI runs it after the fast suite
def test_raw_adult_in_its_own_units_solves_and_verifies():
    """The UCI adult file as shipped (age in years, fnlwgt up to 1.2e6, capital-gain up to
    99,999, one-hot categoricals, an intercept, no standardization), 1,500 rows over 5 clients,
    Neyman-Pearson with a server ridge: default ProxAL verified against CVXPY in ~5 s. As written
    (`scaling=False`, max_outer=20) the same run had no answer after 11 minutes."""
    from fedmodel.builtin_models import neyman_pearson_clients
    from fedmodel.datasets import load_adult_raw
    data = load_data(load_adult_raw)
    X = np.hstack([data.X[:1500], np.ones((1500, 1))])
    prob, w, _ = neyman_pearson_clients(X, data.y[:1500], 5, 0.6, 0)
    prob.server.minimize(1e-2 * fm.sum_squares(w))
    ref = prob.solve("cvxpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve("proxal")
    assert res.status == "converged"
    assert fm.verify(res, ref).ok


def test_multipliers_come_back_in_the_users_units():
    """μ_j = μ̃_j r_j / σ, also for the pieces of a split constraint whose name has brackets
    (`abs(a) <= t` → `name[+]`, `name[-]`): the certificate computed with them is a KKT point's,
    at data ×1e-4 as at ×1."""
    for scale in (1.0, 1e-4):
        prob, w, _ = least_squares(scale)
        prob.clients[0].subject_to((fm.abs(w[0] - 0.2) <= 0.1).named("band[c0]"))
        prob.clients[1].subject_to((fm.sum(w) >= -0.3).named("sum[c1]"))
        res = prob.solve("proxal")
        ref = prob.solve("cvxpy")
        assert res.status == "converged"
        assert res.certificate.relative_stationarity <= 1e-4, scale
        assert fm.verify(res, ref).ok, scale


def test_cvxpy_solves_as_written_where_clarabel_is_inaccurate_on_the_equilibrated_copy():
    """NP monks-1 (one-hot, no unique minimizer): Clarabel is 'optimal' on the model as written
    but only 'optimal_inaccurate' on the equilibrated copy, where the chain fell through ECOS to
    SCS's 200,000 iterations (89 s). The equilibrated attempts stop after Clarabel and the model
    is solved again as written: Clarabel's optimal answer, 95 iterations."""
    from fedmodel.reproductions import proxal_table1
    X, y = load_data(proxal_table1.load, "monks-1")
    prob, w, _ = proxal_table1.build(X, y, 5)
    res = prob.solve("cvxpy")
    assert res.status == "converged" and res.info["solver"] == "CLARABEL"
    assert "as written CLARABEL: optimal" in res.info["attempts"]
    assert not any("SCS" in attempt or "ECOS" in attempt for attempt in res.info["attempts"])
    assert any(a.startswith("equilibrated CLARABEL") for a in res.info["attempts"])
    assert res.objective == pytest.approx(prob.solve("cvxpy", scaling=False).objective, rel=1e-8)
