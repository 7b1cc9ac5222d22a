"""Differential privacy on the node: sensitivities of a node's gradient to one record, the
gradient with every record's term clipped, the node's own noise generator, the Laplace and
Gaussian mechanisms' draws, and a log of them.

Node-side procedures call these with the node program (its public `merit_ir`, `shared`, `name`);
the record-level quantities never leave the node. Noise is drawn from a generator the node keeps
(`node_generator`): spawned from a common seed for reproducible simulations, or seeded from the
node's own OS entropy so that no one else can replay — and subtract — its noise.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..compiler.per_record import RecordGradients, record_count as _record_count
from ..errors import FedModelError

_RECORD_GRADIENTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _record_gradients(program, of=None) -> RecordGradients:
    """The per-record gradients of `of` (an expression of the node's shared variables; default:
    the node's objective), compiled on the first call and kept for the program; raises
    `NotRecordSeparable` when they are not known."""
    function = program.merit_ir.objective if of is None else of
    kept = _RECORD_GRADIENTS.setdefault(program, {})
    if id(function) not in kept:
        kept[id(function)] = (function, RecordGradients(function, program.shared.variables, program.name))
    return kept[id(function)][1]


def record_sensitivity(program, z: np.ndarray) -> float:
    """max_i ‖∇f(z; D) − ∇f(z; D without record i)‖₁ over the node's own records i, at the shared
    point z (flat): the data-dependent L1 sensitivity of the node's objective gradient. Raises
    `NotRecordSeparable` when the objective's per-record gradients are not known."""
    return _record_gradients(program).max_l1(program.shared.unpack(z))


def clipped_record_gradients(program, z: np.ndarray, grad: np.ndarray, bound: float,
                             of=None) -> np.ndarray:
    """`grad` (the gradient of `of`, default the node's objective, at the shared point z, flat)
    with each record's term clipped to L1 norm ≤ `bound` (scaled by min(1, bound/‖term‖₁), as
    DP-SGD clips): replacing one record then moves the result by at most 2·bound in L1, whatever
    the records. `grad` itself when no term exceeds the bound. Raises `NotRecordSeparable` as
    `record_sensitivity` does."""
    correction = _record_gradients(program, of).clipping_correction(program.shared.unpack(z), bound)
    return grad if correction is None else grad + program.shared.pack(correction)


def sampled_clipped_gradient(program, z: np.ndarray, grad: np.ndarray, bound: float,
                             sample: np.ndarray | None, rate: float = 1.0, of=None) -> np.ndarray:
    """r' + (1/q)·Σ_{i ∈ sample} clip(record i's term) at the shared point z (flat): `grad` (the
    gradient of `of`, default the node's objective, there) with its record terms replaced, r' its record-free part, each
    sampled term scaled by min(1, bound/‖term‖₂) — adding or removing one record moves the sum
    by at most `bound` in L2 —, q = `rate`. `sample`: a boolean mask over the records (None:
    all). One pass over the data: grad + Σ_i (kept_i·s_i/q − 1)·term_i. Raises
    `NotRecordSeparable` as `record_sensitivity` does."""
    records = _record_gradients(program, of)
    if not records.products:
        return np.array(grad, dtype=float)
    parts = program.shared.unpack(z)
    norms, adjoints = records.record_l2(parts)
    with np.errstate(divide="ignore"):
        kept = np.where(norms > bound, bound / norms, 1.0)
    if sample is not None:
        kept = np.where(sample, kept, 0.0)
    return grad + program.shared.pack(records.weighted_terms(parts, kept / rate - 1.0, adjoints))


def clipped_records(program, z: np.ndarray, bound: float) -> int:
    """How many of the node's records have a gradient term of L2 norm above `bound` at the shared
    point z (flat): the count `sampled_clipped_gradient` clips there (0 without record terms).
    Data-dependent: a caller releases it only with noise (one record moves it by at most 1)."""
    records = _record_gradients(program)
    if not records.products:
        return 0
    norms, _ = records.record_l2(program.shared.unpack(z))
    return int(np.count_nonzero(norms > bound))


def clipped_record_value(program, z: np.ndarray, bound: float, of) -> float:
    """The value of the scalar `of` at the shared point z (flat) with each record's term clipped to
    [−bound, bound]: replacing one record moves it by at most 2·bound. Raises `NotRecordSeparable`
    when `of` is not a scalar sum of per-record terms."""
    return _record_gradients(program, of).clipped_value(program.shared.unpack(z), bound)


def record_count(program, of=None) -> int:
    """The number of records of `of` (default: the node's objective): the most rows of a data item
    it reads (1 if none)."""
    return _record_count(program.merit_ir.objective if of is None else of)


def node_generator(seed: int | None, index: int) -> np.random.Generator:
    """The node's noise generator: SeedSequence(seed, spawn_key=(index,)) — independent streams
    per node from one seed — or, with seed None, fresh OS entropy on the node."""
    entropy = None if seed is None else np.random.SeedSequence(int(seed), spawn_key=(int(index),))
    return np.random.default_rng(entropy)


def laplace_noise(rng: np.random.Generator, sensitivity: float, epsilon: float,
                  shape: tuple[int, ...]) -> np.ndarray:
    """The Laplace mechanism's noise for an ε-DP release of a quantity with L1 sensitivity Δ:
    i.i.d. Laplace(0, Δ/ε) entries."""
    return rng.laplace(0.0, sensitivity / epsilon, size=shape)


def gaussian_noise(rng: np.random.Generator, std: float, shape: tuple[int, ...]) -> np.ndarray:
    """i.i.d. N(0, std²) entries (the Gaussian mechanism, with std calibrated by the caller)."""
    return rng.normal(0.0, std, size=shape)


class NoiseLog:
    """Per draw: the scale the caller reports (a sensitivity, a standard deviation), the mean
    magnitude of the noise, and, with `keep`, the draw itself (for tests and debugging)."""

    def __init__(self, keep: bool = False):
        self.scale: list[float] = []
        self.noise_abs: list[float] = []
        self.noise: list[np.ndarray] | None = [] if keep else None

    def add(self, scale: float, noise: np.ndarray) -> None:
        self.scale.append(scale)
        self.noise_abs.append(float(np.mean(np.abs(noise))))
        if self.noise is not None:
            self.noise.append(noise.copy())

    @staticmethod
    def add_rows(logs: list["NoiseLog"], scales: list[float], noise: np.ndarray) -> None:
        """`logs[i].add(scales[i], noise[i])` for every row of `noise` (k, d), with the mean
        magnitudes computed in one pass (row by row, the same numbers)."""
        magnitudes = np.mean(np.abs(noise), axis=1) if noise.shape[1] else np.full(len(logs), np.nan)
        for log, scale, row, magnitude in zip(logs, scales, noise, magnitudes.tolist()):
            log.scale.append(scale)
            log.noise_abs.append(magnitude)
            if log.noise is not None:
                log.noise.append(row.copy())

    def report(self) -> dict:
        """The log as plain lists (the draws stacked into one array, or None)."""
        return {"scale": list(self.scale), "noise_abs": list(self.noise_abs),
                "noise": None if self.noise is None else np.array(self.noise)}


def glm_sensitivity_bound(feature_l1: float, slope_l1: float, weight: float,
                          replace: bool = True) -> float:
    """A data-independent L1 sensitivity of the gradient for models whose records enter only
    through a_iᵀw (linear, logistic, softmax regression) with loss weight `weight` per record
    (1/I or 1/I_p). Assumes every possible record has ‖a‖₁ ≤ feature_l1 (pixels in [0, 1]: J)
    and a loss whose derivative in the predictor has ‖∂ℓ/∂(aᵀw)‖₁ ≤ slope_l1 everywhere
    (logistic: 1, softmax cross-entropy: 2; squared loss only with bounded residuals). The
    record's gradient term a ⊗ ∂ℓ then has ‖·‖₁ ≤ feature_l1·slope_l1·weight; replacing one
    record moves the gradient by at most twice that (`replace=False`: adding/removing one with
    the weight fixed)."""
    if min(feature_l1, slope_l1, weight) <= 0:
        raise FedModelError("glm_sensitivity_bound needs positive feature_l1, slope_l1 and weight")
    return (2.0 if replace else 1.0) * feature_l1 * slope_l1 * weight
