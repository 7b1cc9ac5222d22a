"""Plan steps over many directions at once: the rules that let one compiled plan evaluate a
function that is linear in some inputs (the directions) for k directions in one call.

A Hessian-vector product ∇(∇f · v) is linear in v, and every node of its derived expression
that depends on v is linear in v: only sums, products by a v-free factor, matrix products,
reductions and the index/shape maps ever touch v (reverse-mode differentiation multiplies each
adjoint by a local derivative that does not depend on v). So the plan of one product can run
with v holding k directions stacked along a trailing axis — v of shape `shape + (k,)`, every
v-dependent value of shape `node.shape + (k,)` — and return k products. With the k unit
vectors it returns the whole Hessian: Xᵀ (s ⊙ X V) is one matrix product per side instead of
k matrix-vector products, and the plan is derived once, not once per column
(`NodeProgram.hessian`).

`DIRECTION_RULES[kind](node, batched, *values)` computes `node` on `values` where `batched[i]`
says whether argument i carries the trailing axis; the result carries it. Atoms that are not
linear in an argument have no rule (`not_applicable`): such a step never has a v-dependent
argument in a product's plan, and `codegen.Plan(..., batched=...)` raises `Unbatchable` if one
does (the caller then evaluates direction by direction).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..atoms import Add, BroadcastTo, MatMul, Mean, Multiply, Neg, Reshape, Sum, SumTo, Transpose
from ..atoms.elementwise import Elementwise
from ..atoms.indexing import Index, IndexAdjoint, numpy_key
from ..atoms.maximum import GreaterEqual, Maximum
from ..atoms.reductions import ArgmaxAbs, LogSumExp, Norm, QuadForm, Softmax, SumSquares
from ..errors import FedModelError
from ..lowering.rules import RuleTable


class Unbatchable(FedModelError):
    """A plan asked to carry directions reaches an atom with no rule for them (`DIRECTION_RULES`)."""


DIRECTION_RULES = RuleTable(lambda node: Unbatchable(
    f"{node.display} has no rule for a value carrying several directions"), name="directions")

NONLINEAR = ("not linear in its argument: the derived Hessian-vector product never applies it "
             "to a direction-dependent value")


def _lift(value: Any, batched: bool) -> Any:
    """An elementwise operand aligned with the direction-carrying ones: a v-free array gets a
    trailing axis of length 1 (numpy then broadcasts it over the k directions)."""
    if batched or np.ndim(value) == 0:
        return value
    if not isinstance(value, np.ndarray):
        raise Unbatchable(f"an elementwise product with a {type(value).__name__} over directions")
    return value[..., None]


@DIRECTION_RULES.register(Add)
def _add(node: Add, batched: tuple, *values: Any) -> Any:
    out = _lift(values[0], batched[0])
    for value, b in zip(values[1:], batched[1:]):      # Add.numeric's order
        out = out + _lift(value, b)
    return out


@DIRECTION_RULES.register(Multiply)
def _multiply(node: Multiply, batched: tuple, a: Any, b: Any) -> Any:
    return _lift(a, batched[0]) * _lift(b, batched[1])


@DIRECTION_RULES.register(Neg)
def _neg(node: Neg, batched: tuple, x: Any) -> Any:
    return -x


@DIRECTION_RULES.register(MatMul)
def _matmul(node: MatMul, batched: tuple, a: Any, b: Any) -> Any:
    """a @ b with one of them carrying directions: one matrix product for all k (a data matrix
    times k vectors), written with `@` on the v-free operand so sparse data stays sparse."""
    sa, sb = node.args[0].shape, node.args[1].shape
    if batched[0] and batched[1]:
        raise Unbatchable("a product of two direction-dependent values is not linear in them")
    if batched[1]:                                  # b: sb + (k,)
        if len(sb) == 1:
            return a @ b                            # (n, k) -> sa[:-1] + (k,)
        k = b.shape[-1]
        return np.reshape(a @ np.reshape(b, (sb[0], sb[1] * k)), sa[:-1] + (sb[1], k))
    k = a.shape[-1]                                 # a: sa + (k,)
    if len(sa) == 1:
        return b.T @ a                              # (n, k) -> sb[1:] + (k,)
    rows = np.moveaxis(a, -1, 0).reshape(k * sa[0], sa[1])     # (k·m, n)
    return np.moveaxis(np.reshape(rows @ b, (k, sa[0]) + tuple(sb[1:])), 0, -1)


@DIRECTION_RULES.register(Transpose)
def _transpose(node: Transpose, batched: tuple, x: Any) -> Any:
    return np.swapaxes(x, 0, 1)


@DIRECTION_RULES.register(Reshape)
def _reshape(node: Reshape, batched: tuple, x: Any) -> Any:
    return np.reshape(x, tuple(node.target) + (x.shape[-1],))


@DIRECTION_RULES.register(Sum)
def _sum(node: Sum, batched: tuple, x: Any) -> Any:
    if node.axis is None:
        return np.add.reduce(np.reshape(x, (-1, x.shape[-1])), axis=0)
    return np.add.reduce(x, axis=node.axis)


@DIRECTION_RULES.register(Mean)
def _mean(node: Mean, batched: tuple, x: Any) -> Any:
    return _sum(node, batched, x) / node.count


@DIRECTION_RULES.register(BroadcastTo)
def _broadcast_to(node: BroadcastTo, batched: tuple, x: Any) -> Any:
    return np.broadcast_to(x, tuple(node.target) + (x.shape[-1],))


@DIRECTION_RULES.register(SumTo)
def _sum_to(node: SumTo, batched: tuple, x: Any) -> Any:
    """`broadcasting.sum_to_shape` on the leading axes (the directions' axis stays)."""
    shape = tuple(node.target)
    lead = x.ndim - 1 - len(shape)
    if lead:
        x = np.add.reduce(x, axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    if axes:
        x = np.add.reduce(x, axis=axes, keepdims=True)
    return x


@DIRECTION_RULES.register(Index)
def _index(node: Index, batched: tuple, x: Any) -> Any:
    # the appended full slice keeps the directions' axis last (any axes the key leaves out are
    # full slices before it, and the one integer list stays where it is)
    return x[numpy_key(node.key) + (slice(None),)]


@DIRECTION_RULES.register(IndexAdjoint)
def _scatter(node: IndexAdjoint, batched: tuple, g: Any) -> Any:
    out = np.zeros(tuple(node.target) + (g.shape[-1],))
    np.add.at(out, numpy_key(node.key) + (slice(None),), g)
    return out


def inline_form(node: Any, batched: tuple, ndims: tuple, sparse: tuple) -> str | None:
    """Python source (a format string over the arguments' names {0}, {1}, …) computing the
    rule's result for the cases that are one operator — most steps of a product's plan, whose
    call frames would otherwise cost more than their arithmetic on small arrays — or None.
    `ndims`: the arguments' numbers of axes (without the directions'); `sparse`: which of them
    are scipy.sparse constants (those only in products, `@`)."""
    kind = type(node)
    if kind is Neg:
        return "-{0}"
    if kind is Add or kind is Multiply:
        if any(sparse):
            return None
        operands = ["{%d}" % i if b or n == 0 else "{%d}[..., None]" % i
                    for i, (b, n) in enumerate(zip(batched, ndims))]
        return (" + " if kind is Add else " * ").join(operands) if len(operands) <= 64 else None
    if kind is MatMul:
        if batched[1] and ndims[1] == 1:
            return "{0} @ {1}"
        if batched[0] and ndims[0] == 1:
            return "{1} @ {0}" if ndims[1] == 1 and not sparse[1] else "{1}.T @ {0}"
    return None


DIRECTION_RULES.not_applicable(Elementwise, Maximum, GreaterEqual, Norm, SumSquares, QuadForm,
                               LogSumExp, Softmax, ArgmaxAbs, reason=NONLINEAR)
