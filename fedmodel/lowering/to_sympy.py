"""Lower expressions to sympy.

Default (symbolic) form: variables and data become MatrixSymbols named after them, so
`sympy.latex(fm.to_sympy(f))` reads like a paper's formula. `explicit=True` gives numpy
object arrays of scalar sympy expressions (variables as entry symbols, data as numbers), which
sympy can differentiate entry by entry; tests use it to check our derived gradients.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..expression import Constant, Data, Expression, Leaf, Parameter, Variable
from ..compiler.codegen import _postorder


def _symbolic_leaf(node: Leaf) -> Any:
    import sympy
    if isinstance(node, Constant) and not isinstance(node, Data):
        value = node.value
        if value.size == 1:
            return sympy.Float(float(value)) if float(value) != int(float(value)) else sympy.Integer(int(float(value)))
    rows, cols = (node.shape + (1, 1))[:2] if node.shape else (1, 1)
    if not node.shape:
        return sympy.Symbol(node.name)
    return sympy.MatrixSymbol(node.name, rows, cols)


def entry_symbols(var: Leaf) -> np.ndarray:
    """Object array of scalar symbols for a variable's entries (names like w_0 or W_1_2)."""
    import sympy
    if not var.shape:
        return np.asarray(sympy.Symbol(var.name), dtype=object)
    out = np.empty(var.shape, dtype=object)
    for idx in np.ndindex(*var.shape):
        out[idx] = sympy.Symbol(f"{var.name}_{'_'.join(map(str, idx))}", real=True)
    return out


def to_sympy(expr: Expression, explicit: bool = False, symbols: dict | None = None) -> Any:
    """sympy form of `expr`; see the module docstring for the two forms."""
    import sympy
    symbols = {} if symbols is None else symbols
    memo: dict[int, Any] = {}
    for node in _postorder([expr]):
        if isinstance(node, Leaf):
            if not explicit:
                memo[id(node)] = _symbolic_leaf(node)
            elif isinstance(node, (Variable, Parameter)):
                if node.uid not in symbols:
                    symbols[node.uid] = entry_symbols(node)
                memo[id(node)] = symbols[node.uid]
            else:
                value = np.asarray(node.value, dtype=float)
                memo[id(node)] = np.vectorize(sympy.Float, otypes=[object])(value) if value.ndim \
                    else np.asarray(sympy.Float(float(value)), dtype=object)
            continue
        args = [memo[id(a)] for a in node.args]
        if explicit:
            memo[id(node)] = np.asarray(node.to_sympy_explicit(*args), dtype=object)
        else:
            memo[id(node)] = node.to_sympy(*args)
    return memo[id(expr)]
