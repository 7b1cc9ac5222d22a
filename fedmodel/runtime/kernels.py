"""Compiled loops (numba) for the batched executor's sequential and fused elementwise parts.

numpy does one pass over memory per operation and one Python call per node of a sequential
loop; these kernels do the same arithmetic in the same order in one compiled loop. numba is
imported on first use (it costs ≈ 0.5 s to import, and the kernels are compiled once and
cached on disk), so `import fedmodel` does not pay for it.
"""
from __future__ import annotations

from functools import cache

import numpy as np


@cache
def _compiled():
    import numba

    @numba.njit(cache=True, nogil=True)
    def gauss_seidel_soft(B, order, ptr, source, weight, cols, threshold):
        """In S order, node i: B[i] += Σ_e weight[e]∘B[source[e]] over its early ends
        e ∈ ptr[i]:ptr[i+1] (sources already done this sweep), then B[i, cols] ← B − clip(B, −t_i, t_i).
        weight is (m, 1) (one number per edge) or (m, d); threshold[i] < 0: no prox step."""
        d = B.shape[1]
        per_coordinate = weight.shape[1] > 1
        for s in range(order.shape[0]):
            i = order[s]
            for e in range(ptr[i], ptr[i + 1]):
                j = source[e]
                for c in range(d):
                    B[i, c] += weight[e, c if per_coordinate else 0] * B[j, c]
            t = threshold[i]
            if t >= 0.0:
                for c in cols:
                    z = B[i, c]
                    B[i, c] = z - min(max(z, -t), t)

    return gauss_seidel_soft


def gauss_seidel_soft(B: np.ndarray, order: np.ndarray, ptr: np.ndarray, source: np.ndarray,
                      weight: np.ndarray, cols: np.ndarray, threshold: np.ndarray) -> None:
    """The sequential part of a Fed-DALD-DC sweep, in place on the (n, d) stack B (see
    `batched_dc.dc_sweep`). Example, a 3-node chain solved in order 0, 1, 2 with α·2ρ² = 0.5:

    >>> B = np.ones((3, 2)); ptr = np.array([0, 0, 1, 2]); source = np.array([0, 1])
    >>> gauss_seidel_soft(B, np.arange(3), ptr, source, np.full((2, 1), 0.5), np.arange(2), -np.ones(3))
    >>> B[:, 0].tolist()
    [1.0, 1.5, 1.75]
    """
    _compiled()(B, order, ptr, source, weight, cols, threshold)
