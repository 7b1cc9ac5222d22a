"""`info["violated"]` names what the user wrote, in its own units (issue 25; BENCHMARKS, the
lead's 15:40 section): an epigraph copy's slack rows are reported as the client loss they
rewrite, and an affine set scaled row by row (`set_scaling.unit_row`) reports its violation in
the constraint's units, not the equilibrated copy's — the same model in other units reads the
same relative number."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import ProxAL

from test_epigraph_units import hinge, pinball

A = np.array([[1e3, 1e3, 0, 0, 0, 0], [0, 0, 1e-3, 1e-3, 0, 0], [0, 0, 0, 0, 1.0, -1.0]])


def rows_apart(scale: float):
    """Least squares over 3 clients with a server subspace A w = b (rows 1e6 apart in norm) that
    c0's exact fit X₀ w = X₀ w° contradicts: infeasible only jointly. Data, A and b ×scale."""
    rng = np.random.default_rng(3)
    truth = rng.normal(size=6)
    w, prob = fm.Variable(6, name="w"), fm.Problem("rows-apart")
    for i, m in enumerate((8, 30, 300)):
        X = rng.normal(size=(m, 6))
        y = X @ truth + 0.1 * rng.normal(size=m)
        c = prob.add_client()
        c.minimize(fm.sum_squares(c.data(X * scale) @ w - c.data(y * scale)) / 338)
        if i == 0:
            c.subject_to(c.data(X[:6] * scale) @ w == c.data(X[:6] @ truth * scale))
    b = (A * scale) @ (truth + 0.5)
    prob.server.subject_to((A * scale) @ w == b)
    return prob, w, b


def _server_row(result) -> tuple[str, float]:
    (key, value), = [(k, v) for k, v in result.info["violated"].items() if k.startswith("server.con0")]
    return key, value


@pytest.mark.parametrize("backend", [
    "dald", pytest.param(ProxAL(inner="admm"), id="proxal", marks=pytest.mark.integration),
    # (under Newton steps β rises ×100 an outer iteration, and the multipliers' step βc with it:
    # the divergence watch called the infeasible model "diverged" before the verdict could read it)
    pytest.param("proxal", id="proxal-default", marks=pytest.mark.integration),
    pytest.param("auto", id="auto", marks=pytest.mark.integration)])
def test_an_affine_set_scaled_per_row_reports_its_own_units(backend):
    """The subspace's violation is max_k |a_k·w − b_k| at the returned point, in its units: ÷scale
    the same number at ×1e-6, 1 and 1e6 (it read 1e5, 0.1, 1e-7 of it: the copy's units)."""
    relative = []
    for scale in (1e-6, 1.0, 1e6):
        prob, w, b = rows_apart(scale)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = prob.solve(backend)
        assert res.status in ("infeasible", "stalled")
        key, value = _server_row(res)
        assert value == pytest.approx(float(np.max(np.abs((A * scale) @ res.value(w) - b))), rel=1e-9)
        assert key == repr(prob.server.constraints[0])       # the user's form, not the copy's
        quoted = res.info.get("infeasible") or res.info.get("stalled")
        assert f"{key} (by {value:.3g})" in quoted or f"{key} by {value:.3g}" in quoted
        relative.append(value / scale)
    assert relative == pytest.approx([relative[1]] * 3, rel=1e-3)


@pytest.mark.integration       # (~2 s: SCS twice, with CVXPY's import)
def test_cvxpy_stalled_on_the_epigraph_copy_names_the_losses():
    """SCS stopped early (eps 0.3) on the pinball's epigraph copy: "stalled" (its slack rows
    violated). info["violated"] names each client's loss (not `c1.epigraph0[1]`), its violation
    in the loss's units (the slack below its rows): ÷scale the same at ×1 and ×1e6."""
    found = {}
    for scale in (1.0, 1e6):
        prob, w = pinball(scale)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = prob.solve("cvxpy", solver="SCS", eps_abs=0.3, eps_rel=0.3)
        assert res.status == "stalled"
        violated = res.info["violated"]
        for key in violated:     # (each pinball term is two losses, τ·pos(r) and (1−τ)·pos(−r))
            client, _, rest = key.partition(" loss: ")
            assert client in {"c0", "c1", "c2"} and "* pos(" in rest and f"{client}_data0" in rest, key
        assert next(iter(violated)) in res.info["stalled"] and "epigraph0[" not in res.info["stalled"]
        found[scale] = {key.split(" loss: ")[0] + key.rpartition("slack")[2]: value / scale
                        for key, value in violated.items()}
    assert found[1.0].keys() == found[1e6].keys()
    for key, value in found[1.0].items():
        assert found[1e6][key] == pytest.approx(value, rel=1e-3)


def test_a_stall_on_slack_rows_names_the_hinge_loss():
    """cProx-AL with β_max = 1 cannot hold the hinge's slack rows ("stalled", feasible): the
    violated entries are the clients' hinge losses, the slack named beside them."""
    prob, _ = hinge(1e3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve("cproxal", beta=0.1, beta_max=1.0)
    assert res.status == "stalled"
    names = {str(t) for c in prob.clients for t in c.terms}
    assert res.info["violated"]
    for key in res.info["violated"]:
        client, _, rest = key.partition(" loss: ")
        assert client in {"c0", "c1", "c2"} and any(rest.startswith(n) for n in names), key
        assert f"{client}.epigraph" in rest
