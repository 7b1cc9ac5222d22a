"""JAX lowering of compiled plans: the same steps as `codegen.Plan`, as `jax.numpy`, jit-compiled.

A `Plan` is a flat list of steps (an atom's `numeric` applied to earlier slots). This pass
lowers those steps, by atom type, to `jax.numpy` operations (the same formulas as the atoms'
numpy `numeric`, e.g. the overflow-free logistic), traced once and compiled by `jax.jit`:

- `JaxPlan(plan)`: one plan; called like the plan itself (`jplan(*values)` → list of numpy
  arrays), with the plan's constants held as device arrays and its Parameters read at call time.
- `JaxGroupPlan(plans)`: the plans of many clients sharing one structure (`plan_signature`),
  evaluated by one `jax.vmap` over the client axis. Ragged clients (data X_i of m_i × d with
  different m_i) are padded to the largest shape, and every ragged slot keeps the invariant
  "entries outside the client's own shape are 0": steps that map 0 to 0 keep it, every other
  step on a ragged slot is masked back to 0, log-sum-exp and softmax reduce over the valid
  entries only, and a mean divides by each client's own count. Sums and products over padded
  entries thus add exact zeros: padding never changes a loss. Padding that could change a
  result (an index or reshape along a ragged axis, a broadcast that depends on a client's size
  being 1) is refused with a `FedModelError` at construction; callers fall back to numpy.

Arithmetic is float64: every trace and call runs inside `float64()` (jax's `enable_x64`
context), so the rest of the process keeps jax's default. JAX is an optional dependency
(`pip install "fedmodel[jax]"`); it is imported on first use of this module's classes. The
per-atom rules are in `jax_rules.py`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import FedModelError
from ..expression import is_sparse
from .codegen import Plan, _missing
from .jax_rules import _atom_kinds, _rule, _zero_preserving


def jax_modules() -> tuple[Any, Any]:
    """(jax, jax.numpy), imported on first use; a clear error when JAX is not installed."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:
        raise FedModelError("the JAX lowering needs JAX: pip install 'fedmodel[jax]' "
                            "(or jax[cuda12] for an NVIDIA GPU)") from exc
    return jax, jnp


@contextlib.contextmanager
def float64() -> Iterator[None]:
    """jax's 64-bit mode for the duration of the block (traces and calls of lowered plans)."""
    jax, _ = jax_modules()
    enable = getattr(jax, "enable_x64", None)
    if enable is None:              # jax < 0.6: the experimental spelling
        from jax.experimental import enable_x64 as enable
    with enable(True):
        yield


class _Layout:
    """Per slot of a group of same-structure plans: each client's shape, the padded (largest)
    shape and the axes where the clients differ (ragged)."""

    def __init__(self, plans: Sequence[Plan]):
        first = plans[0]
        shapes: dict[int, list[tuple]] = {}
        for i in range(len(first.inputs)):
            shapes[i] = [tuple(p.inputs[i].shape) for p in plans]
        for slot in first.constant_slots:
            shapes[slot] = [tuple(np.shape(p.constant(slot))) for p in plans]
        for k, (slot, _) in enumerate(first.params):
            shapes[slot] = [tuple(p.params[k][1].shape) for p in plans]
        for j, (_, _, out) in enumerate(first.steps):
            shapes[out] = [tuple(p.steps[j][0].__self__.shape) for p in plans]
        self.shapes = shapes
        self.padded: dict[int, tuple] = {}
        self.ragged: dict[int, tuple[int, ...]] = {}
        for slot, per_client in shapes.items():
            if len({len(s) for s in per_client}) > 1:
                raise FedModelError(f"slot {slot} has shapes of different ranks across clients "
                                    f"({sorted(set(per_client))}); these plans cannot be stacked")
            padded = tuple(int(max(s[k] for s in per_client)) for k in range(len(per_client[0])))
            self.padded[slot] = padded
            axes = tuple(k for k in range(len(padded)) if len({s[k] for s in per_client}) > 1)
            if axes:
                self.ragged[slot] = axes

    def sizes(self, slot: int) -> np.ndarray:
        """(n, number of ragged axes) sizes of each client along the slot's ragged axes."""
        axes = self.ragged[slot]
        return np.array([[s[k] for k in axes] for s in self.shapes[slot]], dtype=np.int64)


def _check_paddable(plans: Sequence[Plan], layout: _Layout, K: dict) -> None:
    """Refuse steps whose padded evaluation could differ from the per-client one. (Index keys
    are normalized — nonnegative, resolved slices — and equal within a structure, so an index
    selects the same entries of the padded value.)"""
    A = K["A"]
    for j, (fn, args, out) in enumerate(plans[0].steps):
        node = fn.__self__
        ragged_args = [a for a in args if a in layout.ragged]
        if not ragged_args and out not in layout.ragged:
            continue
        name = f"step {j} ({node.display})"
        if isinstance(node, (A.Reshape, K["IndexAdjoint"])) and ragged_args:
            raise FedModelError(f"{name} reshapes or scatters a value whose shape differs between "
                                "clients; it cannot run padded")
        if isinstance(node, (A.Add, A.Multiply, A.Maximum, A.GreaterEqual)):
            out_shapes = np.array(layout.shapes[out], dtype=np.int64).reshape(len(plans), -1)
            for a in args:
                arg_shapes = np.array(layout.shapes[a], dtype=np.int64).reshape(len(plans), -1)
                lead = out_shapes.shape[1] - arg_shapes.shape[1]
                for k in range(arg_shapes.shape[1]):
                    column = arg_shapes[:, k]
                    # an axis that broadcasts (length 1 ≠ the result's) for some client only
                    if np.any(column != out_shapes[:, lead + k]) and np.any(column != 1):
                        raise FedModelError(f"{name} broadcasts an axis of length 1 for some "
                                            "clients only; it cannot run padded")


def _structure(plan: Plan) -> tuple:
    """The steps of a plan and their atoms' parameters (axes, exponents, index keys, target
    shapes), without the data: plans of one structure lower to one function."""
    steps = tuple((type(fn.__self__), fn.__self__.params(), args, out) for fn, args, out in plan.steps)
    return (steps, tuple(s for s, _ in plan.params), tuple(sorted(plan.constant_slots)),
            tuple(plan.out_slots), tuple(v.shape for v in plan.inputs))


# scipy.sparse data reaches JAX densified (jax.numpy has no CSR products that vmap), only up
# to this many entries over the plans lowered together; beyond, a FedModelError
JAX_DENSIFY_MAX = 50_000_000


class _Densified:
    """A plan whose scipy.sparse constants read as dense arrays (the rest delegated)."""

    def __init__(self, plan: Plan):
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plan, name)

    def constant(self, slot: int) -> Any:
        value = self._plan.constant(slot)
        return value.toarray() if is_sparse(value) else value


def _dense_constants(plans: Sequence[Plan]) -> list:
    """`plans`, those with sparse constants wrapped to read them dense (`_Densified`), after a
    size check: a FedModelError before any allocation when the dense data would exceed
    `JAX_DENSIFY_MAX` entries (the batched and serial executors keep it sparse)."""
    sparse = [(p, s) for p in plans for s in p.constant_slots if is_sparse(p.constant(s))]
    if not sparse:
        return list(plans)
    entries = sum(int(np.prod(p.constant(s).shape)) for p, s in sparse)
    if entries > JAX_DENSIFY_MAX:
        raise FedModelError(
            f"executor='jax' would densify sparse client data into {entries:,} entries "
            f"({8 * entries / 1e9:.1f} GB), beyond JAX_DENSIFY_MAX = {JAX_DENSIFY_MAX:,}: use "
            "executor='batched' (sparse block products) or executor='serial' for this model")
    return [_Densified(p) if any(q is p for q, _ in sparse) else p for p in plans]


def _is_transpose(a: Any, b: Any) -> bool:
    """`a` is `b.T` (a folded transpose viewing the same memory): lowered as `b.T`, so the data
    is held once on the device."""
    a, b = np.asarray(a), np.asarray(b)     # (the view is the one that is not C-ordered)
    return a.ndim == 2 and not a.flags.c_contiguous and b.ndim == 2 and a.shape == b.shape[::-1] and a.strides == b.strides[::-1] \
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def _pad(value: Any, shape: tuple) -> np.ndarray:
    """`value` zero-padded at the end of each axis to `shape`."""
    value = np.asarray(value, dtype=float)
    if value.shape == shape:
        return value
    out = np.zeros(shape)
    out[tuple(slice(0, s) for s in value.shape)] = value
    return out


# ---- the lowered function -------------------------------------------------------------------
class _Lowered:
    """The per-client function of a plan's steps, in jax.numpy, with the slot roles of a group:
    fn(inputs, params, batched_consts, common_consts, sizes, counts) -> outputs."""

    def __init__(self, plans: Sequence[Plan], layout: _Layout | None, common: set[int],
                 transposed: dict[int, int] | None = None):
        _, jnp = jax_modules()
        K = _atom_kinds()
        first = plans[0]
        self.plan = first
        self.n_inputs = len(first.inputs)
        self.param_slots = [slot for slot, _ in first.params]
        consts = sorted(first.constant_slots)
        self.transposed = dict(transposed or {})    # slot -> the slot it is the transpose of
        self.common_slots = [s for s in consts if s in common]
        self.batched_slots = [s for s in consts if s not in common and s not in self.transposed]
        self.ragged_slots = sorted(layout.ragged) if layout is not None else []
        self.mean_steps: list[int] = []        # steps whose count differs between clients
        steps = []
        for j, (fn, args, out) in enumerate(first.steps):
            node = fn.__self__
            if isinstance(node, K["A"].Mean) and len({p.steps[j][0].__self__.count for p in plans}) > 1:
                self.mean_steps.append(j)
            needs_mask = isinstance(node, (K["A"].LogSumExp, K["Softmax"]))
            remask = out in (layout.ragged if layout else {}) and not _zero_preserving(node, K)
            if remask:      # "where": a step that may be ±inf or NaN on zero padding (log 0,
                # 1/0, the log-sum-exp of a row that is all padding); others are finite there
                unsafe = (K["A"].Log, K["A"].Power, K["A"].LogSumExp, K["Softmax"])
                remask = "where" if isinstance(node, unsafe) else "multiply"
            steps.append((j, _rule(node, K, jnp), args, out, needs_mask, remask,
                          float(node.count) if isinstance(node, K["A"].Mean) else None))
        self.steps = steps
        self.layout = layout
        self.out_slots = list(first.out_slots)

    def __call__(self, inputs, params, batched, common, sizes, counts):
        _, jnp = jax_modules()
        vals: dict[int, Any] = dict(enumerate(inputs))
        vals.update(zip(self.param_slots, params))
        vals.update(zip(self.batched_slots, batched))
        vals.update(zip(self.common_slots, common))
        for slot, source in self.transposed.items():     # a folded Xᵀ: the same device array
            vals[slot] = vals[source].T
        size_of = dict(zip(self.ragged_slots, sizes))
        count_of = dict(zip(self.mean_steps, counts))
        masks: dict[int, Any] = {}

        def mask(slot):
            if slot not in size_of:
                return None
            if slot not in masks:
                padded = self.layout.padded[slot]
                m = jnp.ones(padded, dtype=bool)
                for k, axis in enumerate(self.layout.ragged[slot]):
                    shape = [1] * len(padded)
                    shape[axis] = padded[axis]
                    m = m & (jnp.arange(padded[axis]) < size_of[slot][k]).reshape(shape)
                masks[slot] = m
            return masks[slot]

        for j, fn, args, out, needs_mask, remask, count in self.steps:
            extra = {}
            if needs_mask:
                extra["mask"] = mask(args[0])
            if count is not None:
                extra["count"] = count_of.get(j, count)
            value = fn(*[vals[a] for a in args], **extra)
            if remask and out in size_of:
                if remask == "where":
                    value = jnp.where(mask(out), value, 0.0)
                else:       # finite on padding: a product by the 0/1 mask (XLA fuses it; a
                    value = value * mask(out).astype(value.dtype)   # select costs 1.5× there)
            vals[out] = value
        return [vals[s] for s in self.out_slots]


def _param_value(param: Any) -> Any:
    value = param.value
    if value is None:
        _missing(param)         # the compiled plan's error
    return value


class JaxPlan:
    """A `Plan` lowered to jax.numpy and jit-compiled (float64); called like the plan.

    >>> import fedmodel as fm, numpy as np
    >>> w = fm.Variable(2, name="w")
    >>> f = fm.sum_squares(w)
    >>> jplan = JaxPlan(Plan([f, fm.grad(f, w)], [w]))
    >>> [np.round(v, 3).tolist() for v in jplan(np.array([1.0, 2.0]))]
    [5.0, [2.0, 4.0]]
    """

    def __init__(self, plan: Plan):
        jax, jnp = jax_modules()
        self.plan = plan
        plan = _dense_constants([plan])[0]
        self._lowered = _Lowered([plan], None, set(plan.constant_slots))
        with float64():
            self._consts = [jnp.asarray(np.asarray(plan.constant(s), dtype=float))
                            for s in self._lowered.common_slots]
        lowered = self._lowered
        self._run = jax.jit(lambda inputs, params, common: lowered(inputs, params, [], common, [], []))

    def __call__(self, *values: Any) -> list[np.ndarray]:
        """The plan's outputs at `values` (one per input), as numpy arrays."""
        if len(values) != len(self.plan.inputs):
            raise FedModelError(f"this plan takes {len(self.plan.inputs)} value(s), one per input, "
                                f"but was called with {len(values)}")
        params = [np.asarray(_param_value(p), dtype=float) for _, p in self.plan.params]
        with float64():
            out = self._run([np.asarray(v, dtype=float) for v in values], params, self._consts)
            return [np.asarray(o) for o in out]


class JaxGroupPlan:
    """The plans of a group of clients (same structure, their own data) evaluated together:
    one `jax.vmap` over the client axis of the lowered plan, jit-compiled (float64).

    Call with one stacked array per plan input, (n, *input shape); returns one stacked array
    per output, (n, *padded output shape) — `output_shapes` gives each client's own shape (the
    same as the padded one unless the output's length differs between clients). Constants
    equal for every client are held once; per-client data is zero-padded to the largest shape
    and held on the device."""

    def __init__(self, plans: Sequence[Plan]):
        jax, jnp = jax_modules()
        if not plans:
            raise FedModelError("JaxGroupPlan needs at least one plan")
        plans = _dense_constants(plans)
        first = plans[0]
        if len({_structure(p) for p in plans}) > 1:
            raise FedModelError("JaxGroupPlan needs plans of one structure (the same steps with "
                                "the same parameters); these differ")
        K = _atom_kinds()
        layout = _Layout(plans)
        _check_paddable(plans, layout, K)
        common = set()
        for slot in first.constant_slots:
            values = [np.asarray(p.constant(slot)) for p in plans]
            if all(v is values[0] or (v.shape == values[0].shape and np.array_equal(v, values[0]))
                   for v in values):
                common.add(slot)
        batched = [s for s in sorted(first.constant_slots) if s not in common]
        transposed = {s: t for s in batched for t in batched
                      if s != t and all(_is_transpose(p.constant(s), p.constant(t)) for p in plans)}
        transposed = {s: t for s, t in transposed.items() if t not in transposed}
        self.plans, self.n, self.layout = list(plans), len(plans), layout
        lowered = self.lowered = _Lowered(plans, layout, common, transposed)
        self._params = [[p.params[k][1] for p in plans] for k in range(len(first.params))]
        self._param_cache: list[tuple | None] = [None] * len(self._params)
        with float64():
            self._common = [jnp.asarray(np.asarray(first.constant(s), dtype=float))
                            for s in lowered.common_slots]
            self._batched = [jnp.asarray(np.stack([_pad(p.constant(s), layout.padded[s]) for p in plans]))
                             for s in lowered.batched_slots]
            self._sizes = [jnp.asarray(layout.sizes(s)) for s in lowered.ragged_slots]
            self._counts = [jnp.asarray(np.array([float(p.steps[j][0].__self__.count) for p in plans]))
                            for j in lowered.mean_steps]
        self.output_shapes = [layout.shapes.get(s, [np.shape(first.constant(s))] * self.n)
                              for s in first.out_slots]
        self._run = jax.jit(jax.vmap(lowered, in_axes=self.IN_AXES))

    # `lowered(inputs, params, batched, common, sizes, counts)` is one client's function (for
    # callers that fuse it into a larger jitted function); vmap it with these axes
    IN_AXES = (0, 0, 0, None, 0, 0)

    def params(self) -> list[np.ndarray]:
        """The current values of every Parameter, stacked over the clients (zero-padded)."""
        from ..expression import Parameter
        out = []
        for k, params in enumerate(self._params):
            cached = self._param_cache[k]
            stamp = Parameter.assignments      # no assignment since: the stack is current
            if cached is not None and cached[2] == stamp:
                out.append(cached[1])
                continue
            values = [_param_value(q) for q in params]
            if cached is not None and all(a is b for a, b in zip(values, cached[0])):
                self._param_cache[k] = (values, cached[1], stamp)
                out.append(cached[1])
                continue
            shape = self.layout.padded[self.plans[0].params[k][0]]
            stack = np.stack([_pad(v, shape) for v in values])
            self._param_cache[k] = (values, stack, stamp)
            out.append(stack)
        return out

    def constants(self) -> tuple[list, list, list, list]:
        """(per-client constants, common constants, ragged sizes, per-client counts) as the
        lowered function takes them after the inputs and parameters."""
        return self._batched, self._common, self._sizes, self._counts

    def __call__(self, *inputs: Any) -> list[np.ndarray]:
        if len(inputs) != len(self.plans[0].inputs):
            raise FedModelError(f"this plan takes {len(self.plans[0].inputs)} stacked value(s), one "
                                f"per input, but was called with {len(inputs)}")
        with float64():
            out = self._run([np.asarray(v, dtype=float) for v in inputs], self.params(),
                            *self.constants())
            return [np.asarray(o) for o in out]
