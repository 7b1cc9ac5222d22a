"""How a plan step is emitted: the atoms that are one Python operator (`inline_operator`, no
call), and the pairs of steps one kernel computes together (`fused_pairs`). Read by `codegen.Plan._emit`
(and the batched executor's group plans, `runtime.batched_plan`)."""
from __future__ import annotations

import functools
from typing import Sequence

from ..expression import Expression


def fused_pairs(steps: Sequence[tuple]) -> dict[int, tuple | None]:
    """Steps that one kernel computes together: logistic(a) and sigmoid(a) of the same slot (a
    logistic loss's value and derivative) share e^{−|a|} (`logistic_and_sigmoid`, bitwise the
    same results). Maps the pair's first step to (kernel, (logistic slot, sigmoid slot)) and
    its second to None (nothing left to emit there)."""
    from ..atoms.elementwise import Logistic, Sigmoid, logistic_and_sigmoid
    by_argument: dict[int, dict[type, tuple[int, int]]] = {}
    for j, (fn, args, out) in enumerate(steps):
        kind = type(fn.__self__)
        if kind is Logistic or kind is Sigmoid:
            by_argument.setdefault(args[0], {})[kind] = (j, out)
    fused: dict[int, tuple | None] = {}
    for found in by_argument.values():
        if len(found) == 2:
            (j_value, value), (j_slope, slope) = found[Logistic], found[Sigmoid]
            fused[min(j_value, j_slope)] = (logistic_and_sigmoid, (value, slope))
            fused[max(j_value, j_slope)] = None
    return fused


@functools.lru_cache(maxsize=None)
def inline_kinds() -> tuple:
    """The atom classes `inline_operator` knows (imported once: an import statement per step was
    ~5 % of compiling a Hessian plan)."""
    from ..atoms import Add, MatMul, Multiply, Neg, Pos, Square, Step, Transpose
    return Add, MatMul, Multiply, Neg, Pos, Square, Step, Transpose


def inline_operator(node: Expression, args: list[str]) -> str | None:
    """Python source computing `node.numeric(*args)` without a call, for the atoms that are a
    single operator (the same operator their `numeric` applies, so results are identical).
    A plan is mostly such steps on small arrays or scalars, where the call frame per step is
    a visible share of the time (benchmarks/bench_gradient.py, m = 100)."""
    Add, MatMul, Multiply, Neg, Pos, Square, Step, Transpose = inline_kinds()
    kind = type(node)
    if kind is Add:      # (a long chain would exceed the Python compiler's recursion limit:
        return " + ".join(args) if len(args) <= 64 else None   # Add.numeric, same order)
    if kind is Multiply:
        return f"{args[0]} * {args[1]}"
    if kind is Neg:
        return f"-{args[0]}"
    if kind is MatMul:
        return f"{args[0]} @ {args[1]}"
    if kind is Transpose:
        return f"{args[0]}.T"
    if kind is Square:
        return f"{args[0]} * {args[0]}"
    if kind is Step and node.shape == ():
        return f"(1.0 if {args[0]} > 0 else 0.0)"
    if kind is Pos and node.shape == ():
        return f"max({args[0]}, 0.0)"          # keeps a NaN, as np.maximum does
    return None
