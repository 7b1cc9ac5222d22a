"""Rᵀ diag(t) R for one data matrix R (a client's rows times the column scales), by the product
its data allows, chosen once when the data is bound (`GramRows(R)`), never per Hessian:

- dense R: BLAS dsyrk on √|t| ∘ R by sign (half a GEMM's flops) over the columns R has nonzeros
  in, scattered into the upper triangle when they are at most `COMPACT_FRACTION` of the columns
  (MNIST 3v7's pixels: 565 of 784 columns a client of 1,240 rows, syrk 11 → 6 ms; a zero column
  adds nothing to the product);
- sparse R (scipy CSR), its nonzero columns at least `DENSE_DENSITY` full: the same syrk over
  `chunk` rows at a time made dense (at most n² floats, one Hessian's: the whole matrix is never
  densified). scipy.sparse's product of MNIST's rows as CSR takes 170 ms against 17 for syrk:
  its flops are fewer (Σ nnz_r², 1/4 here) but each costs ~6 ns against BLAS's ~0.03;
- sparse R below that density: scipy.sparse's product (R diag(t))ᵀ R, dense d × d;
- fewer than `syrk_min_columns` columns (gram_hessian's): one GEMM (3,256 × 14: syrk 127, GEMM
  85 µs), or scipy.sparse's product for CSR.
Every way gives the dense product's numbers up to round-off (tests/test_bigdense_gram.py, 1e-12).
"""
from __future__ import annotations

import numpy as np

#: compact a dense matrix's columns to its nonzero ones when they are at most this fraction of
#: them (the scatter into d × d costs ~0.5–1 ms at d = 784; a syrk of 10 % fewer columns saves ~2)
COMPACT_FRACTION = 0.9
#: a CSR matrix whose nonzero columns are at least this full takes dense syrk over row chunks
#: (measured crossover, m × d = 1,240 × 784 and 2,000 × 2,000 at random sparsity: between 2 %
#: (sparse 4× faster) and 5 % (dense 1.3–2× faster))
DENSE_DENSITY = 0.035


class GramRows:
    """R (m × n, dense or CSR) as its Gram products take it: `kind` "syrk" (dense rows, maybe
    compacted), "chunks" (CSR rows made dense `chunk` at a time), "sparse" or "gemm";
    `columns` the kept columns (None: all)."""

    __slots__ = ("rows", "columns", "kind", "shape", "chunk")

    def __init__(self, R, syrk_min_columns: int):
        self.shape = R.shape
        m, n = R.shape
        sparse = hasattr(R, "toarray")
        nonzero = np.flatnonzero(np.diff(R.tocsc().indptr) if sparse else np.any(R != 0, axis=0))
        self.columns = nonzero if nonzero.size <= COMPACT_FRACTION * n else None
        self.chunk = m
        if not sparse:
            self.kind = "syrk" if n >= syrk_min_columns else "gemm"
        elif n >= syrk_min_columns and R.nnz >= DENSE_DENSITY * m * max(nonzero.size, 1):
            self.kind = "chunks"
            self.chunk = max(1, n * n // max(nonzero.size, 1))
        else:
            self.kind = "sparse"
        if self.kind in ("gemm", "sparse"):
            self.columns = None
        kept = R if self.columns is None else R[:, self.columns]
        self.rows = kept.tocsr() if sparse else np.ascontiguousarray(kept, dtype=float)

    def transpose_times(self, p: np.ndarray) -> np.ndarray:
        """Rᵀ p (length n)."""
        found = self.rows.T @ p
        if self.columns is None:
            return found
        full = np.zeros(self.shape[1])
        full[self.columns] = found
        return full

    def add_weighted(self, upper: np.ndarray, t: np.ndarray, fresh: bool = False) -> "np.ndarray | None":
        """upper += Rᵀ diag(t) R in its upper triangle (Fortran order, in place; its strict
        lower triangle stays zero); "sparse" and "gemm": the full matrix returned instead.
        `fresh`: upper is all zeros (compacted columns are then assigned, not added: 0.9
        against 2.6 ms at 565 of 784 columns)."""
        R = self.rows
        if self.kind == "gemm":
            return R.T @ (t[:, None] * R)
        if self.kind == "sparse":
            return (R.T @ R.multiply(t[:, None]).tocsr()).toarray()
        if self.columns is None:
            target = upper
        elif self.columns.size == 0:
            return None
        else:
            target = np.zeros((self.columns.size,) * 2, order="F")
        for start in range(0, self.shape[0], self.chunk):
            part = R[start:start + self.chunk]
            _syrk(target, part.toarray() if self.kind == "chunks" else part, t[start:start + self.chunk])
        if target is not upper:     # (sorted columns: the upper triangle lands in the upper)
            block = np.ix_(self.columns, self.columns)
            if fresh:
                upper[block] = target
            else:
                upper[block] += target
        return None


def _syrk(upper: np.ndarray, R: np.ndarray, t: np.ndarray) -> None:
    """upper += Rᵀ diag(t) R (upper triangle, Fortran order, in place): the rows of t > 0 and
    of t < 0 as two symmetric rank-k updates of √|t| ∘ R."""
    from scipy.linalg.blas import dsyrk     # (scipy: not at import time)
    for rows, sign in ((t > 0, 1.0), (t < 0, -1.0)):
        if not rows.any():
            continue
        every = rows.all()
        B = np.multiply(R if every else R[rows], np.sqrt(np.abs(t if every else t[rows]))[:, None])
        a, trans = (B, 1) if B.flags.f_contiguous else (np.ascontiguousarray(B).T, 0)
        found = dsyrk(sign, a, beta=1.0, c=upper, trans=trans, overwrite_c=True)
        if found is not upper:          # (in place for a Fortran float64 `upper`; else a copy)
            upper[...] = found
