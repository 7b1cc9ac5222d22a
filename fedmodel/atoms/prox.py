"""Proximal maps prox_{t·f}(v) = argmin_x t·f(x) + ½‖x − v‖² that several atoms share: an
entry-wise atom and the reduction summing it have the same prox (|x| and ‖x‖₁, x² and ‖x‖²),
because the sum separates over the entries; and the ℓ1 ball's projection (the prox of its
indicator), soft-thresholding at the level that meets the radius.""" 
from __future__ import annotations

import numpy as np


def soft_threshold(v: np.ndarray, t: float) -> np.ndarray:
    """prox of t·|x| entry-wise (and of t·‖x‖₁): sign(v)·max(|v| − t, 0)."""
    return np.sign(v) * np.maximum(np.abs(v) - t, 0.0)


def shrink(v: np.ndarray, t: float) -> np.ndarray:
    """prox of t·x² entry-wise (and of t·‖x‖²): v / (1 + 2t)."""
    return v / (1.0 + 2.0 * t)


def project_l1_ball(v: np.ndarray, radius: float, weights: np.ndarray | None = None) -> np.ndarray:
    """Euclidean projection onto {x : ‖x‖₁ ≤ radius} (sort-based, Duchi et al. 2008), or with
    `weights` e > 0 (v's size) onto {x : Σ e_i|x_i| ≤ radius}: x_i = sign(v_i)·max(|v_i| − θe_i, 0),
    θ from the breakpoints |v_i|/e_i sorted down (the weighted form of the same search)."""
    a = np.abs(np.ravel(v))
    if weights is None:
        if a.sum() <= radius:
            return v
        if radius <= 0:                      # the point {0} (no k below satisfies the test)
            return np.zeros_like(v)
        u = np.sort(a)[::-1]
        cumulative = np.cumsum(u) - radius
        k = np.nonzero(u * np.arange(1, u.size + 1) > cumulative)[0][-1]
        theta = cumulative[k] / (k + 1.0)
        return soft_threshold(v, theta)
    e = np.ravel(weights)
    if float(e @ a) <= radius:
        return v
    if radius <= 0:
        return np.zeros_like(v)
    order = np.argsort(-a / e)
    cumulative = np.cumsum((e * a)[order]) - radius
    thetas = cumulative / np.cumsum((e * e)[order])
    k = np.nonzero(a[order] / e[order] > thetas)[0][-1]
    shrunk = np.maximum(a - thetas[k] * e, 0.0)
    return (np.sign(np.ravel(v)) * shrunk).reshape(np.shape(v))
