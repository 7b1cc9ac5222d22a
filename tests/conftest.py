"""Shared test helpers."""
from __future__ import annotations

import os

import pytest


def missing_data(reason: str) -> None:
    """Reference data absent: a visible skip on a machine without `../shared/data`, a failure
    where FEDMODEL_REQUIRE_DATA is set (.ci/run sets it: CI has the data, so a missing directory
    there is a broken set-up that must not pass having checked nothing)."""
    if os.environ.get("FEDMODEL_REQUIRE_DATA"):
        pytest.fail(f"{reason} (FEDMODEL_REQUIRE_DATA is set)", pytrace=False)
    pytest.skip(reason)
