"""The JAX lowering's per-atom rules (`jax_codegen`): each atom's step as `jax.numpy`, the same
formula as the atom's numpy `numeric` (e.g. the overflow-free logistic). A rule is
`rule(node, jnp) -> fn(*arguments, mask=…, count=…)`; `mask` and `count` describe a ragged
client's valid entries in a padded group (`jax_codegen.JaxGroupPlan`)."""
from __future__ import annotations

from typing import Any, Callable

from .. import atoms as A
from ..atoms.broadcasting import SumTo
from ..atoms.indexing import Index, IndexAdjoint, numpy_key
from ..atoms.reductions import ArgmaxAbs, Norm1, Norm2, NormInf, QuadForm, Softmax
from ..errors import FedModelError
from ..lowering.rules import RuleTable


def _atom_kinds() -> dict:
    from .. import atoms as A
    from ..atoms import elementwise as E
    from ..atoms.broadcasting import SumTo
    from ..atoms.indexing import Index, IndexAdjoint
    from ..atoms.reductions import ArgmaxAbs, Norm1, Norm2, NormInf, QuadForm, Softmax
    return dict(A=A, E=E, SumTo=SumTo, Index=Index, IndexAdjoint=IndexAdjoint, ArgmaxAbs=ArgmaxAbs,
                Norm1=Norm1, Norm2=Norm2, NormInf=NormInf, QuadForm=QuadForm, Softmax=Softmax)


def _zero_preserving(node: Any, K: dict) -> bool:
    """Steps whose result is 0 wherever their (zero-padded) arguments are 0 on padded entries:
    no mask needed after them."""
    A, E = K["A"], K["E"]
    kinds = (A.Multiply, A.Neg, A.MatMul, A.Transpose, A.Sum, A.Square, A.Abs, A.Pos, E.Sign,
             E.Step, A.Sqrt, A.Huber, K["Index"], K["IndexAdjoint"], K["SumTo"], A.BroadcastTo)
    if isinstance(node, kinds):
        return True
    return isinstance(node, A.Power) and node.p > 0


def _rule(node: Any, K: dict, jnp: Any) -> Callable[..., Any]:
    """The jax.numpy computation of one step: fn(*arguments, mask=…, count=…) for the atom
    `node` (its parameters — axis, exponent, key, target — are the group's common ones)."""
    return JAX_RULES(node, jnp)


JAX_RULES = RuleTable(lambda node: FedModelError(
    f"the JAX lowering has no rule for the atom {type(node).__name__} ({node.display}); "
    "evaluate this plan with numpy"), name="jax")
jax_rule = JAX_RULES.register      # rule(node, jnp) -> fn(*arguments, mask=…, count=…)


@jax_rule(A.Add)
def _add(node: Any, jnp: Any) -> Callable[..., Any]:
    def add(*xs, **_):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out
    return add


@jax_rule(A.Multiply)
def _multiply(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda a, b, **_: a * b


@jax_rule(A.Neg)
def _neg(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: -x


@jax_rule(A.MatMul)
def _matmul(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda a, b, **_: a @ b


@jax_rule(A.Transpose)
def _transpose(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: x.T


@jax_rule(A.Reshape)
def _reshape(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.reshape(x, node.target)


@jax_rule(A.BroadcastTo)
def _broadcast_to(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.broadcast_to(x, node.target)


@jax_rule(SumTo)
def _sum_to(node: Any, jnp: Any) -> Callable[..., Any]:
    target = tuple(node.target)

    def sum_to(x, **_):
        lead = x.ndim - len(target)
        if lead:
            x = jnp.sum(x, axis=tuple(range(lead)))
        axes = tuple(i for i, n in enumerate(target) if n == 1 and x.shape[i] != 1)
        return jnp.sum(x, axis=axes, keepdims=True) if axes else x
    return sum_to


@jax_rule(A.Exp)
def _exp(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.exp(x)


@jax_rule(A.Log)
def _log(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.log(x)


@jax_rule(A.Power)
def _power(node: Any, jnp: Any) -> Callable[..., Any]:
    p = node.p
    if p == 2:
        return lambda x, **_: x * x
    if p == -1:
        return lambda x, **_: 1.0 / x
    if p == 0.5:
        return lambda x, **_: jnp.sqrt(x)
    return lambda x, **_: jnp.power(x, p)


@jax_rule(A.Sqrt)
def _sqrt(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.sqrt(x)


@jax_rule(A.Square)
def _square(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: x * x


@jax_rule(A.Abs)
def _abs(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.abs(x)


@jax_rule(A.Logistic)
def _logistic(node: Any, jnp: Any) -> Callable[..., Any]:
    # max(x, 0) + log1p(e^{−|x|}), as the numpy atom
    return lambda x, **_: jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x)))


@jax_rule(A.Sigmoid)
def _sigmoid(node: Any, jnp: Any) -> Callable[..., Any]:
    # e^{min(x, 0)} / (1 + e^{−|x|}), as the numpy atom
    return lambda x, **_: jnp.exp(jnp.minimum(x, 0.0)) / (1.0 + jnp.exp(-jnp.abs(x)))


@jax_rule(A.Pos)
def _pos(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.maximum(x, 0.0)


@jax_rule(A.Huber)
def _huber(node: Any, jnp: Any) -> Callable[..., Any]:
    M = node.M
    return lambda x, **_: jnp.where(jnp.abs(x) <= M, x * x, 2 * M * jnp.abs(x) - M ** 2)


@jax_rule(A.Sign)
def _sign(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.sign(x)


@jax_rule(A.Step)
def _step(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: (x > 0).astype(jnp.float64)


@jax_rule(A.Clip)
def _clip(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.clip(x, node.lower, node.upper)


@jax_rule(A.Maximum)
def _maximum(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda a, b, **_: jnp.maximum(a, b)


@jax_rule(A.GreaterEqual)
def _greater_equal(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda a, b, **_: (a >= b).astype(jnp.float64)


@jax_rule(Index)
def _index(node: Any, jnp: Any) -> Callable[..., Any]:
    key = numpy_key(node.key)
    return lambda x, **_: x[key]


@jax_rule(IndexAdjoint)
def _index_adjoint(node: Any, jnp: Any) -> Callable[..., Any]:
    key, target = numpy_key(node.key), tuple(node.target)
    return lambda g, **_: jnp.zeros(target).at[key].add(g)


@jax_rule(A.Sum)
def _sum(node: Any, jnp: Any) -> Callable[..., Any]:
    axis = node.axis
    return lambda x, **_: jnp.sum(x, axis=axis)


@jax_rule(A.Mean)
def _mean(node: Any, jnp: Any) -> Callable[..., Any]:
    axis = node.axis
    return lambda x, count, **_: jnp.sum(x, axis=axis) / count


@jax_rule(A.SumSquares)
def _sum_squares(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.sum(x * x)


@jax_rule(Norm1)
def _norm1(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.sum(jnp.abs(x))


@jax_rule(Norm2)
def _norm2(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.sqrt(jnp.sum(x * x))


@jax_rule(NormInf)
def _norm_inf(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, **_: jnp.max(jnp.abs(x))


@jax_rule(ArgmaxAbs)
def _argmax_abs(node: Any, jnp: Any) -> Callable[..., Any]:
    def argmax_abs(x, **_):
        flat = jnp.ravel(x)
        i = jnp.argmax(jnp.abs(flat))
        return jnp.zeros(flat.shape).at[i].set(jnp.sign(flat[i])).reshape(x.shape)
    return argmax_abs


@jax_rule(QuadForm)
def _quad_form(node: Any, jnp: Any) -> Callable[..., Any]:
    return lambda x, P, **_: x @ P @ x


@jax_rule(A.LogSumExp)
def _log_sum_exp(node: Any, jnp: Any) -> Callable[..., Any]:
    axis = node.axis

    def lse(x, mask=None, **_):
        masked = x if mask is None else jnp.where(mask, x, -jnp.inf)
        top = jnp.max(masked, axis=axis, keepdims=True)
        top = jnp.where(jnp.isfinite(top), top, 0.0)     # an all-empty row: no NaN
        z = jnp.exp(masked - top)
        out = jnp.log(jnp.sum(z, axis=axis, keepdims=True)) + top
        return out.reshape(()) if axis is None else jnp.squeeze(out, axis=axis)
    return lse


@jax_rule(Softmax)
def _softmax(node: Any, jnp: Any) -> Callable[..., Any]:
    axis = node.axis

    def softmax(x, mask=None, **_):
        masked = x if mask is None else jnp.where(mask, x, -jnp.inf)
        z = jnp.exp(masked - jnp.max(masked, axis=axis, keepdims=True))
        return z / jnp.sum(z, axis=axis, keepdims=True)
    return softmax
