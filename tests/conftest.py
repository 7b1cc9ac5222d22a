"""Shared test helpers."""
from __future__ import annotations

import os
from typing import Any, Callable

import pytest


def missing_data(reason: str) -> None:
    """Reference data absent: a visible skip on a machine without `../shared/data`, a failure
    where FEDMODEL_REQUIRE_DATA is set (.ci/run sets it: CI has the data, so a missing directory
    there is a broken set-up that must not pass having checked nothing)."""
    if os.environ.get("FEDMODEL_REQUIRE_DATA"):
        pytest.fail(f"{reason} (FEDMODEL_REQUIRE_DATA is set)", pytrace=False)
    pytest.skip(reason)


def load_data(loader: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`loader(*args, **kwargs)` for a loader that reads the reference data (fedmodel.datasets,
    a reproduction's `load`); `missing_data` when a file it needs is absent. Any other DataError
    (a checksum mismatch, an unreadable file) is a real failure and propagates."""
    from fedmodel.errors import DataError
    try:
        return loader(*args, **kwargs)
    except DataError as exc:
        # fedmodel.datasets.data_file: "dataset file '...' not found in <dir> (set FEDMODEL_DATA ..."
        if "not found" not in str(exc):
            raise
        missing_data(str(exc))


@pytest.fixture
def solve_counts(monkeypatch) -> dict:
    """Counts of the groups' batched Newton solves ("batched": `Group.solve_newton`) and of the
    clients' own local solves ("own": `NodeProgram.solve_local`) from now on in the test."""
    from fedmodel.runtime.batched_group import Group
    from fedmodel.runtime.program import NodeProgram
    counts = {"batched": 0, "own": 0}
    for cls, method, key in ((Group, "solve_newton", "batched"), (NodeProgram, "solve_local", "own")):
        original = getattr(cls, method)

        def counted(self, *args, _original=original, _key=key, **kwargs):
            counts[_key] += 1
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(cls, method, counted)
    return counts


class StopRun(Exception):
    """Raised by a callback to stop a run the hard way (as a crash would): kill-and-resume tests."""


def stop_after(count: int):
    """A callback that raises `StopRun` at the `count`-th record it is handed."""
    seen = [0]

    def callback(record):
        seen[0] += 1
        if seen[0] == count:
            raise StopRun
    return callback
