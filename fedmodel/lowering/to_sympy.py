"""Lower expressions to sympy.

Default (symbolic) form: variables and data become MatrixSymbols named after them, so
`sympy.latex(fm.to_sympy(f))` reads like a paper's formula. `explicit=True` gives numpy
object arrays of scalar sympy expressions (variables as entry symbols, data as numbers), which
sympy can differentiate entry by entry; tests use it to check our derived gradients.

Each atom class has its rules, one table per form (`@sympy_rule(Add)` symbolic, here;
`@explicit_rule(Add)` entry-wise, in `sympy_explicit`; `@scalar_rule(Exp)` the scalar formula
that elementwise atoms apply to each entry, here), found through the class MRO; the atoms know
nothing of sympy.
sympy is imported when a rule first runs, so that `import fedmodel` stays light.
"""
from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from ..atoms import (Abs, Add, Atom, BroadcastTo, Clip, Exp, Huber, Index, Log, Logistic, LogSumExp,
                     MatMul, Maximum, Mean, Multiply, Neg, Norm1, Norm2, Pos, Power, QuadForm, Reshape,
                     Sigmoid, Sign, Sqrt, Square, Step, Sum, SumSquares, Transpose)
from ..atoms.elementwise import Elementwise
from ..atoms.indexing import hashable_key
from ..expression import Constant, Data, Expression, Leaf, Parameter, Variable, postorder
from .rules import RuleTable
from .sympy_explicit import EXPLICIT_RULES, explicit_rule
from .sympy_forms import SCALAR_RULES, as_scalar, broadcast, function, is_matrix, no_rule


def symbol_names(leaves: list[Leaf]) -> dict[int, str]:
    """A distinct sympy name per leaf uid: the leaf as it renders (`w`, `c3.s`, data `X0`),
    its label (`c0.X0`) where two leaves render alike (two clients' data `X0`), and the uid
    appended where even that is ambiguous — sympy merges symbols of equal name, so two
    different leaves must never share one."""
    unique = {leaf.uid: leaf for leaf in leaves}.values()
    names = {leaf.uid: leaf.render() if isinstance(leaf, Variable) else leaf.name for leaf in unique}
    for rename in (lambda leaf: leaf.label, lambda leaf: f"{leaf.label}#{leaf.uid}"):
        counts: dict[str, int] = {}
        for name in names.values():
            counts[name] = counts.get(name, 0) + 1
        names = {leaf.uid: rename(leaf) if counts[names[leaf.uid]] > 1 else names[leaf.uid]
                 for leaf in unique}
    return names


def _symbolic_leaf(node: Leaf, name: str) -> Any:
    import sympy
    if isinstance(node, Constant) and not isinstance(node, Data):
        value = node.value
        if value.size == 1:
            number = value.item()
            return sympy.Float(number) if number != int(number) else sympy.Integer(int(number))
    rows, cols = (node.shape + (1, 1))[:2] if node.shape else (1, 1)
    if not node.shape:
        return sympy.Symbol(name)
    return sympy.MatrixSymbol(name, rows, cols)


def entry_symbols(var: Leaf, name: str | None = None) -> np.ndarray:
    """Object array of scalar symbols for a variable's entries (names like w_0 or W_1_2;
    `name` defaults to the variable's label, e.g. `c3.s` for a client's private `s`)."""
    import sympy
    name = var.label if name is None else name
    if not var.shape:
        return np.asarray(sympy.Symbol(name), dtype=object)
    out = np.empty(var.shape, dtype=object)
    for idx in np.ndindex(*var.shape):
        out[idx] = sympy.Symbol(f"{name}_{'_'.join(map(str, idx))}", real=True)
    return out


def to_sympy(expr: Expression, explicit: bool = False, symbols: dict | None = None) -> Any:
    """sympy form of `expr`; see the module docstring for the two forms."""
    import sympy
    symbols = {} if symbols is None else symbols
    memo: dict[int, Any] = {}
    nodes = postorder([expr])
    names = symbol_names([node for node in nodes if isinstance(node, Leaf)])
    for node in nodes:
        if isinstance(node, Leaf):
            if not explicit:
                memo[id(node)] = _symbolic_leaf(node, names[node.uid])
            elif isinstance(node, (Variable, Parameter)):
                if node.uid not in symbols:
                    symbols[node.uid] = entry_symbols(node, names[node.uid])
                memo[id(node)] = symbols[node.uid]
            else:
                value = np.asarray(node.value, dtype=float)
                memo[id(node)] = np.vectorize(sympy.Float, otypes=[object])(value) if value.ndim \
                    else np.asarray(sympy.Float(float(value)), dtype=object)
            continue
        args = [memo[id(a)] for a in node.args]
        if explicit:
            memo[id(node)] = np.asarray(EXPLICIT_RULES(node, *args), dtype=object)
        else:
            memo[id(node)] = SYMPY_RULES(node, *args)
    return memo[id(expr)]


# ---- rules --------------------------------------------------------------------------------
SYMPY_RULES = RuleTable(no_rule("symbolic"), "sympy")             # matrix expressions
sympy_rule, scalar_rule = SYMPY_RULES.register, SCALAR_RULES.register


# -- scalar formulas (elementwise atoms; norms and squares of a scalar) --
@scalar_rule(Exp)
def _exp(node: Exp, x: Any) -> Any:
    import sympy
    return sympy.exp(x)


@scalar_rule(Log)
def _log(node: Log, x: Any) -> Any:
    import sympy
    return sympy.log(x)


@scalar_rule(Power)
def _power(node: Power, x: Any) -> Any:
    import sympy
    return x ** sympy.nsimplify(node.p)


@scalar_rule(Sqrt)
def _sqrt(node: Sqrt, x: Any) -> Any:
    import sympy
    return sympy.sqrt(x)


@scalar_rule(Square, SumSquares)
def _square(node: Square | SumSquares, x: Any) -> Any:
    return x ** 2


@scalar_rule(Abs, Norm1, Norm2)
def _abs(node: Abs | Norm1 | Norm2, x: Any) -> Any:
    import sympy
    return sympy.Abs(x)


@scalar_rule(Logistic)
def _logistic(node: Logistic, x: Any) -> Any:
    import sympy
    return sympy.log(1 + sympy.exp(x))


@scalar_rule(Pos)
def _pos(node: Pos, x: Any) -> Any:
    import sympy
    return sympy.Max(x, 0)


@scalar_rule(Huber)
def _huber(node: Huber, x: Any) -> Any:
    import sympy
    M = sympy.nsimplify(node.M)
    return sympy.Piecewise((x ** 2, sympy.Abs(x) <= M), (2 * M * sympy.Abs(x) - M ** 2, True))


@scalar_rule(Maximum)
def _maximum(node: Maximum, a: Any, b: Any) -> Any:
    import sympy
    return sympy.Max(a, b)


@scalar_rule(Sigmoid)
def _sigmoid(node: Sigmoid, x: Any) -> Any:
    import sympy
    return 1 / (1 + sympy.exp(-x))


@scalar_rule(Sign)
def _sign(node: Sign, x: Any) -> Any:
    import sympy
    return sympy.sign(x)


@scalar_rule(Step)
def _step(node: Step, x: Any) -> Any:
    import sympy
    return sympy.Heaviside(x, 0)


@scalar_rule(Clip)
def _clip(node: Clip, x: Any) -> Any:
    import sympy
    return sympy.Min(sympy.Max(x, node.lower), node.upper)


# -- symbolic form --
@sympy_rule(Atom)
def _named(node: Atom, *args: Any) -> Any:
    """`display(args)`, a scalar or a matrix expression of the atom's shape."""
    return function(node.display, node.shape, *args)


@sympy_rule(Elementwise, Maximum, SumSquares, Norm1, Norm2)
def _entrywise(node: Atom, *args: Any) -> Any:
    """The scalar formula on scalars, `display(args)` on matrices."""
    if builtins.any(is_matrix(a) for a in args):
        return _named(node, *args)
    return SCALAR_RULES(node, *args)


@sympy_rule(Power)
def _hadamard_power(node: Power, x: Any) -> Any:
    import sympy
    if is_matrix(x):
        return sympy.HadamardPower(x, sympy.nsimplify(node.p))
    return SCALAR_RULES(node, x)


@sympy_rule(Sum, Mean, LogSumExp)
def _along_axis(node: Sum | LogSumExp, x: Any) -> Any:
    return function(node.display, node.shape, x, *(() if node.axis is None else (node.axis,)))


@sympy_rule(Add)
def _add(node: Add, *args: Any) -> Any:
    import sympy
    if not node.shape:
        return sympy.Add(*args)
    return sympy.MatAdd(*[broadcast(v, a.shape, node.shape) for v, a in zip(args, node.args)])


@sympy_rule(Neg)
@explicit_rule(Neg)
def _neg(node: Neg, x: Any) -> Any:
    return -x


@sympy_rule(Multiply)
def _multiply(node: Multiply, a: Any, b: Any) -> Any:
    import sympy
    a, b = (as_scalar(v) if e.size == 1 else v for v, e in zip((a, b), node.args))
    if is_matrix(a) and is_matrix(b):
        return sympy.HadamardProduct(broadcast(a, node.args[0].shape, node.shape),
                                     broadcast(b, node.args[1].shape, node.shape))
    return a * b


@sympy_rule(MatMul)
def _matmul(node: MatMul, a: Any, b: Any) -> Any:
    import sympy
    a_vec, b_vec = node.args[0].ndim == 1, node.args[1].ndim == 1
    if a_vec:
        a = sympy.Transpose(a) if is_matrix(a) else a
    out = sympy.MatMul(a, b) if (is_matrix(a) or is_matrix(b)) else a * b
    if a_vec and not b_vec and is_matrix(out):
        return sympy.Transpose(out)
    if not node.shape:
        return as_scalar(out)
    return out


@sympy_rule(Transpose)
def _transpose(node: Transpose, x: Any) -> Any:
    import sympy
    return sympy.Transpose(x) if is_matrix(x) else x


@sympy_rule(Index)
def _index(node: Index, x: Any) -> Any:
    if builtins.any(isinstance(k, tuple) or (isinstance(k, slice) and k.step < 0)
                    for k in node.key) or not is_matrix(x):   # beyond sympy's slices
        return function("index", node.shape, x, *map(str, hashable_key(node.key)))
    key = node.key + (slice(None),) * (2 - len(node.key))   # vectors are n×1 columns
    if node.args[0].ndim == 1:
        key = (node.key[0], 0)
    out = x[key]
    if node.shape and len(node.shape) == 1 and isinstance(key[0], int):
        import sympy
        return sympy.Transpose(out)      # a row X[i, :] has our shape (n,): a column
    return out


@sympy_rule(Reshape)
def _reshape(node: Reshape, x: Any) -> Any:
    if len(node.target) <= 1 and node.args[0].ndim <= 1:
        return x                          # (n,) ↔ (n,) or scalars: the same sympy object
    return function("reshape", node.target, x)


@sympy_rule(BroadcastTo)
def _broadcast_to(node: BroadcastTo, x: Any) -> Any:
    return broadcast(x, node.args[0].shape, node.target)


@sympy_rule(QuadForm)
def _quad_form(node: QuadForm, x: Any, P: Any) -> Any:
    import sympy
    return as_scalar(sympy.Transpose(x) * P * x) if is_matrix(x) else P * x ** 2
