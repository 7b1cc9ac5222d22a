"""What every reproduction prints and draws the same way: a table's header, a list of checks,
the closing `result:` line; figures drawn on the Agg backend (no display needed) and saved."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

_COLUMN = re.compile(r"\s*(.+?)([<>]\d+)")


def print_header(layout: str) -> None:
    """Print a table's column titles and a rule of dashes as wide. `layout` lists the titles
    with their alignment and width, groups separated by " | ": "dataset<18 n>3 | paper obj>9"
    prints `dataset` left-aligned in 18 characters, `n` right-aligned in 3, a bar, ...; a title
    may contain spaces."""
    header = " | ".join(" ".join(format(title, spec) for title, spec in _COLUMN.findall(group))
                        for group in layout.split(" | "))
    print(header)
    print("-" * len(header))


def print_checks(checks: Iterable[tuple[str, bool]]) -> bool:
    """Print each (what, passed) as `[ok]` / `[FAIL]` lines; True when all passed."""
    ok = True
    for what, passed in checks:
        print(f"  [{'ok' if passed else 'FAIL'}] {what}")
        ok &= passed
    return ok


def print_subset(name: str, covers: str, rest: str) -> None:
    """Say what a reproduction's default subset covers and what `--full` runs instead."""
    print(f"default subset: {covers}; `fedmodel reproduce {name} --full` runs {rest}")


def finish(ok: bool) -> int:
    """Print the closing `result: OK` (or `MISMATCH`) line; the exit code, 0 when ok."""
    print("result:", "OK" if ok else "MISMATCH")
    return 0 if ok else 1


@dataclass(frozen=True)
class GapVerdict:
    """How far an ε-KKT point's objective lies from the optimum, against what the theory allows.

    `gap` = objective − optimum (signed: > 0 above the optimum, < 0 below it), `bound` the
    theory's allowance for it (`judge_gap`), `scale` = |optimum| (for relative printing)."""
    gap: float
    bound: float
    scale: float

    @property
    def passed(self) -> bool:
        """True when |gap| ≤ bound (a NaN gap or bound never passes)."""
        return bool(abs(self.gap) <= self.bound)

    @property
    def side(self) -> str:
        """"above" (a real gap: the point is worse than the optimum) or "below" (an ε-feasible
        point undercutting the optimum, which only infeasibility allows)."""
        return "above" if self.gap >= 0 else "below"

    def relative(self) -> tuple[float, float]:
        """(gap, bound) divided by |optimum| (as they are when the optimum is 0)."""
        scale = self.scale if self.scale > 0 else 1.0
        return self.gap / scale, self.bound / scale

    def __str__(self) -> str:
        gap, bound = self.relative()
        return f"{gap:+.1e} {self.side} (bound {bound:.1e}): {'PASS' if self.passed else 'FAIL'}"


def judge_gap(objective: float, optimum: float, multipliers: Iterable[Any], feasibility: float,
              stationarity: float = 0.0, distance: float = 0.0) -> GapVerdict:
    """Judge an ε-KKT point's objective against the optimum of a convex model with affine
    constraints c(x) (equalities, or inequalities with [c_j]₊ for |c_j|).

    With the run's multipliers μ and stationarity residual r = ∇f(x) + Σ_j μ_j ∇c_j(x), convexity
    of the Lagrangian gives f(x) − f* ≤ −μᵀc(x) + rᵀ(x − x*), and at the optimum's multipliers
    μ* f(x) − f* ≥ −μ*ᵀc(x); with μ ≈ μ* both sides are within
        bound = Σ_j |μ_j| · `feasibility` + `stationarity` · `distance`
    where `feasibility` bounds every |c_j(x)| (ε of the stopping rule, ∞-norm), `stationarity`
    bounds ‖r‖∞ and `distance` is ‖x − x*‖₁ (0 leaves the stationarity term out).
    `multipliers`: arrays (or numbers) of all the run's multipliers, e.g. `result.multipliers.values()`.
    """
    mu_l1 = float(sum(np.abs(np.asarray(m, dtype=float)).sum() for m in multipliers))
    bound = mu_l1 * float(feasibility) + float(stationarity) * float(distance)
    return GapVerdict(gap=float(objective) - float(optimum), bound=bound, scale=abs(float(optimum)))


def subplots(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """`matplotlib.pyplot.subplots` on the Agg backend (files only, no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(*args, **kwargs)


def save(fig: Any, path: str | Path) -> Path:
    """Lay `fig` out tightly and write it to `path` (`fedmodel.plotting.save_figure`)."""
    from fedmodel.plotting import save_figure
    fig.tight_layout()
    return save_figure(fig, path)
