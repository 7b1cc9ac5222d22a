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
Not in Xu et al.: with server terms the rule never lowers τ below `floor` (clients flat in many
directions drive α̂ down with τ itself).
"""
from __future__ import annotations

import numpy as np

CORRELATION = 0.2      # ε_cor of the paper: an estimate whose changes correlate less is not used
EVERY = 2              # T_f: outer steps between two estimates
# `floor`'s share of √(peak·m̂): peak is read at the first iterates, where a logistic loss curves
# most (σ(1 − σ) ≤ ¼ at margin 0), and overstates the clients' curvature L at the answer q-fold
# (a9a d = 16,507 q ≈ 1.6, MNIST 3v7 d = 784 q ≈ 4): ½ keeps the floor within 2× of √(L·m/n)
# for q in [1, 16]. Measured: a9a 688 steps at 1 (MNIST-ball n = 5: 396, main 212), 883 at ½ (229)
FLOOR_SHARE = 0.5


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


def client_peak(peak: float, client: tuple[np.ndarray, np.ndarray], correlation: float = CORRELATION) -> float:
    """The largest correlated client estimate α̂ of the run so far (`peak` before this one)."""
    alpha, alpha_cor = curvature(*client)
    return max(peak, alpha) if alpha_cor > correlation else peak


def server_curvature(held: float, server: tuple[np.ndarray, np.ndarray], correlation: float = CORRELATION) -> float:
    """m̂, the server's curvature per client, from Δx̂ against the change of its gradient −Σμ_i
    over n (one row); `held` (the last correlated one, 0 before any) where this pair does not
    correlate — as τ itself is kept then: the server's terms do not change, an uncorrelated pair
    is noise. (Raw power-plant data with an intercept: 6 estimates in steps 43–53 correlating
    0.02–0.18 took the floor to 0, τ slipped to 0.0025 under it, and a late raise by α̂ alone,
    ×190 over steps 197–201, was then frozen; DALD said "converged" 5.8e-3 off, branch dald16.)

    >>> dx = np.ones((1, 4))
    >>> server_curvature(0.0, (dx, 0.01 * dx)), server_curvature(0.02, (dx, -dx))
    (0.01, 0.02)
    """
    beta, beta_cor = curvature(*server)
    return beta if beta_cor > correlation else held


def floor(peak: float, m: float) -> float:
    """The least τ the rule may lower τ to: FLOOR_SHARE·√(peak·m̂), m̂ the server's curvature per
    client (`server_curvature`); 0 before both are read (no server terms: Σμ_i ≡ 0, m̂ = 0).

    Not in Xu et al.: where the clients' Hessians are flat in many directions (a9a + hashed
    pairs, d = 16,507, rank ≤ 1,000 rows a client), their moves run along those directions (x_i
    moves ~1/τ there, ~1/L along curvature L), so α̂ follows τ down (0.12, 0.07, 0.02, … 1.6e-3
    over 6 estimates, then √(α̂β̂) to 3.3e-4) while the slow mode is the stiff one: the clients'
    differences in μ_i settle as L/(L + τ) a step, the common mode as nτ/(c + nτ), c ≥ m its
    curvature (server term plus the clients', n clients). The best fixed τ for the two,
    √(L·c/n), is at least √(L·m/n); peak stands for L (`client_peak`, FLOOR_SHARE).

    >>> floor(0.16, 0.01) == FLOOR_SHARE * 0.04
    True
    """
    return FLOOR_SHARE * float(np.sqrt(peak * m)) if peak > 0.0 and m > 0.0 else 0.0
