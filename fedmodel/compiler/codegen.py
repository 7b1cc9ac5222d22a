"""Code generation: compile expressions into one flat evaluation plan.

The plan computes every shared subexpression once (structural CSE across all outputs, e.g.
`X @ w` once for a loss and its gradient), folds constant subtrees at compile time (e.g. `X.T`),
and reads Parameter values at call time, so changing a multiplier or a proximal center never
recompiles.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import FedModelError
from ..expression import Constant, Expression, Leaf, Parameter, Variable, _MissingValue


def _postorder(outputs: Sequence[Expression]) -> list[Expression]:
    order: list[Expression] = []
    seen: set[int] = set()
    for root in outputs:
        stack: list[tuple[Expression, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in seen:
                continue
            if expanded or isinstance(node, Leaf):
                seen.add(id(node))
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((arg, False) for arg in reversed(node.args))
    return order


class Plan:
    """A compiled evaluation of `outputs` as functions of `inputs` (Variables or Parameters).

    >>> import fedmodel as fm, numpy as np
    >>> w = fm.Variable(2, name="w")
    >>> f = fm.sum_squares(w)
    >>> plan = Plan([f, fm.grad(f, w)], [w])
    >>> [np.round(v, 3).tolist() for v in plan(np.array([1.0, 2.0]))]
    [5.0, [2.0, 4.0]]
    """

    def __init__(self, outputs: Sequence[Expression], inputs: Sequence[Leaf]):
        self.outputs = list(outputs)
        self.inputs = list(inputs)
        slot_of_input = {leaf.uid: i for i, leaf in enumerate(self.inputs)}
        template: list[Any] = [None] * len(self.inputs)
        self._params: list[tuple[int, Parameter]] = []
        constant_slots: set[int] = set()
        key_to_slot: dict[tuple, int] = {}
        node_slot: dict[int, int] = {}
        steps: list[tuple] = []

        def new_slot(value: Any = None) -> int:
            template.append(value)
            return len(template) - 1

        for node in _postorder(self.outputs):
            if isinstance(node, Leaf):
                if node.uid in slot_of_input:
                    slot = slot_of_input[node.uid]
                elif isinstance(node, Parameter):
                    key = ("param", node.uid)
                    slot = key_to_slot.get(key)
                    if slot is None:
                        slot = key_to_slot[key] = new_slot()
                        self._params.append((slot, node))
                elif isinstance(node, Constant):
                    slot = new_slot(node.value)
                    constant_slots.add(slot)
                else:
                    raise FedModelError(
                        f"variable {node.name!r} occurs in the compiled expressions but is not an "
                        f"input of the plan (inputs: {[v.name for v in self.inputs]})")
                node_slot[id(node)] = slot
                continue
            arg_slots = tuple(node_slot[id(a)] for a in node.args)
            key = (type(node), node.params(), arg_slots)
            slot = key_to_slot.get(key)
            if slot is None:
                if all(s in constant_slots for s in arg_slots):  # constant folding
                    value = node.numeric(*[template[s] for s in arg_slots])
                    slot = new_slot(value)
                    constant_slots.add(slot)
                else:
                    slot = new_slot()
                    steps.append((node.numeric, arg_slots, slot))
                key_to_slot[key] = slot
            node_slot[id(node)] = slot
        self._template = template
        self._steps = steps
        self._out_slots = [node_slot[id(o)] for o in self.outputs]
        self.n_steps = len(steps)

    def __call__(self, *values: Any) -> list[Any]:
        slots = list(self._template)
        for i, value in enumerate(values):
            slots[i] = value
        for slot, param in self._params:
            if param.value is None:
                raise FedModelError(f"parameter {param.name!r} has no value; set .value first")
            slots[slot] = param.value
        for fn, args, out in self._steps:
            if len(args) == 1:
                slots[out] = fn(slots[args[0]])
            elif len(args) == 2:
                slots[out] = fn(slots[args[0]], slots[args[1]])
            else:
                slots[out] = fn(*[slots[a] for a in args])
        return [slots[s] for s in self._out_slots]

    def describe(self) -> str:
        """One line per step, for inspection."""
        return "\n".join(f"s{out} = {fn.__self__.display}({', '.join(f's{a}' for a in args)})"
                         for fn, args, out in self._steps)


def evaluate(expr: Expression) -> Any:
    """Value of `expr` from the current values of its leaves (raises _MissingValue if unset)."""
    memo: dict[int, Any] = {}
    for node in _postorder([expr]):
        if isinstance(node, Leaf):
            value = node.value
            if value is None:
                raise _MissingValue(node.name)
            memo[id(node)] = value
        else:
            memo[id(node)] = node.numeric(*[memo[id(a)] for a in node.args])
    out = memo[id(expr)]
    return float(out) if np.ndim(out) == 0 else np.asarray(out)
