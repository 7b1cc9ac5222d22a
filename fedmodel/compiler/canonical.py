"""Compiler pass: canonical terms. Every objective (client or server) and every inequality is
flattened into a sum `Σ_k c_k · atom_k` before it is classified, so how a user groups terms
does not matter: `minimize(f + g)` ≡ `minimize(f); minimize(g)` ≡ `minimize(g + f)` ≡
`minimize(2 * (f / 2 + g / 2))`.

`flatten` expands sums, differences, negation and scalar multiples/divisions by constants or
Parameters, nested at any depth. `classify_objective` sorts the flat terms into smooth ones,
prox-able ones (`λ·norm1(w)` of a shared variable; the weights of several such terms on one
variable add; `λ·norm2(w − a)`, `λ·norm2(w)` and `λ·norm1(w − a)` with a constant, by the
shifted prox of `norm_terms`) and those with neither a prox nor a gradient. Constants stay in the
smooth part: they do not move the argmin, but they are in the reported objective.

`canonical_constraints` does the same for constraints: simple sets on a shared variable are
projected (`compiler.sets`) where the caller projects, and nonsmooth convex inequalities with a
smooth equivalent are rewritten (`c·norm2(a) <= c·r` → `(‖a‖² − r²)/(2r) <= 0`, whose
multiplier at the solution is c times the original's (equal for c = 1); `abs(a) <= t`, `norm_inf(a) <= t` → `±a <= t`;
`pos(a) <= t` → `a <= t, 0 <= t`). A rewritten constraint split in two keeps its name with
`[+]`/`[-]`/`[0]` appended (`split_names`), for its multipliers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..atoms import (Abs, Multiply, Neg, Norm1, Norm2, NormInf, Pos, add, broadcast_to, multiply,
                     neg, sum_squares)
from ..constraints import Constraint, Equality, Inequality
from ..expression import Constant, Expression, Variable
from .intersections import check_boxes_meet, check_sets_meet, merge_sets
from .sets import ProxTerm, coefficient_value, norm1_term, simple_set

from .terms import Coefficient, Term, _scaled, _times, flatten  # noqa: F401 (re-exported)
from .norm_terms import norm1_part, norm_term, shifted_norm


def _norm1_of(term: Term) -> tuple[Variable, Coefficient] | None:
    """(w, λ) when `term` is λ·norm1(c·w) with w a shared variable (λ|c| returned)."""
    atom = term.atom
    if isinstance(atom, Abs) and atom.shape == ():
        atom = Norm1(atom.args[0])       # |b| of a scalar b (CVXPY's cp.abs(b)) is norm1(b)
    if not isinstance(atom, Norm1):
        return None
    inner, coefficient = atom.args[0], term.coefficient
    scaled = _scaled(inner) if isinstance(inner, Multiply) else None
    if scaled is not None and not isinstance(scaled[0], Expression):   # |c| of a number only
        inner, coefficient = scaled[1], _times(coefficient, abs(scaled[0]))
    if isinstance(inner, Neg):
        inner = inner.args[0]
    if isinstance(inner, Variable) and inner.owner is None:
        return inner, coefficient
    return None


@dataclass
class Classified:
    """An objective in canonical form, sorted by how a backend handles each term."""
    smooth: list[Expression] = field(default_factory=list)     # differentiable (and constants)
    prox: list[ProxTerm] = field(default_factory=list)         # λ·norm1(w), weights combined;
    # with λ·norm2(c·w + b), λ·norm1(c·w + b) (b ≠ 0): one term a variable (`norm_terms`)
    unsupported: list[Expression] = field(default_factory=list)  # no prox and no gradient

    @property
    def objective(self) -> Expression:
        """The smooth part as one expression (0 when empty)."""
        return add(*self.smooth) if self.smooth else Constant(0.0)


def classify_objective(terms: list[Expression]) -> Classified:
    """Flatten every objective term and classify the pieces (see the module docstring)."""
    out = Classified()
    weights: dict[int, tuple[Variable, Coefficient]] = {}
    constants: list[Expression] = []
    norms: dict[int, tuple[Variable, list]] = {}     # λ‖w − a‖ terms, by variable
    for term in (t for expr in terms for t in flatten(expr)):
        norm1 = _norm1_of(term)
        if norm1 is not None and coefficient_value(norm1[1]) >= 0:
            var, weight = norm1
            old = weights.get(var.uid)
            weights[var.uid] = (var, weight if old is None else _plus(old[1], weight))
        elif (shifted := shifted_norm(term)) is not None:
            norms.setdefault(shifted[0].uid, (shifted[0], []))[1].append(shifted[1])
        elif term.atom.is_constant():
            constants.append(term.expression())
        elif term.atom.is_smooth():
            out.smooth.append(term.expression())
        else:
            expr = term.expression()
            out.unsupported.append(expr)
            out.smooth.append(expr)          # kept in the objective, so a backend can name it
    out.smooth.extend(constants)
    out.prox = [norm1_term(var, weight) for var, weight in weights.values() if var.uid not in norms]
    out.prox += [norm_term(var, found + [norm1_part(var, weights[uid][1])] if uid in weights else found)
                 for uid, (var, found) in norms.items()]
    return out


def _plus(a: Coefficient, b: Coefficient) -> Coefficient:
    if isinstance(a, float) and isinstance(b, float):
        return a + b
    return add(a, b)


def how_to_fix(expr: Expression) -> str:
    """What would make a term with neither a prox nor a gradient work."""
    return (f"{expr} has neither a gradient nor a prox that fedmodel knows; write it with smooth "
            "atoms (e.g. sum_squares, huber, logistic), as λ·norm1(w), λ·norm1(w − a) or "
            "λ·norm2(w − a) of a shared variable w (λ ≥ 0, a constant: handled by its prox), or "
            "as a constraint (e.g. norm2(a) <= r, abs(a) <= t), which is projected or reformulated")


# ---- constraints -------------------------------------------------------------------------
SPLIT = {Abs: ("[+]", "[-]"), NormInf: ("[+]", "[-]"), Pos: ("[+]", "[0]")}


def split_names(constraint: Constraint) -> tuple[str, ...]:
    """Names of the pieces a constraint is rewritten into (empty when it is not split)."""
    found = _nonsmooth_core(constraint)
    return tuple(constraint.name + s for s in SPLIT.get(type(found[0]), ())) if found else ()


def _nonsmooth_core(constraint: Constraint):
    """(atom, rest) when `constraint.expr` = c·atom(a) + rest with c > 0 a constant, atom one
    of Norm2/Abs/NormInf/Pos and rest smooth; `rest` is divided by c."""
    if not isinstance(constraint, Inequality) or constraint.expr.is_smooth():
        return None
    terms = flatten(constraint.expr)
    cores = [t for t in terms if isinstance(t.atom, (Norm2, Abs, NormInf, Pos))
             and not t.atom.is_smooth()]
    if len(cores) != 1 or not isinstance(cores[0].coefficient, float) or cores[0].coefficient <= 0:
        return None
    core = cores[0]
    others = [t.expression() for t in terms if t is not core]
    rest = multiply(1.0 / core.coefficient, add(*others)) if others else Constant(0.0)
    if not rest.is_smooth() or not core.atom.args[0].is_smooth():
        return None
    return core.atom, rest


def _inequality(expr: Expression, name: str, original: Constraint) -> Inequality:
    piece = Inequality(expr, 0.0, name=name)
    piece.expr, piece.owner = expr, original.owner   # exactly `expr`, without a `− 0` node
    return piece


def reformulate(constraint: Constraint) -> list[Constraint] | None:
    """Smooth constraints equivalent to a nonsmooth convex `constraint`, else None."""
    found = _nonsmooth_core(constraint)
    if found is None:
        return None
    atom, rest = found
    a, name = atom.args[0], constraint.name
    if isinstance(atom, Norm2):
        radius = -np.asarray(rest.value, float) if rest.is_constant() and not rest.parameters() \
            else None
        if radius is None or radius.size != 1 or not radius.item() >= 0:
            return None
        if radius.item() == 0:     # ‖a‖ ≤ 0 is a = 0, an equality (whose AL term is smooth)
            piece = Equality(a, 0.0, name=name)
            piece.expr, piece.owner = a, constraint.owner
            return [piece]
        r = float(radius.item())   # (‖a‖² − r²)/(2r): its gradient at ‖a‖ = r is that of ‖a‖
        expr = multiply(0.5 / r, add(sum_squares(a), Constant(-r * r)))
        return [_inequality(expr, name, constraint)]
    plus, second = (constraint.name + s for s in SPLIT[type(atom)])
    shape = constraint.shape if not isinstance(atom, NormInf) else a.shape
    broad = lambda e: broadcast_to(e, tuple(np.broadcast_shapes(e.shape, shape)))  # noqa: E731
    upper = broad(add(a, rest))
    lower = broad(add(neg(a), rest)) if not isinstance(atom, Pos) else broad(rest)
    return [_inequality(upper, plus, constraint), _inequality(lower, second, constraint)]


@dataclass
class CanonicalConstraints:
    """Constraints sorted by how a backend handles them."""
    smooth: list[Constraint] = field(default_factory=list)   # by the augmented Lagrangian
    sets: list[ProxTerm] = field(default_factory=list)       # by projection
    unsupported: list[Constraint] = field(default_factory=list)


PROJECT_ALL = "all"   # `project` value: affine sets too (halfspaces, hyperplanes; FedADMM, DP-ADMM)


def canonical_constraints(constraints: list[Constraint], project: bool | str) -> CanonicalConstraints:
    """Project simple sets on a shared variable when `project` (balls however written, bounds;
    with `project="all"` (`PROJECT_ALL`) also halfspaces, small polyhedra and affine subspaces
    with constant coefficients) — and nonsmooth ones with no smooth form in any case (a ‖·‖₁
    ball) —, rewrite nonsmooth ones with a smooth equivalent, keep the rest for the augmented
    Lagrangian. Several sets on one variable become one set, their intersection (`merge_sets`)."""
    out = CanonicalConstraints()
    for constraint in constraints:
        as_set = simple_set(constraint, affine=project == PROJECT_ALL)
        smooth = constraint.expr.is_smooth()
        if as_set is not None and project:
            out.sets.append(as_set)
            continue
        if smooth or isinstance(constraint, Equality):
            out.smooth.append(constraint)
            if not smooth:
                out.unsupported.append(constraint)
            continue
        pieces = reformulate(constraint)
        if pieces is not None:
            out.smooth.extend(pieces)
        elif as_set is not None:
            out.sets.append(as_set)
        else:
            out.smooth.append(constraint)
            out.unsupported.append(constraint)
    check_boxes_meet(out.sets)
    out.sets = merge_sets(out.sets)
    check_sets_meet(out.sets)
    return out


def needs_projection(constraint: Constraint) -> bool:
    """A nonsmooth constraint with no smooth form but a projection (a ‖·‖₁ ball on a shared
    variable): the compiler places it where projections are applied (the server)."""
    return not constraint.expr.is_smooth() and simple_set(constraint) is not None \
        and reformulate(constraint) is None


def constraint_fix(constraint: Constraint) -> str:
    """What would make a nonsmooth constraint work."""
    return (f"constraint {constraint.name!r}: {constraint!r} is nonsmooth and has no projection "
            "or smooth equivalent fedmodel knows; supported: norm2(a) <= r, abs(a) <= t, "
            "norm_inf(a) <= t, pos(a) <= t (a smooth, r ≥ 0 a constant), a norm2/norm1/norm_inf ball or "
            "bounds on a shared variable (radius and bounds constants or Parameters), or any "
            "smooth g(x) <= 0")
