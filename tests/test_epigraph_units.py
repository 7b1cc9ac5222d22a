"""Epigraph losses (hinge, pinball) with their data in other units (issue 25 item 1): the
equilibration sizes the shared variable from the epigraph rows and each slack t like the rows
it bounds (`scale_probe.epigraph_probe`), so the model ×10^k is equilibrated to the model ×1.

Before (main d7c29d2) w and the slacks kept δ = 1 and σ = 1 while the rows' r shrank as 10^−k:
the hinge SVM ×1e3 ended "stalled" under ProxAL and at its cap under cProx-AL, the pinball ×1e6
likewise (newuser5). Answers are checked against CVXPY's at 1e-4 relative (w and objective).
"""
import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.compiler.epigraph import rewrite_for
from fedmodel.compiler.scaling import equilibrate

RTOL = 1e-4


def hinge(scale):
    """A linear SVM over 3 clients with the features ×scale and the ridge ×scale²: the same
    model in w/scale."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(120, 4)) * scale
    y = np.sign(X @ rng.normal(size=4) + 0.4 * scale * rng.normal(size=120))
    w, prob = fm.Variable(4, name="w"), fm.Problem("hinge")
    for i in range(3):
        r, c = slice(40 * i, 40 * i + 40), prob.add_client(f"c{i}")
        c.minimize(fm.sum(fm.pos(1 - fm.multiply(c.data(y[r]), c.data(X[r]) @ w))) / 120)
    prob.server.minimize(1e-2 * scale ** 2 * fm.sum_squares(w))
    return prob, w


def pinball(scale, tau=0.8):
    """Quantile regression (τ = 0.8, an intercept column) with X and y ×scale: the same w."""
    rng = np.random.default_rng(8)
    X = np.column_stack([rng.normal(size=(90, 3)), np.ones(90)])
    y = X @ np.array([1.0, -1, 2, 0.5]) + rng.standard_t(3, size=90)
    X, y = X * scale, y * scale
    w, prob = fm.Variable(4, name="w"), fm.Problem("pinball")
    for i in range(3):
        r, c = slice(30 * i, 30 * i + 30), prob.add_client(f"c{i}")
        res = c.data(y[r]) - c.data(X[r]) @ w
        c.minimize(fm.sum(tau * fm.pos(res) + (1 - tau) * fm.pos(-res)) / 90)
    return prob, w


MODELS = {"hinge": (hinge, -1), "pinball": (pinball, 0)}   # w ∝ scale^power


class _TakesEpigraph:
    solves_epigraph = True


def _factors(name, scale):
    """(D_w·scale^−power, the slacks' D / scale^(power+1), σ·scale^(power+1)): the factors the
    same model in other units should have (the hinge's t and objective are unitless, the
    pinball's are in y's units)."""
    build, power = MODELS[name]
    prob, w = build(scale)
    copy = rewrite_for(prob, _TakesEpigraph()).problem
    scaled = equilibrate(copy)
    unit = scale ** (power + 1)
    slacks = [np.asarray(scaled.scaling.variables[v.uid]) / unit for v in copy.variables()
              if v.owner is not None]
    return (np.asarray(scaled.scaling.variables[w.uid]) / scale ** power,
            np.concatenate([np.ravel(s) for s in slacks]), scaled.scaling.objective * unit)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_model_in_other_units_is_equilibrated_to_the_same_model(name):
    unit = _factors(name, 1.0)
    assert np.all(unit[1] > 0) and len(unit[1]) == 3 * (1 if name == "hinge" else 2) * \
        (40 if name == "hinge" else 30)
    for scale in (1e-3, 1e3, 1e6):
        for got, want in zip(_factors(name, scale), unit):
            np.testing.assert_allclose(got, want, rtol=1e-9)


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["proxal", "cproxal"])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_epigraph_losses_in_other_units_converge_to_cvxpy(name, scale, backend):
    prob, w = MODELS[name][0](scale)
    ref = prob.solve("cvxpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve(backend)
    assert res.status == "converged"
    assert abs(res.objective - ref.objective) <= RTOL * abs(ref.objective)
    assert np.linalg.norm(res.value(w) - ref.value(w)) <= RTOL * np.linalg.norm(ref.value(w))
