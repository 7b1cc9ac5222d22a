"""ProxAL's default inner solver (issue 27 item 2, "ProxAL in ≤ 100 round trips" with its
defaults): `ProxAL()` / `prob.solve("proxal")` takes federated Newton steps where they fit and
Algorithm 2 otherwise, by the rule `backend="auto"` reads (backends/proxal_inner.py), and says
which ran and why in `res.info["inner"]`. Answers against CVXPY. Before (main 5da04c1):
`ProxAL()` ran Algorithm 2 whatever the model (ridge n = 5: 25 round trips against Newton's 9)
and no result said which inner solver ran."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm
from benchmarks import bench_rounds
from fedmodel import cli
from fedmodel.backends import ProxAL, proxal_inner
from fedmodel.backends.proxal_newton import NewtonInner
from fedmodel.errors import FedModelError

from conftest import StopRun, stop_after
from test_checkpoint import _check_resume, _same


def trips(result) -> int:
    return int(result.info["communication"]["round_trips"])


def _solve(prob, backend, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # statuses are asserted
        return prob.solve(backend, **options)


@pytest.mark.integration      # (~1.5 s CPU: CVXPY and three solves)
def test_the_default_takes_newton_steps_where_they_fit():
    """ridge n = 5 (bench_rounds): the default is the very run of ProxAL(inner=NewtonInner()),
    verified, in fewer round trips than Algorithm 2 (measured 9 against 25)."""
    prob, w = bench_rounds.ridge(5)
    reference = _solve(prob, "cvxpy")
    default, named = _solve(prob, "proxal"), _solve(prob, ProxAL(inner=NewtonInner()))
    admm = _solve(prob, ProxAL(inner="admm"))
    assert default.info["inner"]["name"] == "newton" and default.status == "converged"
    assert default.info["inner"]["reason"].startswith("d = 10, 5 clients: a step's 14 dense d × d matrices fit")
    assert fm.verify(default, reference).ok
    assert trips(default) == trips(named) <= 12 < trips(admm)
    np.testing.assert_allclose(default.value(w), named.value(w), rtol=0, atol=1e-12)
    assert admm.info["inner"]["name"] == "admm" and fm.verify(admm, reference).ok
    assert named.info["inner"] == {"name": "newton", "reason": "inner=NewtonInner(max_steps=50) given"}


def test_algorithm_2_where_asked_for():
    """An Algorithm 2 option given (the user asked for the ADMM), inner="admm" or None, and
    `ProxAL.paper()` (the paper's Algorithm 2, pinned) run Algorithm 2; a bad name is refused."""
    prob, _ = bench_rounds.ridge(5)
    for backend, reason in ((ProxAL(rho=0.1, max_outer=1), "Algorithm 2's own options given (rho)"),
                            (ProxAL(anderson=5, q=0.3, max_outer=1), "Algorithm 2's own options given (anderson, q)"),
                            (ProxAL(inner=None, max_outer=1), "inner='admm' (or None) given"),
                            (ProxAL(inner="admm", max_outer=1), "inner='admm' (or None) given")):
        res = _solve(prob, backend)
        assert res.info["inner"]["name"] == "admm" and res.info["inner"]["reason"].startswith(reason), res.info["inner"]
    # options that are not Algorithm 2's own keep the default (β, ε, the outer cap)
    assert proxal_inner.choose(ProxAL(beta=100.0, tol=(1e-6, 1e-5), max_outer=5), prob)[0].__class__ is NewtonInner
    paper = ProxAL.paper()
    assert paper.inner is None and ProxAL().inner == "auto" and ProxAL(inner="newton").inner.__class__ is NewtonInner
    with pytest.raises(FedModelError, match="the paper's Algorithm 2"):
        ProxAL.paper(inner="newton")
    with pytest.raises(FedModelError, match="inner='auto' .*'newton', 'admm'"):
        ProxAL(inner="fista")
    # the β rule follows the inner that runs, unless given
    assert (ProxAL().beta_growth, ProxAL().with_inner(NewtonInner()).beta_growth) == (4.0, 100.0)
    assert ProxAL(beta_max=1e7).with_inner(NewtonInner()).beta_max == 1e7


@pytest.mark.integration      # (~1.4 s CPU: Algorithm 2 and CVXPY)
def test_algorithm_2_where_newton_steps_do_not_fit():
    """A client's λ‖w‖₂ term (no Newton sum for it): Algorithm 2, with the reason; verified."""
    rng = np.random.default_rng(2)
    u, prob = fm.Variable(3, name="u"), fm.Problem()
    for _ in range(3):
        A, b = rng.standard_normal((8, 3)), rng.standard_normal(8)
        prob.add_client().minimize(fm.sum_squares(A @ u - b) / 8 + 0.1 * fm.norm2(u))
    res = _solve(prob, "proxal")
    assert res.info["inner"]["name"] == "admm"
    assert res.info["inner"]["reason"].startswith("no Newton steps: a client's prox term other than λ‖w‖₁")
    assert res.status == "converged" and fm.verify(res, _solve(prob, "cvxpy")).ok


def test_a_refusal_at_the_first_subproblem_runs_algorithm_2(monkeypatch):
    """NewtonInner refusing at run time (forced): the default runs Algorithm 2 and says why; an
    explicit inner="newton" raises the refusal."""
    monkeypatch.setattr(NewtonInner, "refusal", lambda self, ex: "forced by the test")
    prob, w = bench_rounds.ridge(5)
    res = _solve(prob, "proxal")
    assert res.status == "converged" and res.info["inner"]["name"] == "admm"
    assert res.info["inner"]["reason"] == "Newton steps refused (forced by the test): Algorithm 2 (consensus ADMM)"
    np.testing.assert_allclose(res.value(w), _solve(prob, ProxAL(inner="admm")).value(w), rtol=0, atol=1e-12)
    with pytest.raises(FedModelError, match="forced by the test"):
        _solve(prob, ProxAL(inner="newton"))


def test_a_direct_run_takes_the_default_too():
    """`Backend.run` (no verdicts) resolves the inner solver as `solve` does."""
    prob, _ = bench_rounds.ridge(5)
    outcome = ProxAL().run(prob)
    assert outcome.info["inner"]["name"] == "newton" and outcome.status == "converged"


@pytest.mark.integration      # (~5 s: three solves of each)
def test_resume_equals_uninterrupted_and_keeps_the_inner_that_wrote_it(tmp_path, monkeypatch):
    """The default's checkpoint resumes bit for bit; a checkpoint written by Algorithm 2 (Newton
    steps off when it was written: a fall-back, another executor) resumes with Algorithm 2."""
    prob, _ = bench_rounds.logistic_ball(5)
    reference = _check_resume(tmp_path, prob, ProxAL, stop_at=2)
    assert reference.status == "converged" and reference.info["inner"]["name"] == "newton"
    path = tmp_path / "admm.ckpt"
    with monkeypatch.context() as patched:
        patched.setattr(proxal_inner, "newton_reading", lambda problem, executor=None: (False, "off (the test)"))
        admm = prob.solve(ProxAL())
        with pytest.raises(StopRun):
            prob.solve(ProxAL(), checkpoint=path, callback=stop_after(2))
    assert admm.info["inner"]["name"] == "admm"
    resumed = prob.solve(ProxAL(), checkpoint=path, resume=True)
    assert resumed.info["inner"] == {"name": "admm", "reason": "the checkpoint resumed was written with inner='admm'"}
    _same(resumed, admm)


@pytest.mark.integration      # (~2 s: NP at 5 clients and CVXPY)
def test_cli_run_backend_proxal_verifies_and_says_which_inner_ran(capsys):
    assert cli.main(["run", "--backend", "proxal", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "proxal: converged" in out
    assert "  inner          newton: d = 30, 5 clients: a step's 14 dense d × d matrices fit" in out
    verdict = [line for line in out.splitlines() if line.startswith("verdict")]
    assert len(verdict) == 1 and verdict[0].endswith(": OK")
