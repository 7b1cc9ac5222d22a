"""Issue 25 item 4: no stall verdict on a model CVXPY solves. DALD's stall rule read "no progress"
when the best residual of the last window was not 0.1 % below the best of the window before; a
slow, oscillating fall (the spectral rule with MG alone on Neyman-Pearson models CVXPY solves:
"stalled" at steps 52–91) read as none. It now reads each residual's rate from one window to the
next (`DALD._on_course`) and calls a run stalled only when neither could reach ε in
STALL_HORIZON × the steps run so far. Independent answers: the histories are built by hand, with
the shapes measured (docs/BENCHMARKS.md, branch daldstall2); the rates are computed here."""
from __future__ import annotations

import numpy as np
import pytest

from fedmodel.backends.dald import DALD
from fedmodel.backends.dald.backend import STALL_HORIZON
from test_dald_stall_feasible import _first_verdict, _records   # (violation: the multipliers' step)


def _main_rule_says_no_progress(history: list[dict], W: int) -> bool:
    """The rule this replaces (condition 2 of main's `_stall`): the best max(‖C‖∞, ‖Δμ‖/β) of the
    last window not 0.1 % below the best of the window before."""
    r = [max(h["primal_residual"], h["constraint_residual"]) for h in history[-2 * W:]]
    return min(r[W:]) >= (1.0 - 1e-3) * min(r[:W])


def test_a_slow_oscillating_fall_is_progress():
    """NP seed 3 under MG (measured): the consensus residual rises 0.42 → 0.50 over steps 40–80 and
    oscillates while the multipliers' step falls ∝ k^-0.45 (0.26 at 41, 0.18 at 91; it was still
    falling at 1,000). Main's rule said "stalled" at 64; the multipliers' step reaches ε = 1e-6 in
    ≈ 1,300 more steps at its rate there, within 100 × 64, so the run goes on."""
    k = np.arange(1, 301.0)
    constraint = 0.26 * (k / 41.0) ** -0.45 * (1.0 + 0.05 * np.sin(2 * np.pi * k / 15))
    primal = 0.42 + 0.08 * np.clip((k - 40) / 40, 0, 1) * (1.0 + 0.02 * np.sin(2 * np.pi * k / 7))
    history = _records(primal, constraint, [0.025] * 300)
    assert _main_rule_says_no_progress(history[:64], W=20)
    assert _first_verdict(DALD(), history) is None
    # the rate the rule reads at step 64 (windows 25–44 and 45–64), by hand
    logs = np.log(constraint[24:64])
    slope = (logs[20:].mean() - logs[:20].mean()) / 20
    need = (np.log(1e-6) - logs[20:].mean()) / slope
    assert 500 < need < STALL_HORIZON * 64


def test_a_fall_too_slow_to_finish_is_a_stall():
    """The same shape at a rate that could not reach ε in 100 × the run (the multipliers' step
    falling 1e-4 a step, relative: ≈ 130,000 steps from 0.3 to 1e-6) and a flat one, with the
    iterates settled (dual residual 1e-9): "infeasible" at the first pair of steady windows (40),
    and "stalled" with gd, which cannot tell a slow run from a settled one."""
    k = np.arange(1, 101.0)
    for constraint in (0.3 * (1 - 1e-4) ** k, np.full(100, 0.3)):
        history = _records([0.02] * 100, constraint, [1e-9] * 100)
        assert _first_verdict(DALD(), history) == (40, "infeasible")
        assert _first_verdict(DALD(solver="gd"), history) == (40, "stalled")


def test_a_residual_already_at_the_tolerance_is_not_progress():
    """An infeasible model whose consensus residual is already below ε (the clients agree on the
    least-violation point) and still falls: it says nothing of the constraints; the multipliers'
    step sits at 0.1, so the verdict comes."""
    k = np.arange(1, 41.0)
    history = _records(1e-7 * 0.9 ** k, [0.1] * 40, [1e-9] * 40)
    assert DALD()._stall(history) == "infeasible"
    history = _records(1e-2 * 0.9 ** k, [0.1] * 40, [1e-9] * 40)     # above ε and falling fast
    assert DALD()._stall(history) is None


@pytest.mark.parametrize("period", [7, 20, 40])
def test_oscillations_around_a_geometric_fall_get_no_verdict(period):
    """A slow fall (×0.65 in 250 steps, the client hyperplanes' pace) with the residuals swinging
    ±40 % around it, at periods up to the first windows' span (40): no verdict in 1,000 steps.
    (A rise that lasts both windows — a period of 100 or more at step 40 — reads as one here;
    on the hyperplanes themselves condition 1 holds the verdict: their multipliers' step comes
    and goes.)"""
    k = np.arange(1, 1001.0)
    constraint = 0.04 * 0.65 ** (k / 250) * (1.0 + 0.4 * np.sin(2 * np.pi * k / period))
    history = _records(0.5 * constraint, constraint, 0.1 * constraint)
    assert _first_verdict(DALD(), history) is None
