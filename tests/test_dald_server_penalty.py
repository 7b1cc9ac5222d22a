"""The penalty of constraints held by an augmented Lagrangian rises while their violation does not
fall, on models known to have a point (issue 27 item 2, branch daldbeta): DALD's server penalty
β_s (`backends.dald.penalty.ServerPenalty`) and cProx-AL's β past its default beta_max
(`proxal_outer.beta_cap`). The strong ridge beside a hyperplane (tests/test_feasible_not_infeasible.py)
converges with them; a β the user gives stays as given."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedmodel import backends
from fedmodel.backends.dald.penalty import SERVER_CAP, SERVER_EVERY, SERVER_RAISE, ServerPenalty

from test_checkpoint import _check_resume
from test_feasible_not_infeasible import _point, _ridge_hyperplane


def _fed(penalty: ServerPenalty, violations) -> None:
    for v in violations:
        penalty.read(penalty.beta * v)


def test_a_violation_that_does_not_halve_raises_the_server_penalty():
    """Raised after SERVER_EVERY steps of a violation that fails to halve, above the tolerance
    and the consensus residual; then not again before SERVER_EVERY more steps; never when
    inactive, when the violation halves, or when the consensus residual is the larger."""
    p = ServerPenalty(2.0, True)
    _fed(p, [0.5] * SERVER_EVERY)
    assert not p.slow(SERVER_EVERY, 1e-6, 1e-6)             # one window: not judged yet
    _fed(p, [0.5])
    k = SERVER_EVERY + 1
    assert p.slow(k, 1e-6, 1e-6)
    assert not p.slow(k, 1.0, 1e-6)                          # the consensus residual is the larger
    assert not p.slow(k, 1e-6, 1.0)                          # at the tolerance
    assert p.raise_at(k) == 2.0 * SERVER_RAISE and p.read(p.beta * 0.5) == pytest.approx(2.0 * 0.5)
    assert not p.slow(k + 1, 1e-6, 1e-6)                     # too soon after the raise
    _fed(p, [0.2] * SERVER_EVERY)
    assert not p.slow(k + 1 + SERVER_EVERY, 1e-6, 1e-6)      # it fell below half: the raise works
    off = ServerPenalty(2.0, False)
    _fed(off, [0.5] * (SERVER_EVERY + 2))
    assert not off.slow(SERVER_EVERY + 2, 1e-6, 1e-6)
    capped = ServerPenalty(2.0, True)
    capped.beta = 2.0 * SERVER_CAP
    _fed(capped, [0.5] * (SERVER_EVERY + 2))
    assert not capped.slow(SERVER_EVERY + 2, 1e-6, 1e-6)


def test_a_given_beta_is_not_raised():
    """DALD(beta=2) — the default's β₀, given — keeps it: "stalled" as before at λ = 1e5, where the
    default raises β_s and converges; cProx-AL with beta_max=1e4 given: "stalled" at λ = 1e7."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prob, w, b, z = _ridge_hyperplane(1e5)
        assert prob.solve(backends.DALD(beta=2.0)).status == "stalled"
        res = prob.solve("dald")
        assert res.status == "converged" and np.max(np.abs(_point(res, w, b) - z)) <= 1e-4 * np.max(np.abs(z))
        prob, w, b, z = _ridge_hyperplane(1e7)
        assert prob.solve(backends.CentralizedProxAL(beta_max=1e4)).status == "stalled"


def test_sets_apart_keep_the_infeasible_verdict():
    """Server constraints with no common point: the rule stays off (the sets do not meet), and the
    run ends "infeasible" as before, never "converged"."""
    import fedmodel as fm
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    for k in range(3):
        c = prob.add_client()
        c.minimize(fm.sum_squares(w - float(k)))
    prob.server.subject_to(w[0] + w[1] == 2.0, w[0] + w[1] == -2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert prob.solve("dald").status == "infeasible"
        assert prob.solve("cproxal").status == "infeasible"


def test_dald_resume_after_server_penalty_raises_equals_uninterrupted(tmp_path):
    """A checkpoint taken after β_s rose (a setting the node states leave out) resumes bitwise like
    the uninterrupted run."""
    prob, w, b, z = _ridge_hyperplane(1e5)
    ref = _check_resume(tmp_path, prob, lambda: backends.DALD(), stop_at=12, every=5)
    assert ref.status == "converged"
