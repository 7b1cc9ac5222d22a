"""Timing helpers shared by the benchmarks: interleaved repeated timing and machine info.

Benchmarks in this folder report *ratios* (fedmodel / reference), not absolute times. On a
shared or noisy machine the absolute time of a call drifts by tens of percent within seconds,
so `compare` times the competing functions in the same repetition, one after the other (the
order rotated between repetitions), and the ratio is taken per repetition before the median
is taken: a slow spell slows both sides of a pair and cancels out of their ratio.
"""
from __future__ import annotations

import os
import platform
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from fedmodel.collector import collection_paused


@dataclass
class Timing:
    """Seconds per call of each function, one sample per repetition (samples are paired)."""

    samples: dict[str, np.ndarray]
    number: dict[str, int] = field(default_factory=dict)   # calls per sample

    def median(self, name: str) -> float:
        return float(np.median(self.samples[name]))

    def best(self, name: str) -> float:
        return float(np.min(self.samples[name]))

    def ratio(self, numerator: str, denominator: str) -> float:
        """Median over repetitions of the paired ratio numerator/denominator."""
        return float(np.median(self.samples[numerator] / self.samples[denominator]))

    def best_ratio(self, numerator: str, denominator: str) -> float:
        """Ratio of the best (minimum) times: a second, independent robust estimate."""
        return self.best(numerator) / self.best(denominator)

    @property
    def repeats(self) -> int:
        return len(next(iter(self.samples.values())))


def _time_calls(fn: Callable[[], Any], number: int) -> float:
    """Seconds for `number` calls of fn, garbage collection off (as timeit does)."""
    with collection_paused():
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return time.perf_counter() - start


def calls_per_sample(fn: Callable[[], Any], min_time: float) -> tuple[int, float]:
    """Smallest number of calls in 1, 2, 5, 10, 20, 50, … whose total time reaches
    `min_time` (timeit's autorange), and the seconds per call measured on the way."""
    number = 1
    while True:
        for factor in (1, 2, 5):
            calls = number * factor
            elapsed = _time_calls(fn, calls)
            if elapsed >= min_time or calls >= 10**6:
                return calls, elapsed / calls
        number *= 10


def compare(functions: Mapping[str, Callable[[], Any]], *, budget: float = 2.0,
            min_time: float = 2e-4, min_repeats: int = 5, max_repeats: int = 2001,
            warmup: int = 1) -> Timing:
    """Time each function repeatedly, interleaved, within about `budget` seconds in total.

    Each function gets its own number of calls per sample (so one sample lasts ≥ `min_time`,
    well above the timer's resolution); the number of repetitions is chosen from the budget
    and clamped to [min_repeats, max_repeats]. Repetition r runs the functions in an order
    rotated by r, so no function is always first (cold caches) or always last.
    """
    names = list(functions)
    for name in names:                      # warm up: caches, lazy imports, allocator
        for _ in range(warmup):
            functions[name]()
    number: dict[str, int] = {}
    per_call: dict[str, float] = {}
    for name in names:
        number[name], per_call[name] = calls_per_sample(functions[name], min_time)
    one_round = sum(number[n] * per_call[n] for n in names)
    repeats = int(min(max_repeats, max(min_repeats, budget / max(one_round, 1e-9))))
    samples = {name: np.empty(repeats) for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name][r] = _time_calls(functions[name], number[name]) / number[name]
    return Timing(samples, number)


@contextmanager
def blas_threads(count: int | None) -> Iterator[str]:
    """Limit BLAS to `count` threads inside the block (None: leave it alone); yields a note.

    On a machine whose cores are shared with other work, a multi-threaded BLAS call waits for
    its slowest thread, and one preempted thread can make a 0.3 ms matrix-vector product take
    30 ms: such timings say nothing about the code under test. Both sides of a comparison call
    the same BLAS, so a ratio measured with one thread is the honest one there.
    """
    if count is None:
        yield "BLAS threads: library default"
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield "BLAS threads: library default (threadpoolctl is not installed)"
        return
    with threadpool_limits(limits=count, user_api="blas"):
        yield f"BLAS threads: limited to {count}"


def machine_info() -> dict[str, str]:
    """What a reader needs to judge a timing: CPU, cores, Python, numpy/scipy, BLAS."""
    info: dict[str, str] = {}
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cpu"] = cpu
    logical = os.cpu_count()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = logical
    info["cores"] = f"{usable} usable ({logical} logical)"
    info["os"] = platform.platform()
    info["python"] = sys.version.split()[0]
    info["numpy"] = np.__version__
    try:
        import scipy
        info["scipy"] = scipy.__version__
    except ImportError:
        pass
    info["blas"] = _blas_info()
    return info


def _blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (install threadpoolctl to report it)"
    entries = [f"{p.get('internal_api')} {p.get('version')} ({p.get('architecture')}, "
               f"{p.get('num_threads')} threads, {p.get('threading_layer')})"
               for p in threadpool_info() if p.get("user_api") == "blas"]
    return "; ".join(entries) or "none found by threadpoolctl"


def timed(fn, repeats: int = 1):
    """(result, CPU seconds, wall seconds) of the fastest (CPU) of `repeats` runs."""
    best = None
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        out = fn()
        run = (out, time.process_time() - cpu, time.perf_counter() - wall)
        best = run if best is None or run[1] < best[1] else best
    return best


class _Capped(Exception):
    """Raised from the callback when a run has used up its time."""


def capped_solve(prob, make: Callable, topology, cap: float) -> dict:
    """One run of `make()` stopped once it has used `cap` wall seconds: its result (None when
    capped), whether it was capped, and the iterations and last record the callback saw (so a
    capped run still reports how far it got)."""
    seen = {"result": None, "capped": False, "k": 0, "record": None}
    start = time.perf_counter()

    def stop_late(record):
        seen["k"] += 1
        seen["record"] = record
        if time.perf_counter() - start > cap:
            raise _Capped
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # statuses are in the table
            seen["result"] = prob.solve(make(), topology=topology, callback=stop_late)
    except _Capped:
        seen["capped"] = True
    return seen
