"""DP-IADMM's options: the variants, the penalty schedule ρ̂^t (21) with the paper's presets,
the paper's setting, and the checks of the schedule, sensitivity and clip options. Equation numbers
refer to ../shared/seeds/dp_inexact_admm.txt."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from fedmodel.errors import FedModelError
from ..common import check_number

VARIANTS = ("objT", "objP", "outP")


@dataclass(frozen=True)
class RhoSchedule:
    """ρ̂^t = scale · min{cap, c1·growth^{⌊t/T_c⌋} + c2/ε̄}  (21); ε̄ = ∞ drops c2/ε̄ (the code's
    non-private ρ). `scale` = 0.01 gives OutP+ (A.10)."""

    c1: float = 2.0
    c2: float = 5.0
    T_c: float = 1e4
    cap: float = 1e9
    growth: float = 1.2
    scale: float = 1.0

    def __call__(self, t: int, epsilon: float) -> float:
        extra = 0.0 if math.isinf(epsilon) else self.c2 / epsilon
        return self.scale * min(self.cap, self.c1 * self.growth ** (t // self.T_c) + extra)


RHO_PRESETS = {"mnist": RhoSchedule(2.0, 5.0, 1e4), "femnist": RhoSchedule(0.005, 0.05, 2e3)}
# `DPADMM.paper()`. The constructor's defaults are the fast non-private configuration instead:
# ε̄ = ∞, ObjP with a = 10, ρ floored at the clients' curvature ("auto"), stop at tol — ObjT with
# δ^t = a/t² freezes the clients (Σδ^t = aπ²/6) and never reaches the optimum without noise.
# Measured (tests/test_dp_admm.py models, tol 1e-8): ridge 121 rounds (paper setting: not
# converged in 6000, 0.34 away), logistic 757 rounds (0.36 away).
# A private run (finite ε̄) defaults to sensitivity="clip", a formal guarantee; the paper's
# data-dependent Δ̄ (20) is nominal, so it is kept here (and in the reproductions) only.
PAPER_DPADMM = dict(variant="objT", rho_schedule="mnist", a=1.0, max_rounds=20000,
                    trust_radius="paper", trust_norm="inf", tol=0.0, sensitivity="paper")
# The clip norm C of sensitivity="clip": each record's gradient, in the mean-loss scale
# (I_p·‖record's term of f'_p‖₁; ‖∇ℓ(z; d_i)‖₁ when f_p = (1/I_p)Σℓ), is clipped to L1 norm ≤ C,
# so Δ̄ = 2C/I_p. 1 is DP-SGD's customary clip norm (Abadi et al. 2016, Opacus): for GLMs the
# record's gradient is ‖a_i‖₁·‖∂ℓ/∂(a_iᵀw)‖₁ ≤ ‖a_i‖₁ (logistic; 2‖a_i‖₁ softmax), so on
# features scaled to ‖a‖₁ ≤ 1 it clips little or nothing; on larger features it trades the bias
# of clipping for noise of scale 2C/(I_p ε̄) — tune C near the records' typical gradient norm.
DEFAULT_CLIP = 1.0
# The value clip B of a private run's local constraints that read data (`constrained`): each
# record's term of c_j's value, in the mean scale (its loss ℓ_i when c_j = mean_i ℓ_i − r), is
# clipped to [−B, B], so a released value moves by at most 2B/I_j. Clipping makes the constraint
# look less violated than it is (a logistic loss above 5 is a margin below −5), so B errs large.
DEFAULT_VALUE_CLIP = 5.0


def outp_parameters(t: int, rho: float, records: float, epsilon: float, delta: float, a: float,
                    constants: tuple[float, float] | None) -> tuple[float, float]:
    """OutP's 1/η̂^t and σ^t (spec 2.6, the code's Theorem-4 calibration of Huang et al.):
    1/η̂ = (c3 + 2(c1/I_p)√(t ln(1.25/δ̄))/ε̄)/a, σ = 2(c1/I_p)√(2 ln(1.25/δ̄))/(ε̄(ρ + 1/η̂));
    non-private: 1/η̂ = c3/a, σ = 0. (c1, c3) = `constants`, default (I_p, I_p/4) as the code."""
    c1, c3 = constants or (records, records / 4.0)
    if math.isinf(epsilon):
        return c3 / a, 0.0
    log_term = math.log(1.25 / delta)
    inv_eta = (c3 + 2.0 * (c1 / records) * math.sqrt(t * log_term) / epsilon) / a
    return inv_eta, 2.0 * (c1 / records) * math.sqrt(2.0 * log_term) / (epsilon * (rho + inv_eta))


def as_rho_schedule(value) -> Callable[[int, float], float]:
    """The schedule (t, ε̄) -> ρ^t named by the `rho_schedule` option: a preset name, a
    RhoSchedule or callable, or a number (static ρ)."""
    if isinstance(value, str):
        if value.lower() not in RHO_PRESETS:
            raise FedModelError(f"unknown rho_schedule {value!r}; use one of {sorted(RHO_PRESETS)}, "
                                "a RhoSchedule(c1, c2, T_c), a number or a callable (t, ε̄) -> ρ")
        return RHO_PRESETS[value.lower()]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value < math.inf:
            raise FedModelError(f"a static rho_schedule must be positive and finite, got {value!r}")
        return lambda t, epsilon: float(value)
    if callable(value):
        return value
    raise FedModelError(f"rho_schedule must be a preset name, RhoSchedule, number or callable, "
                        f"got {value!r}")


def check_sensitivity(value):
    """The `sensitivity` option checked: "paper" | "replace" | "clip" | a bound | {client: bound}."""
    if isinstance(value, str):
        if value not in ("paper", "replace", "clip"):
            raise FedModelError(f"sensitivity must be 'paper', 'replace', 'clip', a positive number "
                                f"or {{client: number}}, got {value!r}")
        return value
    bounds = value.values() if isinstance(value, dict) else [value]
    if not all(isinstance(b, (int, float)) and 0 <= b < math.inf for b in bounds):
        raise FedModelError(f"a sensitivity bound must be a finite nonnegative number, got {value!r}")
    return dict(value) if isinstance(value, dict) else float(value)


def check_readings(trust_radius, trust_norm: str, outp_std: str, outp_constants, seed):
    """The readings' options and the seed checked; returns `outp_constants` as floats (or None)."""
    if trust_radius not in ("paper", "code") and not callable(trust_radius):
        raise FedModelError("trust_radius must be 'paper' (δ^t = a/t²), 'code' (δ^t = a) or a "
                            f"callable t -> δ^t, got {trust_radius!r}")
    if trust_norm not in ("inf", "2") or outp_std not in ("sigma", "sigma2"):
        raise FedModelError(f"trust_norm must be 'inf' or '2' and outp_std 'sigma' or 'sigma2' "
                            f"(got {trust_norm!r}, {outp_std!r})")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                             or seed < 0):
        raise FedModelError(f"seed must be a nonnegative integer or None, got {seed!r}")
    if outp_constants is None:
        return None
    if not isinstance(outp_constants, (tuple, list)) or len(outp_constants) != 2:
        raise FedModelError(f"outp_constants must be a pair (c1, c3), got {outp_constants!r}")
    return tuple(check_number("outp_constants", c, 0.0, math.inf) for c in outp_constants)


def check_clip(value) -> float:
    """The clip norm C of sensitivity="clip": positive and finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise FedModelError(f"clip (the per-record clip norm C) must be positive and finite, "
                            f"got {value!r}")
    return float(value)
