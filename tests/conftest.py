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
