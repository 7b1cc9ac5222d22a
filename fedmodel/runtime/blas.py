"""BLAS and LAPACK on one thread while a run's node programs compute.

A client step works on small dense matrices (a d × d Hessian, its factor or eigendecomposition,
products with a client's rows). A multi-threaded BLAS hands every such call to its threads and
waits for the slowest; on cores shared with other work a preempted thread makes the wait a
scheduler time slice. Measured on a 2-core machine at load 8 (OpenBLAS 0.3.31, 2 threads):
`numpy.linalg.eigh` of a 30 × 30 matrix took 39 ms threaded and 0.4 ms on one thread (100 × 100:
391 / 8 ms; 784 × 784: 5.1 / 0.48 s), and `fedmodel run` spent half its solve in 251 such calls.
So a run limits BLAS to one thread (`threadpoolctl`) and restores the caller's setting after.

`FEDMODEL_BLAS_THREADS`: the thread count during a run (default 1); `0` leaves BLAS as it is.
"""
from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from typing import Iterator

from ..errors import FedModelError

_CONTROLLER = None     # threadpoolctl's view of the loaded BLAS libraries (~8 ms to build): once


def run_threads() -> int:
    """The BLAS threads a run uses: `FEDMODEL_BLAS_THREADS` (default 1; 0: leave BLAS alone)."""
    raw = os.environ.get("FEDMODEL_BLAS_THREADS", "1").strip()
    try:
        count = int(raw)
    except ValueError:
        count = -1
    if count < 0:
        raise FedModelError(f"FEDMODEL_BLAS_THREADS must be a whole number ≥ 0 (0: leave BLAS's "
                            f"threads as they are), got {raw!r}")
    return count


@contextmanager
def run_blas_threads() -> Iterator[None]:
    """Inside the block, BLAS/LAPACK use `run_threads()` threads (module docstring)."""
    global _CONTROLLER
    count = run_threads()
    if count == 0:
        yield
        return
    if _CONTROLLER is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:         # (a dependency; without it BLAS keeps its own threads)
            _CONTROLLER = False
        else:
            _CONTROLLER = ThreadpoolController()
    limit = _CONTROLLER.limit(limits=count, user_api="blas") if _CONTROLLER else nullcontext()
    with limit:
        yield
