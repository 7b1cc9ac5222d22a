"""Proximal maps prox_{t·f}(v) = argmin_x t·f(x) + ½‖x − v‖² that several atoms share: an
entry-wise atom and the reduction summing it have the same prox (|x| and ‖x‖₁, x² and ‖x‖²),
because the sum separates over the entries."""
from __future__ import annotations

import numpy as np


def soft_threshold(v: np.ndarray, t: float) -> np.ndarray:
    """prox of t·|x| entry-wise (and of t·‖x‖₁): sign(v)·max(|v| − t, 0)."""
    return np.sign(v) * np.maximum(np.abs(v) - t, 0.0)


def shrink(v: np.ndarray, t: float) -> np.ndarray:
    """prox of t·x² entry-wise (and of t·‖x‖²): v / (1 + 2t)."""
    return v / (1.0 + 2.0 * t)
