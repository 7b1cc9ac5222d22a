"""Divergence watch shared by every backend (and `rounds_to_tol`, a run's pace: DP-ADMM's
stop for a crawling run, DALD's message at its cap): a run whose iterates or residuals become
non-finite or grow without bound stops with status "diverged", a warning, and a message that
names the quantity, the iteration and the setting to change — never a number returned as if it
were an answer.

>>> watch = DivergenceWatch("FedADMM", hint="lower lr or raise beta")
>>> watch.check(1, z=np.ones(3)), watch.check(2, z=np.full(3, 1e9))
(False, True)
>>> watch.message.split(":")[0]
'FedADMM diverged at iteration 2'
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from .outcome import Status

GROWTH = 1e6     # a quantity this many times its smallest size so far (floored at FLOOR) diverges
FLOOR = 1.0      # sizes below this count as this: a residual falling to 1e-9 and back to 1e-3 is fine
CEILING = 1e100  # a quantity this large diverged, whatever its first size (a run that blew up in
                 # its first iteration sets no baseline the growth test could measure from)
STALL_WINDOW = 100   # `check_shrinking` judges a residual over windows of max(this, t/4) iterations
FLAT = 0.01          # ... settled when those 2 windows lie within 1 % of each other,
GROWN = 10.0         # ... or grown when they are all 10× the run's smallest value


class DivergenceWatch:
    """Records quantities (iterates, residuals, multipliers) iteration by iteration and says when
    one of them diverged: a non-finite entry, an ∞-norm above `growth` × max(`floor`, its
    smallest ∞-norm so far), or above CEILING. `message` then says what, where and what to
    change (`hint`)."""

    def __init__(self, backend: str, hint: str, growth: float = GROWTH, floor: float = FLOOR,
                 stall_hint: str | None = None):
        self.backend, self.hint, self.stall_hint = backend, hint, stall_hint
        self.status = Status.DIVERGED          # or STALLED: what `check_shrinking` stopped
        self.growth, self.floor = float(growth), float(floor)
        self.smallest: dict[str, float] = {}
        self.trace: dict[str, list[float]] = {}
        self.least: dict[str, float] = {}          # each trace's smallest value so far
        self.message: str | None = None

    def check(self, iteration: int, **quantities) -> bool:
        """True (and `message` set) when one of `quantities` (name=array or number) diverged."""
        for name, value in quantities.items():
            size = float(np.max(np.abs(np.asarray(value, dtype=float)), initial=0.0))
            if not np.isfinite(size):              # (the largest |entry| is inf or NaN)
                return self._stop(iteration, f"{name} has non-finite entries")
            if size > CEILING:
                return self._stop(iteration, f"‖{name}‖∞ reached {size:.3g}")
            if size == 0.0 and name not in self.smallest:
                continue        # an all-zero start sets no scale: a solution of size 1e7 is fine
            smallest = self.smallest.get(name, size)
            if size > self.growth * max(smallest, self.floor):
                return self._stop(iteration, f"‖{name}‖∞ grew to {size:.3g} (from at most "
                                             f"{max(smallest, self.floor):.3g})")
            self.smallest[name] = min(smallest, size)
        return False

    def check_shrinking(self, iteration: int, name: str, value: float, floor: float,
                        window: int = STALL_WINDOW) -> bool:
        """True (and `message` set) when `name`, a residual a convergent run drives to 0 (a
        multiplier's step: the violation it is updated by), settled above 0: the smallest value
        of the last W iterations (W = max(`window`, iteration/4), growing with the run) is not
        0.1 % below the smallest of the W before, stays above `floor`, and either the 2W values
        lie within `FLAT` of each other or they are all `GROWN` times the run's smallest. The
        signature of an infeasible model, whose multipliers grow by at least its least violation
        every step, so its residual settles or grows (the equilibrated NP model with r = 0.05:
        1.07 at round 0, ≥ 97 from round 100 on) however slowly the iterates drift: a growth test
        on the iterates waits for them to grow 1e6-fold, which a well-scaled model takes
        thousands of iterations to do. (Not merely "not shrinking": a feasible run's residual may
        rise for hundreds of rounds before it falls — NP on adult, 3 clients: 2.6e-4 at round 0,
        8.7e-4 at 650, 8.5e-5 at 5,900.) A residual that settles is no proof that anything grows
        or that the model is infeasible, so the verdict is "stalled" (`status`), never
        "diverged": the message names the residual and says what would decide (`stall_hint`)."""
        trace = self.trace.setdefault(name, [])
        trace.append(float(value))
        self.least[name] = min(self.least.get(name, math.inf), trace[-1])
        span = max(int(window), len(trace) // 4)
        if len(trace) < 2 * span:
            return False
        recent, before = min(trace[-span:]), min(trace[-2 * span:-span])
        settled = max(trace[-2 * span:]) <= (1.0 + FLAT) * min(recent, before)
        # grown: 10× the run's least and above everything the window before held (a rise, not a
        # feasible run's residual wobbling 10–100× above a least it met while a constraint was
        # inactive: bench_verdicts np 2, 2e-4 to 8e-4 over rounds 213–422 from a least of 1e-6)
        grown = min(recent, before) >= GROWN * self.least[name] and recent >= max(trace[-2 * span:-span])
        if recent > floor and recent >= (1.0 - 1e-3) * before and (settled or grown):
            return self._stop(iteration, f"{name} did not shrink over iterations "
                                         f"{iteration - 2 * span + 1}..{iteration} (smallest "
                                         f"{before:.3g}, then {recent:.3g})", Status.STALLED)
        return False

    def _stop(self, iteration: int, what: str, status: Status = Status.DIVERGED) -> bool:
        self.status = status
        hint = self.hint if status is Status.DIVERGED or self.stall_hint is None else self.stall_hint
        self.message = f"{self.backend} {status.value} at iteration {iteration}: {what}; {hint}"
        return True

    def report(self, info: dict, note: str | None = None) -> str:
        """The status (`status`: "diverged", or "stalled" from `check_shrinking`): warn once
        with the message (and the backend's `note` on what the run showed) and keep it in
        `info[status]`."""
        if note:
            self.message = f"{self.message}. {note}"
        info[self.status.value] = self.message
        warnings.warn(self.message, RuntimeWarning, stacklevel=3)
        return self.status


STEADY_RECORDS = 20      # at least this many records in the last half of a run to judge it
STEADY_RATIO = 0.98      # the last tenth's mean fall ≥ this × the half's first tenth's: not shrinking


def steady_descent(history: list[dict], tol: float = 1e-6) -> str | None:
    """A run that ended at its round cap while its objective kept falling at an unshrinking
    rate looks unbounded below: the message saying so, else None.

    Judged on the last half of the records: feasible throughout (violation ≤ `tol`), the
    objective fell in every record, the mean fall of the last tenth is ≥ STEADY_RATIO × that of
    the half's first tenth, and the half's total fall exceeds max(1, |f| / 2) at its start.
    A convergent run's falls are summable, so they shrink; a loss whose infimum is not attained
    (logistic regression on separable data) falls by less than 1 in all. The verdict is a
    diagnosis from the history, not a proof: the message says how to confirm it."""
    half = history[len(history) // 2:]
    objectives = np.array([record.get("objective", np.nan) for record in half], dtype=float)
    violations = np.array([record.get("violation", 0.0) for record in half], dtype=float)
    if len(half) < STEADY_RECORDS or not np.all(np.isfinite(objectives)) or np.any(violations > tol):
        return None
    falls = -np.diff(objectives)
    tenth = max(len(falls) // 10, 1)
    total = objectives[0] - objectives[-1]
    if np.all(falls > 0) and falls[-tenth:].mean() >= STEADY_RATIO * falls[:tenth].mean() \
            and total > max(1.0, 0.5 * abs(objectives[0])):
        return (f"the objective fell by about {falls[-tenth:].mean():.3g} in each of the last "
                f"{len(falls)} records without slowing down (to {objectives[-1]:.6g}): the model "
                "looks unbounded below (a loss with no minimum, a missing constraint or "
                "regularizer); prob.solve('cvxpy') confirms it")
    return None


def rounds_to_tol(trace: list[float], tol: float) -> tuple[float, float, float]:
    """(estimated total rounds to reach `tol`, best residual of rounds t/2..t, that of t/4..t/2)
    from the run's residuals `trace` (one per round, t = len(trace)): the best of the last half
    against the best of the quarter before, taken as a geometric rate per round.

    >>> round(rounds_to_tol([1.0] * 1000 + [0.1] * 1000 + [0.01] * 2000, 1e-8)[0], 6)
    16000.0
    """
    t = len(trace)
    if t < 4 or not tol > 0.0:
        return math.inf, math.nan, math.nan
    values = np.asarray(trace, dtype=float)
    recent, before = float(np.min(values[t // 2:])), float(np.min(values[t // 4:t // 2]))
    if recent <= tol:
        return float(t), recent, before
    if not (0.0 < recent < before):
        return math.inf, recent, before
    per_round = math.log(recent / before) / (t - t // 2)      # < 0
    return t + math.log(tol / recent) / per_round, recent, before
