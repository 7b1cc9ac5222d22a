"""Spectral penalty selection for Fed-DALD-CC (adaptive ADMM, Xu, Figueiredo & Goldstein,
AISTATS 2017, "Adaptive ADMM with spectral penalty parameter selection", §3–4).

Consensus ADMM with weight τ = 2ρ² (Fed-DALD-CC with one inner iteration): client i solves (13),
whose optimality says λ̂_i := μ_i + τ(x̂_sent − x_i) is a (sub)gradient of its local objective
at x_i, and the server's step (14) says −μ_i^new (summed: −Σμ_i) is one of the server's. Over
a few outer steps the changes (Δx_i, Δλ̂_i) and (Δx̂, −Δμ_i) give Barzilai–Borwein estimates of
the curvature of each side; the penalty τ = √(α̂·β̂) (α̂ alone when the server side carries no
curvature — no server terms, Σμ_i ≡ 0) balances them, as the optimal fixed penalty does for
quadratics. The coordinator has every quantity (it sends x̂, receives x_i, mirrors μ_i): no
extra message. An estimate is used only when the changes correlate (`CORRELATION`), else τ stays.
"""
from __future__ import annotations

import numpy as np

CORRELATION = 0.2      # ε_cor of the paper: an estimate whose changes correlate less is not used
ESTIMATE = "mg"
EVERY = 2              # T_f: outer steps between two estimates


def curvature(dx: np.ndarray, dg: np.ndarray) -> tuple[float, float]:
    """(hybrid spectral curvature estimate, correlation) of a (sub)gradient map from a change
    dx of the point and dg of its gradient (Xu et al. (13)–(15): steepest-descent ⟨dg,dg⟩/⟨dx,dg⟩
    and minimum-gradient ⟨dx,dg⟩/⟨dx,dx⟩ estimates, MG when 2·MG > SD, else SD − MG/2);
    (nan, 0) when the changes do not correlate positively.

    >>> curvature(np.array([1.0, 2.0]), np.array([3.0, 6.0]))
    (3.0, 1.0)
    """
    xg = float(np.vdot(dx, dg))
    xx, gg = float(np.vdot(dx, dx)), float(np.vdot(dg, dg))
    if xg <= 0.0 or xx <= 0.0 or gg <= 0.0:
        return float("nan"), 0.0
    sd, mg = gg / xg, xg / xx
    if ESTIMATE == "mg":
        return mg, float(xg / np.sqrt(xx * gg))
    return (mg if 2.0 * mg > sd else sd - 0.5 * mg), float(xg / np.sqrt(xx * gg))


def penalty(tau: float, client: tuple[np.ndarray, np.ndarray], server: tuple[np.ndarray, np.ndarray],
            correlation: float = CORRELATION) -> float:
    """The new consensus weight τ from the clients' changes (ΔX, ΔΛ̂) ((n, d) each: Δx_i and
    Δλ̂_i) and the server side's (ΔX̂, −ΔM) (Δx̂ per row and −Δμ_i), Xu et al. (16): √(α̂β̂) when
    both estimates correlate, the one that does otherwise, else `tau` unchanged.

    >>> penalty(1.0, (np.eye(2), 0.04 * np.eye(2)), (np.eye(2), np.zeros((2, 2))))
    0.04
    """
    alpha, alpha_cor = curvature(*client)
    beta, beta_cor = curvature(*server)
    if alpha_cor > correlation and beta_cor > correlation:
        return float(np.sqrt(alpha * beta))
    if alpha_cor > correlation:
        return alpha
    if beta_cor > correlation:
        return beta
    return tau


BOUND = 0.0     # experiment: bounded adaptivity C (He et al. 2000): |log factor| ≤ log(1 + C/k²)
SETTLE = ""     # experiment: "" (keep), "geomean" (of the last SETTLE_WINDOW weights)
SETTLE_WINDOW = 50


REVERSAL = False
CLIP = False


def bounded(factor: float, k: int, weights=(), bound: float = None) -> float:
    bound = BOUND if bound is None else bound
    if bound <= 0.0 or factor == 1.0:
        return factor
    if REVERSAL:
        w = np.asarray(weights, float)
        w = w[np.isfinite(w)]
        moved = np.flatnonzero(np.diff(w))
        if not moved.size or (w[moved[-1] + 1] > w[moved[-1]]) == (factor > 1.0):
            return factor
    cap = 1.0 + bound / max(k, 1) ** 2
    return float(min(max(factor, 1.0 / cap), cap))


def settle(weights, now: float, weights_records=None) -> float:
    """factor that moves the weight `now` to the settled value at the window's end."""
    w = np.asarray(weights, float)
    w = w[np.isfinite(w)][-SETTLE_WINDOW:]
    if SETTLE == "geomean" and w.size:
        return float(np.exp(np.mean(np.log(w)))) / now
    if SETTLE == "rate" and not swinging(weights):
        return 1.0
    if SETTLE == "rate":
        return best_weight(weights_records) / now if weights_records else 1.0
    if SETTLE == "min" and w.size:
        return float(w.min()) / now
    return 1.0

LATE = ""
LATE_LOG = []
LATE_AT = 100


def late(factor, j):
    LATE_LOG.append((j, factor))
    if LATE == "once" and j == LATE_AT:
        return factor
    return 1.0


def best_weight(history, skip: int = 1, least: int = 3) -> float:
    """the weight under which the stop test's residuals fell fastest (geometric mean per step)
    over a run of records at one weight (its first `skip` steps after the change left out)."""
    w = np.array([h.get("weight", np.nan) for h in history], float)
    m = np.array([max(h["primal_residual"], h["dual_residual"], h["constraint_residual"]) for h in history], float)
    best, rate = np.nan, np.inf
    j = 1
    while j < len(w):
        i = j          # record i-1's weight acted on step i
        while j < len(w) and w[j - 1] == w[i - 1]:
            j += 1
        seg = m[i - 1 + skip:j]
        if j - i - skip >= least and np.all(seg > 0) and np.all(np.isfinite(seg)):
            r = (seg[-1] / seg[0]) ** (1.0 / (len(seg) - 1))
            if r < rate:
                best, rate = w[i - 1], r
        j = max(j, i + 1)
    return float(best) if np.isfinite(best) else float(w[-1])


def swinging(weights, changes: int = 20, net: float = 0.5) -> bool:
    """whether the last `changes` changes of the weight went back and forth (their net change
    in log scale under `net` of their path) rather than one way."""
    w = np.asarray(weights, float)
    w = w[np.isfinite(w)]
    moved = w[np.r_[0, np.flatnonzero(np.diff(w)) + 1]][-changes - 1:]
    if moved.size < 3:
        return False
    logs = np.log(moved)
    path = float(np.sum(np.abs(np.diff(logs))))
    return abs(float(logs[-1] - logs[0])) < net * path
