"""honest13: "converged" under Newton steps only where the answer is — across a curvature kink
(the reading confirmed where its step lands), on a Hessian whose least eigenvalue is tiny but
above round-off (a ridge of 1e-10 … 1e-12 of the loss), and never where no minimizer exists
(status "diverged" without a reading, else a hint at the cap). Each scenario failed on main 5da04c1 (numbers in
docs/BENCHMARKS.md, branch honest13)."""
import types
import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import proxal_certificate, proxal_verdict
from fedmodel.datasets import load_a9a, load_regression
from conftest import load_data



def _kinked(seed: int):
    """ε/2‖w − c‖² + Σ a_j pos(b_jᵀw − t_j)² over 1–3 clients, d = 1–5, every kink term active at
    the start w = 0 and inactive at c, so the answer is c exactly (φ ≥ 0 = φ(c))."""
    rng = np.random.default_rng(seed)
    d, n = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    eps, c = 10.0 ** rng.uniform(-8, -4), rng.normal(size=d) * 3
    w, prob = fm.Variable(d, name="w"), fm.Problem()
    for _ in range(n):
        client = prob.add_client()
        B = rng.normal(size=(int(rng.integers(1, 4)), d))
        t = B @ c + rng.uniform(0.5, 3, size=B.shape[0])
        inside = client.data(B) @ w - client.data(t)
        kinks = fm.sum_squares(fm.pos(inside)) if rng.random() < 0.5 else fm.sum(fm.square(fm.pos(inside)))
        client.minimize(eps / (2 * n) * fm.sum_squares(w - client.data(c)) + float(10 ** rng.uniform(0, 3)) * kinks)
    return prob, w, c


def _off(res, w, exact) -> float:
    return float(np.linalg.norm(res.value(w) - exact) / np.linalg.norm(exact))


def test_the_reviewers_kink_is_not_converged_at_the_kink():
    """ε/2(w + 3)² + 100 pos(w + 1)², ε = 1e-7: main said "converged" at w = −1 (2.0 off); the
    reading at the point the Newton step lands (just past the kink, curvature ε) refuses it."""
    w, prob = fm.Variable(1, name="w"), fm.Problem()
    prob.add_client().minimize(1e-7 / 2 * fm.sum_squares(w + 3.0) + 100.0 * fm.sum(fm.square(fm.pos(w + 1.0))))
    res = prob.solve()
    assert res.status == "converged"
    assert abs(res.value(w)[0] + 3.0) < 1e-4 * 3
    assert np.isfinite(res.history[-1]["newton_landed"])


@pytest.mark.integration
def test_a_sweep_of_kinked_models_says_converged_only_at_the_answer():
    """18 models (`_kinked`): main said "converged" 0.19–1.4 off on 5 (seeds 0, 3, 9, 14, 17:
    kinks switching off between z and z*, and Hessians whose least eigenvalue fell below the
    old 1e-10 floor); now every one converged within 1e-4 of c."""
    for seed in range(18):
        prob, w, c = _kinked(seed)
        res = prob.solve()
        assert res.status == "converged", seed
        assert _off(res, w, c) < 1e-4, (seed, _off(res, w, c))


def test_switches_names_the_terms_whose_curvature_can_switch_off():
    x = fm.Variable(3, name="x")
    assert proxal_certificate.switches(fm.sum_squares(fm.pos(x - 1.0)), [])
    assert proxal_certificate.switches(fm.sum(fm.huber(x)), [])
    assert not proxal_certificate.switches(fm.sum_squares(x) + fm.sum(fm.logistic(x)), [])
    assert proxal_certificate.switches(fm.sum_squares(x), [x <= 1.0])
    assert not proxal_certificate.switches(fm.sum_squares(x), [fm.sum(x) == 1.0])


def _abalone_trap(lam: float):
    """newuser12's dummy trap: intercept + all three sex levels + 7 numeric columns, a ridge λ on
    all but the intercept, 5 clients; the closed form by lstsq on the stacked system."""
    data = load_data(load_regression, "abalone")    # sex one-hot F, I, M, then 7 numeric columns
    X = np.hstack([np.ones((data.X.shape[0], 1)), data.X])
    y, (N, d) = data.y, X.shape
    mask = np.r_[0.0, np.ones(d - 1)]
    exact = np.linalg.lstsq(np.vstack([X / np.sqrt(N), np.sqrt(lam) * np.diag(mask)]),
                            np.r_[y / np.sqrt(N), np.zeros(d)], rcond=None)[0]
    w, prob = fm.Variable(d, name="w"), fm.Problem()
    for r in np.array_split(np.random.default_rng(0).permutation(N), 5):
        client = prob.add_client()
        client.minimize(fm.sum_squares(client.data(X[r]) @ w - client.data(y[r])) / N)
    prob.server.minimize(lam * fm.sum_squares(fm.multiply(mask, w)))
    return prob, w, exact


@pytest.mark.integration
@pytest.mark.parametrize("lam", [1e-10, 1e-12])
def test_the_dummy_trap_with_a_tiny_ridge_reaches_the_closed_form(lam):
    """Main: "converged" 0.12 off (the least eigenvalue, 1.8e-11 / 1.8e-13 of the largest, under
    the reading's old floor 1e-10: no reading, the older tests decided). Now read, and where
    β_max's proximal steps would crawl (2,523 round trips at 1e-12) the run goes on from the
    Newton point: converged 7e-8 / 2.7e-6 off in 9 / 39 round trips."""
    prob, w, exact = _abalone_trap(lam)
    res = prob.solve()
    assert res.status == "converged"
    assert _off(res, w, exact) < 1e-4
    assert res.ledger.round_trips <= 80


X_SEP = np.hstack([np.ones((40, 1)), np.r_[np.linspace(1, 2, 20), -np.linspace(1, 2, 20)][:, None]])
S_SEP = np.r_[np.ones(20), -np.ones(20)]


def _separable(ridge: float = 0.0):
    X, s = X_SEP, S_SEP
    w, prob = fm.Variable(2, name="w"), fm.Problem()
    for part in np.split(np.arange(40), 4):
        client = prob.add_client()
        client.minimize(fm.sum(fm.logistic(-fm.multiply(client.data(s[part]), client.data(X[part]) @ w))) / 40)
    if ridge:
        prob.server.minimize(ridge * fm.sum_squares(w))
    return prob, w


def test_no_minimizer_says_so_at_the_cap():
    """Separable data, no ridge: main ran 349 round trips to max_iterations with no hint. The
    Newton reading exists here (its answer recedes as the iterates go out), which a far minimizer
    behind a smooth collapse of the curvature also shows (the review's soft kink, below): so the
    run goes to its cap, not "converged", and says it may have no minimizer, naming the cure."""
    prob, w = _separable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = prob.solve()
    assert res.status == "max_iterations"
    assert "no minimizer" in res.info["no_minimizer"] and "ridge" in res.info["no_minimizer"]
    assert any("no minimizer" in str(c.message) for c in caught)


def test_a_far_minimizer_behind_a_smooth_collapse_of_curvature_is_not_diverged():
    """The review's case: 1e-7/2 (w + 3)² + 1e-4 logistic(1e3 (w + 1))², a minimizer at −3 (CVXPY
    −3.00005). The reading at −1.009 receded as the iterates went (steps 1e-3, reading 5e-4,
    curvature 1 → 1.8e-8): "diverged" with "no minimizer" advice before; now converged at −3."""
    w, prob = fm.Variable(1, name="w"), fm.Problem()
    prob.add_client().minimize(1e-7 / 2 * fm.sum_squares(w + 3.0)
                               + 1e-4 * fm.sum(fm.square(fm.logistic(1e3 * (w + 1.0)))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve("proxal")
    assert res.status == "converged"
    assert abs(res.value(w)[0] + 3.0) <= 1e-3


def test_with_a_ridge_the_same_data_converges():
    """The runaway rule does not fire where a minimizer exists (the same data, a ridge 1e-4)."""
    prob, w = _separable(1e-4)
    res = prob.solve()
    A = S_SEP[:, None] * X_SEP
    exact = np.zeros(2)
    for _ in range(100):        # Newton's method on the mean logistic loss + 1e-4‖w‖² (closed-form derivatives)
        p = 1.0 / (1.0 + np.exp(A @ exact))
        grad = -A.T @ p / 40 + 2e-4 * exact
        exact -= np.linalg.solve(A.T @ (A * (p * (1 - p))[:, None]) / 40 + 2e-4 * np.eye(2), grad)
    assert res.status == "converged"
    assert np.linalg.norm(res.value(w) - exact) <= 1e-4 * np.linalg.norm(exact)


def _record(size, step, distance=np.inf, curvature=0.0, objective=1.0):
    return {"violation": 0.0, "multiplier_change": 0.0, "size": size, "step": step, "objective": objective,
            "newton_distance": distance, "newton_curvature": curvature}


def test_runaway_reads_only_runs_without_a_reading():
    """Outward steps with no reading (a Hessian singular to round-off), the objective flat:
    True. With readings — receding or falling — it is the hint's at the cap, not a stop (False);
    nor are shrinking steps without a reading, nor a rising objective."""
    n = proxal_verdict.RUNAWAY_OUTER + 1
    flat = [_record(10.0 + k, 1.0, objective=1.0 - 1e-6 * k) for k in range(n)]
    assert proxal_verdict.runaway(flat, 1e-4)
    receding = [_record(10.0 + k, 1.0, 1.5, 1e-3 / (k + 1), 1.0 / (k + 1)) for k in range(n)]
    assert not proxal_verdict.runaway(receding, 1e-4)
    approach = [_record(10.0 + k, 1.0, 20.0 - k, 1e-3, 1.0 / (k + 1)) for k in range(n)]
    assert not proxal_verdict.runaway(approach, 1e-4)
    shrinking = [_record(10.0 + 2 - 2.0 ** -k, 2.0 ** -k, objective=1.0 / (k + 1)) for k in range(n)]
    assert not proxal_verdict.runaway(shrinking, 1e-4)
    rising = [_record(10.0 + k, 1.0, objective=1.0 + k) for k in range(n)]
    assert not proxal_verdict.runaway(rising, 1e-4)


@pytest.mark.integration
def test_a9a_one_class_clients_without_a_ridge_is_not_converged():
    """newuser12's (a): 8 one-class clients, 2,000 a9a rows, no ridge (quasi-separable: no
    minimizer). Main: "converged" 0.17 from CVXPY's point, the objective below CVXPY's. Now
    "diverged" with the hint."""
    data = load_data(load_a9a, sparse=True)
    perm = np.random.default_rng(0).permutation(data.X.shape[0])[:2000]
    X = np.hstack([np.ones((2000, 1)), data.X[perm].toarray()])
    X = X[:, np.r_[True, X[:, 1:].std(0) > 0]]
    yy = data.y[perm]
    w, prob = fm.Variable(X.shape[1], name="w"), fm.Problem()
    for part in np.array_split(np.flatnonzero(yy == 1), 4) + np.array_split(np.flatnonzero(yy == 0), 4):
        client = prob.add_client()
        client.minimize(fm.sum(fm.logistic(-fm.multiply(client.data(2.0 * yy[part] - 1),
                                                        client.data(X[part]) @ w))) / 2000)
    res = prob.solve()
    assert res.status == "diverged"
    assert "no minimizer" in res.info["diverged"]


def test_hints_flat_directions_at_converged_and_a_possible_runaway_at_the_cap():
    """`hints`: a "converged" without a distance reading, the Hessian singular to round-off, says
    so (info["flat"], a warning); a run that reaches max_outer going outward while the objective
    falls says it may have no minimizer (info["no_minimizer"]); neither otherwise."""
    backend = types.SimpleNamespace(eps2=1e-4, max_outer=7)
    flat = [dict(_record(10.0, 0.0), newton_flat=1.0)]
    info = {}
    with pytest.warns(RuntimeWarning, match="singular to round-off along 1 direction"):
        assert proxal_verdict.hints(backend, flat, info, "converged") == "converged"
    assert "not resolved along" in info["flat"]
    read = [dict(_record(10.0, 0.0, 1e-6, 1.0), newton_flat=0.0)]
    info = {}
    assert proxal_verdict.hints(backend, read, info, "converged") == "converged" and not info
    outward = [_record(10.0 + k, 1.0, np.inf, 0.0, 1.0 / (k + 1)) for k in range(7)]
    info = {}
    with pytest.warns(RuntimeWarning, match="may have no minimizer"):
        assert proxal_verdict.hints(backend, outward, info, None) is None
    assert "×1.6 since the first" in info["no_minimizer"]
    info = {}
    assert proxal_verdict.hints(backend, outward[:6], info, None) is None and not info      # (not at the cap)


def test_a_reused_executor_reads_each_run_afresh():
    """One executor serving two runs (a persistent cluster): the kinked model after a smooth one
    said "converged" at the kink, 2.0 off (the landing check's memory was the smooth run's)."""
    from fedmodel import registry
    ex = registry.lookup("executor", "serial")()
    w, smooth = fm.Variable(1, name="w"), fm.Problem()
    smooth.add_client().minimize(fm.sum_squares(w - 2.0))
    assert smooth.solve("proxal", executor=ex).status == "converged"
    v, kink = fm.Variable(1, name="v"), fm.Problem()
    kink.add_client().minimize(1e-7 / 2 * fm.sum_squares(v + 3.0) + 100.0 * fm.sum(fm.square(fm.pos(v + 1.0))))
    res = kink.solve("proxal", executor=ex)
    assert res.status == "converged" and abs(res.value(v)[0] + 3.0) <= 1e-4
