"""A checkpoint's fingerprint (fedmodel/runtime/checkpoint.py): a SHA-256 of the problem's
structure and data (dense or scipy sparse) and of the backend's class and options, so that a
checkpoint of another problem or other settings is refused."""
from __future__ import annotations

import hashlib

import numpy as np


def fingerprint(problem, backend, version: int) -> str:
    """SHA-256 of the problem's structure and data and of the backend's class and options (and
    of the checkpoint format's `version`).
    Independent of variable uids and default names (they differ between processes)."""
    h = hashlib.sha256(f"fedmodel-checkpoint-{version}".encode())
    leaves: dict[int, int] = {}
    memo: dict[int, str] = {}
    for block in problem.blocks:
        h.update(f"|block {type(block).__name__} {block.name}".encode())
        for term in block.terms:
            h.update(b"|term ")
            h.update(_expr_token(term, leaves, memo, h).encode())
        for c in block.constraints:
            h.update(f"|constraint {type(c).__name__} {c.name} ".encode())
            h.update(_expr_token(c.expr, leaves, memo, h).encode())
    h.update(f"|backend {type(backend).__module__}.{type(backend).__qualname__}".encode())
    for name in sorted(vars(backend)):
        if not name.startswith("_"):
            h.update(f"|{name}=".encode())
            _update(h, getattr(backend, name))
    return h.hexdigest()


def _expr_token(node, leaves: dict[int, int], memo: dict[int, str], h) -> str:
    """A canonical text for an expression DAG; leaf values go into the hash `h` directly."""
    from ..expression import Constant, Leaf, Parameter, is_sparse
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, Leaf):
        if node.uid not in leaves:           # first visit: number it and hash its value
            leaves[node.uid] = len(leaves)
            h.update(f"|leaf{leaves[node.uid]} {type(node).__name__} {node.shape}".encode())
            if getattr(node, "remote", False):   # loader data: identified by its loader, not read
                loader = node.loader
                h.update(f"|loader {getattr(loader, '__module__', '')}."
                         f"{getattr(loader, '__qualname__', type(loader).__name__)}".encode())
            elif isinstance(node, (Constant, Parameter)):
                value = node.value
                _update(h, value if value is None or is_sparse(value) else np.asarray(value, float))
        token = f"L{leaves[node.uid]}"
    else:
        extras = {k: v for k, v in vars(node).items() if k not in ("args", "shape") and not k.startswith("_")}
        args = ",".join(_expr_token(a, leaves, memo, h) for a in node.args)
        token = f"{type(node).__name__}{node.shape}[{_simple(extras)}]({args})"
    memo[id(node)] = token
    return token


def _simple(value, depth: int = 0) -> str:
    if depth > 6:
        return "..."
    if isinstance(value, np.ndarray):
        return f"array{value.shape}:{hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:16]}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_simple(v, depth + 1)}"
                              for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + "}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_simple(v, depth + 1) for v in value) + ")"
    if isinstance(value, (str, int, float, bool, type(None), slice, np.number)):
        return repr(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__          # functions: by name (lambdas have stable qualnames)
    if hasattr(value, "__dict__"):         # option objects (e.g. a schedule): by their fields
        public = {k: v for k, v in vars(value).items() if not k.startswith("_")}
        return f"{type(value).__qualname__}{_simple(public, depth + 1)}"
    return type(value).__name__


def _update(h, value) -> None:
    from ..expression import is_sparse
    if is_sparse(value):     # scipy sparse data (np.asarray would make an object array of it)
        import scipy.sparse as sp       # (here only: importing fedmodel loads no scipy)
        csr = sp.csr_array(value, dtype=float)          # a copy in one canonical form
        csr.sum_duplicates()
        csr.sort_indices()
        h.update(f"sparse{csr.shape}".encode())
        # indices as int64: scipy picks int32 or int64 by size and history, not by content
        for part in (csr.indptr.astype(np.int64), csr.indices.astype(np.int64), csr.data):
            _update(h, part)
    elif isinstance(value, np.ndarray):
        h.update(f"array{value.shape}{value.dtype}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    else:
        h.update(_simple(value).encode())
