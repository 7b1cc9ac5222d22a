"""A group of same-structure client programs, with their batched plans and stacked state.

The batched executor (`batched.BatchedExecutor`) groups the client programs whose compiled
merits have the same structure (`program_signature`: same expressions, data of any compatible
shape) and serves each group with one numpy computation. A `Group` holds the members' batched
plans (`batched_plan.BatchedPlan`) and the stacked (n, d) arrays its forms last wrote: it hands
*row views* of them to the clients' state (`Group.sync`) only when the state is read, and
reuses a stack while every client still holds exactly those row objects. It also evaluates the
members' Hessians (`hessian`) and solves their local problems at once (`solve_local`). The
helpers at the end (`in_group_order`, `read_only`, `private_stack`) read a group's stacks.
"""
from __future__ import annotations

import math
from operator import is_, itemgetter
from typing import Any, Callable

import numpy as np

from .batched_newton import NewtonMatrices, newton_batched, stack_fits
from . import ball_newton, exact_step, low_rank
from .batched_plan import BatchedPlan, plan_signature
from ..errors import FedModelError
from .batched_held import HeldRows
from .program import NodeProgram


def program_signature(program: NodeProgram) -> tuple:
    """Programs with equal signatures can be served by one batched computation."""
    m = program.merit_ir
    prox = tuple((program.shared.variables.index(t.variable), _norm1_weight(t) is not None)
                 for t in m.prox_terms)
    return (program.role, program.n_shared, tuple(v.shape for v in program.private.variables),
            plan_signature(program.value_grad_plan), plan_signature(program.objective_plan), prox,
            len(program.all_constraints), tuple(p.shape for p in m.multipliers.values()))


def _norm1_weight(term) -> float | None:
    """λ of a λ‖w‖₁ prox term (kind "norm1", see `compiler.sets.ProxTerm`), else None."""
    return term.weight() if term.kind == "norm1" else None


class Group(HeldRows):
    """Client programs of one structure, with their batched plans and stacked state."""

    STRAGGLERS = 1 / 16     # share of the clients below which `solve_newton` evaluates per client

    def __init__(self, names: list[str], programs: list[NodeProgram]):
        self.names, self.programs = names, programs
        self.n = len(names)
        self.index = {name: i for i, name in enumerate(names)}
        first = programs[0]
        self.n_x, self.n_y = first.n_shared, first.n_private
        self.variables = first.variables
        self.constrained = bool(first.all_constraints)
        self.prox = []                      # (column slice, λ per client or None, term index)
        for k, term in enumerate(first.merit_ir.prox_terms):
            i = first.shared.variables.index(term.variable)
            cols = slice(int(first.shared.offsets[i]), int(first.shared.offsets[i + 1]))
            weights = [_norm1_weight(p.merit_ir.prox_terms[k]) for p in programs]
            self.prox.append((cols, None if None in weights else np.array(weights), k))
        self._plans: dict[str, BatchedPlan] = {}
        self._blocks: dict = {}             # block-diagonal data matrices shared by the plans
        self._stacks: dict[str, tuple[list | None, np.ndarray]] = {}    # slot -> (row views, stack)
        self._pending: dict[str, tuple[str, list[dict]]] = {}          # slot -> (key, dicts) to hand over
        self._write_backs: dict[str, Callable[[], None]] = {}
        self._twice: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._checked: dict[str, Any] = {}      # family -> what it validated (until `forget`)
        self.memo: dict[str, Any] = {}          # what a backend's forms keep per group (e.g. a layout)

    # -- checks of the members' states ---------------------------------------------------------
    def forget(self) -> None:
        """A member's state may have changed in any way (it was served node by node, handed to
        another executor, or replaced by a form that writes new state dicts, as a backend's
        stacked init may), so the forms' checks of the members' states are void. The executor
        holding the members and such forms call it: nothing else can change their state."""
        self._checked.clear()

    def checked(self, family: str, validate: Callable[[], Any]) -> Any:
        """`validate()` (the members' states as a form family needs them, or None), reused
        until a member's state changes outside the forms (`forget`)."""
        known = self._checked.get(family)
        if known is not None:
            return known
        self.sync()
        result = validate()
        if result is not None:
            self._checked[family] = result
        return result

    # -- plans ---------------------------------------------------------------------------------
    def plan(self, which: str) -> BatchedPlan:
        if which not in self._plans:   # built on first use: stacking data costs one pass over it
            self._plans[which] = BatchedPlan([getattr(p.compiled, which) for p in self.programs], self._blocks)
        return self._plans[which]

    def _inputs(self, X: np.ndarray, Y: np.ndarray) -> list[np.ndarray]:
        """Flat per-variable inputs from stacked shared (n, n_x) and private (n, n_y) values."""
        p = self.programs[0]
        cols = [X[:, p.shared.offsets[i]:p.shared.offsets[i + 1]] for i in range(len(p.shared.variables))]
        cols += [Y[:, p.private.offsets[i]:p.private.offsets[i + 1]] for i in range(len(p.private.variables))]
        return [np.ascontiguousarray(c).ravel() for c in cols]

    def value_grad(self, X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """P_i and ∇P_i (w.r.t. z = (x, y)) of every client: (n,), (n, n_x + n_y)."""
        plan = self.plan("value_grad_plan")
        out = plan(*self._inputs(X, Y))
        G = self._gradient_stack(out[1:], plan.output_segs[1:])
        return self._per_client(out[0], plan.output_segs[0], ()).ravel(), G

    def value(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """P_i of every client (n,), bitwise `value_grad`'s, without the gradients."""
        plan = self.plan("value_plan")
        return self._per_client(plan(*self._inputs(X, Y))[0], plan.output_segs[0], ()).ravel()

    def grad(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """∇P_i of every client (n, n_x + n_y), bitwise `value_grad`'s, from the plan without
        P_i's value (for steps that discard it: a logistic loss's log1p pass is skipped)."""
        plan = self.plan("gradient_plan")
        return self._gradient_stack(plan(*self._inputs(X, Y)), plan.output_segs)

    def _gradient_stack(self, outs: list, segs: list) -> np.ndarray:
        """A plan's flat per-variable gradient outputs as one (n, n_x + n_y) stack."""
        grads = [self._per_client(g, seg, v.shape) for g, seg, v in zip(outs, segs, self.variables)]
        return grads[0] if len(grads) == 1 else np.concatenate(grads, axis=1) if grads else np.zeros((self.n, 0))

    def hessian(self, X: np.ndarray, Y: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """∇²P_i at z_i = (x_i, y_i) of the clients `rows` (default all): (k, N, N), N = n_x + n_y.
        Each client's `NodeProgram.hessian` (its compiled Hessian plan: the serial numbers);
        the JAX executor's group computes them in one vmap."""
        rows = np.arange(self.n) if rows is None else np.asarray(rows, dtype=np.intp)
        N = self.n_x + self.n_y
        out = np.empty((len(rows), N, N))
        for k, i in enumerate(rows):
            out[k] = self.programs[i].hessian(np.concatenate([X[i], Y[i]]))
        return out

    def local_method(self, method: str) -> str:
        """The method `NodeProgram.solve_local(method=...)` runs on every member ("auto"
        resolved: the members share prox terms, degree and size, hence the choice)."""
        return self.programs[0]._choose(method)

    def solve_local(self, Z0: np.ndarray, rows: np.ndarray, linear, weight, anchor, tol,
                    method: str = "auto", max_steps: int = 1000, lr: float | None = None,
                    residual: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`NodeProgram.solve_local` for the clients `rows` from Z0 (k, N) = (x, y) rows:
        (Z, steps, ‖∇‖∞) per client. Newton and exact solves of a stack that fits
        (`batched_newton.stack_fits`) are one batched solve (`solve_newton`), prox solves of ball
        clients one `ball_newton` solve; others run each client's own solver. `linear`, `anchor`: (n_x,)
        or (k, n_x); `weight`: a number, (k,) or (k, n_x); `tol`: a number or (k,) (each
        client's own). The members' `y` are not written. `residual=False` (the caller does not
        read ‖∇‖∞: NaN where not evaluated) lets a quadratic's "exact" take one step
        (`exact_step`)."""
        rows, chosen = np.asarray(rows, dtype=np.intp), self.local_method(method)
        held = chosen == "local-al"
        if held:        # rounds of the rest's solver, held constraints' multipliers between
            chosen = self._held_rest(rows) if len(rows) >= self.HELD_ROWS else None
        if chosen in ("exact", "newton") and stack_fits(len(rows), self.n_x + self.n_y) and \
                not any(low_rank.applies(self.programs[r]) for r in rows):   # (few rows: Woodbury, each)
            weight = np.broadcast_to(np.asarray(weight, float).reshape(-1, 1) if np.ndim(weight) == 1
                                     else np.asarray(weight, float), (len(rows), self.n_x))
            if held:
                return self._solve_held(Z0, rows, linear, weight, anchor, tol, chosen, max_steps)
            found = None if residual or not exact_step.applies(self, rows, chosen) else \
                exact_step.solve(self, Z0, rows, linear, weight, anchor)
            if found is not None:
                return found
            return self.solve_newton(Z0, rows, linear, weight, anchor, tol, chosen, max_steps)
        found = ball_newton.solve_rows(self, chosen, Z0, rows, linear, weight, anchor, tol, max_steps)
        return found if found is not None else self._solve_each(
            Z0, rows, linear, weight, anchor, tol, method, max_steps, lr,
            exact=not residual and exact_step.applies(self, rows, chosen))

    def _solve_each(self, Z0, rows, linear, weight, anchor, tol, method, max_steps, lr,
                    exact: bool = False):
        """`solve_local` client by client, each by its program's own solver (its y restored);
        `exact`: each quadratic client's one step first, as the serial executor takes it
        (`exact_step.OneProgram`: the same numbers on every executor)."""
        k, n_x = len(rows), self.n_x
        linear, anchor = broadcast_rows(linear, k, n_x), broadcast_rows(anchor, k, n_x)
        weights = np.asarray(weight, float)
        tols = np.asarray(tol, float)
        Z, steps, residual = np.array(Z0, dtype=float), np.zeros(k, dtype=int), np.zeros(k)
        for j, r in enumerate(rows):
            program = self.programs[r]
            w = weights if weights.ndim == 0 else weights[j]
            found = exact_step.solve(exact_step.OneProgram(program), Z[j:j + 1], np.zeros(1, dtype=np.intp),
                                     linear[j], w, anchor[j]) if exact else None
            if found is not None:
                Z[j], steps[j], residual[j] = found[0][0], found[1][0], found[2][0]
                continue
            kept = program.y
            program.y = Z[j, n_x:].copy()
            out = program.solve_local(linear=linear[j], weight=w, anchor=anchor[j], x0=Z[j, :n_x],
                                      tol=tol if tols.ndim == 0 else tols[j],
                                      method=method, max_steps=max_steps, lr=lr)
            Z[j, :n_x], Z[j, n_x:] = out["x"], program.y
            steps[j], residual[j] = int(out["steps"]), float(out["grad_norm"])
            program.y = kept
        return Z, steps, residual

    def solve_newton(self, Z0: np.ndarray, rows: np.ndarray, linear: np.ndarray, weight: np.ndarray,
                     anchor: np.ndarray, tol, method: str, max_steps: int = 1000
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`NodeProgram.solve_local` with method "exact" or "newton" for the clients `rows` at
        once: argmin_z P_i(z) + linear_iᵀx + ½ weight_i‖x − anchor‖² from Z0 (k, N), returning
        (Z, steps, ‖∇‖∞) per client: `batched_newton.newton_batched` (the serial solve's rules
        per client), its directions from the clients' chord Hessians (`NewtonMatrices`: kept
        in their programs as the serial solve keeps them, factored once per Hessian or weight
        change). An evaluation is one group `value_grad` call (or, for at most
        `STRAGGLERS`·n clients, each one's own plan), Hessians one group `hessian` call.
        Memory: a few (k, N) stacks, the clients' Hessians and their (k, N, N) factor stack.
        tol: a number or (k,); weight: (k,) or (k, n_x); the members do not write their `y`
        here (the caller does)."""
        if method not in ("exact", "newton"):
            raise FedModelError(f"Group.solve_newton: method {method!r} is not 'exact' or 'newton'")
        if method == "exact":        # as `NodeProgram.solve_local`: exact solve, one refinement
            tol, max_steps = 0.0, 2
        rows = np.asarray(rows, dtype=np.intp)
        k, n_x = len(rows), self.n_x
        W = np.broadcast_to(np.asarray(weight, float).reshape(k, -1), (k, n_x))
        linear = np.broadcast_to(np.asarray(linear, float), (k, n_x))
        anchor = np.broadcast_to(np.asarray(anchor, float), (k, n_x))
        directions = NewtonMatrices(self, rows, W, chord=method == "newton")
        return newton_batched(self._penalized(rows, linear, W, anchor, Z0[0]), directions, Z0, tol, max_steps)

    def exact_directions(self, Z: np.ndarray, G: np.ndarray, rows: np.ndarray, W: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        """−A_j⁻¹g_j for the clients `rows`, A_j = ∇²P_j + diag(W_j) from the kept Hessians
        and the group's `FactorStack` (`exact_step`), and which A_j are regular; W (k, n_x) or
        (k, 1)."""
        matrices = NewtonMatrices(self, rows, np.broadcast_to(W, (len(rows), self.n_x)), chord=False)
        D = matrices(Z, G, np.ones(len(rows), dtype=bool), np.zeros(len(rows), dtype=bool))
        return D, ~matrices.factors.singular

    def _penalized(self, rows: np.ndarray, linear: np.ndarray, W: np.ndarray, anchor: np.ndarray,
                   filler: np.ndarray) -> Callable:
        """fun_grad(Z, which) of `solve_newton`'s problems: values and gradients at Z (k, N) of
        the rows `which` (default all; other rows: 0). A group evaluation computes every client
        (~3 µs each at n = 1000, d = 10, against ~30 µs for one client's own plan): when at
        most `STRAGGLERS` of the group's clients are asked for (a solve's last steps), each is
        evaluated by its own program. `filler`: the non-members' point (values unused)."""
        k, n_x, N = len(rows), self.n_x, self.n_x + self.n_y
        full = np.empty((self.n, N))
        full[:] = filler

        def fun_grad(Z: np.ndarray, which: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
            if which is not None and int(np.count_nonzero(which)) <= self.STRAGGLERS * self.n:
                v, G = np.zeros(k), np.zeros((k, N))
                for j in np.flatnonzero(which):
                    v[j], G[j] = self.programs[rows[j]].value_grad(Z[j, :n_x], Z[j, n_x:])
            else:
                full[rows] = Z
                v, G = self.value_grad(full[:, :n_x], full[:, n_x:])
                v, G = v[rows], G[rows]
            diff = Z[:, :n_x] - anchor
            scaled = W * diff
            v = v + (np.einsum("ij,ij->i", linear, Z[:, :n_x]) + 0.5 * np.einsum("ij,ij->i", diff, scaled))
            G[:, :n_x] += linear + scaled
            return v, G
        return fun_grad

    def objective(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        plan = self.plan("objective_plan")
        return self._per_client(plan(*self._inputs(X, Y))[0], plan.output_segs[0], ()).ravel()

    def _per_client(self, flat, seg, shape) -> np.ndarray:
        """Flat per-client values → (n, size of `shape`), broadcasting each client's value."""
        size = math.prod(shape)
        if seg.uniform is not None and math.prod(seg.uniform) == size:
            return flat.reshape(self.n, size)
        rows = [np.ravel(np.broadcast_to(v, shape)) for v in seg.split(flat)]
        return np.array(rows, dtype=float).reshape(self.n, size)

    def twice(self, key: str, stack: np.ndarray) -> np.ndarray:
        """2·stack, computed once per published stack (e.g. the weights 2ρ_i∘ρ_i); (n, 1) when
        every row is one number repeated (a scalar ρ_i: the kernels then read no (n, d) array)."""
        cached = self._twice.get(key)
        if cached is None or cached[0] is not stack:
            rows_constant = stack.shape[1] > 0 and bool(np.all(stack == stack[:, :1]))
            cached = self._twice[key] = (stack, 2.0 * (stack[:, :1] if rows_constant else stack))
        return cached[1]

    # -- stacked state -------------------------------------------------------------------------
    def gather(self, key: str, states: list[dict], width: int, slot: str | None = None) -> np.ndarray:
        """(len(states), width) stack of the `state[key]` rows (the clients' states, or any list
        of dicts, cached under `slot`, default `key`). Reused while every dict still holds the
        row views last published (or their hand-over is pending); otherwise stacked afresh."""
        slot = slot or key
        if slot in self._pending and self._pending[slot][1] is states:
            return self._stacks[slot][1]
        if any(k == key for k, _ in self._pending.values()):
            self.sync()                             # our newer `key` rows, held under another slot
        cached = self._stacks.get(slot)
        rows = list(map(itemgetter(key), states))
        if cached is not None and len(rows) == len(cached[0]) and all(map(is_, rows, cached[0])):
            return cached[1]
        stack = np.array([np.broadcast_to(np.asarray(r, float), (width,)) for r in rows], dtype=float) \
            .reshape(len(rows), width)
        self.publish(key, stack, states, slot)
        return stack

    def stack(self, slot: str) -> np.ndarray:
        """The stack last gathered or published under `slot`."""
        return self._stacks[slot][1]

    def row_views(self, slot: str) -> list[np.ndarray]:
        """The row views of the stack under `slot` that its dicts hold (handed over first)."""
        if slot in self._pending:
            self.sync()
        return self._stacks[slot][0]

    def publish(self, key: str, stack: np.ndarray, states: list[dict], slot: str | None = None) -> None:
        """Make `stack` the rows of `state[key]` of the dicts `states`. The dicts get their row
        views on `sync`, which the executor holding the members runs before anything reads them
        (a request it serves node by node or by a per-member form, a hand-over, `close`): a
        batched run does not touch n dicts per step."""
        slot = slot or key
        self._stacks[slot] = (None, stack)
        self._pending[slot] = (key, states)

    def on_sync(self, name: str, write_back: Callable[[], None]) -> None:
        """Run `write_back()` at the next `sync`, after the pending stacks (once per name)."""
        self._write_backs[name] = write_back

    def sync(self) -> None:
        """Hand the pending stacks' row views to their dicts, then run the write-backs."""
        if not self._pending and not self._write_backs:
            return
        for slot, (key, states) in self._pending.items():
            stack = self._stacks[slot][1]
            views = list(stack)
            for state, view in zip(states, views):
                state[key] = view
            self._stacks[slot] = (views, stack)
        self._pending.clear()
        write_backs, self._write_backs = self._write_backs, {}
        for write_back in write_backs.values():
            write_back()

    def kernel_prox(self, t: float, prox: bool) -> tuple[np.ndarray, slice, bool]:
        """How a compiled step applies the prox at step t: (threshold tλ_i per client, its
        columns, whether the prox terms must still be applied after the kernel). The kernels
        soft-threshold when the only prox term is λ_i‖w‖₁; otherwise (threshold −1: none) the
        caller applies every prox term itself, or none when `prox` is False."""
        if prox and len(self.prox) == 1 and self.prox[0][1] is not None:
            return t * self.prox[0][1], self.prox[0][0], False
        return np.full(self.n, -1.0), slice(0, 0), prox

    def apply_prox(self, Z: np.ndarray, t: float) -> np.ndarray:
        """Every client's prox step (in term order, as `NodeProgram.apply_prox`)."""
        for cols, weights, k in self.prox:
            if weights is not None:     # λ‖w‖₁: soft-thresholding at t·λ_i, all clients at once
                v = Z[:, cols]          # Norm1.prox, sign(v)·max(|v| − tλ, 0), in place
                if np.all(weights == weights[0]):   # one λ: v − clip(v, −tλ, tλ), two passes
                    v -= np.clip(v, -t * weights[0], t * weights[0])
                    continue
                shrunk = np.abs(v)      # (copysign: the same numbers, up to the sign of a zero)
                shrunk -= (t * weights)[:, None]
                np.maximum(shrunk, 0.0, out=shrunk)
                np.copysign(shrunk, v, out=v)
            else:
                for i, p in enumerate(self.programs):
                    term = p.merit_ir.prox_terms[k]
                    Z[i, cols] = np.ravel(term.prox(Z[i, cols].reshape(term.variable.shape), t))
        return Z


# ---- reading a group's stacks -----------------------------------------------------------------
def broadcast_rows(value: Any, k: int, width: int) -> np.ndarray:
    """`value` as k rows of `width` floats, as `np.broadcast_to(value, (k, width))` reads it,
    without numpy's broadcast set-up (an nditer: ~3 µs, several times per ADMM step of a
    client served alone, as many as its merit evaluation's numpy calls) where none is needed:
    a (k, width) float array is returned itself, a row as a (1, width) view. Read it only."""
    a = np.asarray(value, float)
    if a.shape == (k, width):
        return a
    if k == 1 and a.shape == (width,):
        return a[None, :]
    return np.broadcast_to(a, (k, width))


def in_group_order(rows: np.ndarray, n: int) -> bool:
    """`rows` are all n rows of a group, in group order (a stack can then be replied as is)."""
    return len(rows) == n and bool(np.all(rows[1:] > rows[:-1]))


def read_only(stack: np.ndarray) -> np.ndarray:
    """A read-only view of a group's stack, for a reply: the caller cannot write the clients'
    state through it."""
    view = stack.view()
    view.flags.writeable = False
    return view


def private_stack(group: Group) -> np.ndarray:
    """(n, n_y) stack of the clients' private variables (their `program.y`)."""
    if not group.n_y:
        return np.zeros((group.n, 0))
    return np.array([p.y for p in group.programs], dtype=float)
