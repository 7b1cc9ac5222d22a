"""The batched executor's flat layout (`batched_plan`): a per-client value of shape s_i stored
as the concatenation of the clients' raveled values, its segments (`Seg`), the clients'
constants as one flat vector (`flat_constant`) and their data as one block-diagonal CSR matrix
(`block_diag`)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import FedModelError
from ..expression import is_sparse


class Seg:
    """Per-client shapes of one slot and the offsets of their segments in the flat vector."""

    def __init__(self, shapes: Sequence[tuple]):
        self.shapes = [tuple(s) for s in shapes]
        self.n = len(self.shapes)
        self.sizes = np.array([int(np.prod(s)) for s in self.shapes], dtype=np.intp)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.intp)
        self.total = int(self.offsets[-1])
        first = self.shapes[0]
        self.uniform = first if all(s == first for s in self.shapes) else None
        self.scalar = self.uniform == ()

    def stack(self, flat: np.ndarray) -> np.ndarray:
        return flat.reshape((self.n,) + self.uniform)

    def split(self, flat: np.ndarray) -> list[np.ndarray]:
        o = self.offsets
        return [flat[o[i]:o[i + 1]].reshape(s) for i, s in enumerate(self.shapes)]

    def segment_reduce(self, ufunc: np.ufunc, flat: np.ndarray, empty: float = 0.0) -> np.ndarray:
        """ufunc-reduction of each client's segment → (n,)."""
        if self.uniform is not None:
            return ufunc.reduce(flat.reshape(self.n, -1), axis=1) if self.sizes[0] else \
                np.full(self.n, empty)
        out = np.full(self.n, empty)
        keep = self.sizes > 0
        if keep.any():
            out[keep] = ufunc.reduceat(flat, self.offsets[:-1][keep])
        return out

    def repeat(self, per_client: np.ndarray) -> np.ndarray:
        """Per-client scalars (n,) spread over each client's segment."""
        return np.repeat(per_client, self.sizes)


# scipy.sparse client data is multiplied as sparse (`BatchedPlan._sparse_block`); a step that
# needs its entries one by one (an elementwise product with the data itself) densifies it only
# up to this many entries over the group, else refuses (FedModelError, naming the serial executor)
SPARSE_DENSIFY_MAX = 1_000_000


def flat_constant(cache: dict[int, np.ndarray], values: list, slot: int) -> np.ndarray:
    """The clients' values of per-client constant `slot` as one flat vector, made on first use
    and kept in `cache`."""
    if slot not in cache:
        if any(is_sparse(v) for v in values):
            entries = sum(int(np.prod(v.shape)) for v in values)
            if entries > SPARSE_DENSIFY_MAX:
                raise FedModelError(
                    f"the batched executor would densify sparse client data ({entries} entries "
                    "over the group) for a step other than a product with it (X @ w, X.T @ r); "
                    "solve with executor='serial', which keeps every step sparse")
            values = [v.toarray() if is_sparse(v) else v for v in values]
        cache[slot] = np.concatenate([np.ravel(v) for v in values]).astype(float)
    return cache[slot]


def block_diag(blocks: list[np.ndarray]):
    """diag(B_1, …, B_n) as CSR without the zero entries (2-D blocks; 1-D blocks as rows)."""
    import scipy.sparse as sp
    blocks = [b.reshape(1, -1) if b.ndim == 1 else b for b in blocks]
    heights = np.array([b.shape[0] for b in blocks])
    widths = np.array([b.shape[1] for b in blocks])
    if len(set(widths.tolist())) > 1 and len(set(heights.tolist())) == 1:
        return block_diag([b.T for b in blocks]).T.tocsr()     # Xᵢᵀ blocks: via diag(Xᵢ)ᵀ
    if len(set(widths.tolist())) == 1:
        # equal widths (clients' X_i with m_i rows): one nonzero scan of the stacked rows, in
        # row-major order, which is already CSR order
        stacked = np.concatenate(blocks, axis=0) if blocks else np.zeros((0, 0))
        rows, cols = np.nonzero(stacked)
        owner = np.repeat(np.arange(len(blocks)), heights)
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=stacked.shape[0]))])
        shape = (int(heights.sum()), int(widths.sum()))
        # one index dtype for indices and indptr: scipy would otherwise convert them on every
        # product (a copy of the index arrays, 3× the cost of the product itself)
        index = np.int32 if max(len(rows), *shape) < 2**31 - 1 else np.int64
        return sp.csr_matrix((stacked[rows, cols].astype(float),
                              (cols + owner[rows] * int(widths[0])).astype(index),
                              indptr.astype(index)), shape=shape)
    row0 = np.concatenate([[0], np.cumsum(heights)])
    col0 = np.concatenate([[0], np.cumsum(widths)])
    rows, cols, data = [], [], []
    for b, r, c in zip(blocks, row0, col0):
        i, j = np.nonzero(b)
        rows.append(i + r)
        cols.append(j + c)
        data.append(b[i, j])
    coo = sp.coo_matrix((np.concatenate(data).astype(float), (np.concatenate(rows), np.concatenate(cols))),
                        shape=(int(row0[-1]), int(col0[-1])))
    return coo.tocsr()
