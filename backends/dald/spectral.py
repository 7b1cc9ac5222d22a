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
