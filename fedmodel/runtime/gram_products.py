"""Rᵀ diag(t) R for one data matrix R (a client's rows times the column scales), by the product
its data allows, chosen once when the data is bound (`GramRows(R)`), never per Hessian:

- dense R: BLAS dsyrk on √|t| ∘ R by sign (half a GEMM's flops) over the columns R has nonzeros
  in, when they are at most `COMPACT_FRACTION` of the columns (a zero column adds nothing to the
  product; MNIST 3v7's pixels: 565 of 784 columns a client of 1,240 rows, syrk 11 → 6 ms), the
  result scattered into the upper triangle. The columns are gathered `chunk` rows at a time
  into the product's own scratch (√|t| ∘ R is a copy in any case: +0.3 ms at MNIST's size), so
  the data is never held twice;
- sparse R (scipy CSR), its nonzero columns at least `DENSE_DENSITY` full: the same syrk over
  `chunk` rows at a time made dense — never more than a chunk's floats (one Hessian's) at once. scipy.sparse's
  product of MNIST's rows as CSR takes 170 ms against 17 for syrk: its flops are fewer (Σ nnz_r²,
  1/4 here) but each costs ~6 ns against BLAS's ~0.03;
- sparse R below that density: scipy.sparse's product (R diag(t))ᵀ R, dense d × d;
- fewer than `syrk_min_columns` columns (gram_hessian's): one GEMM (3,256 × 14: syrk 127, GEMM
  85 µs), or scipy.sparse's product for CSR.
A chunk is at most `CHUNK_FLOATS` or n² floats (one Hessian's), whichever is more. Every way
gives the dense product's numbers up to round-off (tests/test_bigdense_gram.py, 1e-12).
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
#: the floats of a chunk's dense scratch (or n², if more): 8 MB
CHUNK_FLOATS = 1 << 20
#: the side of the blocks `symmetric` copies (a 128 × 128 block and its transpose stay in cache)
BLOCK = 128


class GramRows:
    """R (m × n, dense or CSR) as its Gram products take it: `kind` "syrk" (dense rows, over
    `columns` gathered `chunk` rows at a time), "chunks" (CSR rows made dense `chunk` at a
    time), "sparse" or "gemm"; `columns` the nonzero columns kept (None: all)."""

    __slots__ = ("rows", "columns", "kind", "shape", "chunk")

    def __init__(self, R, syrk_min_columns: int):
        self.shape = R.shape
        m, n = R.shape
        sparse = hasattr(R, "toarray")
        if sparse:      # (the model hands canonical float64 CSR; any other sparse input as that)
            R = R.tocsr().astype(float, copy=False)
        # (a stored zero of CSR counts as a nonzero: a kept column, never a lost one)
        nonzero = np.flatnonzero(np.bincount(R.indices, minlength=n) if sparse else np.any(R, axis=0))
        self.columns = nonzero if nonzero.size <= COMPACT_FRACTION * n else None
        if not sparse:
            self.kind = "syrk" if n >= syrk_min_columns else "gemm"
        elif n >= syrk_min_columns and R.nnz >= DENSE_DENSITY * m * max(nonzero.size, 1):
            self.kind = "chunks"
        else:
            self.kind = "sparse"
        if self.kind in ("gemm", "sparse"):
            self.columns = None
        width = n if self.columns is None else max(self.columns.size, 1)
        self.chunk = m if self.kind == "syrk" and self.columns is None else \
            max(1, max(CHUNK_FLOATS, n * n) // width)
        if sparse:
            self.rows = (R if self.columns is None else R[:, self.columns]).tocsr()
        else:
            self.rows = np.asarray(R, dtype=float)      # (the caller's array: not copied)

    def transpose_times(self, p: np.ndarray) -> np.ndarray:
        """Rᵀ p (length n)."""
        if self.columns is None or not hasattr(self.rows, "toarray"):
            return self.rows.T @ p
        full = np.zeros(self.shape[1])
        full[self.columns] = self.rows.T @ p
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
            part, scratch = R[start:start + self.chunk], True
            if self.kind == "chunks":
                part = part.toarray()
            elif self.columns is not None:
                part = np.take(part, self.columns, axis=1)
            else:
                scratch = False
            _syrk(target, part, t[start:start + self.chunk], scratch)
        if target is not upper:     # (sorted columns: the upper triangle lands in the upper)
            block = np.ix_(self.columns, self.columns)
            if fresh:
                upper[block] = target
            else:
                upper[block] += target
        return None


def add_term(R: "GramRows | None", weights: list, pairs: list, upper: np.ndarray, M, n: int,
             fresh: bool):
    """One Gram term Rᵀ (diag(Σ weights) + Σ a bᵀ) R (R None: the identity) at a point:
    Rᵀ diag(t) R into `upper` (all zeros if `fresh`; for sparse and narrow rows into the full
    matrix M, made on first use and returned: `GramRows.add_weighted`), the pairs (a, b) as
    (Rᵀa)(Rᵀb)ᵀ, their symmetric part into `upper` by syr2."""
    from scipy.linalg.blas import dsyr2     # (scipy: not at import time)
    m = n if R is None else R.shape[0]
    if weights:
        t = np.array(np.broadcast_to(weights[0], (m,)), dtype=float)
        for w in weights[1:]:
            t += w
        if R is None:
            upper[np.diag_indices(n)] += t
        else:
            G = R.add_weighted(upper, t, fresh)
            if G is not None:
                M = G if M is None else M.__iadd__(G)
    for a, b in pairs:
        p, q = (np.array(np.broadcast_to(x, (m,)), dtype=float) for x in (a, b))
        found = dsyr2(0.5, p if R is None else R.transpose_times(p),
                      q if R is None else R.transpose_times(q), a=upper, overwrite_a=True)
        if found is not upper:
            upper[...] = found
    return M


def _syrk(upper: np.ndarray, R: np.ndarray, t: np.ndarray, scratch: bool) -> None:
    """upper += Rᵀ diag(t) R (upper triangle, Fortran order, in place): the rows of t > 0 and
    of t < 0 as two symmetric rank-k updates of √|t| ∘ R (`scratch`: R is this call's own copy,
    scaled in place)."""
    from scipy.linalg.blas import dsyrk     # (scipy: not at import time)
    for rows, sign in ((t > 0, 1.0), (t < 0, -1.0)):
        if not rows.any():
            continue
        every = rows.all()
        weights = np.sqrt(np.abs(t if every else t[rows]))[:, None]
        if every and scratch:
            B = np.multiply(R, weights, out=R)
        else:
            B = np.multiply(R if every else R[rows], weights)
        a, trans = (B, 1) if B.flags.f_contiguous else (np.ascontiguousarray(B).T, 0)
        found = dsyrk(sign, a, beta=1.0, c=upper, trans=trans, overwrite_c=True)
        if found is not upper:          # (in place for a Fortran float64 `upper`; else a copy)
            upper[...] = found


def symmetric(upper: np.ndarray) -> np.ndarray:
    """The symmetric matrix (C order) whose upper triangle is `upper`'s (its strict lower
    triangle zero): L + Lᵀ less L's diagonal (L = upperᵀ), by blocks from n > 2·BLOCK (the
    whole transpose read across the cache: n = 784 1.24 against 0.72 ms, 2,000 61 against 15;
    n = 129 0.019 against 0.034); the same numbers either way."""
    n = upper.shape[0]
    lower = upper.T
    if n <= 2 * BLOCK:
        H = lower + lower.T
        H[np.diag_indices(n)] = np.diagonal(lower)
        return H
    H = np.empty((n, n))
    for i in range(0, n, BLOCK):
        for j in range(0, i, BLOCK):
            H[i:i + BLOCK, j:j + BLOCK] = lower[i:i + BLOCK, j:j + BLOCK]
            H[j:j + BLOCK, i:i + BLOCK] = lower[i:i + BLOCK, j:j + BLOCK].T
        block = lower[i:i + BLOCK, i:i + BLOCK]
        H[i:i + BLOCK, i:i + BLOCK] = block + block.T
        np.einsum("ii->i", H[i:i + BLOCK, i:i + BLOCK])[:] = np.diagonal(block)
    return H
