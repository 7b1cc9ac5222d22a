"""Paper reproductions for `fedmodel reproduce NAME` (each prints the paper's numbers beside ours).

A reproduction is `run(full: bool = False) -> int` (exit code 0 when every check passes); the
modules are imported only when their reproduction runs.
"""
from __future__ import annotations

import importlib
from typing import Callable

_MODULES = {
    "table1": "fedmodel.reproductions.table1",
    "table4": "fedmodel.reproductions.table4",
}


def _lazy(module: str) -> Callable[..., int]:
    def run(full: bool = False) -> int:
        return importlib.import_module(module).run(full=full)
    run.__doc__ = f"run {module}"
    return run


REPRODUCTIONS: dict[str, Callable[..., int]] = {name: _lazy(m) for name, m in _MODULES.items()}
