"""A checkpoint's history as appended records (issue 25; used by runtime/checkpoint.py).

Each save used to re-walk (`checkpoint._remap`) and re-pickle the whole history, so a run saved
every round cost O(rounds²). Here each record is encoded and pickled once, at the first save that
holds it, and the file stores the pickles appended as one bytes string: a save costs O(state +
new records) in Python work (writing the bytes is a copy). The file is still written whole and
atomically, so a kill at any moment leaves a checkpoint that resumes bitwise.

A record must not change after the save that follows it: backends complete a record (callback,
objective) before that save (docs/checkpoints.md).
"""
from __future__ import annotations

import io
import pickle
from typing import Any, Callable


class AppendedHistory:
    """The pickles of the history records saved so far, their count and the last record itself
    (a list handed over that does not continue the one saved before is noticed by it, and
    encoded afresh)."""

    def __init__(self) -> None:
        self.pickles = bytearray()
        self.count = 0
        self.last: Any = None
        self.encoded = 0        # records encoded by this run (tests: bounded per save)

    def resume(self, pickles: bytes | None, history: Any) -> None:
        """After a resume: `history` (the loop's, decoded) is what `pickles` holds."""
        if pickles and isinstance(history, list):
            self.pickles, self.count = bytearray(pickles), len(history)
            self.last = history[-1] if history else None

    def bytes_of(self, history: list, encode: Callable[[Any], Any]) -> bytes:
        """The pickles of all of `history`'s records, encoding only those not encoded before."""
        done = self.count
        if not done or done > len(history) or history[done - 1] is not self.last:
            self.pickles, done = bytearray(), 0
        for record in history[done:]:
            self.pickles += pickle.dumps(encode(record), protocol=pickle.HIGHEST_PROTOCOL)
        self.encoded += len(history) - done
        self.count, self.last = len(history), history[-1] if history else None
        return bytes(self.pickles)


def join_history(data: dict[str, Any]) -> bytes | None:
    """Put the records of `data["history"]` back into `data["loop"]["history"]`; return their
    pickles. A file whose loop state holds its history itself (written by `atomic_write`
    directly, as tests do) is left as it is."""
    pickles = data.pop("history", None)
    if pickles is None or data.get("loop") is None:
        return None
    records, stream = [], io.BytesIO(pickles)
    while stream.tell() < len(pickles):
        records.append(pickle.load(stream))
    data["loop"]["history"] = records
    return pickles
