"""Compiler pass: the epigraph rewrite of piecewise-linear losses in client objectives.

The SVM hinge `mean(pos(1 − y ∘ (X w)))`, the pinball loss `τ·sum(pos(r)) + (1 − τ)·sum(pos(−r))`
or `sum(maximum(τ r, (τ − 1) r))`, least absolute deviations `norm1(y − X w)` / `mean(abs(r))`
have neither a gradient nor a prox. As CVXPY's canonicalization does for its solvers, each
such term `c · Σ_e ω_e · φ(a)_e` (c > 0, ω ≥ 0 constant weights, Σ a sum, a mean or a scalar) of
a client objective becomes `c · Σ_e ω_e t_e` over a new private variable t of the client, one
entry per row, with the rows of

    pos(a):          t ≥ a,  t ≥ 0          maximum(a, b):   t ≥ a,  t ≥ b
    abs(a), norm1:   t ≥ a,  t ≥ −a         (a affine; for pos and maximum, smooth and convex)

as that client's local constraints: its data never leaves it. At a solution t = φ(a), so the
rewritten model has the user's optimum and objective value. Backends whose runs take a
client's private variables and inequalities exactly (`solves_epigraph` True: ProxAL, cProx-AL,
auto without DP options, and CVXPY, whose multipliers of the rows then certify the point — as
written, the certificate read the hinge's gradient on one side of each support vector's kink
and called CVXPY's own answer "not a solution", KKT 0.016) solve the rewritten copy; any other
backend is refused before it runs, with the names of those that can (`rewrite_for`).
Prox-able terms (λ‖w‖₁ of a shared variable) and the server's terms are left as they are:
they have prox paths.

`EpigraphModel.to_user` reports the result in the user's terms: the slacks are not among the
values, their constraints not among the multipliers, the objective and the largest violation
are the user's model's at the point; the KKT certificate is the rewritten model's (the smooth
equivalent, whose conditions the user's nonsmooth ones are; `info["epigraph"]` says so).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..atoms import Abs, Maximum, Mean, Multiply, Norm1, Pos, Sum, add, broadcast_to, multiply, neg
from ..atoms import sum as sum_
from ..constraints import Inequality
from ..errors import SmoothnessError
from ..expression import Constant, Expression, Variable
from .canonical import classify_objective
from .codegen import Plan
from .scale_probe import factor, value_at
from .terms import Term, flatten
from .violated import restate


@dataclasses.dataclass
class Loss:
    """A recognized term c·Σ_e ω_e φ(a)_e: t ≥ each of `pieces` (broadcast to `shape`)."""
    coefficient: float          # c / count for a mean
    weights: Any                # ω: 1.0 or a nonnegative constant array
    pieces: list[Expression]
    shape: tuple
    written: Expression         # the term as the user wrote it (for info["epigraph"])


def _pieces(core: Expression) -> list[Expression] | None:
    """The lower bounds of t for φ = `core`'s atom, or None when it is not one of them (or its
    arguments make it nonconvex: |a| needs a affine, pos and maximum smooth convex ones)."""
    if isinstance(core, (Abs, Norm1)):
        a = core.args[0]
        return [a, neg(a)] if a.is_affine() else None
    if isinstance(core, Pos):
        args = [core.args[0], Constant(0.0)]
    elif isinstance(core, Maximum):
        args = list(core.args)
    else:
        return None
    return args if all(a.is_smooth() and a.is_convex() for a in args) else None


def _nonnegative_constant(expr: Expression) -> Any:
    """The value of `expr` when it is a constant ≥ 0 (dense), else None."""
    if not expr.is_constant() or expr.parameters():
        return None
    value = expr.value
    if value is None or hasattr(value, "tocsr"):
        return None
    value = np.asarray(value, float)
    return value if np.all(value >= 0) else None


def recognize(term: Term) -> Loss | None:
    """`term` as a `Loss`, or None (see the module docstring for the forms)."""
    if not isinstance(term.coefficient, float) or term.coefficient <= 0 or term.atom.shape != ():
        return None
    atom, coefficient, weights = term.atom, term.coefficient, 1.0
    if isinstance(atom, Sum) and not isinstance(atom, Norm1):
        inner = atom.args[0]
        if isinstance(atom, Mean):
            coefficient /= atom.count
        if isinstance(inner, Multiply):       # ω ∘ φ(a), either side
            for side, other in ((inner.args[0], inner.args[1]), (inner.args[1], inner.args[0])):
                found = _nonnegative_constant(side)
                if found is not None and _pieces(other) is not None:
                    weights, inner = found, other
                    break
        core = inner
    else:
        core = atom
    pieces = _pieces(core)
    if pieces is None:
        return None
    shape = core.args[0].shape if isinstance(core, Norm1) else core.shape
    try:
        shape = tuple(np.broadcast_shapes(shape, np.shape(weights)))
    except ValueError:
        return None
    return Loss(coefficient, weights, pieces, shape, term.expression())


def client_losses(block) -> list[tuple[int, list[Term], list[Loss | None]]]:
    """Per objective term of a client block with a loss to rewrite: (its index, its canonical
    terms, the `Loss` of each or None). Only terms with neither a gradient nor a prox count."""
    found = []
    for index, expr in enumerate(block.terms):
        if expr.is_smooth() or not classify_objective([expr]).unsupported:
            continue
        terms = flatten(expr)
        losses = [recognize(t) if classify_objective([t.expression()]).unsupported else None
                  for t in terms]
        if any(losses):
            found.append((index, terms, losses))
    return found


class EpigraphModel:
    """The rewritten copy of a problem and the map of its results to the user's model."""

    def __init__(self, original, problem, slacks: list[Variable],
                 rows: dict[str, tuple[str, float]], rewritten: list[str]):
        self.original, self.problem = original, problem
        self.slack_uids = {v.uid for v in slacks}
        # the epigraph constraints' names -> (the loss they rewrite, as info["violated"] names
        # it; the divisor of its rows, `_size`)
        self.rows = rows
        self.names = set(rows)
        self.rewritten = rewritten      # "client c0: mean(pos(...)) (40 rows)", for info

    def to_user(self, result):
        """`result` (of `self.problem`) as a result of the user's model (module docstring)."""
        values = {uid: v for uid, v in result.values.items() if uid not in self.slack_uids}
        objective, violation = result.objective, result.max_violation
        variables = self.original.variables()
        # (data produced on the workers cannot be evaluated here: the run's own report stays)
        if values and all(v.uid in values for v in variables) and not self.original.remote_data():
            outputs = [self.original.objective] + [c.expr for c in self.original.constraints]
            evaluated = Plan(outputs, variables)(*[values[v.uid] for v in variables])
            objective = float(evaluated[0])
            violation = max([0.0] + [c.violation(val) for c, val in
                                     zip(self.original.constraints, evaluated[1:])])
        info = dict(result.info or {})
        info["epigraph"] = {"rewritten": list(self.rewritten), "note": (
            "these client losses were solved in epigraph form (a private slack per row, held by "
            "its client, and two inequalities per row); the certificate is that form's")}
        # a verdict's slack rows are the loss they rewrite, the slack's shortfall below its rows
        # in the loss's units (the rows were written ÷ their size)
        restate(info, {key: (self.rows[name][0], value * self.rows[name][1])
                       for key, value in (info.get("violated") or {}).items()
                       if (name := str(key).split(":")[0]) in self.rows})
        multipliers = {k: v for k, v in (result.multipliers or {}).items() if k not in self.names}
        return dataclasses.replace(result, values=values, objective=objective,
                                   max_violation=violation, multipliers=multipliers, info=info,
                                   problem=self.original)


def rewrite_for(problem, solver: Any) -> EpigraphModel | None:
    """The epigraph form of `problem` for `solver` (a backend instance): None when no client
    objective has such a loss; SmoothnessError, naming the term and the
    backends that take the rewritten form, when `solver` is none of them."""
    takes = getattr(solver, "solves_epigraph", False)     # (`backends.base.Backend`)
    # (a smooth term is passed over at once: ~37 µs a client of a smooth model, 10⁴ clients)
    found = [(block, found) for block in problem.clients if (found := client_losses(block))]
    if not found:
        return None
    if takes is not True:
        # (DALD takes both but runs the SVM, quantile and LAD forms to its iteration cap,
        # 1.7e-4 to 1.7e-3 from CVXPY's w: docs/BENCHMARKS.md, branch epigraph)
        block, losses = found[0]
        term = next(loss.written for _, _, ls in losses for loss in ls if loss is not None)
        raise SmoothnessError(
            f"client {block.name!r}: the loss {term} has neither a gradient nor a prox, and "
            f"backend {getattr(solver, 'name', None)!r} does not solve its epigraph form (a "
            "private slack t ≥ the loss's pieces per row, held by the client, and two inequalities per row); ProxAL "
            "('proxal'), cProx-AL ('cproxal') and backend='auto' do, and 'cvxpy' solves it "
            "centrally: prob.solve('proxal')")
    return _rewrite(problem, dict(found))


def solve_as_user(problem, solver: Any, **options: Any):
    """`solver.solve(problem, **options)` on the epigraph form where `problem` has one
    (`rewrite_for`), the result in the user's terms (`EpigraphModel.to_user`): `fm.verify`'s
    reference. (`Problem.solve` does the same around its own call, which the warnings of a run
    name as their place.)"""
    epigraph = rewrite_for(problem, solver)
    result = solver.solve(epigraph.problem if epigraph else problem, **options)
    return epigraph.to_user(result) if epigraph is not None else result


def _rewrite(problem, found: dict) -> EpigraphModel:
    """A Problem of the same blocks, names and data, with each found loss in epigraph form."""
    copy = type(problem)(name=problem.name)
    copy._constraint_names = dict(problem._constraint_names)
    shared_names = {v.name for v in problem.shared_variables()}
    slacks, losses_of, rewritten = [], {}, []
    for block in problem.blocks:
        target = copy.server if block is problem.server else \
            copy.add_client(block.name, getattr(block, "weight", None))
        target.terms, target.constraints = list(block.terms), list(block.constraints)
        target.data_items = list(block.data_items)
        target.private_variables = list(getattr(block, "private_variables", []))
        for index, terms, losses in found.get(block, []):
            kept = [t.expression() for t, loss in zip(terms, losses) if loss is None]
            for loss in (loss for loss in losses if loss is not None):
                t = _slack(target, loss.shape, shared_names)
                # its slope in the objective, for the equilibration (`scale_probe.epigraph_probe`)
                t.epigraph_slope = loss.coefficient * float(np.sum(np.broadcast_to(
                    loss.weights, loss.shape)))
                slacks.append(t)
                kept.append(_objective(loss, t))
                size = _size(loss.pieces)
                for j, piece in enumerate(loss.pieces):
                    piece = broadcast_to(piece, loss.shape) if piece.shape != loss.shape else piece
                    constraint = Inequality(*[multiply(1.0 / size, e) if size != 1.0 else e
                                              for e in (piece, t)],
                                            name=_fresh(copy, f"{block.name}.{t.name}[{j}]"))
                    constraint.owner = block.name
                    copy.claim_constraint_name(constraint.name, block.name)
                    target.constraints.append(constraint)
                    losses_of[constraint.name] = (f"{block.name} loss: {loss.written} (epigraph "
                                                  f"slack {block.name}.{t.name})", size)
                rows = int(np.prod(loss.shape, dtype=int))
                rewritten.append(f"client {block.name!r}: {loss.written} ({rows} row"
                                 f"{'' if rows == 1 else 's'}, slack {block.name}.{t.name})")
            target.terms[index] = kept[0] if len(kept) == 1 else add(*kept)
    copy.slacks = list(problem.slacks)
    return EpigraphModel(problem, copy, slacks, losses_of, rewritten)


def _slack(target, shape: tuple, shared_names: set[str]) -> Variable:
    """A new private variable of client `target`, named `epigraph<k>` (unused in the client
    and by every shared variable)."""
    taken = shared_names | {v.name for v in target.private_variables}
    k = sum(1 for name in taken if name.startswith("epigraph"))
    while f"epigraph{k}" in taken:
        k += 1
    return target.variable(shape, name=f"epigraph{k}")


def _size(pieces: list[Expression]) -> float:
    """The loss's largest row at the origin, max |a(0)| (1 when zero or not computable here:
    data on the nodes): its rows t ≥ a are written ÷ it, in units of the loss, so that their
    violation, which `backends.base.finish_result` reads against an absolute 1e-3 on the
    rewritten copy, is the same for the data in any units. (In the data's units the pinball
    ×1e3 ended "stalled" under cProx-AL, t below its loss by 7e-3 of a y ~ 1e4, where ×1
    converged at 9e-6: the same run, measured in other units.)"""
    try:
        with np.errstate(all="ignore"):
            size = max(float(np.max(np.abs(value_at(p, {})), initial=0.0)) for p in pieces)
    except (TypeError, ValueError, ArithmeticError, AttributeError):
        return 1.0
    return factor(size)


def _objective(loss: Loss, t: Variable) -> Expression:
    """c · Σ_e ω_e t_e."""
    weighted = t if np.ndim(loss.weights) == 0 and float(loss.weights) == 1.0 else \
        multiply(Constant(loss.weights), t)
    total = sum_(weighted) if t.shape != () else weighted
    return total if loss.coefficient == 1.0 else multiply(loss.coefficient, total)


def _fresh(problem, name: str) -> str:
    """`name`, or `name` with a counter when a constraint of the problem has it."""
    out, k = name, 1
    while out in problem._constraint_names:
        out, k = f"{name}#{k}", k + 1
    return out
