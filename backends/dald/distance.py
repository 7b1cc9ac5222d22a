"""Fed-DALD-CC's distance rule (`DALD(dist_tol=…)`): how far x̂ still is from the answer, read from
the contraction of its outer steps ‖Δx̂‖₂ (a flat objective has small residuals far from it), and
what a change of the consensus weight 2ρ² does to that reading. The coordinator has every step.
"""
from __future__ import annotations

from . import spectral

DIST_WINDOW = 10       # outer steps over which the distance rule reads the contraction of x̂
# ... and after a change of ρ, from this many steps before the last step at another weight: two
# estimates (`spectral.EVERY`) more, the foot of a rise staged over three (power-plant: 197–201)
SINCE = 2 * spectral.EVERY + 1


def distance_left(steps: list[float], window: int = DIST_WINDOW) -> float:
    """An estimate of ‖x̂ − x̂*‖₂ from the last `window` + 1 outer steps ‖Δx̂‖₂ of a linearly
    converging run: the tail s·r/(1 − r) of a geometric series, r the steps' mean contraction
    over the window (geometric mean: ADMM's steps need not shrink at every step) and s the
    largest of the window's last half (ADMM's steps come in bursts: slopes ~1e-3 beside an
    intercept ~1e4, the steps 5.4e-8, 2.2e-8, 2.3e-8, then 6.6e-9 — the last alone put the tail
    at 8e-9 where 2.2e-7 was left, and DALD stopped "converged" with the slopes 1.5e-3 off);
    inf while the window is not full or the steps do not shrink, 0 once they are 0.

    >>> distance_left([8.0, 4.0, 2.0], window=2)
    2.0
    >>> distance_left([1.0, 1.0, 1.0], window=2)
    inf
    """
    if len(steps) <= window:
        return float("inf")
    return _tail(steps[-window - 1], steps[-max(window // 2, 1):], window)


def _tail(first: float, recent: list[float], length: float) -> float:
    """s·r/(1 − r): r the contraction from `first` to recent[-1] over `length` steps, s max(recent)."""
    last = recent[-1]
    if last <= 0.0:
        return 0.0
    rate = (last / first) ** (1.0 / length) if first > 0.0 else 1.0
    return max(recent) * rate / (1.0 - rate) if rate < 1.0 else float("inf")


def last_change(weights: list[float]) -> int | None:
    """The index of the last weight unlike the last one (None: one weight throughout)."""
    now = weights[-1]
    for i in range(len(weights) - 2, -1, -1):
        if weights[i] != now:
            return i
    return None


def distance_at(steps: list[float], weights: list[float], window: int = DIST_WINDOW,
                changed: int | None = -1) -> float:
    """`distance_left` where ρ may have changed: the largest of its reading of the steps, of the
    steps times the weight 2ρ² they were taken at (then over the last weight) within the
    window, and of those since `SINCE` steps before the last step at another weight (`changed`,
    `last_change` unless given), each step at a smaller weight w counted as w_now/w steps.

    Why the weight: a larger ρ shrinks x̂'s steps by itself, which the steps alone read as
    contraction (a9a d = 16,507 as written, `scaling=False`: ρ∘ρ ×3–4 every other step,
    "converged" at step 107 2.6e-4 from CVXPY; branch dald15). Times the weight they read the
    stationarity n·2ρ²·Δx̂ (69), which a change of ρ does not shrink.
    Why since before the change: after a rise the fast modes' steps die out first, and a window
    of them at the new ρ reads a short tail while a flat direction still holds the distance
    (raw power-plant data with an intercept, ρ∘ρ ×190 over steps 197–201: "converged" at step
    214 on a window at one ρ that read 1.3e-6, 2.1e-4 from the answer, 5.8e-3 in the user's
    units; the steps times their weight had not fallen since step 196).
    Why counted w_now/w times: a flat direction of curvature c contracts by nτ/(c + nτ) a step
    at τ = 2ρ², its gap ≈ c/(nτ) falls as τ rises, so a step at a smaller weight did the work of
    w_now/w steps at this one (the same model, ρ∘ρ ×10 … ×1,000 forced at steps 350–395:
    "converged" 1.7e-4 … 7.1e-4 from the answer, as a window read the contraction the steps
    before the rise had made). The cost is O(window + SINCE) with `changed` given.

    >>> distance_at([8.0, 4.0, 2.0], [1.0, 2.0, 4.0], window=2)     # shrinking by ρ's rise only
    inf
    >>> steps, weights = [1.0, 0.5, 0.25, 2e-3, 5e-4, 1.25e-4], [1.0] * 3 + [100.0] * 3   # ×100, then fast
    >>> f"{distance_left(steps, window=2):.1e} {distance_at(steps, weights, window=2):.1e}"
    '4.2e-05 5.7e-03'
    """
    plain = distance_left(steps, window)
    c = last_change(weights) if changed == -1 else changed
    if c is None or len(steps) <= window:
        return plain
    now, h = weights[-1], max(window // 2, 1)
    recent = [w * s for w, s in zip(weights[-h:], steps[-h:])]
    start = max(min(c - SINCE, len(steps) - 1 - window), 0)
    length = sum(max(1.0, now / w) for w in weights[start + 1:c + 1]) + (len(steps) - 1 - c)
    # (after a fall of the weight the steps grow by themselves: the plain reading already waits)
    since = _tail(weights[start] * steps[start], recent, length) / now if weights[c] < now else 0.0
    if c < len(steps) - 1 - window:           # (one weight over the window)
        return max(plain, since)
    inside = _tail(weights[-window - 1] * steps[-window - 1], recent, window) / now
    return max(plain, inside, since)


def kept(weights: list[float], window: int = DIST_WINDOW, changed: int | None = -1) -> int:
    """How many last steps `distance_at` reads: a window's, or back to `SINCE` before the last
    step at another weight (`changed`, as there): what a checkpoint keeps."""
    c = last_change(weights) if changed == -1 else changed
    return max(window + 1, len(weights) - c + SINCE if c is not None else 0)
