"""What every reproduction prints and draws the same way: a table's header, a list of checks,
the closing `result:` line; figures drawn on the Agg backend (no display needed) and saved."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

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


def finish(ok: bool) -> int:
    """Print the closing `result: OK` (or `MISMATCH`) line; the exit code, 0 when ok."""
    print("result:", "OK" if ok else "MISMATCH")
    return 0 if ok else 1


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
