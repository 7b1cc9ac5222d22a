"""What an unconverged DALD run says about itself (a mixin of `DALD`): the constraints an
infeasible / stalled run violates (`_stall_report`), how far the stop test still is at the cap
and which residual holds it back (`_cap_report`), and the clients that were away
(`_absent_report`). Messages only: no status is changed here.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from ..base import violated_constraints
from ..outcome import Outcome, Status
from ..watch import rounds_to_tol

# the residuals of the outer stop test (`DALD._converged`), by history key: (what it measures,
# which ε it is held to)
STOP_PARTS = {"primal_residual": ("the consensus residual ‖C‖∞ (clients apart from the model)", "eps_primal"),
              "dual_residual": ("the model's step ‖D‖∞", "eps_dual"),
              "constraint_residual": ("the constraints' multiplier step ‖Δμ‖/β", "eps_primal")}
SWING_SPAN, SWING = 20, 10.0   # adaptive ρ "still swinging": 2ρ² over its last SWING_SPAN changing steps spans > ×SWING
AWAY = 10                      # an absence of at least this many inner steps (and 5 % of the run) is named


class Reports:
    """The DALD backend's end-of-run messages (options live in `DALD`)."""

    def _stall_report(self, problem, status: str, values: dict, info: dict, k: int) -> None:
        """For an infeasible / stalled run: the violated constraints by name (at the returned
        point, the least-violation point found) in info["violated"], a message and a warning."""
        if status not in (Status.INFEASIBLE, Status.STALLED):
            return
        violated = violated_constraints(problem, values, tol=self.eps_primal)
        what = ("the model looks infeasible (the iterates settled while the multipliers grow)"
                if status == Status.INFEASIBLE else "no progress while the multipliers grow")
        if getattr(self, "_has_point", False):       # (`DALD._stall`: never "infeasible" then)
            what += (", on a feasible model (its constraints are sets that read no client data and "
                     "have a common point): its multipliers may need to be very large — raise rho, "
                     "or prob.solve('proxal')")
        info["violated"] = violated
        info[status] = (f"DALD stopped at outer iteration {k}: the consensus / constraint residuals "
                        f"did not improve over {2 * self._stall_span(k)} outer iterations — {what}. "
                        f"Violated at the point returned: "
                        + (", ".join(f"{n} (by {v:.3g})" for n, v in violated.items()) or "none")
                        + ". Check these constraints together (and against the other clients' "
                        "constraints: the model variables are shared), or pass stall_window=None")
        warnings.warn(info[status], RuntimeWarning, stacklevel=4)

    def _absent_report(self, problem, outcome: Outcome) -> None:
        """A run not converged while a client took no part in its last quarter of the steps says
        so (newuser4: a client gone from step 5 left DALD at its cap 0.72 away, no word of it);
        so does one that was away for a stretch and came back (`AWAY`; nu4: s0 away for steps
        5–59 left the run at its cap 2.6e-3 away, adaptive ρ fixed mid-swing at step 200)."""
        seen, total = getattr(self, "_last_seen", {}), len(outcome.history) and outcome.history[-1].get("inner_total", 0)
        if not seen or total < 20 or outcome.status == Status.CONVERGED:
            return
        gone = [f"{c.name} ({_last_seen(seen.get(c.name, -1))})" for c in problem.clients if seen.get(c.name, -1) < 0.75 * total]
        notes = [f"client(s) {', '.join(gone)} took no part in the last steps of {total}: the point lacks their data"] if gone else []
        away = getattr(self, "_away", {})
        back = [f"{c.name} (steps {away[c.name][0]}–{away[c.name][1]})" for c in problem.clients
                if c.name in away and seen.get(c.name, -1) >= 0.75 * total
                and away[c.name][1] - away[c.name][0] + 1 >= max(AWAY, 0.05 * total)]
        if back:
            notes.append(f"client(s) {', '.join(back)} took no part for a stretch of the {total} steps and came "
                         "back: the run had not recovered from the absence by its end")
        if notes:
            note = "; ".join(notes)
            outcome.info["absent"] = outcome.info[outcome.status.value] = note + "; " + outcome.info.get(outcome.status.value, "")
            warnings.warn(f"DALD ended {outcome.status.value}: {note}", RuntimeWarning, stacklevel=4)

    def _cap_report(self, history: list[dict], info: dict) -> None:
        """At the cap: how far the stop test still is, by the run's own rate (`watch.rounds_to_tol`
        on the stop test's residuals — consensus, the model's step and the constraints'
        multiplier step — best of the last half against the quarter before), which of them is
        furthest from its ε, and (`_swing`) whether adaptive ρ was fixed mid-swing, in
        info["max_iterations"]. The flat NP model in mixed units (tests/test_np_convergence.py)
        was 2e-2 away at 1,000 iterations and converged, verified, at 3,590; this read 3,290."""
        eps, k = min(self.eps_primal, self.eps_dual), len(history)
        # (DALD's own records only: its special cases keep others; a short cap or ε = 0 — a run
        # the user chose to end at its cap — has nothing to read)
        if self.name != "dald" or k < 40 or eps <= 0.0 or \
                any("primal_residual" not in h or "dual_residual" not in h for h in history):
            return
        # all three, as the stop test needs them: with the consensus and D alone the clients'
        # slow constraint multipliers went unread (examples/centralized_form.py: "about 1,950
        # iterations, pass 3000", still 1.5e-2 away at 3,000, its ‖Δμ‖/β 8.7e-3 at the cap)
        trace = [max(h["primal_residual"], h["dual_residual"], h.get("constraint_residual", 0.0)) for h in history]
        total, recent, before = rounds_to_tol(trace, eps)
        where = f"over outer iterations {k // 4}..{k} their best fell from {before:.3g} to {recent:.3g}"
        slowest = max(STOP_PARTS, key=lambda key: history[-1].get(key, 0.0) / getattr(self, STOP_PARTS[key][1]))
        what = (f"; the furthest from its ε is {STOP_PARTS[slowest][0]}, {history[-1][slowest]:.3g} at the last step")
        if slowest == "constraint_residual":
            beta = self._dc_beta() if info.get("mode") == "dc" else self._beta()
            what += (f" (DALD keeps the constraints in an augmented Lagrangian with a fixed penalty "
                     f"beta={beta:g}: a larger beta moves their multipliers faster)")
        info["max_iterations"] = (
            f"DALD reached max_iterations={self.max_iterations} with its residuals above "
            f"ε = {eps:g}; {where}{what}; " + self._swing(history) + (
                f"a rate that meets ε after about {total:,.0f} outer iterations in all: pass "
                f"max_iterations={int(math.ceil(1.25 * total / 1000.0)) * 1000} to run on, or use "
                "prob.solve('proxal')" if total <= 10 * k else
                (f"a rate that meets ε only after about {total:,.0f} outer iterations"
                 if math.isfinite(total) else "so more iterations will not get there at this rate")
                + ": use prob.solve('proxal') (or check the model's scaling)"))

    def _swing(self, history: list[dict]) -> str:
        """"" unless adaptive ρ (Fed-DALD-CC's records carry its weight 2ρ², "weight") stopped
        moving (its window `cc.ADAPT_UNTIL` closed, or its estimates stopped correlating) while
        still swinging: its last SWING_SPAN changes span more than ×SWING. The rate after that
        depends on where the swing stopped (nu4's abalone run with a client away: fixed
        at 2ρ² = 14, the same run with every client settled near 0.01 and converged)."""
        weights = np.array([h.get("weight", np.nan) for h in history], float)
        if not self.adaptive_rho or not np.all(np.isfinite(weights)) or np.all(weights == weights[0]):
            return ""
        changed = np.flatnonzero(np.diff(weights)) + 1          # the steps whose weight is new
        last = int(changed[-1])
        if last >= len(weights) - 1:                              # still adapting at the end
            return ""
        first = int(changed[max(0, len(changed) - SWING_SPAN)])
        span = weights[first - 1:last + 1]
        if span.max() <= SWING * span.min():
            return ""
        return (f"adaptive ρ last moved at outer iteration {last + 1}, still swinging (2ρ² spanned "
                f"×{span.max() / span.min():.3g} over outer iterations {first}..{last + 1}; fixed at {weights[last]:.3g}, "
                f"×{weights[last] / weights[0]:.3g} of its start): the pace since depends on where it stopped; ")


def _last_seen(step: int) -> str:
    """Where a client was last seen, in words (step −1: never took part)."""
    return f"last at step {step}" if step >= 0 else "never took part"
