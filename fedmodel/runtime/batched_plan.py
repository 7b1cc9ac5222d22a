"""A compiled `Plan` evaluated for many clients at once (the batched executor's engine).

Clients that share one model structure compile to plans with the same steps and different
constants (their data). `BatchedPlan` takes those plans and runs each step once for all of
them, on a *flat* representation: a per-client value of shape s_i is stored as the
concatenation of the clients' raveled values (a segmented vector). This covers ragged client
sizes (X_i: m_i × d with different m_i) without padding:

- elementwise atoms act on the concatenation directly (entry i of every client at once);
- broadcasting within a client: uniform shapes use a stacked view (n, *s); a per-client scalar
  against a ragged value is repeated over its segment;
- reductions (sum, mean, sum_squares, norms, log_sum_exp) are segment reductions
  (`np.add.reduceat`), or row reductions of the stacked view when every client has one shape;
- `data @ v` with per-client data is one sparse matrix-vector product with the block-diagonal
  matrix diag(X_1, …, X_n) (CSR, zeros dropped — MNIST pixels are ~80% zeros; mostly nonzero
  data of one width keeps its stacked rows: `dense_blocks.DenseBlocks`), so one pass
  gives every X_i v_i and, with the folded Xᵢᵀ, every X_iᵀ r_i;
- any other atom (indexing, quad_form, softmax, …) runs client by client with that client's
  own node (`loop` rule): correct for every atom, just not faster.

Results equal the per-client plans up to summation order (sparse vs BLAS dot products,
segment vs pairwise sums): a few ulps.
"""
from __future__ import annotations

from operator import attrgetter, is_, itemgetter
from typing import Any, Callable, Sequence

import numpy as np

from .. import atoms as A
from ..atoms.elementwise import Elementwise
from ..compiler.codegen import Plan
from ..compiler.inline_steps import _fused_pairs
from ..errors import FedModelError
from ..expression import Parameter, is_sparse
from ..lowering.rules import RuleTable
from .dense_blocks import DenseBlocks


_VALUE = attrgetter("_value")      # Parameter.value without the property call (1000s per step)


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


def _flat_constant(cache: dict[int, np.ndarray], values: list, slot: int) -> np.ndarray:
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


def _same_structure(plans: Sequence[Plan]) -> bool:
    return len({plan_signature(p) for p in plans}) == 1


def plan_signature(plan: Plan) -> tuple:
    """Structure of a plan (its steps and slots), without its constants' values or shapes:
    two clients with the same model and different data have the same signature."""
    steps = tuple((type(fn.__self__), fn.__self__.params(), args, out) for fn, args, out in plan.steps)
    params = tuple((slot, p.shape) for slot, p in plan.params)
    return (steps, params, tuple(sorted(plan.constant_slots)), tuple(plan.out_slots),
            tuple(v.shape for v in plan.inputs))


def _block_diag(blocks: list[np.ndarray]):
    """diag(B_1, …, B_n) as CSR without the zero entries (2-D blocks; 1-D blocks as rows)."""
    import scipy.sparse as sp
    blocks = [b.reshape(1, -1) if b.ndim == 1 else b for b in blocks]
    heights = np.array([b.shape[0] for b in blocks])
    widths = np.array([b.shape[1] for b in blocks])
    if len(set(widths.tolist())) > 1 and len(set(heights.tolist())) == 1:
        return _block_diag([b.T for b in blocks]).T.tocsr()     # Xᵢᵀ blocks: via diag(Xᵢ)ᵀ
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


class BatchedPlan:
    """`plans` (one per client, same structure) evaluated together on flat per-client inputs.

    Call with one flat array per plan input (the clients' values concatenated, see `Seg`); get
    one flat array per output. `input_segs` / `output_segs` give the layouts."""

    def __init__(self, plans: Sequence[Plan], cache: dict | None = None):
        if not plans or not _same_structure(plans):
            raise FedModelError("BatchedPlan needs plans of the same structure")
        self.plans = list(plans)
        self.n = n = len(plans)
        first = plans[0]
        self.kind: dict[int, str] = {}           # slot -> "B" (per client) | "C" (common)
        self.seg: dict[int, Seg] = {}
        self.common: dict[int, Any] = {}
        for i, leaf in enumerate(first.inputs):
            self.kind[i] = "B"
            self.seg[i] = Seg([p.inputs[i].shape for p in plans])
        for slot in first.constant_slots:
            values = [p.constant(slot) for p in plans]
            values = [v if is_sparse(v) else np.asarray(v) for v in values]   # sparse stays sparse
            if all(v is values[0] or (not is_sparse(v) and not is_sparse(values[0]) and
                                      v.shape == values[0].shape and np.array_equal(v, values[0]))
                   for v in values):
                self.kind[slot] = "C"
                v = values[0]
                self.common[slot] = v[()] if v.ndim == 0 else v
            else:
                self.kind[slot] = "B"
                self.seg[slot] = Seg([v.shape for v in values])
                self.common[slot] = values            # per-client arrays; flattened lazily
        self._const_flat: dict[int, np.ndarray] = {}
        # block-diagonal matrices by (ids of the blocks, transposed): shared between the plans
        # of one group (value-gradient and objective read the same data arrays)
        self._bd: dict[tuple, Any] = {} if cache is None else cache
        self._param_slots = [slot for slot, _ in first.params]
        self._params = [[dict(p.params)[slot] for p in plans] for slot in self._param_slots]
        for slot, params in zip(self._param_slots, self._params):
            self.kind[slot] = "B"
            self.seg[slot] = Seg([q.shape for q in params])
        self._param_cache: dict[int, tuple] = {}
        self._ops: list[Callable] = []
        self.rules: list[str] = []               # which rule serves each step (for tests/docs)
        for j, (fn, args, out) in enumerate(first.steps):
            nodes = [p.steps[j][0].__self__ for p in plans]
            self.kind[out] = "B"
            self.seg[out] = Seg([node.shape for node in nodes])
            rule, op = self._rule(nodes, args, out)
            self.rules.append(f"{type(nodes[0]).__name__}:{rule}")
            self._ops.append(op)
        self._fuse_logistic_sigmoid(first)
        self.out_slots = list(first.out_slots)
        self.output_segs = [self.seg.get(s) or Seg([np.shape(self.common[s])] * n) for s in self.out_slots]
        self.input_segs = [self.seg[i] for i in range(len(first.inputs))]
        # per-client scalar parameters whose value 0 (for every client) switches terms off, e.g.
        # the proximal weight ω of a merit that DALD configures with ω = 0: a pruned op list each
        self._zero_variants: list[tuple[int, list[Callable], list[int | None]]] = []
        for slot, params in zip(self._param_slots, self._params):
            if all(q.shape == () for q in params):
                variant = self._prune_zero(slot)
                if variant is not None:
                    self._zero_variants.append((slot, *variant))

    def _fuse_logistic_sigmoid(self, first: Plan) -> None:
        """logistic(a) and sigmoid(a) of one per-client slot (a logistic loss's value and
        derivative) computed by one `logistic_and_sigmoid` at the first of the two steps (one
        e^{−|a|} instead of two, and one exp less: bitwise the separate results, as the serial
        plans' `inline_steps._fused_pairs`); the second step then finds its result already there."""
        step_of = {out: j for j, (_, _, out) in enumerate(first.steps)}
        for j, pair in _fused_pairs(first.steps).items():
            if pair is None:
                continue
            kernel, (value, slope) = pair
            j_value, j_slope = step_of[value], step_of[slope]
            if not all(self.rules[i].endswith(":elementwise") for i in (j_value, j_slope)):
                continue
            slot = first.steps[j][1][0]
            g = self._getter((slot,))[0]

            def both(vals, g=g, value=value, slope=slope, kernel=kernel):
                vals[value], vals[slope] = kernel(g(vals))
            later = max(j_value, j_slope)
            alone = self._ops[later]            # (a pruned variant may drop the first step)

            def second(vals, out=first.steps[later][2], alone=alone):
                if out not in vals:
                    alone(vals)
            self._ops[min(j_value, j_slope)], self._ops[later] = both, second

    # ---- runtime -----------------------------------------------------------------------------
    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        vals: dict[int, Any] = {i: v for i, v in enumerate(inputs)}
        for slot, params in zip(self._param_slots, self._params):
            vals[slot] = self._gather_params(slot, params)
        for slot, ops, outs in self._zero_variants:
            if not vals[slot].any():            # the parameter is 0 for every client
                for op in ops:
                    op(vals)
                return [np.zeros(seg.total) if s is None else self._flat_output(s, vals)
                        for s, seg in zip(outs, self.output_segs)]
        for op in self._ops:
            op(vals)
        return [self._flat_output(s, vals) for s in self.out_slots]

    _ZERO_PRESERVING = (A.Multiply, A.Neg, A.Sum, A.SumSquares, A.MatMul, A.Reshape, A.Transpose,
                        A.BroadcastTo)

    def _prune_zero(self, zero_slot: int):
        """The steps left when parameter `zero_slot` is 0: a product with (or a sum, reshape,
        sum of squares of) a zero is zero, an addition of a zero forwards its other operand (same
        layout). Returns (ops, output slots with None for an output that is zero), or None when
        the parameter reaches a step these rules do not cover. Equal to the full plan for finite
        values (the full plan computes 0·v)."""
        first = self.plans[0]
        zero, alias, kept = {zero_slot}, {}, []
        for j, (fn, args, out) in enumerate(first.steps):
            node = fn.__self__
            args = tuple(alias.get(a, a) for a in args)
            hit = [a in zero for a in args]
            if not any(hit):
                kept.append((j, args, out))
            elif isinstance(node, self._ZERO_PRESERVING) and not isinstance(node, A.Add):
                zero.add(out)
            elif isinstance(node, A.Add):
                rest = [a for a, h in zip(args, hit) if not h]
                if not rest:
                    zero.add(out)
                elif len(rest) == 1 and self.kind.get(rest[0]) == "B" and rest[0] in self.seg and \
                        out in self.seg and self.seg[rest[0]].shapes == self.seg[out].shapes and \
                        not isinstance(self.common.get(rest[0]), list):
                    alias[out] = rest[0]
                else:
                    return None
            else:
                return None
        if not any(out in zero or out in alias for _, _, out in kept) and \
                len(kept) == len(first.steps):
            return None
        outs = [None if s in zero else alias.get(s, s) for s in self.out_slots]
        live = {s for s in outs if s is not None}
        needed = []
        for j, args, out in reversed(kept):      # drop steps whose results nobody reads
            if out in live:
                needed.append((j, args, out))
                live.update(args)
        ops = []
        for j, args, out in reversed(needed):
            nodes = [p.steps[j][0].__self__ for p in self.plans]
            ops.append(self._ops[j] if args == first.steps[j][1] else self._rule(nodes, args, out)[1])
        return ops, outs

    def _gather_params(self, slot: int, params: list) -> np.ndarray:
        """Current values of one parameter of every client, flat; reused while no parameter
        was assigned since, or every client still holds the very same value objects."""
        cached = self._param_cache.get(slot)
        if cached is not None and cached[2] == Parameter.assignments:
            return cached[1]
        values = list(map(_VALUE, params))
        if cached is not None and all(map(is_, values, cached[0])):
            flat = cached[1]
        elif any(v is None for v in values):
            raise FedModelError(f"parameter {params[0].name!r} has no value; set .value first")
        else:   # (values of one shape: one np.array, not a ravel each: 40 µs → 1 at n = 40)
            flat = np.array(values, dtype=float).ravel() if self.seg[slot].uniform is not None else \
                np.concatenate([np.ravel(v) for v in values]).astype(float, copy=False)
        self._param_cache[slot] = (values, flat, Parameter.assignments)
        return flat

    def _flat_output(self, slot: int, vals: dict) -> np.ndarray:
        return vals[slot] if slot in vals else self._value(slot, vals, self.seg.get(slot))

    def _const(self, slot: int) -> np.ndarray:
        return _flat_constant(self._const_flat, self.common[slot], slot)

    def _value(self, slot: int, vals: dict, seg: Seg | None):
        """Flat per-client value of a slot (a common constant is tiled when `seg` needs it)."""
        if self.kind[slot] == "B":
            return vals[slot] if slot in vals else self._const(slot)
        value = np.asarray(self.common[slot], float)
        return np.tile(value.ravel(), self.n)

    # ---- rules -------------------------------------------------------------------------------
    def _arg(self, slot: int):
        """Accessor of an argument at run time: ("C", value) or ("B", seg)."""
        if self.kind[slot] == "C":
            return "C", self.common[slot]
        if isinstance(self.common.get(slot), list):     # per-client constant (data)
            return "K", self.seg[slot]
        return "B", self.seg[slot]

    def _rule(self, nodes: list, args: tuple, out: int) -> tuple[str, Callable]:
        node = nodes[0]
        out_seg = self.seg[out]
        kinds = [self._arg(a) for a in args]
        get = self._getter(args)
        if all(k == "C" for k, _ in kinds):            # only parameters could make this per client
            value = node.numeric(*[v for _, v in kinds])
            self.kind[out] = "C"
            self.common[out] = value
            del self.seg[out]
            return "common", lambda vals: None
        # an atom without a rule runs client by client too (right for any atom);
        # tests/test_atom_rules.py is what makes every atom state its rule
        rule = BATCHED_RULES.find(node)
        found = rule(node, self, nodes, args, kinds, out_seg, out, get) if rule else None
        return found or ("loop", self._loop(nodes, args, out, get))

    def _getter(self, args: tuple) -> list[Callable]:
        """Per argument, a function vals -> flat per-client array (or a common value)."""
        out = []
        for a in args:
            if self.kind[a] == "C":
                value = self.common[a]
                out.append(lambda vals, v=value: v)
            elif isinstance(self.common.get(a), list):  # per-client constant (not self._const: a cycle)
                out.append(lambda vals, a=a, cache=self._const_flat, values=self.common[a]:
                           _flat_constant(cache, values, a))
            else:
                out.append(itemgetter(a))       # vals[a] (a C call: the most frequent of a step's calls)
        return out

    def _broadcast_rule(self, node, args, kinds, out_seg: Seg, out: int, get) -> tuple[str, Callable]:
        fn = node.numeric
        if all(k == "C" and np.ndim(v) == 0 or k != "C" and v.shapes == out_seg.shapes
               for k, v in kinds):                        # same shapes: entry by entry (two: no list)
            return "elementwise", (lambda vals, a=get[0], b=get[-1]: vals.__setitem__(out, fn(a(vals), b(vals)))) \
                if len(get) == 2 else (lambda vals: vals.__setitem__(out, fn(*[g(vals) for g in get])))
        if out_seg.uniform is not None and all(k == "C" or v.uniform is not None for k, v in kinds):
            n, rank = self.n, len(out_seg.uniform)
            shapers = []
            for k, v in kinds:
                if k == "C":
                    shapers.append(None)
                else:
                    shapers.append((n,) + (1,) * (rank - len(v.uniform)) + v.uniform)

            def stacked(vals, full=(n,) + out_seg.uniform):    # (a result of full shape: no broadcast_to)
                r = fn(*[g(vals) if s is None else g(vals).reshape(s) for g, s in zip(get, shapers)])
                vals[out] = r.ravel() if np.shape(r) == full else np.ascontiguousarray(np.broadcast_to(r, full)).ravel()
            return "stacked", stacked
        if all((k == "C" and np.ndim(v) == 0) or (k != "C" and (v.shapes == out_seg.shapes or v.scalar))
               for k, v in kinds):                        # ragged: repeat per-client scalars
            spread = [k != "C" and v.scalar and not out_seg.scalar for k, v in kinds]

            def ragged(vals):
                parts = [out_seg.repeat(g(vals)) if s else g(vals) for g, s in zip(get, spread)]
                vals[out] = fn(*parts)
            return "ragged", ragged
        return "loop", self._loop(None, args, out, get)

    def _matmul_rule(self, nodes, args, kinds, out, get):
        (ka, sa), (kb, sb) = kinds
        n = self.n
        # per-client data @ per-client vector/matrix: one block-diagonal sparse product
        if ka == "K" and kb == "B" and all(len(s) in (1, 2) for s in sa.shapes):
            k = sb.shapes[0][1:] if all(len(s) == 2 for s in sb.shapes) else ()
            if all(s[1:] == k for s in sb.shapes):
                g = get[1]
                if k:
                    bd = self._block(args[0], transpose=False)
                    return "block-diagonal", lambda vals: vals.__setitem__(out, (bd @ g(vals).reshape(-1, k[0])).ravel())
                bd = self._block(args[0], transpose=False, dense=True)
                return "block-diagonal", lambda vals: vals.__setitem__(out, bd @ g(vals))
        if ka == "B" and kb == "K" and all(len(s) == 1 for s in sa.shapes):
            bd = self._block(args[1], transpose=True, dense=True)     # v @ B = Bᵀ v
            g = get[0]
            return "block-diagonal", lambda vals: vals.__setitem__(out, bd @ g(vals))
        # a matrix shared by every client
        if ka == "C" and np.ndim(sa) == 2 and kb == "B" and sb.uniform is not None and len(sb.uniform) == 1:
            M, g = (sa if is_sparse(sa) else np.asarray(sa)), get[1]
            return "shared-matrix", lambda vals: vals.__setitem__(out, (g(vals).reshape(n, -1) @ M.T).ravel())
        if kb == "C" and np.ndim(sb) == 2 and ka == "B" and sa.uniform is not None and len(sa.uniform) == 1:
            M, g = (sb if is_sparse(sb) else np.asarray(sb)), get[0]
            return "shared-matrix", lambda vals: vals.__setitem__(out, (g(vals).reshape(n, -1) @ M).ravel())
        return None

    def _block(self, slot: int, transpose: bool, dense: bool = False):
        """diag(C_1, …, C_n) of a per-client constant (transposed: diag(C_1ᵀ, …)). A folded
        `X.T` is a view of X: its matrix is diag(X_i)ᵀ, sharing the data of diag(X_i), so the
        gradient's Xᵀr reads the same memory as Xw (half the traffic, one copy of the data)."""
        if any(is_sparse(v) for v in self.common[slot]):
            return self._sparse_block(self.common[slot], transpose)
        blocks = [np.asarray(v, float) for v in self.common[slot]]
        if transpose:
            blocks = [b.T if b.ndim == 2 else b for b in blocks]   # 1-D: v @ c = c as a row
        if all(b.ndim == 2 and b.base is not None and b.base.ndim == 2 and b.base.T.shape == b.shape
               and np.shares_memory(b, b.base) and b.strides == b.base.T.strides for b in blocks):
            return self._block_of([b.base for b in blocks], dense).T   # CSC view of the same arrays
        return self._block_of(blocks, dense)

    def _block_of(self, blocks: list[np.ndarray], dense: bool = False):
        """diag(blocks), built once per group: CSR, or with `dense` (the caller multiplies
        vectors only) a `DenseBlocks` when the data is mostly nonzero (same numbers, no index
        reads: ~1.5× faster per product on dense data)."""
        key = tuple(id(b) for b in blocks)
        if dense:
            if (key, "dense") not in self._bd:      # (keep the blocks: their ids stay unique)
                self._bd[(key, "dense")] = (DenseBlocks.of(blocks), blocks)
            if self._bd[(key, "dense")][0] is not None:
                return self._bd[(key, "dense")][0]
        if key not in self._bd:
            self._bd[key] = (_block_diag(blocks), blocks)
        return self._bd[key][0]

    def _sparse_block(self, values: list, transpose: bool):
        """diag(C_i) (transposed: diag(C_iᵀ)) of per-client constants some of which are sparse,
        never densified: one CSR diag of the clients' data in CSR orientation, built once per
        group, and its transpose (a CSC view of the same arrays) where the step reads Cᵀ. A
        folded `X.T` (CSC, a view of the CSR X) so shares the matrix of X's products."""
        import scipy.sparse as sp
        oriented, flipped = [], []
        for v in values:
            v = v if is_sparse(v) else sp.csr_array(np.atleast_2d(np.asarray(v, float)))
            flipped.append(v.format == "csc")
            oriented.append(v.T if v.format == "csc" else v.tocsr())   # (a view for csr/csc)
        if len(set(flipped)) > 1:      # mixed orientations (rare): each block as the step reads it
            blocks = [(v if f else v.T) if transpose else (v.T if f else v) for v, f in zip(oriented, flipped)]
            return sp.block_diag([b.tocsr() for b in blocks], format="csr")
        # keyed by the stored arrays (X and a folded X.T share them); the entry keeps them alive
        key = ("sparse", tuple(id(v.data) for v in oriented))
        if key not in self._bd:
            base = sp.block_diag(oriented, format="csr")
            index = np.int32 if max(base.nnz, *base.shape) < 2**31 - 1 else np.int64
            base.indices, base.indptr = base.indices.astype(index), base.indptr.astype(index)
            self._bd[key] = (base, oriented)
        base = self._bd[key][0]
        return base.T if flipped[0] != transpose else base

    def _loop(self, nodes, args, out: int, get) -> Callable:
        """Client by client with each client's own node (any atom)."""
        if nodes is None:                       # broadcast fallback: the step's nodes by client
            j = next(i for i, o in enumerate(self.plans[0].steps) if o[2] == out)
            nodes = [p.steps[j][0].__self__ for p in self.plans]
        segs = [self.seg.get(a) if self.kind[a] == "B" else None for a in args]
        out_seg = self.seg[out]

        def loop(vals):
            parts = [g(vals) if s is None else s.split(g(vals)) for g, s in zip(get, segs)]
            results = []
            for i, node in enumerate(nodes):
                r = node.numeric(*[p if s is None else p[i] for p, s in zip(parts, segs)])
                results.append(np.ravel(np.broadcast_to(r, out_seg.shapes[i])))
            vals[out] = np.concatenate(results).astype(float) if results else np.zeros(0)
        return loop


# ---- per-atom rules ---------------------------------------------------------------------------
# rule(node, plan, nodes, args, kinds, out_seg, out, get) -> (name, op), or None where this step's
# layout has no vectorized form: then the step runs client by client (`BatchedPlan._loop`).
BATCHED_RULES = RuleTable(lambda node: FedModelError(
    f"the batched plan has no rule for the atom {type(node).__name__} ({node.display})"),
    name="batched")
batched_rule = BATCHED_RULES.register


@batched_rule(Elementwise, A.Neg)
def _elementwise(node, plan, nodes, args, kinds, out_seg, out, get):
    """Entry by entry on the concatenation (every client's entry i at once)."""
    if len(args) != 1:
        return None
    fn, g = node.numeric, get[0]
    return "elementwise", lambda vals: vals.__setitem__(out, fn(g(vals)))


@batched_rule(A.Add, A.Multiply, A.Maximum, A.GreaterEqual)
def _broadcasting(node, plan, nodes, args, kinds, out_seg, out, get):
    return plan._broadcast_rule(node, args, kinds, out_seg, out, get)


@batched_rule(A.Transpose, A.Reshape)
def _view(node, plan, nodes, args, kinds, out_seg, out, get):
    """Row-major: the flat vector of a reshape (or of a vector's transpose) is unchanged."""
    if isinstance(node, A.Reshape) or len(node.args[0].shape) < 2:
        g = get[0]
        return "view", lambda vals: vals.__setitem__(out, g(vals))
    return None


@batched_rule(A.Sum, A.Mean)
def _sum(node, plan, nodes, args, kinds, out_seg, out, get):
    """Segment sums over all entries; row sums of the stacked view along an axis."""
    mean = type(node) is A.Mean
    seg, g = kinds[0][1], get[0]
    if node.axis is None:
        if mean:
            counts = np.array([float(nd.count) for nd in nodes])
            return "segment-mean", lambda vals: vals.__setitem__(
                out, seg.segment_reduce(np.add, g(vals)) / counts)
        return "segment-sum", lambda vals: vals.__setitem__(out, seg.segment_reduce(np.add, g(vals)))
    if seg.uniform is not None:
        axis = node.axis + 1
        if not mean:
            return "row-sum", lambda vals: vals.__setitem__(
                out, np.add.reduce(seg.stack(g(vals)), axis=axis).ravel())
        counts = np.array([float(nd.count) for nd in nodes]).reshape((-1,) + (1,) * len(out_seg.uniform))
        return "row-mean", lambda vals: vals.__setitem__(
            out, (np.add.reduce(seg.stack(g(vals)), axis=axis) / counts).ravel())
    return None


_SEGMENT_NORMS = {
    A.SumSquares: lambda seg, v: seg.segment_reduce(np.add, v * v),
    A.Norm1: lambda seg, v: seg.segment_reduce(np.add, np.abs(v)),
    A.Norm2: lambda seg, v: np.sqrt(seg.segment_reduce(np.add, v * v)),
    A.NormInf: lambda seg, v: seg.segment_reduce(np.maximum, np.abs(v), -np.inf)}


@batched_rule(*_SEGMENT_NORMS)
def _segment_norm(node, plan, nodes, args, kinds, out_seg, out, get):
    if kinds[0][0] == "C":
        return None
    seg, g, norm = kinds[0][1], get[0], _SEGMENT_NORMS[type(node)]
    if seg.scalar and type(node) is A.SumSquares:     # per-client scalars: v², what a reduction of one is
        return "elementwise", lambda vals: vals.__setitem__(out, g(vals) * g(vals))
    return "segment-norm", lambda vals: vals.__setitem__(out, norm(seg, g(vals)))


@batched_rule(A.LogSumExp)
def _log_sum_exp(node, plan, nodes, args, kinds, out_seg, out, get):
    if node.axis is not None or kinds[0][0] == "C":
        return None
    seg, g = kinds[0][1], get[0]

    def lse(vals):
        x = g(vals)
        top = seg.segment_reduce(np.maximum, x, -np.inf)
        vals[out] = np.log(seg.segment_reduce(np.add, np.exp(x - seg.repeat(top)))) + top
    return "segment-lse", lse


@batched_rule(A.MatMul)
def _matmul(node, plan, nodes, args, kinds, out_seg, out, get):
    return plan._matmul_rule(nodes, args, kinds, out, get)


@batched_rule(A.BroadcastTo)
def _broadcast_to(node, plan, nodes, args, kinds, out_seg, out, get):
    if not (kinds[0][0] == "B" and kinds[0][1].uniform is not None and out_seg.uniform is not None):
        return None
    seg, g, target, n = kinds[0][1], get[0], out_seg.uniform, plan.n
    lead = (1,) * (len(target) - len(seg.uniform))
    return "broadcast", lambda vals: vals.__setitem__(out, np.broadcast_to(
        g(vals).reshape((n,) + lead + seg.uniform), (n,) + tuple(target)).ravel())


@batched_rule(A.Index, A.IndexAdjoint, A.SumTo, A.ArgmaxAbs, A.QuadForm, A.Softmax)
def _client_by_client(node, plan, nodes, args, kinds, out_seg, out, get):
    """No vectorized form (yet): indexing and its adjoint, the sum back over broadcast axes,
    argmax, quad_form and softmax run each client's own node (`loop`): right, not faster."""
    return None
