"""Paper reproductions for `fedmodel reproduce NAME` (each prints the paper's numbers beside ours).

A reproduction module is named `<algorithm>_<artifact>` and defines
`run(full: bool = False, ...) -> int` (exit code 0 when every check passes); some also take
`rounds` and `plot_dir`. The modules are imported only when their reproduction runs. What they
all print and draw alike (table headers, checks, the `result:` line, figures) is in `report`.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

# `fedmodel reproduce` name -> module (the names are the papers' own table/figure labels).
_MODULES = {
    "table1": "fedmodel.reproductions.proxal_table1",        # ProxAL: Neyman-Pearson
    "table2": "fedmodel.reproductions.proxal_table2",        # ProxAL: fairness (nonconvex constraints)
    "table4": "fedmodel.reproductions.proxal_table4",        # ProxAL: LCQP
    "tableI": "fedmodel.reproductions.dald_table1",          # DALD: regression
    "tableII": "fedmodel.reproductions.dald_table2",         # DALD: MNIST 3 vs 7
    "fig5": "fedmodel.reproductions.dald_fig5",              # DALD: accuracy curves
    "insa-table1": "fedmodel.reproductions.fedadmm_synthetic",  # FedADMM-InSa: synthetic
    "insa-table2": "fedmodel.reproductions.fedadmm_mnist",      # FedADMM-InSa: MNIST
    "dp-mnist": "fedmodel.reproductions.dpadmm_mnist",       # DP-IADMM: MNIST test error vs ε̄
    "dp-constrained": "fedmodel.reproductions.dpadmm_constrained",  # DP-IADMM with constraints (ours)
    "dp-budget": "fedmodel.reproductions.dpadmm_budget",     # DP-IADMM at a total ε (ours)
}


def _lazy(name: str, module: str) -> Callable[..., int]:
    def run(full: bool = False, **options: Any) -> int:
        from fedmodel.errors import FedModelError
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            raise FedModelError(f"reproduction module {module} is not part of this version") from None
        accepted = inspect.signature(loaded.run).parameters
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            known = [p for p in accepted if p != "full"]
            raise FedModelError(f"reproduction {name!r} takes no option {', '.join(unknown)} "
                                f"(its options: {', '.join(known) or 'none'})")
        return loaded.run(full=full, **options)
    run.__doc__ = f"run {module}"
    return run


REPRODUCTIONS: dict[str, Callable[..., int]] = {name: _lazy(name, m) for name, m in _MODULES.items()}
