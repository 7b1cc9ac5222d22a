"""The JAX engine of the batched executor: same-structure clients evaluated by one `jax.vmap`
over the client axis (`BatchedExecutor(engine="jax")`, by name `executor="jax"`).

The batched executor (`batched.BatchedExecutor`: grouping, stacked state, the client steps'
forms, checks and ledger) builds each group once, by its engine (`JaxEngine.group`): here a
`JaxGroup`, which evaluates the clients' compiled merits with the JAX lowering
(`compiler.jax_codegen.JaxGroupPlan`) instead of numpy block-diagonal products:

- `JaxGroup.value_grad` / `objective`: P_i and ∇P_i (or f_i) of every client of a group by
  one jit-compiled, vmapped function of the stacked (n, d) points; ragged client data is
  zero-padded with masks that change no loss (see `jax_codegen`); the data lives on the
  device, once. Clients of very different sizes run in buckets of similar size (`buckets`).
- `JaxGroup.hessian`: ∇²P_i (Newton and exact local solves) by one jitted vmap of `jax.hessian`
  of the same lowered merit, on the same device data; a few clients (`Group.STRAGGLERS`) by
  their own Hessian plans instead (no second compiled shape for a handful of clients).
- `JaxGroup.fused_local_steps`: W (proximal-)gradient steps z ← z − α(∇P_i(z) + linear +
  weight∘(x − anchor)), soft-thresholded when λ‖w‖₁ is the only prox term, as one jitted
  `lax.fori_loop` (the serial steps' arithmetic in the same order); the runtime's
  `batched_procedures.local_steps` uses it when a group offers it, so every vectorized form
  built on local steps runs them inside JAX.

What falls back, and how it is reported (`JaxEngine`; the executor's `fallbacks`):

- a group whose plans the lowering cannot run padded (a data value that numpy broadcasts for
  some clients only, an atom without a JAX rule): numpy's `BatchedPlan` for that group
  (`fallbacks` names it, with a `JaxFallbackWarning`);
- a request kind without a vectorized form (per-node payloads or group requests), the server,
  singleton groups and options a form does not cover: the serial per-node path, exactly as on
  the numpy engine (`stats[(kind, "serial")]` counts them; a `JaxFallbackWarning` names
  each such kind once per run, one-off set-up steps included, and `fallbacks` lists them).

float64 throughout (`jax_codegen.float64`, scoped to the lowered functions). On a machine with
an NVIDIA GPU and `jax[cuda12]` the same code runs there; nothing else changes.
"""
from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import numpy as np

from ..compiler.jax_codegen import JaxGroupPlan, float64, jax_modules
from ..errors import FedModelError
from .batched_group import Group
from .messages import MESSAGES


class JaxFallbackWarning(UserWarning):
    """A request, or a group's evaluation, served without JAX (numpy per node or per group)."""


# bookkeeping kinds served per node on purpose (they set or read state, no arithmetic to vectorize)
_QUIET = {"configure", "multipliers", "private_values", "save_state", "load_state"}


MAX_BUCKETS = 8          # padded shapes (one traced vmap each) per group of ragged clients


def buckets(programs: list, which: str, max_buckets: int = MAX_BUCKETS) -> list[np.ndarray]:
    """The group's clients split by data size into at most `max_buckets` runs of similar size
    (in size order; a geometric grid between the smallest and largest), each padded to its own
    largest client: with 10–100 rows per client one padded shape would do 1.8× the arithmetic,
    eight do ~1.1×. One bucket when every client has the same data shapes."""
    sizes = np.array([sum(int(np.size(p_plan.constant(s))) for s in p_plan.constant_slots)
                      for p_plan in (getattr(p, which) for p in programs)], dtype=float)
    order = np.argsort(sizes, kind="stable")
    low, high = max(float(sizes.min()), 1.0), max(float(sizes.max()), 1.0)
    if high <= low * 1.05 or len(programs) < 2 * max_buckets:
        return [order]
    edges = np.geomspace(low, high, max_buckets + 1)[1:-1]
    label = np.searchsorted(edges, sizes[order], side="left")
    return [order[label == k] for k in range(max_buckets) if np.any(label == k)]


def _client_function(program, lowered, gradient: bool):
    """One client's merit as a function of its flat points (x, y) and the lowered plan's other
    arguments: P_i, or (P_i, ∇P_i) when `gradient`."""
    _, jnp = jax_modules()
    shapes = [v.shape for v in program.shared.variables] + [v.shape for v in program.private.variables]
    x_cuts = [int(o) for o in program.shared.offsets]
    y_cuts = [int(o) for o in program.private.offsets]

    def run(x, y, *rest):
        parts = [x[a:b] for a, b in zip(x_cuts, x_cuts[1:])] + [y[a:b] for a, b in zip(y_cuts, y_cuts[1:])]
        out = lowered([q.reshape(s) for q, s in zip(parts, shapes)], *rest)
        value = jnp.reshape(out[0], ())
        if not gradient:
            return value
        grads = [jnp.ravel(jnp.broadcast_to(g, s)) for g, s in zip(out[1:], shapes)]
        return value, (jnp.concatenate(grads) if grads else jnp.zeros(0))
    return run


def _client_hessian(run, gradient: bool):
    """∇²P_i(z) of a `_client_function` by forward-over-reverse differentiation of its value
    (the gradient it also returns is dropped by XLA), symmetrized as `NodeProgram.hessian`."""
    jax, jnp = jax_modules()

    def hessian(x, y, *rest):
        def value(z):
            out = run(z[:x.shape[0]], z[x.shape[0]:], *rest)
            return out[0] if gradient else out
        H = jax.hessian(value)(jnp.concatenate([x, y]))
        return 0.5 * (H + H.T)
    return hessian


_IN_AXES = (0, 0) + JaxGroupPlan.IN_AXES[1:]      # (x, y, params, batched, common, sizes, counts)


class _VectorFunction:
    """jit(vmap) of one client's compiled plan as a function of the stacked flat points:
    (X (n, n_x), Y (n, n_y)) -> values (n,) [and gradients (n, n_x + n_y)], clients in group
    order. The clients are evaluated in buckets of similar data size (`buckets`), one vmap
    each, inside one jitted function (`sorted`: the same in bucket order, no permutation).
    `hessian` differentiates the same lowered functions on the same device arrays (the data is
    stacked and moved to the device once)."""

    def __init__(self, programs: list, which: str):
        jax, _ = jax_modules()
        gradient = self.gradient = which == "value_grad_plan"
        self.groups = buckets(programs, which)
        self.plans = [JaxGroupPlan([getattr(programs[i], which) for i in idx]) for idx in self.groups]
        self.order = np.concatenate(self.groups)            # bucket order -> group order
        self.inverse = np.argsort(self.order)
        self.identity = bool(np.all(self.order == np.arange(len(self.order))))
        self.clients = [_client_function(programs[0], plan.lowered, gradient) for plan in self.plans]
        self.bounds = np.cumsum([0] + [len(idx) for idx in self.groups])
        self._hessian = None                # jitted on first use (`hessian`)
        self.sorted, in_group_order = self._fused([jax.vmap(run, in_axes=_IN_AXES) for run in self.clients],
                                                  gradient)
        self._run = jax.jit(in_group_order)

    def _fused(self, parts: list, pair: bool) -> tuple:
        """(in bucket order, in group order): one function of (X, Y, per-bucket arguments) that
        applies each bucket's vmapped function `parts[b]` to its rows; `pair`: each returns two
        stacks (values, gradients)."""
        _, jnp = jax_modules()
        bounds, order, inverse, identity = self.bounds, self.order, self.inverse, self.identity

        def in_bucket_order(X, Y, arguments):
            outs = [fn(X[a:b], Y[a:b], *args) for fn, args, a, b in zip(parts, arguments, bounds, bounds[1:])]
            if len(outs) == 1:
                return outs[0]
            if not pair:
                return jnp.concatenate(outs)
            return jnp.concatenate([o[0] for o in outs]), jnp.concatenate([o[1] for o in outs])

        def in_group_order(X, Y, arguments):
            if identity:
                return in_bucket_order(X, Y, arguments)
            out = in_bucket_order(X[order], Y[order], arguments)
            return out[inverse] if not pair else (out[0][inverse], out[1][inverse])
        return in_bucket_order, in_group_order

    def arguments(self) -> list:
        """Per bucket, the parameters and constants its vmapped function takes after X and Y."""
        return [(plan.params(), *plan.constants()) for plan in self.plans]

    def __call__(self, X: np.ndarray, Y: np.ndarray):
        with float64():
            return self._run(np.asarray(X, dtype=float), np.asarray(Y, dtype=float), self.arguments())

    def hessian(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """∇²P_i of every client (n, N, N) in group order, as a writable array: one jitted call
        of `_client_hessian` over the lowered functions and device data `__call__` uses."""
        if self._hessian is None:
            jax, _ = jax_modules()
            parts = [jax.vmap(_client_hessian(run, self.gradient), in_axes=_IN_AXES) for run in self.clients]
            self._hessian = jax.jit(self._fused(parts, False)[1])
        with float64():
            return np.array(self._hessian(np.asarray(X, dtype=float), np.asarray(Y, dtype=float),
                                          self.arguments()))


class JaxGroup(Group):
    """A `batched_group.Group` whose merits and objectives are evaluated by JAX (vmap + jit).
    A group whose plans cannot be lowered keeps numpy's batched plans (`lowering_error`)."""

    def __init__(self, names: list[str], programs: list, on_fallback=None):
        super().__init__(names, programs)
        self._jax: dict[str, _VectorFunction | None] = {}
        self._steps: dict[tuple, Any] = {}
        self.lowering_error: str | None = None
        self._on_fallback = on_fallback
        self.calls: Counter = Counter()     # evaluations served by JAX, by kind (tests, docs)

    def _function(self, which: str) -> _VectorFunction | None:
        if which not in self._jax:       # lowered on first use (stacking data costs a pass)
            try:
                self._jax[which] = _VectorFunction(self.programs, which)
            except FedModelError as exc:
                self._jax[which] = None
                self.lowering_error = str(exc)
                if self._on_fallback is not None:
                    self._on_fallback(self, which, str(exc))
        return self._jax[which]

    def value_grad(self, X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """P_i and ∇P_i (w.r.t. z = (x, y)) of every client: (n,), (n, n_x + n_y)."""
        fn = self._function("value_grad_plan")
        if fn is None:
            return super().value_grad(X, Y)
        values, G = fn(X, Y)
        self.calls["value_grad"] += 1
        return np.array(values), np.array(G)

    def grad(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """∇P_i of every client from the jitted merit (XLA drops the unused value)."""
        return self.value_grad(X, Y)[1]

    def value(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """P_i of every client from the jitted merit (the numbers its `value_grad` compares with)."""
        return self.value_grad(X, Y)[0]

    def hessian(self, X: np.ndarray, Y: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """∇²P_i at z_i = (x_i, y_i) of the clients `rows` (default all): (k, N, N), N = n_x + n_y,
        by one jitted vmap of jax.hessian of the lowered merit `value_grad` uses (its device
        data) over every client; at most `STRAGGLERS`·n clients by their own Hessian plans (as
        fast as the group call there, and no second compiled function for a few clients)."""
        fn = self._function("value_grad_plan")
        if fn is None or (rows is not None and len(rows) <= self.STRAGGLERS * self.n):
            return super().hessian(X, Y, rows)
        self.calls["hessian"] += 1
        H = fn.hessian(X, Y)
        return H if rows is None else H[rows]

    def objective(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        fn = self._function("objective_plan")
        if fn is None:
            return super().objective(X, Y)
        self.calls["objective"] += 1
        return np.array(fn(X, Y))

    def fused_local_steps(self, Z: np.ndarray, linear, weight, anchor, step: float, steps: int,
                          prox: bool, subtract_linear: bool = False) -> np.ndarray | None:
        """`batched_procedures.local_steps` as one jitted loop, or None where it does not apply
        (prox terms other than one λ‖w‖₁, or plans that run on numpy)."""
        threshold, cols, prox_after = self.kernel_prox(step, prox)
        fn = self._function("value_grad_plan")
        if (prox_after and self.prox) or fn is None:   # (prox_after without terms: nothing to apply)
            return None
        n, n_x = Z.shape[0], self.n_x
        lo, hi, _ = cols.indices(Z.shape[1])
        key = (lo, hi, bool(subtract_linear))
        run = self._steps.get(key)
        if run is None:
            run = self._steps[key] = _step_loop(fn, n_x, lo, hi, -1.0 if subtract_linear else 1.0)

        def operand(a):      # scalar, (n_x,), (n, 1) or (n, n_x): as given, broadcast in JAX
            a = np.asarray(a, dtype=float)
            if a.ndim == 2 and a.shape[0] > 1 and a.strides[0] == 0:
                a = a[:1]                       # a broadcast view: its one row
            return a if a.ndim == 2 else np.reshape(a, (1, -1))

        with float64():
            out = run(np.asarray(Z, dtype=float), operand(linear), operand(weight), operand(anchor),
                      float(step), int(steps), np.asarray(threshold, dtype=float).reshape(n),
                      fn.arguments())
        self.calls["local_steps"] += int(steps)
        return np.array(out)


def _step_loop(fn: _VectorFunction, n_x: int, lo: int, hi: int, sign: float):
    """The jitted W-step loop of `JaxGroup.fused_local_steps` for one prox column range. The
    loop runs in the clients' bucket order (rows permuted once on the way in and out)."""
    jax, jnp = jax_modules()
    order, inverse, identity = fn.order, fn.inverse, fn.identity

    def rows(a):                 # an operand with one row per client, into bucket order
        return a if identity or a.shape[0] == 1 else a[order]

    def loop(Z, linear, weight, anchor, step, steps, threshold, arguments):
        Z, linear, weight, anchor = rows(Z), rows(linear), rows(weight), rows(anchor)
        t = (threshold if identity else threshold[order])[:, None]

        def body(_, Z):
            X = Z[:, :n_x]
            _, G = fn.sorted(X, Z[:, n_x:], arguments)
            new_x = X - (((X - anchor) * weight + sign * linear) + G[:, :n_x]) * step
            new = jnp.concatenate([new_x, Z[:, n_x:] - G[:, n_x:] * step], axis=1)
            if hi > lo:                  # soft-thresholding z − clip(z, −t, t) where t ≥ 0
                v = new[:, lo:hi]
                shrunk = v - jnp.minimum(jnp.maximum(v, -t), t)
                new = new.at[:, lo:hi].set(jnp.where(t >= 0.0, shrunk, v))
            return new

        Z = jax.lax.fori_loop(0, steps, body, Z)
        return Z if identity else Z[inverse]

    return jax.jit(loop)


class JaxEngine:
    """The JAX engine of `batched.BatchedExecutor` (`batched.Engine`): its groups are
    `JaxGroup`s, and it reports what ran without JAX (`fallbacks`, `JaxFallbackWarning`)."""

    name = "jax"

    def __init__(self) -> None:
        jax_modules()                   # a clear error now if JAX is not installed
        self.fallbacks: list[str] = []
        self._warned: set[str] = set()

    def start(self) -> None:
        """A run starts: what the previous one reported is forgotten."""
        self.fallbacks = []
        self._warned = set()

    def group(self, names: list[str], programs: list) -> JaxGroup:
        return JaxGroup(names, programs, self._group_fallback)

    def served_alone(self, group: Group, kind: str) -> None:
        """A member of `group` is served node by node: a warning names the kind once per run
        (bookkeeping kinds and node-local steps are not reported: nothing to vectorize)."""
        if kind not in _QUIET and kind not in self._warned and not MESSAGES[kind].local:
            self._warned.add(kind)
            self._report(f"request {kind!r} served node by node (numpy): no vectorized form for it "
                         "or for these options")

    def calls(self, groups: list) -> Counter:
        """Evaluations served by JAX over `groups`: "value_grad", "objective", "hessian" (one
        per vmapped call) and "local_steps" (steps taken inside the fused loop)."""
        total: Counter = Counter()
        for group in groups:
            total.update(group.calls)
        return total

    def _group_fallback(self, group: JaxGroup, which: str, reason: str) -> None:
        self._report(f"group of {group.n} clients ({group.names[0]}, …): {which} on numpy: {reason}")

    def _report(self, message: str) -> None:
        self.fallbacks.append(message)
        warnings.warn(f"executor 'jax': {message}", JaxFallbackWarning, stacklevel=4)
