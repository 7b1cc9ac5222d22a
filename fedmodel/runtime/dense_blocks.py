"""diag(X_1, …, X_n) for dense client data of one width: the batched plans' `X_i v_i` and
`X_iᵀ r_i` of every client as two compiled loops over the stacked rows, without an index array.

`batched_plan` multiplies per-client data by a block-diagonal matrix. For sparse data (MNIST:
~80 % zeros) that is a CSR matrix without the zeros; for dense data CSR reads an index per
entry and scatters through it, so a product costs ~1.5–2× a pass over the stacked data.
`DenseBlocks` keeps the stacked (Σm_i, d) rows as they are, with each client's first row, and
multiplies in the same order as CSR (row by row, columns in order, one accumulator per row):
the same numbers, bit for bit. The loops are numba-compiled on first use
(`dense_loops`), so importing the runtime does not load numba.

Large products run on the calling thread or split whole clients over numba's threads (same
numbers), whichever has been faster lately for this matrix and direction (`faster_way`): idle,
16 threads were 2.6–5.5× faster than one (2 threads on 2 cores: 0.8–1.2×, so
below `MIN_THREADS` usable CPUs products stay on one thread); beside other
processes on the cores, threads can be 2–25× slower. Numba's threads wait passively between
products (`OMP_WAIT_POLICY=PASSIVE` unless set, for GNU OpenMP loaded after this; inherited
by child processes): spinning threads take the cores from other work, the main thread's
included, a cost no product's time shows. Where threads are unsafe a product runs on the
calling thread: in a process forked after this one started numba's threads (GNU OpenMP
terminates a forked child that launches them) and while another thread of the process is in a
parallel product (numba's workqueue layer is not thread-safe).
"""
from __future__ import annotations

import os
import threading
import time
from functools import cache

import numpy as np

from .faster_way import FasterWay

#: stacked data with at least this fraction of nonzero entries is kept dense
DENSE_FRACTION = 0.5
#: entries of stacked data below which a product runs on one thread (a thread's start costs
#: about what 10⁵ multiply-adds do)
PARALLEL_ENTRIES = 100_000
#: fewer usable CPUs than this: one thread. On 2 cores, threads that wait passively were
#: 0.8–1.2× one thread, and the chooser's probes of them cost up to 15 % of a 20-iteration run
#: (n = 10³, d = 10); 16 threads were 2.6–5.5× faster than one.
MIN_THREADS = 4
#: tasks per thread of a parallel product (threads that finish early take the remaining ones)
TASKS_PER_THREAD = 4
#: FasterWay's ways of a product
ONE_THREAD, THREADS = 0, 1


@cache
def _numba():
    """(numba, the compiled loops `dense_loops`), imported on first use; GNU OpenMP told to
    wait passively before numba loads it (module docstring)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import numba
    from . import dense_loops
    return numba, dense_loops


def _usable_threads(numba) -> int:
    """numba's thread count, at most the CPUs this process may run on; 1 below `MIN_THREADS`."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = min(numba.get_num_threads(), cpus or 1)
    return threads if threads >= MIN_THREADS else 1


_PARALLEL_LOCK = threading.Lock()
_threads_pid: int | None = None         # the process that started numba's threads


def _in_parallel(name: str, args: tuple, chunks: np.ndarray, threads: int) -> bool:
    """dense_loops' parallel `name` over every client, one task per chunk handed out one at a
    time on `threads` threads (a thread slowed by another process does not hold the product
    up); False, running nothing, where threads are unsafe (module docstring)."""
    global _threads_pid
    if _threads_pid not in (None, os.getpid()) or not _PARALLEL_LOCK.acquire(blocking=False):
        return False
    numba, loops = _numba()
    try:
        _threads_pid = os.getpid()
        chunk_size, thread_count = numba.set_parallel_chunksize(1), numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            getattr(loops, name)(*args, chunks)
        finally:
            numba.set_num_threads(thread_count)
            numba.set_parallel_chunksize(chunk_size)
    finally:
        _PARALLEL_LOCK.release()
    return True


class DenseBlocks:
    """diag(X_1, …, X_n) (or its transpose, `.T`) for X_i of shape (m_i, d): `A @ v` for a
    flat vector v, like the CSR matrix it replaces (shape, `.T`, `@` with 1-D operands)."""

    def __init__(self, stacked: np.ndarray, starts: np.ndarray, n: int, transposed: bool = False):
        self.stacked, self.starts, self.n = stacked, starts, n      # client i: rows starts[i]:starts[i+1]
        self.transposed = transposed
        rows, d = stacked.shape
        self.shape = (n * d, rows) if transposed else (rows, n * d)
        self.faster = FasterWay()       # one thread (way 0, the safe one) or numba's threads
        self._tasks: tuple[np.ndarray, int] | None = None   # (chunks, threads) of a parallel product

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
        if self.transposed:
            out = np.empty((self.n, d))
            self._product("backward", (self.stacked, self.starts, v, out))
            return out.ravel()
        out = np.empty(self.stacked.shape[0])
        self._product("forward", (self.stacked, self.starts, v.reshape(self.n, d), out))
        return out

    def _product(self, name: str, args: tuple) -> None:
        """dense_loops' `name` over every client, on the way `faster` chooses; a call that could
        not take the threads (unsafe: module docstring) runs on one thread and is not timed."""
        numba, loops = _numba()
        first = self._tasks is None
        if first:                       # (numba's thread count when the data is first multiplied)
            threads = _usable_threads(numba)
            self._tasks = self.chunks(threads), threads
        chunks, threads = self._tasks
        one_thread = getattr(loops, f"{name}_clients")
        if len(chunks) <= 2:            # one task
            one_thread(*args, 0, self.n)
            return
        # the first product takes the threads, untimed: starting numba's thread pool and loading
        # its parallel loop (~10 ms, once) is set-up, not the first probe's time in mid-run
        if first and _in_parallel(name, args, chunks, threads):
            self.faster.warmed(THREADS)
            return
        way = self.faster.choose()
        start = time.perf_counter()
        if way == THREADS and _in_parallel(name, args, chunks, threads):
            self.faster.record(time.perf_counter() - start)
            return
        one_thread(*args, 0, self.n)
        if way == ONE_THREAD:           # (not a product the threads were unsafe for)
            self.faster.record(time.perf_counter() - start)
