"""The data products of a Hessian-vector product ∇(∇P_i · v): the nodes A @ (s ∘ v) of the
direction v with A a constant (data, or an expression of data), which the structured Hessians
read (`low_rank`: diagonal plus few data rows; `gram_hessian`: Gram products), and the random
direction both check their matrices on.
"""
from __future__ import annotations

import functools

import numpy as np

from ..atoms.arithmetic import Multiply
from ..atoms.linear import MatMul
from ..expression import Constant, Parameter, Variable


def scale_of(node, direction):
    """s where `node` is s ∘ v of the direction v (1.0 for v itself) with s a constant; else None."""
    if node is direction:
        return 1.0
    if isinstance(node, Multiply) and len(node.args) == 2:
        a, b = node.args
        if b is direction and isinstance(a, Constant):
            a, b = b, a
        if a is direction and isinstance(b, Constant) and b.ndim <= 1 and not hasattr(b.value, "toarray"):
            return b
    return None


def data_product(node, direction):
    """(A, s) where `node` is A @ (s ∘ v) of the direction v with A free of variables and
    parameters (a constant, data, or an expression of them: a slice), s as `scale_of`; else None."""
    if not isinstance(node, MatMul):
        return None
    scale = scale_of(node.args[1], direction)
    if scale is None or not is_constant(node.args[0]):
        return None
    return node.args[0], scale


def is_constant(node) -> bool:
    """Whether no variable and no parameter (directions included) occurs in `node`."""
    return not any(isinstance(leaf, (Variable, Parameter)) for leaf in node.leaves())


def value_of(node):
    """The value of a constant expression: a float array, or scipy.sparse CSR (a slice of sparse
    data evaluates to one wrapped in a 0-d object array)."""
    value = node.value
    if isinstance(value, np.ndarray) and value.dtype == object and value.shape == ():
        value = value.item()
    return value.tocsr() if hasattr(value, "toarray") else np.asarray(value, dtype=float)


@functools.lru_cache(maxsize=8)
def check_direction(n: int) -> np.ndarray:
    """The checks' random direction, the same for every program of n unknowns (read-only, made
    once: a generator per Hessian was a tenth of 1,000 tiny clients' sums)."""
    v = np.random.default_rng(n).standard_normal(n)
    v.flags.writeable = False
    return v
