"""diag(X_1, …, X_n) for dense client data of one width: the batched plans' `X_i v_i` and
`X_iᵀ r_i` of every client as two compiled loops over the stacked rows, without an index array.

`batched_plan` multiplies per-client data by a block-diagonal matrix. For sparse data (MNIST:
~80 % zeros) that is a CSR matrix without the zeros; for dense data CSR reads an index per
entry and scatters through it, so a product costs ~1.5–2× a pass over the stacked data.
`DenseBlocks` keeps the stacked (Σm_i, d) rows as they are, with each client's first row, and
multiplies in the same order as CSR (row by row, columns in order, one accumulator per row):
the same numbers, bit for bit. The loops are numba-compiled on first use
(`dense_loops`), so importing the runtime does not load numba.
"""
from __future__ import annotations

from functools import cache

import numpy as np

#: stacked data with at least this fraction of nonzero entries is kept dense
DENSE_FRACTION = 0.5


@cache
def _loops():
    """(forward, backward), the compiled loops (`dense_loops`), imported on first use."""
    from . import dense_loops
    return dense_loops.forward, dense_loops.backward


class DenseBlocks:
    """diag(X_1, …, X_n) (or its transpose, `.T`) for X_i of shape (m_i, d): `A @ v` for a
    flat vector v, like the CSR matrix it replaces (shape, `.T`, `@` with 1-D operands)."""

    def __init__(self, stacked: np.ndarray, starts: np.ndarray, n: int, transposed: bool = False):
        self.stacked, self.starts, self.n = stacked, starts, n      # client i: rows starts[i]:starts[i+1]
        self.transposed = transposed
        rows, d = stacked.shape
        self.shape = (n * d, rows) if transposed else (rows, n * d)

    @classmethod
    def of(cls, blocks: list[np.ndarray]) -> "DenseBlocks | None":
        """The dense form of diag(blocks), or None where CSR is the better form (not 2-D blocks
        of one width, or fewer than `DENSE_FRACTION` nonzero entries)."""
        if not blocks or any(b.ndim != 2 for b in blocks) or len({b.shape[1] for b in blocks}) > 1:
            return None
        stacked = np.ascontiguousarray(np.concatenate(blocks, axis=0), dtype=float)
        if stacked.size == 0 or np.count_nonzero(stacked) < DENSE_FRACTION * stacked.size:
            return None
        starts = np.concatenate([[0], np.cumsum([b.shape[0] for b in blocks])]).astype(np.int64)
        return cls(stacked, starts, len(blocks))

    @property
    def T(self) -> "DenseBlocks":
        return DenseBlocks(self.stacked, self.starts, self.n, not self.transposed)

    def __matmul__(self, v):
        v = np.ascontiguousarray(v, dtype=float)
        if v.ndim != 1 or v.shape[0] != self.shape[1]:
            raise ValueError(f"DenseBlocks of shape {self.shape} times an operand of shape {v.shape}")
        forward, backward = _loops()
        d = self.stacked.shape[1]
        if self.transposed:
            G = np.empty((self.n, d))
            backward(self.stacked, self.starts, v, G)
            return G.ravel()
        out = np.empty(self.stacked.shape[0])
        forward(self.stacked, self.starts, v.reshape(self.n, d), out)
        return out
