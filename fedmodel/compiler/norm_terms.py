"""Compiler pass helper: norm terms with a closed-form prox beyond λ‖w‖₁ — λ·norm2(c·w + b)
and λ·norm1(c·w + b) of a shared variable w, with b a constant (numbers, data, Parameters).
Since λ‖c·w + b‖ = λ|c|·‖w − a‖ with a = −b/c, the prox is the norm's prox shifted by a:
prox_{tλ|c|‖· − a‖}(v) = a + prox_{tλ|c|‖·‖}(v − a) (block soft-thresholding for ‖·‖₂,
soft-thresholding for ‖·‖₁). A geometric median Σ_i ‖w − a_i‖₂ (one anchor a client) or a
robust fit Σ_i ‖w − a_i‖₁ is then a prox term of each client, as λ‖w‖₁ is.

Recognized here (`shifted_norm`), turned into `sets.ProxTerm`s of kind "norm2" or
"norm1-shift" (`norm_term`); the plain λ‖w‖₁ keeps kind "norm1" (`sets.norm1_term`), whose
weights the local solvers read directly. Several such terms on one variable (the whole model's
objective, as the KKT certificate reads it) are one term of kind "norm-sum" whose remainder is
exact (the kinks' subdifferentials add up to a box or a ball); its prox is not known, so a node
holding one is refused (`shifted_conflict`). The shift is read at each use, so a Parameter in b
may change between solves without a recompile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..atoms import Norm1, Norm2, add
from ..atoms.prox import soft_threshold
from ..errors import FedModelError
from ..expression import Expression, Variable
from .parameter_sets import coefficient_value
from .sets import ACTIVE, ProxTerm
from .terms import Term, _times, flatten

SHIFTED = ("norm2", "norm1-shift", "norm-sum")   # the kinds made here
# x within ACTIVE (`sets`: 1e-5, two orders below verify's 1e-3) of the sizes of x and the
# anchors reads as at a kink x = a, whatever the caller's `zero`; that is then the exact
# residual of a point so near. An ℓ1 median always lies on a kink and iterative runs end 1e-8–1e-6
# off it: at 1e-8 ProxAL's answer 1.4e-8 from CVXPY's, at 1e-6 DALD's 9e-7 from it (3.5e-6
# relative), read "not stationary" (a full λ charged).


@dataclass
class Norm:
    """One written term λ‖w − a‖_p (p = 1 or 2): λ and a read at their present values."""
    p: int
    lam: Callable[[], float]
    shift: Callable[[], np.ndarray]
    label: str


def _weight(weight: Any, label: str) -> Callable[[], float]:
    def lam() -> float:
        value = coefficient_value(weight)
        if not value >= 0:      # a Parameter set negative after compiling: no longer convex
            raise FedModelError(f"the weight of {label} is now {value:g}; it needs to be ≥ 0")
        return value
    return lam


def _shift(var: Variable, b: Expression | None) -> Callable[[], np.ndarray]:
    """a = −b (b already divided by c) at its present value, of `var`'s shape; computed once
    when b holds no Parameter."""
    zero = np.zeros(var.shape)
    if b is None:
        return lambda: zero
    cache: dict = {}

    def shift() -> np.ndarray:
        if "a" in cache:
            return cache["a"]
        value = b.value
        if value is None:
            raise FedModelError(f"{b} has no value; give its Parameters a value before solving")
        a = -np.broadcast_to(np.asarray(value, float), var.shape)
        if not b.parameters():
            cache["a"] = a
        return a
    return shift


def shifted_norm(term: Term) -> tuple[Variable, Norm] | None:
    """(w, the term) when `term` is λ·norm2(c·w + b) or λ·norm1(c·w + b) with w a shared
    variable of the argument's shape, c a nonzero number, b constant and λ ≥ 0 — not the plain
    λ‖c·w‖₁ (`canonical._norm1_of`); else None."""
    if type(term.atom) not in (Norm1, Norm2):
        return None
    inner = term.atom.args[0]
    parts = flatten(inner)
    moving = [t for t in parts if not t.atom.is_constant()]
    fixed = [t for t in parts if t.atom.is_constant()]
    if len(moving) != 1 or not isinstance(moving[0].coefficient, float) \
            or moving[0].coefficient == 0:
        return None
    var, c = moving[0].atom, moving[0].coefficient
    if not isinstance(var, Variable) or var.owner is not None or var.shape != inner.shape \
            or (isinstance(term.atom, Norm1) and not fixed):
        return None
    weight = _times(term.coefficient, abs(c))
    if coefficient_value(weight) < 0:
        return None
    b = add(*[t.expression() for t in fixed]) if fixed else None
    scaled = None if b is None else (b if c == 1.0 else _times(1.0 / c, b))
    name = "norm2" if isinstance(term.atom, Norm2) else "norm1"
    written = f"{name}({var.name})" if b is None else f"{name}({var.name} + {scaled})"
    label = f"{weight:g}·{written}" if isinstance(weight, float) else f"({weight})·{written}"
    return var, Norm(2 if name == "norm2" else 1, _weight(weight, label), _shift(var, scaled), label)


def norm1_part(var: Variable, weight: Any) -> Norm:
    """λ‖var‖₁ as a `Norm`, to join the shifted terms on its variable (`norm_term`)."""
    label = f"{weight}·norm1({var.name})"
    return Norm(1, _weight(weight, label), _shift(var, None), label)


def _residual(norms: list[Norm], x: np.ndarray, g: np.ndarray, zero: float) -> np.ndarray:
    """g + the element of Σ λ∂‖x − a‖ closest to −g: the smooth terms' gradients added, then
    the kinks' sets (a box per entry for ‖·‖₁, a ball for ‖·‖₂; exact for either alone, an
    upper bound for both) taken off. A kink is x within `zero`·max(1, ‖x‖∞) of a (the
    certificate's tolerance), or within `sets.ACTIVE` of the sizes of x and the anchors (a
    method stops 1e-8–1e-6 off it); reading it so gives the smaller residual, that of a point within that."""
    x, r = np.asarray(x, float), np.array(g, dtype=float)
    box, ball = np.zeros(np.shape(x)), 0.0
    top = float(np.max(np.abs(x), initial=0.0))
    size = max([top] + [float(np.max(np.abs(n.shift()), initial=0.0)) for n in norms])
    tol = max(zero * max(1.0, top), ACTIVE * size)
    for norm in norms:
        a, lam = norm.shift(), norm.lam()
        d = x - a
        if norm.p == 2:
            if float(np.max(np.abs(d), initial=0.0)) <= tol:
                ball += lam
            else:
                r += lam * d / np.linalg.norm(np.ravel(d))
        else:
            kink = np.abs(d) <= tol
            r += np.where(kink, 0.0, lam * np.sign(d))
            box += np.where(kink, lam, 0.0)
    r = soft_threshold(r, box)
    size = float(np.linalg.norm(np.ravel(r)))
    return r * max(0.0, 1.0 - ball / size) if ball > 0 and size > 0 else r


def norm_term(var: Variable, norms: list[Norm]) -> ProxTerm:
    """The ProxTerm of Σ λ_k‖var − a_k‖ (`norms`): kind "norm2" or "norm1-shift" for one term,
    with its shifted prox; "norm-sum" for several, with no prox (see the module docstring)."""
    if len(norms) == 1:
        norm = norms[0]
        kind = "norm2" if norm.p == 2 else "norm1-shift"
        threshold = Norm2.prox if norm.p == 2 else soft_threshold

        def prox(v, t):
            a = norm.shift()
            return a + threshold(np.asarray(v, float) - a, t * norm.lam())
    else:
        kind = "norm-sum"

        def prox(v, t):
            raise FedModelError(f"no prox is known for the sum {label} on one node")

    def value(x):
        x = np.asarray(x, float)
        return sum(n.lam() * float(np.linalg.norm(np.ravel(x - n.shift()), ord=n.p)) for n in norms)
    label = " + ".join(n.label for n in norms)
    return ProxTerm(var, prox, value, lambda x, g: _residual(norms, x, g, 0.0), label, kind=kind,
                    weight=lambda: sum(n.lam() for n in norms),
                    kinked=lambda x, g, zero: _residual(norms, x, g, zero))


def shifted_conflict(terms: list[ProxTerm]) -> list[str]:
    """Why a node's prox terms applied in turn are not the prox of their sum, for the kinds made
    here: a shifted norm shares its variable with no other prox term or projected set, and a
    "norm-sum" (several norms on one variable) has no prox (two anchors on one w, or an anchor
    and a ball, need a joint prox fedmodel does not know)."""
    for term in terms:
        if term.kind in SHIFTED and (term.kind == "norm-sum" or any(
                t is not term and t.variable is term.variable for t in terms)):
            other = next((t.label for t in terms if t is not term and t.variable is term.variable),
                         None)
            both = f"{term.label} and {other}" if other else term.label
            return [f"{both} on {term.variable.label}: the prox of such a sum is not known (its "
                    "terms' proxes applied in turn are not it); give each shifted norm its own "
                    "client (one anchor a client, as a geometric median), or write it smoothly"]
    return []
