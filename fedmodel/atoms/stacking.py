"""`hstack` / `vstack`: numpy's (and CVXPY's) stacking of expressions, written with the linear
atoms already there — a sum of products with constant 0/1 embedding matrices — so every
derivative, lowering (CVXPY, sympy) and backend reads a stacked expression with no rule of
its own, and stacked data stay an expression of each client's data (never one constant: a
client's data must not leave its block). A user from CVXPY or numpy writes
`fm.hstack([X1, X2]) @ w`; before, fedmodel had no such function (AttributeError, newuser9)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import ShapeError
from ..expression import Constant, Expression, as_expr
from .arithmetic import add
from .linear import matmul, reshape


def _items(items: Sequence[Any], name: str) -> list[Expression]:
    if isinstance(items, (Expression, np.ndarray)) or not len(items):
        raise ShapeError(f"{name} takes a non-empty list of expressions, e.g. {name}([a, b])")
    return [as_expr(x) for x in items]


def _embedding(total: int, start: int, size: int, transposed: bool) -> Constant:
    """The (total, size) 0/1 matrix that places `size` entries at rows start … start+size−1
    (or its transpose), marked `embedding`: the compiler's column scales read through it, not
    as data (`scale_probe.data_reads`; read as data, its unit columns swamped the data's)."""
    out = np.zeros((total, size))
    out[np.arange(start, start + size), np.arange(size)] = 1.0
    constant = Constant(out.T if transposed else out)
    constant.embedding = True
    return constant


def _placed(parts: list[Expression], sizes: list[int], on_left: bool) -> Expression:
    """Σ_k E_k @ x_k (on_left) or Σ_k x_k @ E_kᵀ: the parts side by side along one axis."""
    total, start, terms = sum(sizes), 0, []
    for part, size in zip(parts, sizes):
        e = _embedding(total, start, size, transposed=not on_left)
        terms.append(matmul(e, part) if on_left else matmul(part, e))
        start += size
    return terms[0] if len(terms) == 1 and total == sizes[0] else add(*terms)


def hstack(items: Sequence[Any]) -> Expression:
    """numpy's hstack: vectors (and scalars) end to end into one vector; matrices with the same
    number of rows side by side."""
    xs = _items(items, "hstack")
    if all(x.ndim <= 1 for x in xs):
        xs = [reshape(x, (x.size,)) for x in xs]
        return _placed(xs, [x.size for x in xs], on_left=True)
    if not all(x.ndim == 2 for x in xs) or len({x.shape[0] for x in xs}) != 1:
        raise ShapeError("hstack: all vectors, or all matrices with the same number of rows; got "
                         f"shapes {[x.shape for x in xs]}")
    return _placed(xs, [x.shape[1] for x in xs], on_left=False)


def vstack(items: Sequence[Any]) -> Expression:
    """numpy's vstack: matrices with the same number of columns one above the other; a vector
    of length n is a row (1, n)."""
    xs = [reshape(x, (1, x.size)) if x.ndim <= 1 else x for x in _items(items, "vstack")]
    if not all(x.ndim == 2 for x in xs) or len({x.shape[1] for x in xs}) != 1:
        raise ShapeError("vstack: rows or matrices with the same number of columns; got shapes "
                         f"{[x.shape for x in _items(items, 'vstack')]}")
    return _placed(xs, [x.shape[0] for x in xs], on_left=True)
