"""diag(X_1, …, X_n) for dense client data of one width: the batched plans' `X_i v_i` and
`X_iᵀ r_i` of every client as two compiled loops over the stacked rows, without an index array.

`batched_plan` multiplies per-client data by a block-diagonal matrix. For sparse data (MNIST:
~80 % zeros) that is a CSR matrix without the zeros; for dense data CSR reads an index per
entry and scatters through it, so a product costs ~1.5–2× a pass over the stacked data.
`DenseBlocks` keeps the stacked (Σm_i, d) rows as they are, with each client's first row, and
multiplies in the same order as CSR (row by row, columns in order, one accumulator per row):
the same numbers, bit for bit. The loops are numba-compiled on first use
(`dense_loops`), so importing the runtime does not load numba.

Large products split whole clients over numba's threads (the reference pass Xᵀ(X v) uses
every BLAS thread too). Where threads are unsafe a product runs on the calling thread (same
numbers): in a process forked after this one started numba's threads (GNU OpenMP, numba's
usual threading layer, terminates a forked child that launches them) and while another thread
of the process is in a parallel product (numba's fallback layer, workqueue, is not thread-safe).
"""
from __future__ import annotations

import os
import threading
from functools import cache

import numpy as np

#: stacked data with at least this fraction of nonzero entries is kept dense
DENSE_FRACTION = 0.5
#: entries of stacked data below which a product runs on one thread (a thread's start costs
#: about what 10⁵ multiply-adds do)
PARALLEL_ENTRIES = 100_000
#: tasks per thread of a parallel product (threads that finish early take the remaining ones)
TASKS_PER_THREAD = 4


@cache
def _numba():
    """(numba, the compiled loops `dense_loops`), imported on first use."""
    import numba
    from . import dense_loops
    return numba, dense_loops


_PARALLEL_LOCK = threading.Lock()
_threads_pid: int | None = None         # the process that started numba's threads


def _run(name: str, args: tuple, chunks: np.ndarray) -> None:
    """dense_loops' `name` over every client: in parallel, one task per chunk handed out one
    at a time (a thread slowed by another process does not hold the product up), or on the
    calling thread where threads are unsafe (module docstring) or there is one task."""
    global _threads_pid
    numba, loops = _numba()
    pid = os.getpid()
    if len(chunks) > 2 and _threads_pid in (None, pid) and _PARALLEL_LOCK.acquire(blocking=False):
        try:
            _threads_pid = pid
            previous = numba.set_parallel_chunksize(1)
            try:
                getattr(loops, name)(*args, chunks)
            finally:
                numba.set_parallel_chunksize(previous)
        finally:
            _PARALLEL_LOCK.release()
    else:
        getattr(loops, f"_{name}_clients")(*args, 0, int(chunks[-1]))


class DenseBlocks:
    """diag(X_1, …, X_n) (or its transpose, `.T`) for X_i of shape (m_i, d): `A @ v` for a
    flat vector v, like the CSR matrix it replaces (shape, `.T`, `@` with 1-D operands)."""

    def __init__(self, stacked: np.ndarray, starts: np.ndarray, n: int, transposed: bool = False):
        self.stacked, self.starts, self.n = stacked, starts, n      # client i: rows starts[i]:starts[i+1]
        self.transposed = transposed
        rows, d = stacked.shape
        self.shape = (n * d, rows) if transposed else (rows, n * d)
        self._chunks: np.ndarray | None = None     # client boundaries of the tasks (`chunks`)

    def chunks(self, threads: int) -> np.ndarray:
        """Client boundaries splitting the rows into TASKS_PER_THREAD · `threads` nearly equal
        tasks (one for small data or one thread): each task multiplies whole clients."""
        parts = TASKS_PER_THREAD * threads if self.stacked.size >= PARALLEL_ENTRIES and threads > 1 else 1
        rows = np.linspace(0, self.stacked.shape[0], parts + 1)
        return np.unique(np.searchsorted(self.starts, rows)).astype(np.int64)

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
        d = self.stacked.shape[1]
        if self._chunks is None:        # (numba's thread count when the data is first multiplied)
            self._chunks = self.chunks(_numba()[0].get_num_threads())
        if self.transposed:
            out = np.empty((self.n, d))
            _run("backward", (self.stacked, self.starts, v, out), self._chunks)
            return out.ravel()
        out = np.empty(self.stacked.shape[0])
        _run("forward", (self.stacked, self.starts, v.reshape(self.n, d), out), self._chunks)
        return out
