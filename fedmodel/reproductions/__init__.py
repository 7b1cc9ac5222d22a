"""Paper reproductions for `fedmodel reproduce NAME` (each prints the paper's numbers beside ours).

A reproduction is `run(full: bool = False) -> int` (exit code 0 when every check passes); the
modules are imported only when their reproduction runs.
"""
from __future__ import annotations

import importlib
from typing import Callable

_MODULES = {
    "table1": "fedmodel.reproductions.proxal_table1",        # ProxAL: Neyman-Pearson
    "table2": "fedmodel.reproductions.proxal_table2",        # ProxAL: fairness (nonconvex constraints)
    "table4": "fedmodel.reproductions.proxal_table4",        # ProxAL: LCQP
    "tableI": "fedmodel.reproductions.dald_table1",   # DALD: regression
    "tableII": "fedmodel.reproductions.dald_table2",  # DALD: MNIST 3 vs 7
    "fig5": "fedmodel.reproductions.dald_fig5",       # DALD: accuracy curves
    "insa-table1": "fedmodel.reproductions.fedadmm_synthetic",  # FedADMM-InSa: synthetic
    "insa-table2": "fedmodel.reproductions.fedadmm_mnist",      # FedADMM-InSa: MNIST
    "dp-mnist": "fedmodel.reproductions.dpadmm_mnist",    # DP-IADMM: MNIST test error vs ε̄
}


def _lazy(module: str) -> Callable[..., int]:
    def run(full: bool = False) -> int:
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            from fedmodel.errors import FedModelError
            raise FedModelError(f"reproduction module {module} is not part of this version") from None
        return loaded.run(full=full)
    run.__doc__ = f"run {module}"
    return run


REPRODUCTIONS: dict[str, Callable[..., int]] = {name: _lazy(m) for name, m in _MODULES.items()}
