"""Backends: the algorithms. Each consumes compiled node programs, never raw data.

Their names are the entry points of group `fedmodel.backends` in pyproject.toml, the one list,
read through `fedmodel.registry`; `make_backend(name, **options)` and the attributes
`backends.ProxAL`, `backends.DALD`, ... (imported when first used) read it too.
"""
from __future__ import annotations

from typing import Any

from fedmodel import registry
from fedmodel.problem import make_backend
from .base import Backend
from .cvxpy_backend import CVXPY

__all__ = ["Backend", "CVXPY", "make_backend"]


def __getattr__(name: str) -> Any:
    # the registered backend whose class is `name`, found by the entry point's attribute so
    # that only its module is imported
    for entry in registry.installed("backend"):
        if entry.attr == name:
            return registry.lookup("backend", entry.name)
    raise AttributeError(f"module 'backends' has no attribute {name!r}")
