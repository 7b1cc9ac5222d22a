"""Compiler pass: equilibration, so that the units of the data do not change the answer.

A model whose data are in other units (×10⁻³, ×10³) or whose columns differ by orders of
magnitude (age in years beside a weight of 10⁶) is the same model, but absolute tolerances,
penalties and step sizes see a different one. As OSQP, SCS and Clarabel do, the backends solve
an equilibrated copy and results come back in the user's units. The copy is an exact change of
variables and a positive rescaling of the objective and of each constraint:

    minimize σ·F(D v)   subject to   r_j · c_j(D v) ≤ 0 (= 0),        w = D v

- column scales: a variable read as `X @ w` by data matrices gets one factor per column (the
  geometric mean of those columns' root-mean-square sizes over column j's, over every client
  holding such a matrix), unless it is in a prox term (sets stay sets: `set_scaling`);
- variable scale δ and objective scale σ: from a probe of the smooth objective at the origin:
  each probed client reports two scalars per variable, the size of its gradient g_i and its
  curvature along it g_iᵀH_i g_i; δ is the length of a Newton step along the gradient per
  entry, σ makes the curvature along it one. A ball ‖Dv‖ ≤ r is an ellipsoid (the ball ‖v‖ ≤ r/δ
  where D is one δ), balls and bounds are written in v (`set_scaling`); only a variable in a
  nonsmooth constraint that is no projected set keeps δ = 1 (and r = 1); a variable the smooth
  probe cannot size but shifted norm terms λ‖w − a‖ read takes δ from their anchors and σ from
  their weights (`scale_probe.norm_probe`); one read only by epigraph rows (`epigraph`: the
  hinge's w beside a ridge) takes δ from the rows, each slack t the rows' size, σ = 1/(the
  losses' slope) (`scale_probe.epigraph_probe`);
- row scales r_j: one per constraint, from its size at the origin and at the point v = 1.

The factors are not rounded (to powers of two, say): for data in other units they are the same
up to rounding errors, and so is the equilibrated model, so every backend runs the same
iterations to the same answer (a rounded factor would jump between neighbouring powers at some
units). Presets that reproduce a paper, and runs whose privacy accounting would not cover a
data-dependent scaling, solve the model as written (`Backend.scaling`, `solve(scaling=False)`).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..atoms import Multiply, multiply
from ..constraints import Constraint
from ..errors import FedModelError
from ..expression import Constant, Expression, Leaf, Variable
from .canonical import SPLIT, canonical_constraints, classify_objective
from .scale_probe import (data_reads, epigraph_probe, factor, norm_probe, objective_scale, probe,
                          slack_sizes, value_at)
from .set_scaling import (column_squares, compact, in_sets, normalized_rows, round_balls, unit_row,
                          unsized, written_in_v)

PIECES = {s for pair in SPLIT.values() for s in pair}   # suffixes of a split constraint's pieces


@dataclass
class Scaling:
    """The factors of one equilibration (see the module docstring), by original variable uid and
    constraint name."""
    objective: float = 1.0
    variables: dict[int, np.ndarray] = field(default_factory=dict)   # D, broadcast to the shape
    constraints: dict[str, Any] = field(default_factory=dict)   # r_j (per row for bounds)

    def is_identity(self) -> bool:
        return self.objective == 1.0 and all(np.all(d == 1.0) for d in self.variables.values()) \
            and all(np.all(r == 1.0) for r in self.constraints.values())

    def summary(self) -> dict[str, Any]:
        """For `result.info["scaling"]`: the objective's factor and each variable's range."""
        return {"objective": self.objective,
                "variables": {uid: (float(np.min(d)), float(np.max(d)))
                              for uid, d in self.variables.items()},
                "constraints": {name: r if np.ndim(r) == 0 else (float(np.min(r)), float(np.max(r)))
                                for name, r in self.constraints.items()}}


class ScaledModel:
    """The equilibrated copy of a problem and the maps between its units and the user's."""

    def __init__(self, original, problem, scaling: Scaling, pairs: list[tuple[Variable, Variable]]):
        self.original, self.problem, self.scaling = original, problem, scaling
        self.pairs = pairs    # (original variable, its scaled twin)

    def release(self) -> None:
        """Break the copy's block ↔ problem references once its run is over, so the copy (its
        expressions, at 10⁵ clients millions of objects) is freed when dropped, not left to the
        cyclic collector."""
        for block in self.problem.blocks:
            block.problem = None

    # ---- user units → equilibrated units -----------------------------------------------------
    def shared_to_scaled(self, flat: np.ndarray | None) -> np.ndarray | None:
        """A flat point of the shared variables (e.g. a backend's `w0`) in equilibrated units."""
        if flat is None:
            return None
        flat = np.asarray(flat, dtype=float).ravel()
        scales = self.shared_scales()
        return flat / scales if scales.size == flat.size else flat

    def shared_to_user(self, flat: np.ndarray) -> np.ndarray:
        """A flat point of the shared variables (a client's copy, say) in the user's units."""
        flat = np.asarray(flat, dtype=float)
        scales = self.shared_scales()
        return flat * scales if scales.size == flat.size else flat

    def shared_scales(self) -> np.ndarray:
        """D of the shared variables, flattened in the order backends pack them."""
        return np.concatenate([np.ravel(np.broadcast_to(self.scaling.variables[o.uid], o.shape))
                               for o in self.original.shared_variables()] or [np.zeros(0)])

    # ---- equilibrated units → user units -----------------------------------------------------
    def values_to_user(self, values: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        out = {}
        for original, scaled in self.pairs:
            if scaled.uid in values:
                out[original.uid] = np.asarray(values[scaled.uid], float) * \
                    self.scaling.variables[original.uid]
        return out

    def multipliers_to_user(self, multipliers: dict[str, Any]) -> dict[str, Any]:
        """μ_j of the user's model: the Lagrangian σF + Σ μ̃_j r_j c_j over σ, so μ_j = μ̃_j r_j / σ
        (a constraint the compiler split into pieces, `name[+]`, has its parent's r_j)."""
        out = {}
        for name, mu in multipliers.items():
            r = self._row(name)
            out[name] = np.asarray(mu, float) * (r / self.scaling.objective) \
                if mu is not None else mu
        return out

    def _row(self, name: str) -> Any:
        """r_j of constraint `name` (a piece `name[+]` has its parent's)."""
        parent = name[:-3] if name[-3:] in PIECES and name not in self.scaling.constraints else name
        return self.scaling.constraints.get(parent, 1.0)

    def violations_to_user(self, info: dict) -> None:
        """info["violated"] (a verdict's constraints, "name: form" → violation r_j·c_j on the
        copy) in the user's units, c_j, and so the messages that quote them ("name: form (by
        v)"); rows scaled per entry (bounds, affine sets: `set_scaling.unit_row`) are left to
        `verdicts.restate_violated`, which measures each at the returned point on the model."""
        violated = info.get("violated")
        if not isinstance(violated, dict):
            return
        for key, value in list(violated.items()):
            r = self._row(str(key).split(":")[0])
            if np.ndim(r) or not r > 0 or r == 1.0:
                continue
            violated[key] = float(value) / r
            old, new = f"{key} (by {value:.3g})", f"{key} (by {violated[key]:.3g})"
            for key_of_text, text in info.items():
                if isinstance(text, str):
                    info[key_of_text] = text.replace(old, new)

    def record_to_user(self, record: dict) -> dict:
        """A history record with its objective in the user's units (residuals stay in the
        equilibrated ones: they are relative measures of the run)."""
        if "objective" in record:
            record = dict(record)
            try:
                record["objective"] = float(record["objective"]) / self.scaling.objective
            except (TypeError, ValueError):
                pass
        return record

    def outcome_to_user(self, outcome: dict) -> dict:
        """A backend's outcome on the copy as one on the user's model: values, multipliers and
        history in the user's units; the certificate is recomputed on the user's model."""
        outcome = dict(outcome)
        outcome["values"] = self.values_to_user(outcome.get("values") or {})
        outcome["multipliers"] = self.multipliers_to_user(outcome.get("multipliers") or {})
        outcome["history"] = [self.record_to_user(r) for r in outcome.get("history") or []]
        outcome["certificate"] = None
        info = dict(outcome.get("info") or {})
        if isinstance(info.get("client_values"), dict):    # each client's copy of the shared point
            info["client_values"] = {k: self.shared_to_user(v) for k, v in info["client_values"].items()}
        if isinstance(info.get("violated"), dict):
            info["violated"] = dict(info["violated"])
            self.violations_to_user(info)
        info["scaling"] = self.scaling.summary()
        outcome["info"] = info
        return outcome


def equilibrate(problem) -> ScaledModel | None:
    """The equilibrated copy of `problem`, or None when there is nothing to scale (every factor
    is one) or the data are not held here (loaders: the nodes hold them)."""
    if problem.remote_data() or not problem.is_convex() or not _supported(problem):
        return None
    variables = problem.variables()
    fixed, balls, kept, in_v, held, normals = in_sets(problem)
    columns = column_scales(problem, variables, fixed | _in_prox_terms(problem),
                            frozenset(normals) - kept)
    round_balls(columns, balls)
    lengths, curvature = probe(problem, variables, columns)
    anchors, slopes = norm_probe(problem)
    sized = {u for u in lengths if lengths[u]} | {u for u in anchors if anchors[u]}
    by_rows, slacks = epigraph_probe(problem, columns, sized | fixed)
    for uid in unsized(fixed, kept, in_v, held, sized | set(by_rows) | set(slacks)):
        columns.pop(uid, None)
    scaling = Scaling()
    deltas = {}
    for var in variables:
        delta = 1.0
        if var.uid not in fixed and lengths.get(var.uid):
            delta = factor(lengths[var.uid] / math.sqrt(var.size))
        elif var.uid not in fixed and anchors.get(var.uid):     # sized by its norms' anchors
            delta = factor(anchors[var.uid])
        elif var.uid not in fixed and by_rows.get(var.uid):     # sized by its epigraph rows
            delta = by_rows[var.uid]
        deltas[var.uid] = delta
        scaling.variables[var.uid] = columns.get(var.uid, np.ones(var.shape)) * delta
    # each slack t of one size with its rows a(Dv): the epigraph's (`scale_probe.epigraph_probe`)
    # and the split's (`split`: g_i(w) ≤ s_i of a coupling constraint; at δ = 1 with the data
    # ×1e-3 its rows were 1e-5 in size beside a stop tolerance 1e-4, and ProxAL "converged" 38 %
    # off on a budget of group losses over one-hot data)
    split = {v.uid for v in variables if getattr(v, "is_slack", False) and v.uid not in fixed | sized}
    linear = 0.0
    if slacks or split:
        sizes = slack_sizes(problem, {u: d for u, d in scaling.variables.items()
                                      if u not in slacks and u not in split}, set(slacks) | split)
        for var in (v for v in variables if v.uid in set(slacks) | split and v.uid not in fixed):
            deltas[var.uid] = sizes.get(var.uid, 1.0)
            scaling.variables[var.uid] = np.full(var.shape, deltas[var.uid])
            linear += slacks.get(var.uid, 0.0) * deltas[var.uid]
    scaling.objective = objective_scale(variables, deltas, curvature, slopes, linear)
    pairs = [(v, v if np.all(scaling.variables[v.uid] == 1.0) else _twin(v)) for v in variables]
    rebuild = Rebuild({o.uid: multiply(Constant(compact(scaling.variables[o.uid])), s)
                       for o, s in pairs if s is not o})
    rewritten, twins = {}, {o.uid: t for o, t in pairs}
    for constraint in problem.constraints:
        name = constraint.name
        if name in in_v:     # balls and bounds: written in v (`set_scaling.in_v`)
            var = next(iter(constraint.expr.variables()))
            rewritten[name], scaling.constraints[name] = written_in_v(
                *in_v[name], twins[var.uid], scaling.variables[var.uid])
        elif name in normals and name not in kept:      # an affine set: unit rows in v
            scaling.constraints[name] = unit_row(normals[name], scaling.variables[held[name]],
                                                 constraint.expr.shape)
        else:
            scaling.constraints[name] = 1.0 if name in kept else \
                _row_scale(constraint.expr, scaling.variables)
    if scaling.is_identity():
        return None
    scaled = _copy_problem(problem, pairs, rebuild, scaling, rewritten)
    return ScaledModel(problem, scaled, scaling, pairs)


def _supported(problem) -> bool:
    """Every term has a gradient or a prox and every constraint a smooth form or a projection.
    A model that fails this is refused by the backend; unscaled, its error shows the user's
    expressions, not their equilibrated copies. (Nonconvex models are not equilibrated either:
    CVXPY refuses them naming their terms, and a probe at the origin says little about them.)"""
    try:
        return not classify_objective(problem.objective_terms).unsupported and \
            not canonical_constraints(problem.constraints, project=True).unsupported
    except FedModelError:
        return False


# ---- which variables keep their units ---------------------------------------------------------
def _in_prox_terms(problem) -> set[int]:
    return {t.variable.uid for t in classify_objective(problem.objective_terms).prox}


# ---- column scales -----------------------------------------------------------------------------
def column_scales(problem, variables: list[Variable], excluded: set[int],
                  unit_rows: frozenset[str] = frozenset()) -> dict[int, np.ndarray]:
    """Per entry j of each variable read through data (`scale_probe.data_reads`): gm / rms_j,
    rms_j the rms size of the columns reading j over the rows of every such matrix, gm their
    geometric mean (the probe sets the overall scale). Rows of `unit_rows` constraints (affine
    sets: `set_scaling.unit_row`) count at the other rows' rms norm: a row 1e3 in norm beside
    data ×1e-3 set w's scales 1e5 apart (answer ~1; every backend but CVXPY 0.9 off)."""
    sums, rows = {}, {}                   # uid → per entry: Σ column squares, the rows reading it
    sizes: dict[int, np.ndarray] = {}     # (Σ‖row‖², rows): the rows' rms norm, for `unit_rows`
    affine: dict[int, list] = {}          # uid → (w, entries, unit_rows matrix normalized)
    by_uid = {v.uid: v for v in variables}
    def count(var: Variable, entries: np.ndarray, x) -> None:
        squares, uid = column_squares(x), var.uid
        np.add.at(sums.setdefault(uid, np.zeros(var.size)), entries, squares)
        np.add.at(rows.setdefault(uid, np.zeros(var.size)), entries, x.shape[0])
        sizes[uid] = sizes.get(uid, 0.0) + np.array([np.sum(squares), x.shape[0]])
    for name, expr in [(None, t) for t in problem.objective_terms] + \
            [(c.name, c.expr) for c in problem.constraints]:
        for var, entries, x in data_reads(expr):
            if var.uid in excluded or var.uid not in by_uid:
                continue
            if name in unit_rows:
                affine.setdefault(var.uid, []).append((var, entries, normalized_rows(x)))
            else:
                count(var, entries, x)
    for uid, matrices in affine.items():
        row_size = sizes[uid][0] / sizes[uid][1] if uid in sizes else 1.0
        for var, entries, x in matrices:
            count(var, entries, np.sqrt(row_size) * x)
    out = {}
    for uid, total in sums.items():
        rms = np.sqrt(total / np.where(rows[uid] > 0, rows[uid], 1.0))
        if not np.any(rms > 0):
            continue
        gm = float(np.exp(np.mean(np.log(rms[rms > 0]))))
        # an entry no matrix reads (the intercept of X @ w[:d] + w[d]) is a column of ones: it
        # took 1, not gm, and ran FedADMM 3.7× the unit-scaled twin's rounds (newuser9)
        ratio = np.where(rms > 0, gm / np.where(rms > 0, rms, 1.0), np.where(rows[uid] > 0, 1.0, gm))
        d = np.array([factor(r) for r in ratio])
        if np.any(d != 1.0):
            out[uid] = d.reshape(by_uid[uid].shape)
    return out


def _row_scale(expr: Expression, scales: dict[int, np.ndarray]) -> float:
    """r_j = 1 / max(|c(0)|, |c(D·1) − c(0)|) (∞-norms over the rows): the size of the
    constraint at the origin and its change over one unit of every equilibrated variable."""
    try:
        with np.errstate(all="ignore"):
            at_zero = np.asarray(value_at(expr, {}), float)
            at_one = np.asarray(value_at(expr, scales), float)
    except ArithmeticError:
        return 1.0
    size = max(float(np.max(np.abs(at_zero), initial=0.0)),
               float(np.max(np.abs(at_one - at_zero), initial=0.0)))
    return factor(1.0 / size) if np.isfinite(size) and size > 0 else 1.0


# ---- the copy -----------------------------------------------------------------------------------
def _twin(var: Variable) -> Variable:
    """A new variable like `var` (name, owner, slack mark), with its own uid."""
    twin = Variable(var.shape, name=var.name)
    twin.__dict__.update({k: v for k, v in var.__dict__.items() if k not in ("uid", "_value")})
    return twin


class Rebuild:
    """The DAG of an expression with variables replaced (memoized across calls, so shared
    subexpressions stay shared)."""

    def __init__(self, substitution: dict[int, Expression]):
        self.substitution = substitution
        self.memo: dict[int, Expression] = {}

    def __call__(self, expr: Expression) -> Expression:
        memo = self.memo
        stack: list[tuple[Expression, bool]] = [(expr, False)]
        while stack:     # postorder, not entering what an earlier call rebuilt already
            node, expanded = stack.pop()
            if id(node) in memo:
                continue
            if isinstance(node, Leaf):
                memo[id(node)] = self.substitution.get(node.uid, node) \
                    if isinstance(node, Variable) else node
            elif not expanded:
                stack.append((node, True))
                stack.extend((a, False) for a in node.args if id(a) not in memo)
            else:
                args = [memo[id(a)] for a in node.args]
                memo[id(node)] = node if all(a is b for a, b in zip(args, node.args)) \
                    else node.with_args(*args)
        return memo[id(expr)]


def _scaled(weight: Constant, expr: Expression) -> Expression:
    """weight · expr (the node itself: `multiply` would fold and copy constants, per term)."""
    return expr if np.ndim(weight.value) == 0 and weight.value == 1.0 else Multiply(weight, expr)


def _leaf(name: str, r: Any) -> Any:
    """The key of constraint `name`'s factor leaf: the value of a scalar r (shared by every
    constraint with it), the name for per-row factors (`unit_row`)."""
    return float(r) if np.ndim(r) == 0 else name


def _constraint(original: Constraint, expr: Expression) -> Constraint:
    """`original` with `expr` as its canonical expression (shown as the user wrote it)."""
    new = copy.copy(original)
    new.expr = expr
    return new


def _copy_problem(problem, pairs: list[tuple[Variable, Variable]], rebuild: Rebuild,
                  scaling: Scaling, rewritten: dict[str, Expression]):
    """A Problem of the same blocks, names and data, over the scaled twins."""
    twins = {o.uid: s for o, s in pairs}
    scaled = type(problem)(name=problem.name)
    scaled._constraint_names = dict(problem._constraint_names)
    sigma = Constant(scaling.objective)
    rows = {_leaf(name, r): Constant(r) for name, r in scaling.constraints.items()
            if name not in rewritten}     # one leaf per scalar factor
    for block in problem.blocks:
        target = scaled.server if block is problem.server else \
            scaled.add_client(block.name, getattr(block, "weight", None))
        target.terms = [_scaled(sigma, rebuild(t)) for t in block.terms]
        target.constraints = []
        for c in block.constraints:
            expr = rewritten[c.name] if c.name in rewritten else \
                _scaled(rows[_leaf(c.name, scaling.constraints[c.name])], rebuild(c.expr))
            target.constraints.append(c if expr is c.expr else _constraint(c, expr))
        target.data_items = list(block.data_items)
        target.private_variables = [twins.get(v.uid, v) for v in block.private_variables]
    scaled.slacks = [twins.get(v.uid, v) for v in problem.slacks]
    for original, twin in pairs:
        if twin is not original:
            twin.problem_id = scaled.uid
    return scaled
