"""DALD's stall rule (`StallRule`, a mixin of `DALD`): when the history of a constrained run shows
the augmented-Lagrangian signature of an infeasible model — or of a run that no longer moves — and
nothing else, it says "infeasible" / "stalled" (not in the paper; `stall_window=None`: off)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..outcome import Status


# the stall rule's horizon (`DALD._on_course`): a residual that falls at a rate reaching ε within
# this many times the steps run so far is progress. Measured on stall-free histories (bench_verdicts'
# 60 models and the DALD reproducers, the spectral rule as it is and with MG alone; docs/BENCHMARKS.md,
# branch daldstall2): MG's NP models CVXPY solves (the multipliers' step ∝ k^-0.45) were "stalled"
# at 10 (7 runs) and 30 (1); 50 was the least that called none of them; 100 for a margin
STALL_HORIZON = 100.0
# the stall rule's test 5: iterates still moving with the reported violation falling by this
# fraction over the last window (its least-squares trend in log scale) is progress (`_stall`)
VIOLATION_PROGRESS = 1e-3


def _log_trend(values: Sequence[float]) -> float:
    """The change of log(values) across the series by its least-squares line (positive values).

    >>> round(_log_trend([1.0, 0.9, 0.81]), 3)
    -0.211
    """
    return float(np.polyfit(np.arange(len(values)), np.log(values), 1)[0] * (len(values) - 1))


class StallRule:
    """`_stall(history)` for `DALD` (reads its `stall_window`, `eps_primal`, `solver`)."""

    def _stall_span(self, k: int) -> int:
        """The stall rule's window after `k` outer steps: `stall_window`, growing with the run
        (a quarter of it), so a long run is judged by its progress over a long stretch, not by
        the last few steps of an oscillation."""
        return max(int(self.stall_window), k // 4)

    def _stall(self, history: list[dict]) -> str | None:
        """"infeasible" / "stalled" when the run shows the augmented-Lagrangian signature of an
        infeasible model — the iterates settle at a least-violation point while the multipliers
        grow linearly — and nothing else, over the last two windows of `_stall_span(k)` steps
        (growing with the run):

        1. the constraint multipliers grow at every step of both windows: their step ‖Δμ‖/β
           (`constraint_residual`) stays above the tolerance and within a factor 2 of its
           largest value there (an infeasible run's settles at a constant; a feasible run's
           rises as a constraint turns active and falls again, or comes and goes);
        2. no progress: the best consensus / constraint residual max(‖C‖∞, ‖Δμ‖/β) of the last
           window is not 0.1 % below the best of the window before, and neither it nor the
           multipliers' step falls, from that window to the last, at a rate that would reach ε
           within STALL_HORIZON × the steps run so far (`_on_course`); and it stays well above
           the tolerance;
        3. the model's constraints are violated at every reported point of the last window;
        4. no client's own inequality multiplier fell in the last window (`unwinding`, Fed-DALD-CC:
           a constraint that holds at x_i but still acts; the residuals move again once it is 0);
        5. the iterates settled, or the violation's trend over the last window not falling
           (VIOLATION_PROGRESS). The cost (review14): an infeasible model whose iterates drift
           while its violation creeps down towards its least value gets its verdict late (two
           clients' bands 5 … 15 apart: at steps 442 … 949 instead of 41) or reaches its cap
           (20 apart: max_iterations) — slower, and still no "converged".

        A feasible model whose residuals oscillate (adaptive ρ, a constraint turning active)
        fails 1, 3 or 4 and runs on; one whose residuals fall slowly and oscillate, 2's rate.
        "infeasible" also needs the iterates settled and exact local solves; with gd / prox-grad
        a slow run looks the same, so it says "stalled"; so does a model whose sets meet
        (`compiler.feasibility.feasible_by_its_sets`): a strong ridge against one hyperplane at
        λ = 1e5 needs a multiplier ~2λ, whose slow growth reads as this signature (newuser8)."""
        if self.stall_window is None:
            return None
        W = self._stall_span(len(history))
        if len(history) < 2 * W:
            return None
        span = history[-2 * W:]
        floor = max(100.0 * self.eps_primal, 1e-6)
        # 1 over both windows, so the baseline of 2 is a step where the multipliers already grew
        # steadily: a constraint that turns active leaves a small residual before its multiplier
        # builds up (Neyman-Pearson on a complete graph: 0.0022 at step 25 against 0.0052 at
        # 29–48 read as "stalled" at 48; converged, verified, at 312), and a start transient's
        # (a box model CVXPY solves read 0.025 at step 2 against 0.042 at 21–40)
        steps = [h["constraint_residual"] for h in span]
        if min(steps) <= floor or min(steps) < 0.5 * max(steps):
            return None
        # 2: the best points and the rates each see progress the other misses — a slow, oscillating
        # fall (NP models CVXPY solves under MG alone: the multipliers' step falling ∝ k^-0.45 while
        # the best max residual rose, "stalled" at 52–91 on the best points alone) and the client
        # hyperplanes at 49 (the best point 3 % lower, the windows' means level: "stalled" on rates
        # alone). Not the consensus residual's own rate: on an infeasible model it falls to ε
        # while the multipliers' step sits at the least violation (a verdict 19 steps later)
        r = [max(h["primal_residual"], h["constraint_residual"]) for h in span]
        before, recent = min(r[:W]), min(r[W:])
        if recent < (1.0 - 1e-3) * before or recent <= floor or \
                self._on_course(r, W, len(history)) or self._on_course(steps, W, len(history)):
            return None
        # a client's multiplier that fell in the window (a constraint that holds at x_i but still
        # acts, `local.unwinding`) lets go when it reaches 0 and the residuals move again: a box
        # model CVXPY solves sat 400 steps at 0.025 while one fell 0.05 a step from 22 to 0 and
        # was "stalled" at step 133 (Fed-DALD-CC); the window after it is the test
        if max(h.get("unwinding", 0.0) for h in history[-W:]) > floor:
            return None
        reported = [h["violation"] for h in history[-W:] if np.isfinite(h["violation"])]
        if not reported or min(reported) <= floor:
            return None
        settled = max(h["dual_residual"] for h in history[-W:]) <= 1e-3 * recent
        # iterates still moving with the violation's trend over the last window falling is
        # progress, however slow: a multiplier that must grow large (wine's client bands
        # mean(X_i w) ≥ 10 and ≤ 0, ‖w*‖ 75) climbs at β·violation a step — the signature above —
        # while the violation wobbles down ~1 % a window: "stalled", "may be infeasible" at step
        # 41 (newuser13; CVXPY solves it). An infeasible run's iterates settle
        if not settled and len(reported) > 1 and _log_trend(reported) < -VIOLATION_PROGRESS:
            return None
        infeasible = settled and self.solver not in ("gd", "prox-grad") and not getattr(self, "_has_point", False)
        return Status.INFEASIBLE if infeasible else Status.STALLED

    def _on_course(self, residuals: Sequence[float], W: int, k: int) -> bool:
        """Whether `residuals` (two windows of W steps, after k steps in all) fall at a rate that
        reaches ε_pri within STALL_HORIZON·k more steps: the ratio of the windows' geometric means
        (a rate over the whole stretch, not the best point of each: an oscillation's dips are no
        baseline) extrapolated geometrically (the caller's residuals are all above ε_pri)."""
        if self.eps_primal <= 0:     # (ε = 0 is allowed: no rate reaches it)
            return False
        logs = np.log(np.asarray(residuals, float))
        now, slope = float(np.mean(logs[W:])), float(np.mean(logs[W:]) - np.mean(logs[:W])) / W
        target = np.log(self.eps_primal)
        return slope < 0.0 and (target - now) / slope <= STALL_HORIZON * k
