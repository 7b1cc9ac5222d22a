"""Compiler pass helper of the equilibration (`scaling`): how a variable held in a projected set
is scaled so that its set stays one a backend projects on exactly.

- bounds, halfspaces, polyhedra, affine subspaces stay such sets under any w = D v, D > 0 per
  entry (bounds ÷ D; (a∘D)·v ≤ b): their variables get column scales and δ as free ones;
- so do balls' variables: ‖D v‖₂ ≤ r is an ellipsoid, projected exactly (`projection.Ellipsoid`,
  the root of a secular equation), ‖D v‖∞ ≤ r the box |v| ≤ r/D, ‖D v‖₁ ≤ r a weighted ℓ1 ball
  (sort-based projection); where the column scales are one unit's (`ROUND_SPREAD`) they are
  dropped, D is one scalar δ and ‖δv‖ ≤ r the ball ‖v‖ ≤ r/δ, projected in closed form as before;
- balls and bounds are written anew in v (`written_in_v`), ‖e∘v‖ ≤ r/s (e = D/s, s = max D:
  e = 1, the plain ball, where D is one δ) and ±v ≤ ±u/D, so every row has v's size whether a
  backend projects on the set (`sets.simple_set` reads it) or keeps it in its augmented
  Lagrangian; halfspaces, polyhedra and subspaces get one r per row, each row in v of norm 1
  (`unit_row`: their projection does not see it);
- a variable in a nonsmooth constraint that is no such set keeps its units (δ = 1).

Before (main 7643bfc) every variable in a projected set kept δ = 1: a logistic loss with client
balls ‖w‖ ≤ 10^−k at features ×10^k stalled or ran to its cap at k = 6 under five backends, and
least squares with a box and columns in units 1e-4 … 1e5 ended stalled under every backend.
Until branch ellball a ball held its variable whole (one δ, no column scales): raw airfoil columns
(Hz to 2e4 beside a thickness of 3e-3) with an inactive ball ‖w‖ ≤ 1e6 (‖w*‖ = 111) ran ProxAL,
cProx-AL, DALD and FedADMM to their caps 0.66–1.0 off; without the ball all converged.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..atoms import Norm1, Norm2, NormInf, add, multiply, neg
from ..constraints import Constraint
from ..expression import Constant, Expression, Variable
from .scale_probe import factor
from .sets import AFFINE, scaled_shared, simple_set
from .terms import flatten

# sets that stay sets a backend projects on exactly under any w = D v, D > 0 per entry
BALLS = ("ball2", "ellipsoid", "ball1", "ballinf")
SCALABLE = ("upper", "lower", "halfspace", "polyhedron", "subspace") + BALLS
# A ball's variable keeps one δ (the round ball, in closed form) where its column scales are
# those of one unit: the bulk of them (10th … 90th percentile) spread by at most ROUND_SPREAD
# and any two by at most UNIT_SPREAD. On the unit-scale suite (bench_rounds, logistic-ball:
# scales 0.80 … 1.0) the ellipsoid changed ProxAL's iterates (32 → 35, 39 → 43 round trips);
# on MNIST 3v7 with client balls (pixels in one unit; rarely lit border pixels spread max/min
# 985, the bulk 16) it cost DALD 211 → 411 iterations, ProxAL 194 → 286 round trips, FedADMM
# 380 → 496. Raw airfoil columns (Hz beside metres) spread 2.5e5, the bulk 3.4e3.
ROUND_SPREAD = 100.0
UNIT_SPREAD = 1e4


def in_sets(problem) -> tuple[set[int], set[int], set[str], dict[str, tuple], dict[str, int], dict]:
    """(fixed, balls, kept, in_v, held, normals). fixed: the variables that keep their units,
    those in a nonsmooth constraint that is no set a backend projects on (`simple_set`; FedADMM
    projects affine sets too); balls: the variables a norm ball holds (`round_balls`); kept: the
    constraints that keep r = 1 (those, sets on fixed variables); in_v: the balls and bounds written anew in v (`set_form`, `written_in_v`), by name; held:
    the other sets' variables by constraint name (`unsized`); normals: an affine set's rows by
    name (`unit_row`). Every set of `SCALABLE` stays one under any D > 0 (u ÷ D; (a∘D)·v ≤ b; a
    ball an ellipsoid): their variables are scaled as free ones."""
    fixed: set[int] = set()
    found = {}
    for c in problem.constraints:
        term = found[c.name] = simple_set(c, affine=True)
        if (term is None and not c.expr.is_smooth()) or \
                (term is not None and term.kind not in SCALABLE):
            fixed.update(v.uid for v in c.expr.variables())
    balls, kept, in_v, held, normals = set(), set(), {}, {}, {}
    for c in problem.constraints:
        term = found[c.name]
        if term is None or term.variable.uid in fixed:
            kept.update([c.name] if not c.expr.is_smooth() or term is not None else [])
            continue
        held[c.name] = term.variable.uid
        if term.kind in BALLS:
            balls.add(term.variable.uid)
        form = set_form(c, term.variable)
        if form is not None:
            in_v[c.name] = form
        elif term.kind in AFFINE:    # a Parameter: its value now
            normals[c.name] = _rows(term.pieces)
    return fixed, balls - fixed, kept, in_v, held, normals


def round_balls(columns: dict[int, np.ndarray], balls: set[int]) -> None:
    """Drop the column scales (`scaling.column_scales`) of the variables a ball holds where they
    are one unit's (`ROUND_SPREAD`, `UNIT_SPREAD`): the ball stays round (‖δv‖ ≤ r)."""
    for uid in balls:
        d = columns.get(uid)
        if d is not None and np.percentile(d, 90) <= ROUND_SPREAD * np.percentile(d, 10) and \
                float(np.max(d)) <= UNIT_SPREAD * float(np.min(d)):
            columns.pop(uid)


def _rows(pieces) -> np.ndarray:
    """The rows (k, n) of an affine set's pieces: a halfspace's a, each of a polyhedron's, a
    subspace's A as written."""
    found = [p.current() for p in pieces]
    return np.vstack([np.atleast_2d(p.rows if hasattr(p, "rows") else p.a) for p in found])


def unit_row(a: np.ndarray, scale: np.ndarray, shape: tuple = ()) -> Any:
    """r_k = 1/‖a_k∘D‖₂ for each row a_k of a halfspace a·w ≤ b, a polyhedron or an affine
    subspace on w = D v: every row in v of norm 1 (one r for a halfspace and its contrary alike:
    DALD's stall rule read contradictory halfspaces "stalled" at r from `_row_scale`, which reads
    b). With r = 1 a row was the column scales' size: sum(w) ≥ 0 on house prices in dollars had
    ‖a∘D‖ = 2.7e4, so its AL term's curvature β·7e8 beside an objective's 1, and Newton
    backtracked from the kink to no step (ProxAL and cProx-AL "converged" 7 % off, issue 25); a
    subspace A w = b with A, b and the data ×1e-3 kept r = 1 until round 6 of the new-user probes
    (cProx-AL "infeasible", DALD "stalled" where ×1 converged). Per row, not one r for the set:
    with rows 1e6 apart in norm, one r left the small row 1e-6 in size beside the stop tolerance
    and ProxAL "converged" 18 % off it. A scalar where the rows are equal in size (`compact`),
    else shaped as the constraint's `shape` (its entries in C order, as the rows are)."""
    rows = np.atleast_2d(a)
    sizes = np.linalg.norm(rows * np.broadcast_to(np.ravel(scale), rows.shape[1:]), axis=1)
    r = np.array([factor(1.0 / float(size)) for size in sizes])
    if r.size != int(np.prod(shape)):     # (rows not one per entry: the largest of norm 1)
        return factor(1.0 / float(np.max(sizes)))
    return compact(r.reshape(shape)) if r.size > 1 else float(r[0])


def normalized_rows(x):
    """`x` (dense or scipy.sparse) with each nonzero row divided by its norm: an affine set's
    rows as `unit_row` makes them, for `scaling.column_scales`."""
    sparse = hasattr(x, "multiply")
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel()) if sparse else np.linalg.norm(x, axis=1)
    inverse = 1.0 / np.where(norms > 0, norms, 1.0)
    return x.multiply(inverse[:, None]).tocsr() if sparse else x * inverse[:, None]


def column_squares(x) -> np.ndarray:
    """Σ_i x_ij² per column j (dense or scipy.sparse)."""
    return np.asarray(x.multiply(x).sum(axis=0)).ravel() if hasattr(x, "multiply") \
        else np.einsum("ij,ij->j", x, x)


def unsized(fixed: set[int], kept: set[str], in_v: dict, held: dict[str, int],
            sized: set[int]) -> set[int]:
    """The variables of `held` (set constraint → its variable) that the probe did not size
    (`sized`): they keep their units, and their sets r = 1, as before branch setscale (`fixed`,
    `kept`, `in_v` updated). Σ‖Xᵢw‖² with w ≥ −1 has no gradient at the origin: δ = σ = 1,
    only column scales ≈ 1, and CVXPY, no longer solving the model as written, stopped at
    f = 1e-12 (f* = 0) with the data ×1e-6. Returns the variables that lose column scales."""
    out = {uid for uid in held.values() if uid not in sized}
    for name, uid in held.items():
        if uid in out:
            kept.add(name)
            in_v.pop(name, None)
    fixed |= out
    return out


def set_form(constraint: Constraint, var: Variable) -> tuple | None:
    """(c, d, atom, offset terms) when `constraint` is c·norm(d·x) + offset ≤ 0 or a bound
    c·(d∘x) + offset ≤ 0 on x = `var` (c ≠ 0 a number, d > 0 constants), else None (a squared
    norm, a halfspace: scaled as any smooth constraint)."""
    terms = flatten(constraint.expr)
    moving = [t for t in terms if not t.atom.is_constant()]
    if len(moving) != 1 or not isinstance(moving[0].coefficient, float) or \
            moving[0].coefficient == 0:
        return None
    atom = moving[0].atom
    inner = atom.args[0] if isinstance(atom, (Norm1, Norm2, NormInf)) else atom
    found = scaled_shared(inner)
    if found is None or found[0] is not var:
        return None
    return moving[0].coefficient, found[1], atom, [t for t in terms if t is not moving[0]]


def written_in_v(c: float, d: np.ndarray, atom: Expression, offset: list, twin: Variable,
                 scale: np.ndarray) -> tuple[Expression, Any]:
    """(the expression, r): a set c·norm(d·w) + offset ≤ 0 or c·(d∘w) + offset ≤ 0 with w = D v
    is s·(norm(e∘v) + offset/s), s = max |c|·d∘D, e = |c|·d∘D/s (e = 1 where D is one scalar δ:
    the ball as before, bit for bit), or s∘(±v + offset/s), s = |c|·d∘D: written as
    norm(e∘v) + offset/s (±v + offset/s), r = 1/s. Each row then has the size of v
    (bounds in the scaled rows r·(D∘v − u) were 1e-9 apart with columns in units 1e-4 … 1e5,
    and cProx-AL's penalty never enforced the small ones), and a norm stays on the variable:
    `reformulate` makes ‖v‖ ≤ ρ smooth and drops a factor outside the norm, so with δ inside
    it, (‖δv‖² − r²)/2r, DALD's clients saw a constraint ∝ 10^−k at data ×10^k."""
    norm = isinstance(atom, (Norm1, Norm2, NormInf))
    size = np.abs(c) * d * scale
    if norm:     # one r for the norm; its columns' spread stays inside it, e (max e = 1)
        top = float(np.max(size))
        r, e = factor(1.0 / top), compact(size / top)
        head = atom.with_args(twin if np.ndim(e) == 0 else multiply(Constant(e), twin))
    else:
        r = 1.0 / size if np.ndim(size) else factor(1.0 / float(size))
        r = compact(r) if np.ndim(r) else r
        head = twin if c > 0 else neg(twin)
    if not offset:
        return head, r
    return add(head, multiply(Constant(r), add(*[t.expression() for t in offset]))), r


def compact(d: np.ndarray) -> np.ndarray | float:
    """`d` as one float when its entries are all equal (one Constant leaf, a scalar factor)."""
    flat = np.ravel(d)
    return float(flat[0]) if flat.size and np.all(flat == flat[0]) else d
