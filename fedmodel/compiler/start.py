"""Compiler pass: the start point of an iterative solve.

Iterative backends start the shared variables at 0 unless given a start (`w0` for ProxAL,
cProx-AL, FedADMM and DP-ADMM; `x0` for DALD, FedProx and FedAvg). As in CVXPY, a value the user
assigned to every shared variable (`w.value = ...`) is taken as that start (a warm start), for
this solve and the next ones until the user assigns another; a value a previous solve left
there is not (`remember_solved`: re-solving does not silently start from the last answer).
A model whose objective or a constraint is not finite at 0 when no start is given (a log
barrier `-sum(log(w))`) would end "diverged" after its first step: it is refused before the
run, naming the term and saying to set `w.value` to a point of its domain. A start the user
gave is run as given (outside the domain: "diverged", with the backend's words).
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..errors import DataError, FedModelError
from ..expression import Constant, Expression, Parameter, Variable, is_sparse, postorder
from .terms import flatten

START_OPTIONS = ("w0", "x0")   # a backend's start option, by name (the first it has)
# On each shared variable (so nothing outlives it): `_solved_value`, the value object a solve
# assigned; `_start_value`, the value the user assigned last.


def remember_solved(variables: list[Variable]) -> None:
    """Mark the present values of `variables` as a solve's (not a start the user asked for)."""
    for var in variables:
        var._solved_value = var.value


def user_start(problem) -> np.ndarray | None:
    """The values the user assigned last to the shared variables (not those a solve left),
    flattened in the order backends pack them, when every one has such a value; else None. A
    re-solve thus starts where the first did, and runs the same iterations."""
    shared = problem.shared_variables()
    for var in shared:                   # the user's latest start survives the solves after it
        if var.value is not getattr(var, "_solved_value", None):   # assigned since: a start, or None
            var._start_value = var.value
    if not shared or any(getattr(v, "_start_value", None) is None for v in shared):
        return None
    return np.concatenate([np.ravel(np.asarray(v._start_value, float)) for v in shared])


def takes_start(solver: Any) -> bool:
    """Whether `solver` has a start option (`START_OPTIONS`), or is `Auto` (overrides)."""
    return any(hasattr(solver, name) for name in START_OPTIONS) or \
        isinstance(getattr(solver, "overrides", None), dict)


def with_start(solver: Any, start: np.ndarray) -> Any:
    """A copy of `solver` (which `takes_start`) starting at `start`, unless its own start
    option is set already; for `Auto`, overrides for the backends it may pick."""
    for name in START_OPTIONS:
        if hasattr(solver, name):
            if getattr(solver, name) is not None:
                return solver                # the user's own start option wins
            out = copy.copy(solver)
            setattr(out, name, start.copy())
            return out
    out = copy.copy(solver)
    out.overrides = {key: dict(value) for key, value in solver.overrides.items()}
    for backend, option in (("proxal", "w0"), ("fedadmm", "w0"), ("dp-admm", "w0"),
                            ("dald", "x0"), ("fedprox", "x0"), ("fedavg", "x0")):
        out.overrides.setdefault(backend, {}).setdefault(option, start.copy())
    return out


def start_solver(problem, solver: Any, backend: Any) -> Any:
    """`solver` as it should run on `problem`: from the user's start (`user_start`) where it
    takes one; from 0 otherwise, after `check_start` there. A start the user gave (w.value or
    the backend's own w0/x0) is run as given: a point outside the domain there ends the run
    "diverged" with the backend's message. CVXPY needs no start."""
    if getattr(solver, "name", None) == "cvxpy" or \
            any(getattr(solver, o, None) is not None for o in START_OPTIONS):
        return solver
    start, honoured = user_start(problem), takes_start(solver)
    if start is not None and honoured:
        return with_start(solver, start)
    check_start(problem, start is not None, honoured, getattr(solver, "name", str(backend)))
    return solver


def check_start(problem, ignored: bool, honoured: bool, backend: str) -> None:
    """Refuse a model whose objective terms or constraints are not finite at the start 0 (shared
    and private variables), naming the first such term and how to start elsewhere: `honoured`,
    the backend takes a start (set w.value); `ignored`, the user set one it cannot take. A term
    over non-finite data is left to the run's data check (a DataError naming the data)."""
    values = {var.uid: np.zeros(var.shape) for var in problem.variables()}
    for block in problem.blocks:
        where = "the server" if block.kind == "server" else f"client {block.name!r}"
        items = [("objective term", t) for t in block.terms] + \
            [("constraint", c.expr) for c in block.constraints]
        for kind, expr in items:
            value = _value_at(expr, values)
            if value is None or np.all(np.isfinite(value)) or not _finite_data(expr):
                continue
            if kind == "objective term":        # the piece that is not finite, as written
                pieces = [t.expression() for t in flatten(expr)]
                expr, value = next(((p, v) for p in pieces if (v := _value_at(p, values)) is not None
                                    and not np.all(np.isfinite(v))), (expr, value))
            huge = _huge_data(expr)
            if huge is not None:       # a unit problem, not a start problem: no start helps
                raise DataError(f"{where}: the {kind} {expr} overflows at the start point: its data "
                                f"{huge[0]!r} reach {huge[1]:.3g}, whose square overflows double "
                                "precision; rescale them (e.g. divide by their largest entry) and "
                                "solve again")
            names = [v.label for v in expr.variables() if v.owner is None] or \
                [v.label for v in expr.variables()]
            settable = " and ".join(n + ".value" for n in names)
            fix = f"set {settable} to a point where it is finite before solving (a warm start)"
            if not honoured:
                ignoring = f" (it ignores {settable})" if ignored else ""
                fix = (f"backend {backend!r} takes no start point{ignoring}; use 'proxal', "
                       f"'fedadmm' or 'dald' and set {settable} to a point where it is finite")
            raise FedModelError(
                f"{where}: the {kind} {expr} is not finite at the start point "
                f"{', '.join(f'{n} = 0' for n in names)} (its value there: {_show(value)}), so an "
                f"iterative solve cannot start there; {fix}")


def _finite_data(expr: Expression) -> bool:
    """Whether the constants `expr` reads are all finite."""
    for leaf in postorder([expr]):
        if isinstance(leaf, Constant) and not isinstance(leaf, Parameter):
            value = leaf.value
            data = getattr(value, "data", value) if is_sparse(value) else value
            if not np.all(np.isfinite(np.asarray(data, float))):
                return False
    return True


def _huge_data(expr: Expression) -> tuple[str, float] | None:
    """(name, largest |entry|) of the first constant `expr` reads whose square overflows."""
    for leaf in postorder([expr]):
        if isinstance(leaf, Constant) and not isinstance(leaf, Parameter):
            value = leaf.value
            data = np.asarray(getattr(value, "data", value) if is_sparse(value) else value, float)
            largest = float(np.max(np.abs(data))) if data.size else 0.0
            if largest > 1e154:
                return getattr(leaf, "label", None) or leaf.name, largest
    return None


def _value_at(expr: Expression, values: dict[int, np.ndarray]) -> np.ndarray | None:
    """`expr` with its variables at `values` (None when it cannot be evaluated)."""
    variables = expr.variables()
    saved = [v.value for v in variables]
    try:
        for var in variables:
            var.value = values[var.uid]
        with np.errstate(all="ignore"):
            value = expr.value
        return None if value is None else np.asarray(value, float)
    except (FedModelError, KeyError, ValueError, TypeError):
        return None
    finally:
        for var, old in zip(variables, saved):
            var._value = old        # as it was, without the setter's copy (`remember_solved`)


def _show(value: np.ndarray) -> str:
    bad = value[~np.isfinite(value)] if value.ndim else value
    return f"{float(np.ravel(bad)[0]):g}" + (f" in {bad.size} of {value.size} entries" if value.size > 1 else "")
