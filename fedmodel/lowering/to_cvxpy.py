"""Lower expressions to CVXPY, atom by atom, so DCP structure is preserved.

Each atom class has its rule here (`@cvxpy_rule(Exp)`), found through the class MRO; the
atoms themselves know nothing of CVXPY. cvxpy is imported when a rule first runs, so that
`import fedmodel` stays light.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis import CONVEX
from ..atoms import (Abs, Add, ArgmaxAbs, BroadcastTo, Clip, Exp, GreaterEqual, Huber, Index,
                     IndexAdjoint, Log, Logistic, LogSumExp, MatMul, Maximum, Mean, Multiply, Neg,
                     Norm1, Norm2, NormInf, Pos, Power, QuadForm, Reshape, Sigmoid, Sign, Softmax,
                     Sqrt, Square, Step, Sum, SumSquares, SumTo, Transpose)
from ..atoms.indexing import numpy_key
from ..errors import FedModelError
from ..expression import Expression, Leaf, Parameter, Variable, postorder
from .rules import RuleTable


class CvxpyContext:
    """Maps our leaves (by uid, never by name) to CVXPY leaves, so one model lowers to one
    consistent problem; CVXPY names are the labels (`c3.s` for client c3's private `s`)."""

    def __init__(self):
        self.leaves: dict[int, Any] = {}

    def leaf(self, node: Leaf) -> Any:
        import cvxpy as cp
        if node.uid not in self.leaves:
            if isinstance(node, Variable):
                self.leaves[node.uid] = cp.Variable(node.shape, name=node.label)
            elif isinstance(node, Parameter):
                param = cp.Parameter(node.shape, name=node.label, nonneg=node.nonneg,
                                     nonpos=node.nonpos)
                if node.value is not None:
                    param.value = node.value
                self.leaves[node.uid] = param
            else:
                value = node.value
                self.leaves[node.uid] = cp.Constant(value) if np.ndim(value) else float(value)
        return self.leaves[node.uid]

    def variable(self, var: Variable) -> Any:
        return self.leaf(var)


def to_cvxpy(expr: Expression, context: CvxpyContext | None = None) -> Any:
    """The CVXPY expression of `expr` (variables are created once per `context`).

    >>> import fedmodel as fm
    >>> w = fm.Variable(2, name="w")
    >>> fm.to_cvxpy(fm.norm1(w)).is_convex()
    True
    """
    import cvxpy as cp
    context = context or CvxpyContext()
    memo: dict[int, Any] = {}
    for node in postorder([expr]):
        if isinstance(node, Leaf):
            memo[id(node)] = context.leaf(node)
        else:
            memo[id(node)] = CVXPY_RULES(node, *[memo[id(a)] for a in node.args])
    result = memo[id(expr)]
    if not isinstance(result, cp.Expression):   # scalar constants are kept as floats inside
        result = cp.Constant(result)
    return result


# ---- rules --------------------------------------------------------------------------------
CVXPY_RULES = RuleTable(lambda node: FedModelError(
    f"{node.display} has no CVXPY lowering (it appears only in derived gradients, which CVXPY "
    "does not need)"), name="cvxpy")
cvxpy_rule = CVXPY_RULES.register

# Atoms that only derived gradients build (σ of a logistic's slope, the sign and step of a
# subgradient, clip, the indicator of a maximum, the adjoints of indexing and broadcasting,
# the argmax of a norm-∞'s subgradient, log-sum-exp's softmax): no model a user writes holds
# them, and CVXPY differentiates its own problem.
CVXPY_RULES.not_applicable(Sigmoid, Sign, Step, Clip, GreaterEqual, IndexAdjoint, SumTo, ArgmaxAbs,
                           Softmax, reason="appears only in derived gradients")


def _same_name(name: str):
    """The rule `cp.<name>(*args)`: CVXPY's atom of the same name and arguments."""
    def rule(node: Any, *args: Any) -> Any:
        import cvxpy as cp
        return getattr(cp, name)(*args)
    return rule


for _kind, _name in ((Exp, "exp"), (Log, "log"), (Sqrt, "sqrt"), (Square, "square"), (Abs, "abs"),
                     (Logistic, "logistic"), (Pos, "pos"), (Maximum, "maximum"),
                     (SumSquares, "sum_squares")):
    cvxpy_rule(_kind)(_same_name(_name))


@cvxpy_rule(Power)
def _power(node: Power, x: Any) -> Any:
    import cvxpy as cp
    return cp.power(x, node.p)


@cvxpy_rule(Huber)
def _huber(node: Huber, x: Any) -> Any:
    import cvxpy as cp
    return cp.huber(x, node.M)


@cvxpy_rule(LogSumExp)
def _log_sum_exp(node: LogSumExp, x: Any) -> Any:
    import cvxpy as cp
    return cp.log_sum_exp(x, axis=node.axis)


@cvxpy_rule(Add)
def _add(node: Add, *args: Any) -> Any:
    out = args[0]
    for a in args[1:]:
        out = out + a
    return out


@cvxpy_rule(Neg)
def _neg(node: Neg, x: Any) -> Any:
    return -x


@cvxpy_rule(Multiply)
def _multiply(node: Multiply, a: Any, b: Any) -> Any:
    import cvxpy as cp
    if np.ndim(a) == 0 or np.ndim(b) == 0 or getattr(a, "shape", ()) == () or getattr(b, "shape", ()) == ():
        return _weighted(a, b) if isinstance(a, (int, float)) else \
            _weighted(b, a) if isinstance(b, (int, float)) else a * b
    return cp.multiply(a, b)


def _weighted(c: float, x: Any) -> Any:
    """c·x, with c > 0 moved inside a sum of squares (c‖r‖² = ‖√c r‖²) or a norm (c‖r‖ = ‖c r‖):
    the cone program's auxiliary variables then have the size of the weighted term, not of r.
    An equilibrated model's σ·‖A w − b‖² with data ×10^k otherwise keeps a 10^k-sized residual
    inside Clarabel's second-order cone (answers 3e-6 apart across k; now to rounding)."""
    import cvxpy as cp
    from cvxpy.atoms.pnorm import Pnorm
    if c > 0 and isinstance(x, cp.quad_over_lin) and x.args[1].is_constant() \
            and float(x.args[1].value) == 1.0:
        return cp.sum_squares(np.sqrt(c) * x.args[0])
    if c > 0 and isinstance(x, Pnorm) and x.p == 2 and x.axis is None:
        return cp.norm(c * x.args[0], 2)
    return c * x


@cvxpy_rule(MatMul)
def _matmul(node: MatMul, a: Any, b: Any) -> Any:
    return a @ b


@cvxpy_rule(Transpose)
def _transpose(node: Transpose, x: Any) -> Any:
    return x.T


@cvxpy_rule(Index)
def _index(node: Index, x: Any) -> Any:
    return x[numpy_key(node.key)]


@cvxpy_rule(Reshape)
def _reshape(node: Reshape, x: Any) -> Any:
    import cvxpy as cp
    return cp.reshape(x, node.target, order="C")


@cvxpy_rule(BroadcastTo)
def _broadcast_to(node: BroadcastTo, x: Any) -> Any:
    import cvxpy as cp
    if getattr(x, "shape", ()) == node.target:
        return x
    if np.ndim(x) == 0 or getattr(x, "shape", None) == ():
        return x * np.ones(node.target)
    return cp.broadcast_to(x, node.target) if hasattr(cp, "broadcast_to") \
        else x + np.zeros(node.target)


@cvxpy_rule(Sum)
def _sum(node: Sum, x: Any) -> Any:
    import cvxpy as cp
    return cp.sum(x, axis=node.axis)


@cvxpy_rule(Mean)
def _mean(node: Mean, x: Any) -> Any:
    return _sum(node, x) / node.count


def _flat(x: Any) -> Any:
    """Norms of matrices are entry-wise (‖vec X‖), as in the IR."""
    import cvxpy as cp
    return cp.vec(x, order="C") if len(getattr(x, "shape", ())) > 1 else x


@cvxpy_rule(Norm1)
def _norm1(node: Norm1, x: Any) -> Any:
    import cvxpy as cp
    return cp.norm1(_flat(x))


@cvxpy_rule(Norm2)
def _norm2(node: Norm2, x: Any) -> Any:
    import cvxpy as cp
    return cp.norm(_flat(x), 2)


@cvxpy_rule(NormInf)
def _norm_inf(node: NormInf, x: Any) -> Any:
    import cvxpy as cp
    return cp.norm_inf(_flat(x))


@cvxpy_rule(QuadForm)
def _quad_form(node: QuadForm, x: Any, P: Any) -> Any:
    import cvxpy as cp
    if node.fixed_P() is None:
        return x @ (P @ x)   # P holds a Parameter: same value, and (like ours) not DCP
    value = np.asarray(P.value if hasattr(P, "value") and P.value is not None else P)
    return cp.quad_form(x, cp.psd_wrap((value + value.T) / 2)) if node.curvature == CONVEX \
        else cp.quad_form(x, (value + value.T) / 2)
