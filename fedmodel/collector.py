"""Python's cyclic garbage collector around fedmodel's set-up (issue 16): paused while the
node programs and the final whole-model plans are built (`collection_paused`), and the programs
frozen for the run of a solve (`solve_scope`, `freeze_setup`). Nothing here changes a number.

The scope's state is module-global: two solves in threads of one process may unfreeze each
other's objects early, which costs collection time, never correctness.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (restored after; nestable). Building
    the expressions and plans of 10⁴ clients allocates millions of long-lived objects, and the
    full collections their growth triggers rescan all of them: ~40 % of `compile_programs` and
    half of the final objective at n = 10⁴ (issue 16). Cycles made in the block are collected
    by a later collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# `freeze_setup` within the outermost `solve_scope`: whether it may freeze (set on entering it)
_solves_open = 0
_may_freeze = False


@contextlib.contextmanager
def solve_scope() -> Iterator[None]:
    """The extent of one solve for `freeze_setup`: what it froze is unfrozen when the scope ends
    (an exception included). Only the outermost scope freezes, and only when the collector runs
    and nothing is frozen yet (an application's own `gc.freeze()`, e.g. before forking, is left
    alone)."""
    global _solves_open, _may_freeze
    outermost = _solves_open == 0
    if outermost:
        _may_freeze = gc.isenabled() and gc.get_freeze_count() == 0
    _solves_open += 1
    try:
        yield
    finally:
        _solves_open -= 1
        if outermost:
            if _may_freeze and gc.get_freeze_count():
                gc.unfreeze()
            _may_freeze = False


def freeze_setup() -> None:
    """Within a `solve_scope`: move every object the collector tracks (the model and the node
    programs just built) to its permanent generation until the scope ends. They live for the
    whole run (freed by reference counting as before when dropped), so the collections during
    the run need not rescan them; and, called before `collection_paused` ends, it keeps the
    collector from passing the millions of objects made in the pause through its generations
    once it runs again (3 scans and a full collection: 12 s of executor start at 3·10⁴
    clients, issue 16)."""
    if _solves_open and _may_freeze:
        gc.freeze()
