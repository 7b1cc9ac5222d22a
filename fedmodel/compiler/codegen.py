"""Code generation: compile expressions into one flat evaluation plan.

The plan computes every shared subexpression once (structural CSE across all outputs, e.g.
`X @ w` once for a loss and its gradient), folds constant subtrees at compile time (e.g. `X.T`),
and reads Parameter values at call time, so changing a multiplier or a proximal center never
recompiles.

The steps are emitted as the body of one generated Python function (locals instead of a slot
list, one direct call per step), so a plan costs what the equivalent hand-written numpy costs
(benchmarks/bench_gradient.py): an array intermediate is deleted right after its last use, as a
hand-written temporary would be (keeping them all alive until the end made glibc hand the heap
back to the OS after every call and page-fault it in again on the next: 3× slower at
m = 10⁵), and scalar constants and parameters enter as numpy scalars, not 0-d arrays, whose
arithmetic costs four times as much.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import numpy as np

from ..atoms import Atom
from ..errors import FedModelError
from ..expression import Constant, Expression, Leaf, Parameter, is_sparse, postorder
from ..lowering.rules import MethodRules
from .inline_steps import fused_pairs, inline_operator

# The numpy target: an atom's value is its own `numeric` method (the atom knows its math,
# DESIGN.md); this table is how plans find it, and how tests/test_atom_rules.py checks that every
# atom defines one. A plan step's function is the bound method, `fn.__self__` its node.
NUMPY_VALUE = MethodRules(lambda node: FedModelError(
    f"the atom {type(node).__name__} ({node.display}) has no numpy value: define its `numeric`"),
    [("numeric", Atom)], name="numpy value")


# Compiled plan sources. Constants and functions are bound as arguments of `_make`, so the plans
# of clients that share a model structure (1000 in DALD's Table II) have the same source and
# compile once.
_COMPILED: dict[str, Any] = {}
# Generated code by structure (`Plan.structure_key`): (the key, source, compiled code, binders).
# A plan whose structure was seen skips emitting its source (the larger share of a plan's set-up
# once compiling was cached) and only binds its own constants, parameters and step functions.
_STRUCTURES: dict[tuple, tuple[tuple, str, Any, tuple]] = {}
_CACHE_MAX = 4096   # entries per cache; cleared when full (a few KB each)
BIG_PLAN = 1000     # bound names above which a plan reads them from one tuple (see `Plan._emit`)


class Plan:
    """A compiled evaluation of `outputs` as functions of `inputs` (Variables or Parameters).

    >>> import fedmodel as fm, numpy as np
    >>> w = fm.Variable(2, name="w")
    >>> f = fm.sum_squares(w)
    >>> plan = Plan([f, fm.grad(f, w)], [w])
    >>> [np.round(v, 3).tolist() for v in plan(np.array([1.0, 2.0]))]
    [5.0, [2.0, 4.0]]
    """

    def __init__(self, outputs: Sequence[Expression], inputs: Sequence[Leaf],
                 batched: Sequence[Leaf] = ()):
        """`batched`: inputs whose values carry k directions along a trailing axis (shape
        `leaf.shape + (k,)`), for outputs linear in them (a Hessian-vector product in its
        direction): every step that reads one runs its `directions.DIRECTION_RULES` rule and
        its result carries the axis too (`batched_outputs`); `directions.Unbatchable` when a
        step has no such rule."""
        self.outputs = list(outputs)
        self.inputs = list(inputs)
        slot_of_input = {leaf.uid: i for i, leaf in enumerate(self.inputs)}
        batched_slots = {slot_of_input[leaf.uid] for leaf in batched}
        self._batched: dict[int, tuple] = {}    # step index -> (rule, which arguments carry the axis)
        self.batched_size = 0                   # largest size of a direction-carrying step, per direction
        template: list[Any] = [None] * len(self.inputs)
        params: list[tuple[int, Parameter]] = []
        constant_slots: set[int] = set()
        constant_leaves: list[tuple[int, Constant]] = []   # where constants come from (`rebound`)
        folds: list[tuple] = []
        key_to_slot: dict[tuple, int] = {}
        node_slot: dict[int, int] = {}
        steps: list[tuple] = []
        signature: list[tuple] = []   # per step what the emitted source depends on (structure_key)
        self._slot_size: dict[int, int] = {}    # size of each step's result (scalars: 1)

        def new_slot(value: Any = None) -> int:
            template.append(value)
            return len(template) - 1

        for node in postorder(self.outputs):
            if isinstance(node, Leaf):
                if node.uid in slot_of_input:
                    slot = slot_of_input[node.uid]
                elif isinstance(node, Parameter):
                    key = ("param", node.uid)
                    slot = key_to_slot.get(key)
                    if slot is None:
                        slot = key_to_slot[key] = new_slot()
                        params.append((slot, node))
                elif isinstance(node, Constant):
                    # one slot per array: `X @ w` in two terms built from the same numpy X
                    # (two Constant leaves around one array) is still computed once
                    key = ("const", id(node.value)) if node.value.ndim else None
                    slot = key_to_slot.get(key) if key else None
                    if slot is None:
                        slot = new_slot(node.value)
                        constant_slots.add(slot)
                        constant_leaves.append((slot, node))
                        if key:
                            key_to_slot[key] = slot
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
                numeric = NUMPY_VALUE.rule(node)
                carried = tuple(a in batched_slots for a in arg_slots)
                if any(carried):
                    form = self._batch_step(node, len(steps), carried, [
                        is_sparse(template[a]) if a in constant_slots else False for a in arg_slots])
                    slot = new_slot()
                    batched_slots.add(slot)
                    steps.append((numeric, arg_slots, slot))
                    self._slot_size[slot] = 2       # an array whatever its node's shape (deleted after use)
                    self.batched_size = max(self.batched_size, math.prod(node.shape))
                    signature.append((key[0], key[1], arg_slots, slot, carried, form))
                elif constant_slots.issuperset(arg_slots):  # constant folding
                    value = numeric(*[template[s] for s in arg_slots])
                    slot = new_slot(value)
                    constant_slots.add(slot)
                    folds.append((numeric, arg_slots, slot))
                else:
                    slot = new_slot()
                    steps.append((numeric, arg_slots, slot))
                    size = math.prod(node.shape)     # = node.size, without np.prod's overhead
                    self._slot_size[slot] = size
                    signature.append((key[0], key[1], arg_slots, slot, node.shape == (), size > 1))
                key_to_slot[key] = slot
            node_slot[id(node)] = slot
        self._steps = tuple(steps)
        self._params = tuple(params)
        self._out_slots = tuple(node_slot[id(o)] for o in self.outputs)
        self.batched_outputs = tuple(slot in batched_slots for slot in self._out_slots)
        used = set(self._out_slots).union(*(args for _, args, _ in steps))
        for slot in constant_slots - used:   # folded away into other constants: drop them
            template[slot] = None
        self._template = template
        self._constant_leaves, self._folds = tuple(constant_leaves), tuple(folds)
        self._constant_slots = frozenset(constant_slots & used)
        self.n_steps = len(steps)
        self.structure_key = (
            len(self.inputs), tuple(signature),
            tuple((slot, _constant_kind(template[slot])) for slot in sorted(self._constant_slots)),
            tuple((slot, param.shape == ()) for slot, param in params), self._out_slots,
            tuple(sorted(slot_of_input[leaf.uid] for leaf in batched)))
        self._run = self._generate()

    def rebound(self, node_of: Callable[[Expression], Expression]) -> "Plan":
        """This plan for other expressions of the same structure (`node_of` maps each of its
        nodes, leaves and inputs to theirs; `compiler.shared_structure`): their steps, their
        Parameters, their constants, and the constants folded from them computed again (the
        same operations); the generated code is this plan's. KeyError from `node_of` when a
        node has no counterpart."""
        new = object.__new__(Plan)
        new.__dict__.update(self.__dict__)
        new.outputs = [node_of(o) for o in self.outputs]
        new.inputs = [node_of(leaf) for leaf in self.inputs]
        # the step functions are the atoms' `numeric` methods: the same functions, bound to the
        # counterpart nodes (which the batched executor and the Gram form read)
        new._steps = tuple((fn.__func__.__get__(node_of(fn.__self__)), args, out)
                           for fn, args, out in self._steps)
        new._params = tuple((slot, node_of(p)) for slot, p in self._params)
        template = [None] * len(self._template)
        for slot, leaf in self._constant_leaves:
            template[slot] = node_of(leaf).value
        for fn, args, slot in self._folds:
            template[slot] = fn.__func__(node_of(fn.__self__), *[template[a] for a in args])
        for slot in range(len(template)):
            if slot not in self._constant_slots:     # (folded away: dropped, as in `__init__`)
                template[slot] = None
        new._constant_leaves = tuple((slot, node_of(leaf)) for slot, leaf in self._constant_leaves)
        new._folds = tuple((fn.__func__.__get__(node_of(fn.__self__)), args, slot)
                           for fn, args, slot in self._folds)
        new._template = template
        new._run = new._generate()
        return new

    def _batch_step(self, node: Expression, index: int, carried: tuple, sparse: list) -> str | None:
        """Record step `index`'s rule over directions (`carried`: which arguments carry them;
        `sparse`: which are sparse constants) and return its inline form (or None)."""
        from .directions import DIRECTION_RULES, Unbatchable, inline_form
        rule = DIRECTION_RULES.find(node)
        if rule is None:
            raise Unbatchable(f"{node.display} ({node}) has no rule for a value carrying "
                              "several directions (fedmodel.compiler.directions)")
        form = inline_form(node, carried, tuple(a.ndim for a in node.args), tuple(sparse))
        self._batched[index] = (rule, carried, form)
        return form

    def __call__(self, *values: Any) -> list[Any]:
        if len(values) != len(self.inputs):
            raise FedModelError(
                f"this plan takes {len(self.inputs)} value(s), one per input "
                f"{[leaf.name for leaf in self.inputs]}, but was called with {len(values)}")
        return self._run(*values)

    # ---- code generation ----------------------------------------------------------------
    def _generate(self) -> Callable[..., list[Any]]:
        """The plan's function: the code generated for its structure (emitted and compiled the
        first time a structure is seen, `_emit`), bound to this plan's own constants,
        parameters and step functions."""
        cached = _STRUCTURES.get(self.structure_key)
        if cached is None:
            source, binders = self._emit()
            code = _COMPILED.get(source)
            if code is None:
                if len(_COMPILED) >= _CACHE_MAX:
                    _COMPILED.clear()
                code = _COMPILED[source] = compile(source, "<fedmodel plan>", "exec")
            if len(_STRUCTURES) >= _CACHE_MAX:
                _STRUCTURES.clear()
            cached = _STRUCTURES[self.structure_key] = (self.structure_key, source, code, binders)
        # the first plan's key object, shared by every plan of the structure: its nested tuples
        # were a sixth of the objects a client's program keeps (memory, and what the cyclic
        # collector scans), and an equal key compares by identity in the caches keyed by it
        self.structure_key, source, code, binders = cached
        param_of = dict(self._params)
        bound: list[Any] = []      # in the order of `_make`'s parameters
        for _, kind, ref in binders:
            if kind == "const":
                bound.append(self._template[ref])
            elif kind == "scalar":
                bound.append(self._template[ref][()])
            elif kind == "param":
                bound.append(param_of[ref])
            elif kind == "fn":
                bound.append(self._steps[ref][0])
            elif kind == "directions":      # a step over directions: its rule, given its node
                rule, carried, _ = self._batched[ref]
                bound.append(functools.partial(rule, self._steps[ref][0].__self__, carried))
            else:                       # "object": the same for every plan of the structure
                bound.append(ref)
        namespace: dict[str, Any] = {}
        exec(code, namespace)
        # popped, not read: left in `namespace`, `_make` and its own globals (`namespace`) would
        # form a reference cycle, and the plan function (whose globals are `namespace` too) with
        # everything it binds — the plan's steps, their expression nodes, its data — would be
        # cyclic garbage once the Plan is dropped, freed only by a full collection (issue 16)
        make = namespace.pop("_make")
        self._source = source
        # positionally: CPython matches each keyword argument by a scan of the parameter names,
        # quadratic in their number (minutes for the 10⁴-client whole-model plans)
        return make(*bound)

    def _emit(self) -> tuple[str, tuple]:
        """Emit the steps as the source of one Python function over locals, and say how to bind
        its free names: (name, kind, ref) in the order of `_make`'s parameters, kind
        "const"/"scalar" (constant slot ref), "param" (the Parameter of slot ref), "fn" (step
        ref's function), "directions" (step ref's rule over directions, `batched`) or "object"
        (ref itself). It reads only what `structure_key` holds, so
        plans of one structure share it.

        Names: `v{i}` the i-th input, `s{k}` slot k (a step's result or a parameter's value),
        `c{k}` a constant, `f{j}` the j-th step's numeric function, `p{k}` a parameter object.
        A plan with more than BIG_PLAN of them (a whole model of many clients) reads them as
        `_b[i]` from one tuple instead: Python's compiler takes time quadratic in the number of
        names a closure captures (minutes at 10⁵ clients).
        """
        n_inputs = len(self.inputs)
        big = 1 + 2 * len(self._constant_slots) + len(self._params) + len(self._steps) > BIG_PLAN
        binders: list[tuple[str, str, Any]] = []

        def bind(label: str, kind: str, ref: Any) -> str:
            binders.append((label, kind, ref))
            return f"_b[{len(binders) - 1}]" if big else label

        missing = bind("_missing", "object", _missing)
        name: dict[int, str] = {i: f"v{i}" for i in range(n_inputs)}
        out_name: dict[int, str] = dict(name)   # what an output returns (leaves: as stored)
        body: list[str] = []
        for slot in sorted(self._constant_slots):
            value = self._template[slot]
            name[slot] = out_name[slot] = bind(f"c{slot}", "const", slot)
            if isinstance(value, np.ndarray) and value.ndim == 0:
                name[slot] = bind(f"k{slot}", "scalar", slot)   # numpy scalar for the arithmetic
        for slot, param in self._params:
            p = bind(f"p{slot}", "param", slot)
            body += [f"r{slot} = {p}._value",     # (what the `value` property returns: no call)
                     f"if r{slot} is None: {missing}({p})"]
            out_name[slot] = f"r{slot}"
            if param.shape == ():
                body.append(f"s{slot} = r{slot}[()]")
                name[slot] = f"s{slot}"
            else:
                name[slot] = f"r{slot}"
        last_use: dict[int, int] = {}
        for j, (_, args, _) in enumerate(self._steps):
            for a in args:
                last_use[a] = j
        keep = set(self._out_slots)
        fused = fused_pairs(self._steps)
        for j, (fn, args, out) in enumerate(self._steps):
            arg_names = [name[a] for a in args]
            name[out] = out_name[out] = f"s{out}"
            if j in fused:                # one kernel for two steps: emitted at the first
                if fused[j] is not None:
                    kernel, outs = fused[j]
                    f = bind(f"f{j}", "object", kernel)
                    for o in outs:
                        name[o] = out_name[o] = f"s{o}"
                    body.append(f"{', '.join(f's{o}' for o in outs)} = {f}({', '.join(arg_names)})")
            elif j in self._batched:
                form = self._batched[j][2]
                body.append(f"s{out} = " + (form.format(*arg_names) if form is not None else
                                            f"{bind(f'f{j}', 'directions', j)}({', '.join(arg_names)})"))
            else:
                inline = inline_operator(fn.__self__, arg_names)
                if inline is None:
                    inline = f"{bind(f'f{j}', 'fn', j)}({', '.join(arg_names)})"
                body.append(f"s{out} = {inline}")
            dead = [f"s{a}" for a in dict.fromkeys(args) if last_use[a] == j
                    and a in self._slot_size and self._slot_size[a] > 1 and a not in keep]
            if dead:
                body.append(f"del {', '.join(dead)}")
        for slot in set(self._out_slots) & self._constant_slots:
            if isinstance(self._template[slot], np.ndarray) and self._template[slot].ndim:
                out_name[slot] = f"{out_name[slot]}.copy()"   # a caller may update a result in place
        body.append(f"return [{', '.join(out_name[s] for s in self._out_slots)}]")
        inputs = ", ".join(f"v{i}" for i in range(n_inputs))
        parameters = "*_b" if big else ", ".join(b[0] for b in binders)
        source = (f"def _make({parameters}):\n"
                  f"    def plan({inputs}):\n"
                  + "".join(f"        {line}\n" for line in body)
                  + "    return plan\n")
        return source, tuple(binders)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_run"], state["_source"]   # generated code does not pickle; rebuilt below
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._run = self._generate()

    # ---- structure (read by `runtime.batched_plan`, which runs many clients' plans as one) ----
    @property
    def steps(self) -> tuple[tuple[Callable, tuple[int, ...], int], ...]:
        """The computed steps in order, each (fn, argument slots, result slot): fn is the bound
        `numeric` of the expression node `fn.__self__`. Slots 0 … len(inputs) − 1 are the inputs."""
        return self._steps

    @property
    def params(self) -> tuple[tuple[int, Parameter], ...]:
        """(slot, Parameter) of every Parameter the plan reads at call time."""
        return self._params

    @property
    def constant_slots(self) -> frozenset[int]:
        """The slots holding constants (data and folded constant subtrees) that the plan reads."""
        return self._constant_slots

    @property
    def out_slots(self) -> tuple[int, ...]:
        """The slot of each output, in the order of `outputs`."""
        return self._out_slots

    def constant(self, slot: int) -> Any:
        """The value held in a constant slot (one of `constant_slots`)."""
        return self._template[slot]

    @property
    def source(self) -> str:
        """The generated Python source of the plan (for inspection and tests)."""
        return self._source

    def describe(self) -> str:
        """One line per step, for inspection."""
        return "\n".join(f"s{out} = {fn.__self__.display}({', '.join(f's{a}' for a in args)})"
                         for fn, args, out in self._steps)


def _constant_kind(value: Any) -> int:
    """What the emitted source depends on in a constant: 0 not an array (a numpy or Python
    scalar from folding), 1 a 0-d array (bound as a numpy scalar too), 2 an array with axes
    (an output of it is copied), 3 a scipy.sparse matrix (products only, never densified)."""
    if not isinstance(value, np.ndarray):
        return 3 if is_sparse(value) else 0
    return 1 if value.ndim == 0 else 2


def _missing(param: Parameter) -> None:
    raise FedModelError(f"parameter {param.name!r} has no value; set .value first")
