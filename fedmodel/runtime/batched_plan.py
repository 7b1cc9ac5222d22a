"""A compiled `Plan` evaluated for many clients at once (the batched executor's engine).

Clients that share one model structure compile to plans with the same steps and different
constants (their data). `BatchedPlan` takes those plans and runs each step once for all of
them, on a *flat* representation (`segments`): a per-client value of shape s_i is stored as
the concatenation of the clients' raveled values. Ragged client sizes (X_i: m_i × d with
different m_i) need no padding; each atom's rule (`batched_rules`):

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
from ..compiler.codegen import Plan
from ..compiler.inline_steps import fused_pairs
from ..errors import FedModelError
from ..expression import Parameter, is_sparse
from .batched_rules import BATCHED_RULES
from .dense_blocks import DenseBlocks
from .segments import Seg, block_diag, flat_constant


_VALUE = attrgetter("_value")      # Parameter.value without the property call (1000s per step)


def _same_structure(plans: Sequence[Plan]) -> bool:
    return len({plan_signature(p) for p in plans}) == 1


def plan_signature(plan: Plan) -> tuple:
    """Structure of a plan (its steps and slots), without its constants' values or shapes:
    two clients with the same model and different data have the same signature."""
    steps = tuple((type(fn.__self__), fn.__self__.params(), args, out) for fn, args, out in plan.steps)
    params = tuple((slot, p.shape) for slot, p in plan.params)
    return (steps, params, tuple(sorted(plan.constant_slots)), tuple(plan.out_slots),
            tuple(v.shape for v in plan.inputs))


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
        plans' `inline_steps.fused_pairs`); the second step then finds its result already there."""
        step_of = {out: j for j, (_, _, out) in enumerate(first.steps)}
        for j, pair in fused_pairs(first.steps).items():
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
        return flat_constant(self._const_flat, self.common[slot], slot)

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
                           flat_constant(cache, values, a))
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
            self._bd[key] = (block_diag(blocks), blocks)
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
