"""FedADMM-InSa's self-adaptive rules (Song, Wang, Zuazua, arXiv 2402.13989; equation numbers:
that paper) and the safeguards around them (docs/fedadmm.md): the inexactness bound σ (3.9)/(3.18),
the penalty rule (3.15) and its application within `beta_range`, the end of a client round
(the multiplier step (2.8b), residuals (3.14)) and the server's test for a run
that diverges too slowly for the divergence watch."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..watch import DivergenceWatch


def sigma_bound(beta, c: float = 1.0):
    """√2/(√2 + √(β/c)): the bound (3.8)/(3.9) on σ for strong-convexity constant c (β: one
    client's float or an array, one per client)."""
    return math.sqrt(2.0) / (math.sqrt(2.0) + np.sqrt(beta / c))


def adapt_penalty(beta, primal, dual, mu: float, tau: float):
    """(3.15): β·τ if d > μp; β/τ if p > μd; else β (p, d: the residuals (3.14)); elementwise
    on arrays (one entry per client)."""
    return np.where(dual > mu * primal, beta * tau, np.where(primal > mu * dual, beta / tau, beta))


def adapt(s: dict, beta, primal, dual, scale: float, lr, curvature):
    """(β_i^{k+1} by (3.15) within `beta_range`, the step η_i that goes with it), for one client
    (floats) or a group's clients (arrays, elementwise), with the options of `s` (the round,
    `client._Round`). Safeguards (`safe`): residuals at round-off
    (both ≤ 1e-12·max(1, ‖z‖∞) = 1e-12·`scale`) leave β and η alone (their ratio is noise: the
    paper's rule then drifts β to 1e-27 or 1e+30); with the automatic η, η follows β:
    η = 1/(L̂ + β), L̂ = `curvature` (with the user's η, a β that makes the local steps unstable
    is caught by the local steps' safeguard, `client._Round.steps`, which halves η)."""
    p = beta * primal if s["penalty_rule"] == "code" else primal
    new = np.clip(adapt_penalty(beta, p, dual, s["mu"], s["tau"]), s["beta_min"], s["beta_max"])
    new_lr = 1.0 / (curvature + new) if s["auto_lr"] else lr
    if s["safe"]:
        noise = np.maximum(primal, dual) <= 1e-12 * scale
        new, new_lr = np.where(noise, beta, new), np.where(noise, lr, new_lr)
    return new, new_lr


def sustained_growth(history: list[dict], watch: DivergenceWatch, window: int = 20,
                     factor: float = 2.0) -> bool:
    """A run that hit max_rounds while diverging slowly (below the watch's 1e6-fold test): the
    round's change ‖z^{k+1} − z^k‖∞ rose in every one of the last `window` rounds, by ≥ `factor`
    overall, the clients' drift max_i‖u_i − z^k‖∞ grew by ≥ `factor` too, and the objective
    did not fall (its first and last finite values in the window; not tested with fewer than
    two: `report_every`). Sets `watch.message`.
    Why all three: a converging InSa run cut short at 202 rounds (a flat logistic model that
    converged at 449, tests/test_fedadmm_local_solver.py) had changes and drift rising 6.5-
    and 6.9-fold over its last 20 rounds, after its β_i were halved (a new penalty's first
    rounds move z more), while its objective fell (0.0859631 → 0.0859588); the diverging runs
    measured grow all three: the paper's vanilla rounds at β = 10, η = 0.05, E = 1 (changes and
    drift 8-fold, objective 8e3 → 5e5), its unbounded InSa rule driving β to 3e-7 (objective
    0.54 → 1.5e10)."""
    recent = history[-window - 1:]
    changes = [r["z_change"] for r in recent]
    if len(changes) <= window or not all(b > a for a, b in zip(changes, changes[1:])):
        return False
    if changes[-1] < factor * changes[0]:
        return False
    drift = recent[-1]["drift"] / recent[0]["drift"] if recent[0]["drift"] > 0 else math.inf
    if not drift >= factor:
        return False
    values = [r["objective"] for r in recent if math.isfinite(r.get("objective", math.nan))]
    if len(values) >= 2 and values[-1] < values[0]:
        return False
    watch.message = (f"{watch.backend} diverged at iteration {history[-1]['round']}: the change "
                     f"‖z^(k+1) − z^k‖∞ rose in each of the last {window} rounds, "
                     f"{changes[-1] / changes[0]:.3g}-fold to {changes[-1]:.3g}, the clients' drift "
                     f"‖u_i − z‖∞ {drift:.3g}-fold to {recent[-1]['drift']:.3g} (sustained growth); "
                     f"{watch.hint}")
    return True


class RoundEnd(NamedTuple):
    """What `round_end` computes for a group's clients (stacks, one row per client)."""
    lam: np.ndarray         # λ_i^{k+1} (2.8b)
    w: np.ndarray           # the message β_i^k u_i^{k+1} − λ_i^{k+1}
    primal: Any             # ‖u_i^{k+1} − u_i^k‖ (3.14a)
    dual: Any               # ‖u_i^{k+1} − z^k‖ (3.14b)
    drift: Any              # ‖u_i^{k+1} − z^k‖∞
    beta: Any               # β_i^{k+1} (3.15; β_i^k without adaptation)
    lr: Any                 # η_i for the next round


def round_end(s: dict, u, u_old, lam, beta, z: np.ndarray, lr, curvature) -> RoundEnd:
    """The end of a round at the local solutions u (k, n) of a group's clients (β (k,)): the
    multiplier step (2.8b), the message, the residuals (3.14) and InSa's β, η (`adapt`)
    with the options of `s` (`client._round` calls it). It writes no state."""
    b = np.asarray(beta, float)[..., None]
    lam = lam - b * (u - z)                                                      # (2.8b)
    primal = np.linalg.norm(u - u_old, axis=-1)                                  # (3.14a)
    dual = np.linalg.norm(u - z, axis=-1)                                        # (3.14b)
    drift = np.max(np.abs(u - z), axis=-1, initial=0.0)
    new_beta, new_lr = adapt(s, beta, primal, dual, float(np.max(np.abs(z), initial=1.0)), lr,
                             curvature) if s["adaptive"] else (beta, lr)
    return RoundEnd(lam, b * u - lam, primal, dual, drift, new_beta, new_lr)
