"""Which of two interchangeable ways of computing the same numbers is faster now.

`FasterWay` times the calls of one call site in blocks of `BLOCK` and runs the way whose
recent blocks were faster; the other way gets one block (a probe) after `interval` blocks,
and each probe it loses doubles the interval (up to `MAX_INTERVAL`). Under a steady load
the slower way so costs at most one block in `MAX_INTERVAL + 1`; when the load changes, a
probe finds the better way within `MAX_INTERVAL` blocks, and a running way whose mean rose
above the other's last probe has the other probed at once (no margin: where the two are
close, either costs little, and a margin would keep a way that is slower by less than it).

Block means, not single calls, are compared: a call preempted by another process costs
milliseconds, which would otherwise decide alone. The caller times the calls:

    way = faster.choose()
    start = time.perf_counter(); run(way); faster.record(time.perf_counter() - start)
"""
from __future__ import annotations

#: calls per timed block
BLOCK = 8
#: the most blocks of the faster way between two probes of the other
MAX_INTERVAL = 128


class FasterWay:
    """The faster of ways 0 and 1 of one call site, by timed blocks of calls (module docstring).
    Way 0 runs first: give it the way that is safe when the other is slow."""

    def __init__(self) -> None:
        self.current = 0                # the way that runs between probes
        self.running = 0                # the way of the block under way
        self.means: list[float | None] = [None, None]  # s per call: running mean / last probe
        self.interval = 1               # blocks of `current` between two probes
        self._wait = 0                  # blocks of `current` before the next probe
        self._untimed = [True, True]    # a way's first call is not timed (it may compile)
        self._calls, self._seconds = 0, 0.0

    def choose(self) -> int:
        """The way to run next (0 or 1)."""
        return self.running

    def warmed(self, way: int) -> None:
        """`way` ran once outside the choice (untimed): its next call is timed."""
        self._untimed[way] = False

    def record(self, seconds: float) -> None:
        """The time of a call of the chosen way."""
        if self._untimed[self.running]:
            self._untimed[self.running] = False
            return
        self._calls += 1
        self._seconds += seconds
        if self._calls >= BLOCK:         # (≥: two threads' calls may both count before one checks)
            self._finish(self._seconds / self._calls)
            self._calls, self._seconds = 0, 0.0

    def _finish(self, mean: float) -> None:
        """Take a block's mean time per call and pick the next block's way."""
        way, other = self.running, 1 - self.running
        if way == self.current:
            previous = self.means[way]
            self.means[way] = mean if previous is None else (previous + mean) / 2
            slowed = self.means[other] is None or self.means[way] > self.means[other]
            self._wait = 0 if slowed else self._wait - 1
        else:                                   # a probe: the other way as it runs now
            self.means[way] = mean
            if mean < self.means[other]:
                self.current = way
            else:
                self.interval = min(2 * self.interval, MAX_INTERVAL)
            self._wait = self.interval
        self.running = self.current if self._wait > 0 else 1 - self.current
