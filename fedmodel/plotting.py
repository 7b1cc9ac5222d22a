"""`fm.plot(result, path)`: convergence figures like the papers' (docs/watching.md).

- convergence.png: the objective; the largest constraint violation with the feasibility
  threshold (dashed black, as in Figs. 1–2 of the ProxAL paper); the residuals the backend
  reports (primal/dual residuals, changes, certificates) on a log scale; with `reference`,
  the relative objective gap |f − f*|/|f*| on a log scale (never /max(1, |f*|): the same
  curve for data in any units).
- clients.png (when the history has per-client values, e.g. ProxAL): mean local objective and
  mean local violation over the clients with their min–max range as a band (the papers'
  "cross-client variation"), and the threshold.
- topology.png (when `topology` is given): the graph, by `topologies.draw`.

Works with any backend's history: it plots the keys that are present. Figures are drawn with
matplotlib's object API on an Agg canvas, so the user's pyplot state is never touched.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FedModelError

# history key -> legend label; the residuals panel shows those present
RESIDUALS = {
    "primal_residual": "primal residual",
    "dual_residual": "dual residual",
    "primal_change": "primal change ‖Δw‖∞",
    "multiplier_change": "multiplier change ‖Δμ‖∞",
    "certificate": "ADMM certificate (22)",
    "true_residual": "‖∇ℓ_k‖∞",
    "constraint_residual": "constraint residual",
    "consensus_violation": "consensus violation Σ‖w − z_p‖₁",
    "tau": "tolerance τ_k",
}
BLUE, BROWN = "tab:blue", "tab:brown"


def plot(result, path: str | Path, threshold: float = 1e-3, reference: Any = None,
         topology: Any = None, dpi: int = 110) -> list[Path]:
    """Write the convergence figures of `result` as PNG files into the directory `path` (created
    if needed) and return their paths. `threshold`: the feasibility threshold drawn on the
    violation panels (default 1e-3, ProxAL's ε₁). `reference`: the optimal objective (a number
    or a Result, e.g. a CVXPY solve) for an objective-gap panel. A result without history (CVXPY)
    gives no convergence figures."""
    history = getattr(result, "history", None)
    if history is None:
        raise FedModelError(f"fm.plot takes a Result, got {type(result).__name__}")
    if not (isinstance(threshold, (int, float)) and threshold > 0 and math.isfinite(threshold)):
        raise FedModelError(f"threshold must be a positive number, got {threshold!r}")
    if reference is not None and not isinstance(reference, (int, float)):
        reference = getattr(reference, "objective", None)
        if reference is None:
            raise FedModelError("reference must be a number or a Result")
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise FedModelError(f"fm.plot writes PNG files into a directory; {str(directory)!r} is a file")
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    title = f"{result.backend}: {result.status}"
    problem = getattr(result, "problem", None)
    constrained = None if problem is None else bool(problem.constraints)
    figures = {"convergence.png": convergence_figure(history, threshold, reference, title, constrained),
               "clients.png": clients_figure(history, threshold, title)}
    for name, figure in figures.items():
        if figure is not None:
            figure.savefig(directory / name, dpi=dpi)
            paths.append(directory / name)
    if topology is not None:
        from fedmodel import topologies
        paths.append(Path(topologies.draw(topology, directory / "topology.png") or directory / "topology.png"))
    return paths


def save_figure(figure, path: str | Path, dpi: int = 110) -> Path:
    """Write `figure` to the PNG `path` (creating its directory) and close it."""
    import matplotlib.pyplot as plt
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return path


def _series(history, key) -> np.ndarray:
    return np.array([_float(r.get(key)) for r in history])


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _positive(values: np.ndarray) -> np.ndarray:
    """Zeros become gaps on a log scale (NaN breaks the line instead of bridging it)."""
    return np.where(values > 0, values, np.nan)


def _x_axis(history) -> tuple[np.ndarray, str]:
    for key, label in (("iteration", "outer iteration"), ("round", "round")):
        if history and all(isinstance(r.get(key), (int, np.integer)) for r in history):
            return np.array([r[key] for r in history]), label
    return np.arange(1, len(history) + 1), "record"


def _new_figure(panels: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    cols = panels if panels <= 3 else 2
    rows = math.ceil(panels / cols)
    figure = Figure(figsize=((5.2 if cols < 3 else 4.6) * cols, 3.6 * rows), layout="constrained")
    from matplotlib.ticker import MaxNLocator
    FigureCanvasAgg(figure)
    axes = [figure.add_subplot(rows, cols, i + 1) for i in range(panels)]
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # iterations are integers
    return figure, axes


def _violation_axes(ax, threshold: float, values: np.ndarray) -> None:
    # symlog: zero (feasible) is shown, and decades below the threshold stay readable
    ax.set_yscale("symlog", linthresh=threshold / 100)
    top = np.nanmax(values, initial=0.0)
    ax.set_ylim(0, 3 * max(top, threshold))       # the threshold line is always in view
    ax.axhline(threshold, color="black", linestyle="--", linewidth=1,
               label=f"threshold {threshold:g}")


def convergence_figure(history, threshold: float = 1e-3, reference: float | None = None,
                       title: str = "", constrained: bool | None = None):
    """Objective, violation (with threshold), residuals and (with `reference`) objective gap
    against the iteration; None for an empty history. `constrained=False` drops the violation
    panel (None: shown when the history has violations)."""
    if not history:
        return None
    x, xlabel = _x_axis(history)
    objective = _series(history, "objective")
    violation = _series(history, "violation")
    residuals = {k: _series(history, k) for k in RESIDUALS
                 if any(np.isfinite(v) and v > 0 for v in _series(history, k))}
    if constrained is None:
        constrained = bool(np.any(violation > 0))
    kinds = ["objective"] + (["violation"] if constrained and np.any(np.isfinite(violation)) else []) \
        + (["residuals"] if residuals else []) + (["gap"] if reference is not None else [])
    figure, axes = _new_figure(len(kinds))
    marker = "." if len(x) < 40 else None
    for ax, kind in zip(axes, kinds):
        if kind == "objective":
            ax.plot(x, objective, color=BLUE, marker=marker, label="objective")
            if reference is not None:
                ax.axhline(reference, color="gray", linestyle=":", label=f"reference {reference:.6g}")
            ax.set_title("objective")
        elif kind == "violation":
            ax.plot(x, violation, color=BROWN, marker=marker, label="max violation")
            _violation_axes(ax, threshold, violation)
            ax.set_title("constraint violation")
        elif kind == "residuals":
            for i, (key, values) in enumerate(residuals.items()):
                ax.plot(x, _positive(values), marker=marker, label=RESIDUALS[key],
                        linestyle=("-", "--", "-.", ":")[i % 4])   # lines that coincide stay visible
            ax.set_yscale("log")
            ax.set_title("residuals")
        else:
            scale, label = _gap_scale(reference, objective)
            ax.plot(x, _positive(np.abs(objective - reference) / scale), color=BLUE, marker=marker)
            ax.set_yscale("log")
            ax.set_title(f"relative objective gap |f − f*| / {label}")
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    return figure


def _gap_scale(reference: float, objective: np.ndarray) -> tuple[float, str]:
    """What the objective gap is divided by, and its label: |f*|, or where f* = 0 the largest
    |f| of the run (a gap to a zero optimum has no size of its own); 1 when both are 0."""
    if reference != 0 and math.isfinite(reference):
        return abs(reference), "|f*|"
    largest = np.nanmax(np.abs(objective), initial=0.0)
    return (largest, "max |f|") if largest > 0 and math.isfinite(largest) else (1.0, "1")


def _per_client(history, key) -> np.ndarray | None:
    """(records × clients) array of a per-client dict entry, or None if absent."""
    if not history or not all(isinstance(r.get(key), dict) and r[key] for r in history):
        return None
    clients = list(history[0][key])
    return np.array([[_float(r[key].get(c)) for c in clients] for r in history])


def clients_figure(history, threshold: float = 1e-3, title: str = ""):
    """Mean local objective and mean local violation over the clients, each with its min–max
    band, as in Figs. 1–2 of the ProxAL paper; None when the history has no per-client values."""
    objective = _per_client(history, "client_objective")
    violation = _per_client(history, "client_violation")
    panels = [(k, v) for k, v in (("objective", objective), ("violation", violation)) if v is not None]
    if not panels:
        return None
    x, xlabel = _x_axis(history)
    figure, axes = _new_figure(len(panels))
    for ax, (kind, values) in zip(axes, panels):
        color = BLUE if kind == "objective" else BROWN
        n = values.shape[1]
        ax.fill_between(x, np.nanmin(values, axis=1), np.nanmax(values, axis=1), color=color,
                        alpha=0.25, linewidth=0, label=f"min–max over {n} clients")
        ax.plot(x, np.nanmean(values, axis=1), color=color, label="mean over clients")
        if kind == "violation":
            global_violation = _series(history, "violation")
            ax.plot(x, global_violation, color=BLUE, linestyle="-.", linewidth=1,
                    label="max violation (all constraints)")
            _violation_axes(ax, threshold, np.concatenate([values.ravel(), global_violation]))
            ax.set_title("local feasibility (constraint violation)")
        else:
            ax.set_title("local objectives")
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    return figure
