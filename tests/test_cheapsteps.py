"""Cheaper Newton steps on the default path (issue 27 item 3): the line search's shorter steps'
values ride along only after a full Newton step that fell short of its quadratic model (a full
step that decreased ℓ by more than the model said is as good a sign as one on the model); a
subproblem's first line search asks them."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import ProxAL
from fedmodel.backends.proxal_newton import CONFIDENT, NewtonInner


def _neyman_pearson(seed: int = 0, n: int = 3, d: int = 5, rows: int = 40):
    """Mean logistic losses on class 0 with a client constraint on class 1's (Neyman-Pearson):
    from w = 0 the AL term's Newton steps decrease ℓ ~1.2× more than their model says."""
    rng = np.random.default_rng(seed)
    w, prob = fm.Variable(d, name="w"), fm.Problem(name="np")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(rng.standard_normal((rows, d)) + 1.0, name="X0") @ w)) / n)
        c.subject_to(fm.mean(fm.logistic(-c.data(rng.standard_normal((rows, d)) - 1.0, name="X1") @ w)) <= 0.3)
    prob.server.minimize(1e-3 * fm.sum_squares(w))
    return prob, w


def _spied(monkeypatch, shorten: float | None = None) -> list:
    """Each line search's (trial values asked, its full step's ratio), "sub" at each subproblem;
    `shorten`: the first line search reports that ratio instead of its own."""
    seen: list = []
    line_search, subproblem = NewtonInner._line_search, NewtonInner.solve_subproblem

    def spy(self, *args, **kwargs):
        found = line_search(self, *args, **kwargs)
        if shorten is not None and not any(isinstance(s, tuple) for s in seen) and found is not None:
            found = (shorten, *found[1:])
        seen.append((args[-1] if len(args) > 9 else kwargs.get("trials", True), None if found is None else found[0]))
        return found

    def sub(self, *args, **kwargs):
        seen.append("sub")
        return subproblem(self, *args, **kwargs)
    monkeypatch.setattr(NewtonInner, "_line_search", spy)
    monkeypatch.setattr(NewtonInner, "solve_subproblem", sub)
    return seen


def _asked_after(seen: list) -> list[tuple[float, bool]]:
    """(the last full step's ratio, whether the next line search asked the trial values) within
    each subproblem."""
    pairs, last = [], None
    for entry in seen:
        if entry == "sub":
            last = None
            continue
        if last is not None:
            pairs.append((last, entry[0]))
        last = entry[1]
    return pairs


def _assert_cvxpy(prob, w, res):
    ref = prob.solve("cvxpy")
    assert res.status == "converged", res.status
    np.testing.assert_allclose(res.value(w), ref.value(w), atol=1e-4 * max(1.0, np.abs(ref.value(w)).max()))


@pytest.mark.integration      # (~1 s: a Newton run and CVXPY)
def test_a_full_step_beyond_its_model_asks_no_shorter_steps(monkeypatch):
    prob, w = _neyman_pearson()
    seen = _spied(monkeypatch)
    res = prob.solve(ProxAL(inner=NewtonInner()))
    _assert_cvxpy(prob, w, res)
    pairs = _asked_after(seen)
    beyond = [asked for ratio, asked in pairs if ratio is not None and ratio > 1.0 + CONFIDENT]
    assert len(beyond) >= 5 and not any(beyond), pairs       # (main: each of them asked)
    # each subproblem's first line search alone (3 of 14; main: 13 of 14)
    firsts = [seen[i + 1] for i, s in enumerate(seen[:-1]) if s == "sub" and seen[i + 1] != "sub"]
    assert sum(asked for asked, _ in (s for s in seen if s != "sub")) == len(firsts), seen


def test_a_full_step_short_of_its_model_still_asks_them(monkeypatch):
    """A full step whose decrease was half its model's: the next line search asks the shorter
    steps' values in its first message."""
    prob, w = _neyman_pearson()
    seen = _spied(monkeypatch, shorten=0.5)
    prob.solve(ProxAL(inner=NewtonInner()))
    searches = [s for s in seen if s != "sub"]
    assert searches[0][1] == 0.5 and searches[1][0] is True, searches
