"""The verdicts of ProxAL's and cProx-AL's outer loop (`proxal_outer.outer_stop`): "infeasible",
"stalled" or "unbounded", read from the outer records, and the ceiling of β's rise they read
(`beta_cap`), which a model known to have a point lifts."""
from __future__ import annotations

import warnings

import numpy as np

from .outcome import Status
from .proxal_admm import MULTIPLIER_LIMIT, needed_multipliers

STALL_OUTER = 3       # outer iterations at β_max with a flat violation: infeasible (see verdict)
UNBOUNDED_OUTER = 5   # outer iterations of equal objective decrease and step: unbounded
RUNAWAY_OUTER = 6     # outer iterations of outward steps that the distance read does not explain: no minimizer
FLAT = 1e-3          # (`runaway` without readings) the objective's fall, relative, over its window
RUNAWAY = ("the iterates kept moving outward (‖w‖ growing) while the objective kept decreasing and "
           "its Hessian went singular to round-off: the objective has no minimizer (separable data, a "
           "loss with no ridge?) — add a ridge (λ‖w‖²) or a bound on w")      # ("diverged": `runaway`, proxal_outer's message)

# β's cap on a violation that does not fall, on a model known to have a point (`beta_cap`), over beta_max:
# cProx-AL on a ridge λ‖w‖² against w0 + w1 = 2 (its multiplier ~2λ) needed β ≈ 1e8 at λ = 1e7 and
# ~1e13 in units ×1e-3 (λ ×1e6 beside the loss), where β_max = 1e4 read as "infeasible"
# (docs/BENCHMARKS.md, branch daldbeta)
FEASIBLE_HEADROOM = 1e12


def beta_cap(backend) -> float:
    """The ceiling of β's rise on a violation that does not fall: `beta_max`, or FEASIBLE_HEADROOM
    times it where the backend knows the model has a point (`known_feasible`: cProx-AL with its
    default beta_max on constraints that are sets that meet, `feasible_by_its_sets`). There a
    violation that stays is a penalty too weak for the multiplier a solution needs (a strong
    objective pulling against the constraint), never an infeasible model's least violation."""
    return backend.beta_max * (FEASIBLE_HEADROOM if getattr(backend, "known_feasible", False) else 1.0)


def slow_rise_cap(backend, history: list[dict]) -> float:
    """The ceiling of β's rise on slow outer steps (`proxal_outer.next_beta`): `beta_max`, or the
    inner's lower one (`NewtonInner.slow_rise_cap`: 1e7 where the summed Hessian was singular —
    no β bends a flat direction, and at large β the Newton steps wander along it: NP monks-1
    n = 40, 109 round trips) — but `beta_max` while the iterates run outward (`_outward`), so
    that `runaway` still tells a model with no minimizer (a9a's one-class clients)."""
    inner_cap = getattr(getattr(backend, "inner", None), "slow_rise_cap", None)
    if inner_cap is None or _outward(history, getattr(backend, "eps2", 0.0)) is not None:
        return backend.beta_max
    return min(backend.beta_max, inner_cap())


def verdict(history: list[dict], growth: float, beta_max: float, eps1: float, eps2: float,
            feasible: bool = False) -> str | None:
    """The verdict on a run from its outer records: "infeasible", "stalled", "unbounded" or None.

    Infeasible: β has reached β_max (or the multipliers a solution would need are above
    MULTIPLIER_LIMIT: `needed_multipliers`) and over the last STALL_OUTER outer iterations the
    largest violation fell by less than 1 % in each,
    or fell by drops shrinking geometrically towards a limit (`_positive_limit`) at least 0.9×
    the violation, while staying above ε2 — the multipliers then grow by β_k·violation per iteration, faster
    and faster, which a feasible model's method of multipliers needs only when its optimal
    multipliers are huge (nearly infeasible: then it can be premature; BENCHMARKS.md, pxinfeas).
    Stalled: at β_max for 3·STALL_OUTER iterations, the violation still above ε2 but
    falling by less than 2× over them. Unbounded: for UNBOUNDED_OUTER outer iterations, feasible,
    the objective fell by at least 0.9× the previous decrease (and by more than ε1) while the
    iterate moved at least 0.9× the previous distance — a proximal point step on a convex model
    only keeps its length when the model has no minimizer — and over them the objective fell by
    more than its own size (and at least 1): a loss bounded below whose infimum is not attained
    (logistic regression on separable data) keeps its steps too, but its decreases are small.
    `feasible`: the model is known to have a point, so large multipliers tell nothing (β_max alone)."""
    if growth > 1 and len(history) > STALL_OUTER and (history[-1]["beta"] >= beta_max or not feasible
                                                      and needed_multipliers(history) >= MULTIPLIER_LIMIT):
        recent = [r["violation"] for r in history[-STALL_OUTER - 1:]]
        # (not from a violation that unsolved subproblems sent up: at β_max NP monks-1 n = 40 under
        # Algorithm 2, feasible, rose 1e-7 → 2e-3 in two outer iterations, certificate 327 against
        # τ 4e-7; a violation that stays — balls apart — is read whether solved or not)
        unsolved = bool(_unsolved(history[-STALL_OUTER:]))
        blown_up = unsolved and recent[-1] > 10 * min(recent)
        if not blown_up and recent[-1] > eps2 and (all(b > 0.99 * a for a, b in zip(recent, recent[1:]))
                                               or _positive_limit(recent) > max(eps2, 0.9 * recent[-1])):
            return Status.INFEASIBLE
        window = history[-3 * STALL_OUTER - 1:]
        if len(window) > 3 * STALL_OUTER and all(r["beta"] >= beta_max for r in window[1:]) \
                and recent[-1] > max(eps2, 0.5 * window[0]["violation"]):
            return Status.STALLED
    if len(history) > UNBOUNDED_OUTER:
        window = history[-UNBOUNDED_OUTER - 1:]
        drops = [a["objective"] - b["objective"] for a, b in zip(window, window[1:])]
        steps = [r["primal_change"] for r in window]
        if all(r["violation"] <= eps2 for r in window) and min(drops) > eps1 \
                and sum(drops) > max(1.0, abs(window[0]["objective"])) \
                and all(b >= 0.9 * a for a, b in zip(drops, drops[1:])) \
                and all(b >= 0.9 * a > 0 for a, b in zip(steps[1:], steps[2:])):
            return Status.UNBOUNDED
    return None


def runaway(history: list[dict], eps2: float) -> bool:
    """The iterates run away from a model with no minimizer (logistic regression without a ridge
    on quasi-separable data: the objective falls towards an infimum it never reaches as ‖w‖ → ∞),
    told only where the Newton reading has nothing to say: over the last RUNAWAY_OUTER outer
    iterations, feasible (violation ≤ ε2, no multiplier moved), the objective never rose and
    ‖w‖₂ grew by at least half the length of the steps (outward), no reading exists (a summed
    Hessian singular to round-off), the last step was at least the first, ‖w‖₂ grew by at least
    10 % and the objective fell by at most FLAT of itself (a9a's one-class clients: ‖w‖ 74 → 93
    in steps 4.8, 13, 4.7, 7.7, the objective by 2e-5 of itself, then a standstill at τ_k ~ 1e-9,
    which the older tests called "converged").
    Where a reading exists, a receding answer (steps beyond the distance read while its
    curvature falls) is also what a far minimizer behind a smooth collapse of the curvature
    looks like (the review's 1e-7/2 (w + 3)² + 1e-4 logistic(1e3 (w + 1))², answer −3: "diverged"
    at −1.009), so there the run goes on and `hints` says at its cap that it may have no minimizer.
    Read under Newton steps only (`proxal_outer.outer_stop`): Algorithm 2's `finish` jumps
    outward to a far answer too (a column 1000 ± 1 beside an intercept, ‖w*‖ = 461)."""
    window = _outward(history, eps2)
    if window is None or any(np.isfinite(r.get("newton_distance", np.inf)) for r in (window[0], window[-1])):
        return False
    moved = [r["step"] for r in window[1:] if r["step"] > 0]
    return moved[-1] >= moved[0] and window[-1]["size"] >= 1.1 * window[0]["size"] \
        and window[0]["objective"] - window[-1]["objective"] <= FLAT * abs(window[-1]["objective"])


def _outward(history: list[dict], eps2: float) -> list[dict] | None:
    """The last RUNAWAY_OUTER + 1 records where over them, feasible and with no multiplier
    moved, the objective never rose and ‖w‖₂ grew by at least half the steps' length; else None."""
    window = history[-RUNAWAY_OUTER - 1:]
    if len(window) <= RUNAWAY_OUTER or any(r["violation"] > eps2 or r.get("multiplier_change", 0.0) > 0
                                           or "step" not in r for r in window):
        return None
    moved = sum(r["step"] for r in window[1:])
    if not moved > 0 or any(b["objective"] > a["objective"] for a, b in zip(window, window[1:])) \
            or window[-1]["size"] - window[0]["size"] < 0.5 * moved:
        return None
    return window


FLAT_NOTE = ("the summed Hessian at the answer is singular to round-off along {n:.0f} direction(s) "
             "(a curvature below ~1e-14 of the largest): the answer is not resolved along those "
             "directions (a face of solutions, or a ridge too small to fix the point: raise it, or "
             "rescale the data)")
MAYBE_RUNAWAY = ("over the last {k} outer iterations the iterates moved outward while the objective kept "
                 "decreasing (‖w‖ ×{r:.3g} since the first outer iteration, in the run's units): it may have "
                 "no minimizer (separable data, a loss with no ridge?) — add a ridge (λ‖w‖²) or a bound on w")


# at the cap, the last outer iterations whose subproblems mostly ended above τ_k are named
UNSOLVED_WINDOW = 10
UNSOLVED_NOTE = ("{k} of the last {n} subproblems ended with their certificate (median {cert:.2g}, in the "
                 "run's units) above τ_k ({tau:.2g}): their steps could not lower the gradient further "
                 "at β = {beta:.3g} — round-off, where β times a constraint's round-off enters the "
                 "augmented Lagrangian's gradient, or a loss saturated on data in large units. The last "
                 "outer step was {step:.2g} of ‖w‖: the point may be near the answer but is not "
                 "certified; check it with fm.verify(res, prob.solve('cvxpy')), or rescale the data")


def hints(backend, history: list[dict], info: dict, status: str | None) -> str | None:
    """`status` as it is, with what a user should know (info and a RuntimeWarning) under Newton
    steps: at "converged" without a distance reading (`proxal_certificate.reading`: a Hessian
    singular to round-off), the flat directions (info["flat"]; the dummy trap with a ridge of
    1e-14 of its loss, 1.9e-15 of the largest curvature);
    at the last outer iteration, iterates that went outward while the objective fell
    (`_outward`, info["no_minimizer"]: MNIST 3 v 7, 200 rows, no ridge, ‖w‖ 133 → 1,455 in 100
    outer iterations with no reading, which `runaway` cannot tell from a slow approach), and
    subproblems that mostly ended above τ_k (info["unsolved"]: separable logistic ×1e3 with one
    sum constraint, certificates 2e-8 against τ_k 1e-10 for 80 outer iterations, honest15)."""
    last = history[-1]
    if status == Status.CONVERGED and last.get("newton_flat", 0.0) > 0 and not np.isfinite(
            last.get("newton_distance", 0.0)):
        info["flat"] = FLAT_NOTE.format(n=last["newton_flat"])
        warnings.warn(info["flat"], RuntimeWarning, stacklevel=4)
    at_cap = status is None and len(history) >= getattr(backend, "max_outer", np.inf)
    window = _outward(history, getattr(backend, "eps2", 0.0)) if at_cap else None
    if window and "newton_distance" in last:
        info["no_minimizer"] = MAYBE_RUNAWAY.format(k=len(window) - 1, r=last["size"] / max(history[0]["size"], 1e-300))
        warnings.warn(info["no_minimizer"], RuntimeWarning, stacklevel=4)
    unsolved = _unsolved(history[-UNSOLVED_WINDOW:]) if at_cap else []
    if at_cap and 2 * len(unsolved) >= min(len(history), UNSOLVED_WINDOW):
        info["unsolved"] = UNSOLVED_NOTE.format(
            k=len(unsolved), n=min(len(history), UNSOLVED_WINDOW), cert=np.median([r["certificate"] for r in unsolved]),
            tau=last["tau"], beta=last.get("beta", np.nan), step=last.get("step", np.nan) / max(last.get("size", 0.0), 1e-300))
        warnings.warn(info["unsolved"], RuntimeWarning, stacklevel=4)
    return status


def _unsolved(records: list[dict]) -> list[dict]:
    """The outer iterations whose subproblem ended with its certificate above its τ_k."""
    return [r for r in records if r.get("certificate", 0.0) > r.get("tau", np.inf)]


def _positive_limit(values: list[float]) -> float:
    """The limit of `values` extrapolated from their last drops when those shrink geometrically
    (each drop a fraction r < 1 of the one before, r the largest such ratio: the rest of the
    sequence falls by at most d·r/(1 − r) after a drop d); 0 when they do not. A violation
    falling geometrically to 0 (a feasible model) extrapolates to about 0; an infeasible model's
    violation approaching its least value v* > 0 extrapolates to about v*, however slowly in
    relative terms it gets there (the equilibrated NP model of tests/test_proxal_speed.py at
    β_max: 7 %, 4 %, 2.6 % per iteration, drops shrinking ×0.54, ×0.63: limit 0.0303 against
    0.0317 now, where the 1 % rule needed 5 more iterations and "stalled" fired first). A
    violation falling sublinearly to 0 (c/√k) extrapolates to ≤ 2/3 of its value, below 0.9."""
    drops = [a - b for a, b in zip(values, values[1:])]
    if len(drops) < 2 or min(drops) <= 0:
        return 0.0
    ratio = max(b / a for a, b in zip(drops, drops[1:]))
    if ratio >= 1.0:
        return 0.0
    return values[-1] - drops[-1] * ratio / (1.0 - ratio)
