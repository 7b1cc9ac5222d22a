"""A client step written once, over rows of clients, and the engines that run it.

A backend writes each client step once, as a *form* over a group of same-structure clients:
`form(group, members, payloads) -> {member: reply}` (see `messages.BATCHED`), reading and writing
the clients' state as stacks (`Group.gather` / `Group.publish`), evaluating gradients, proxes
and local solves for rows of clients (`Group.grad`, `Group.apply_prox`, `Group.solve_local`).
Engines run that one function:

- stacked with numpy: a `batched_group.Group` of many clients (the batched executor);
- under `jax.vmap`: the JAX executor's `JaxGroup` (same form, its gradients and Hessians vmapped);
- per node: `NodeRows`, a group of one client evaluated by the client's own compiled plans —
  what the serial, Ray and Flower executors run (`one_node`: the node procedure serving the form
  on one program), so a client on another machine runs the very code the batched executor runs.

`client_step(name, request, reply)` declares such a form as a node procedure: the form is its
batched form and, on one node, its serve function.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import FedModelError
from . import exact_step
from .batched_group import Group
from .messages import MessageKind, Procedure
from .program import NodeProgram


class NodeRows(Group):
    """One client program as a group of one row: the per-node engine of a form. Its gradients,
    values and Hessians are the program's own plans (`NodeProgram.value_grad`, `.gradient`,
    `.hessian`: the serial numbers, no batched plan is built), its local solves the program's
    `solve_local` (every method, the serial solver), and the state it publishes is handed to
    the program's state at once (nothing is pending between requests)."""

    def __init__(self, program: NodeProgram):
        super().__init__([program.name], [program])
        self.program = program

    def checked(self, family: str, validate: Callable[[], Any]) -> Any:
        """`validate()` every time: between two requests anything may change a node's state."""
        return validate()

    def value_grad(self, X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        value, g = self.program.value_grad(np.asarray(X[0], float), np.asarray(Y[0], float))
        return np.array([value]), g[None, :]

    def value(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        p = self.program
        return np.array([float(p.compiled.value_plan(*p.compiled.values(np.asarray(X[0], float), np.asarray(Y[0], float)))[0])])

    def grad(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        # the gradient plan, as `Group.grad`: P_i's value (a logistic loss's log1p pass) is not
        # computed for a step that discards it (ProxAL's (22), once per ADMM step)
        return self.program.compiled.gradient_z(np.asarray(X[0], float), np.asarray(Y[0], float))[None, :]

    def objective(self, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        p = self.program
        return np.array([float(p.objective_plan(*p._values(np.asarray(X[0], float), np.asarray(Y[0], float)))[0])])

    def solve_local(self, Z0: np.ndarray, rows: np.ndarray, linear, weight, anchor, tol: float,
                    method: str = "auto", max_steps: int = 1000, lr: float | None = None,
                    residual: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not residual and exact_step.applies(self, rows, self.local_method(method)):
            found = exact_step.solve(exact_step.OneProgram(self.program), Z0, rows, linear, weight, anchor)
            if found is not None:
                return found
        return self._solve_each(Z0, rows, linear, weight, anchor, tol, method, max_steps, lr)

    def constraint_remainder(self, rows: np.ndarray, x: np.ndarray, R: np.ndarray) -> np.ndarray:
        # the program's own plans (the serial numbers), no batched plan built for one row
        return self.program.constraint_remainder(x, R[0])[None, :]

    def gather(self, key: str, states: list[dict], width: int, slot: str | None = None) -> np.ndarray:
        """The states' `key` rows as a stack, without the group's bookkeeping (a NodeRows serves
        one request; `publish` hands rows over at once): the one row itself as a (1, width)
        view when it is a float row (forms never write a gathered stack in place)."""
        if len(states) == 1:
            row = states[0][key]
            if isinstance(row, np.ndarray) and row.dtype == np.float64 and row.shape == (width,):
                return row[None, :]
        return np.array([np.broadcast_to(np.asarray(s[key], float), (width,)) for s in states],
                        dtype=float).reshape(len(states), width)

    def publish(self, key: str, stack: np.ndarray, states: list[dict], slot: str | None = None) -> None:
        for state, row in zip(states, stack):
            state[key] = row

    def on_sync(self, name: str, write_back: Callable[[], None]) -> None:
        super().on_sync(name, write_back)
        self.sync()


@dataclass(frozen=True)
class OneNode:
    """The serve function of a form on one node program (`NodeRows`). A module-level form
    keeps it picklable by reference (Ray ships procedures that way)."""

    form: Callable
    name: str

    def __call__(self, program: NodeProgram, **payload) -> dict:
        replies = self.form(NodeRows(program), [program.name], {program.name: payload})
        if replies is None:
            raise FedModelError(f"{self.name!r}: the step does not cover node {program.name!r} with "
                                f"this request ({sorted(payload)}); a client step's form must serve "
                                "any single node")
        return replies[program.name]


def client_step(name: str, request: dict[str, str], reply: dict[str, str], *, local: bool = False,
                read_only: bool = False, stacked: Callable | None = None) -> Callable[[Callable], Callable]:
    """Decorator: declares a form over rows of clients (`form(group, members, payloads)`) as the
    node procedure `name`, served on one node by the same form (`OneNode`) and on a group by the
    batched executor. The form must serve any single node (it may return None for a group it
    does not cover: those members are then served one by one, by the same form)."""
    def wrap(form):
        form.procedure = Procedure(MessageKind(name, request, reply, local=local, read_only=read_only),
                                   OneNode(form, name), form, stacked)
        return form
    return wrap
