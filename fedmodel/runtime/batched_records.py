"""Per-record gradients of a whole group of same-structure clients at once.

`privacy.clipped_record_gradients` and `privacy.record_sensitivity` work on one node: its
`compiler.per_record.RecordGradients` rewrites each product `A @ w` of the objective as a
variable S and compiles two plans, S from w and u = ∂f/∂S from (w, S); record i's gradient term
is a_i ⊗ u_i, of L1 norm ‖a_i‖₁‖u_i‖₁. `GroupRecordGradients` evaluates those plans for every
client of a `batched_group.Group` with one `batched_plan.BatchedPlan` each (ragged records are
segments of one flat vector), and the clipping correction Σ_i a_i ⊗ (s_i − 1)u_i as one
product with the block-diagonal diag(A_1, …, A_n)ᵀ (the matrices shared with the group's own
plans). The numbers are the per-node ones up to summation order (a few ulps); the clipping
decisions (‖term‖₁ > bound) are the same comparisons.

Used by the client steps written over rows of clients (on the batched and JAX executors; on one
client, `client_step.NodeRows`, `NodeRecordGradients` gives its program's own terms); the
records never leave the nodes' programs.
"""
from __future__ import annotations

import numpy as np

from ..compiler.codegen import Plan
from ..compiler.per_record import RecordGradients
from ..errors import FedModelError
from ..expression import Expression, Leaf
from .batched_group import Group
from .batched_plan import BatchedPlan
from .segments import Seg
from .client_step import NodeRows
from .privacy import _record_gradients


class GroupRecordGradients:
    """The per-record gradient terms of each client's objective for every client of `group`,
    evaluated together. Raises `NotRecordSeparable` as the per-node version does,
    and `FedModelError` when the clients' records are not laid out alike (products with equal
    row counts must be the same products for every client)."""

    def __init__(self, group: Group):
        programs = group.programs
        per_node = [_record_gradients(p) for p in programs]
        first = per_node[0]
        self.n, self.n_x = group.n, group.n_x
        self.empty = not first.products
        if any(bool(r.products) == self.empty for r in per_node):
            raise FedModelError("GroupRecordGradients: the clients' objectives differ in their products")
        if self.empty:
            return
        count = len(first.products)
        if any(len(r.products) != count for r in per_node):
            raise FedModelError("GroupRecordGradients: the clients' objectives differ in their products")
        # products with the same row count are the same records (their norms add): the same
        # partition of the products for every client, else the per-node path
        classes = [_classes([p.rows.shape[0] for p in r.products]) for r in per_node]
        if any(c != classes[0] for c in classes):
            raise FedModelError("GroupRecordGradients: the clients' products share records differently")
        self.classes = classes[0]
        cache = group._blocks                       # the group's block-diagonal data, shared
        # u = ∂f/∂S as functions of the shared variables alone (S := A @ w substituted back):
        # the per-node adjoint plans take S, whose row count differs between clients
        self.adjoint = BatchedPlan([_adjoint_plan(r) for r in per_node], cache)
        shared = programs[0].shared
        self.offsets = [int(o) for o in shared.offsets]
        self.products = []          # per product: (rows Seg, width k, adjoint broadcast?, row ‖a_i‖₁, A, var)
        for j in range(count):
            rows = [r.products[j].rows.shape for r in per_node]
            seg_rows = Seg([(s[0],) for s in rows])
            width = int(np.prod(rows[0][1:], dtype=int))
            if any(int(np.prod(s[1:], dtype=int)) != width for s in rows):
                raise FedModelError("GroupRecordGradients: the clients' products differ in width")
            out_seg = self.adjoint.output_segs[j]
            broadcast = out_seg.shapes != [tuple(s) for s in rows]
            row_l1 = np.concatenate([r._row_l1[j] for r in per_node]).astype(float)
            blocks = [np.asarray(r.products[j].data.value, float) for r in per_node]
            var = first._shared.index(first.products[j].product.args[1].uid)
            self.products.append((seg_rows, width, broadcast, row_l1, blocks, var, rows))

    def _matrix(self, j: int):
        """diag(A_1, …, A_n) of product j (CSR), from the group's cache of block matrices (built
        there once when the group's plans have not built it)."""
        return self.adjoint._block_of(self.products[j][4])

    def _inputs(self, X: np.ndarray) -> list[np.ndarray]:
        o = self.offsets
        return [np.ascontiguousarray(X[:, o[i]:o[i + 1]]).ravel() for i in range(len(o) - 1)]

    def _terms(self, X: np.ndarray) -> tuple[list[np.ndarray], dict[int, np.ndarray]]:
        """Per product the adjoints u as (Σ m_i, k) blocks; per record class the L1 norms of the
        records' terms (flat over the clients' records, summed over the class's products)."""
        adjoints = []
        for j, (u, (seg, width, broadcast, _, _, _, shapes)) in \
                enumerate(zip(self.adjoint(*self._inputs(X)), self.products)):
            if broadcast:           # as `np.broadcast_to(u, S.shape)` per client
                parts = self.adjoint.output_segs[j].split(u)
                u = np.concatenate([np.ravel(np.broadcast_to(p, s)) for p, s in zip(parts, shapes)])
            adjoints.append(np.asarray(u, float).reshape(-1, width))
        totals = {}
        for c, members in enumerate(self.classes):
            total = 0.0
            for j in members:
                row_l1 = self.products[j][3]
                total = total + row_l1 * np.abs(adjoints[j]).sum(axis=1)
            totals[c] = total
        return adjoints, totals

    def max_l1(self, X: np.ndarray) -> np.ndarray:
        """(n,): each client's max_i ‖record i's gradient term‖₁ at its row of X (n, n_x)
        (`RecordGradients.max_l1`, `privacy.record_sensitivity`)."""
        if self.empty:
            return np.zeros(self.n)
        _, totals = self._terms(X)
        out = np.full(self.n, -np.inf)
        for c, t in totals.items():
            seg = self.products[self.classes[c][0]][0]
            out = np.maximum(out, seg.segment_reduce(np.maximum, t, empty=-np.inf))
        return out

    def clipping_correction(self, X: np.ndarray, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(correction (n, n_x), clipped (n,) bool): per client Σ_i (s_i − 1)·(record i's term),
        s_i = min(1, bound_i/‖term_i‖₁) (`RecordGradients.clipping_correction`), and whether any
        of its terms exceeded its bound — the clients where it did not keep ∇f as it is (their
        correction rows are 0 and must not be added, as the per-node step adds none)."""
        correction = np.zeros((self.n, self.n_x))
        clipped = np.zeros(self.n, dtype=bool)
        if self.empty:
            return correction, clipped
        bound = np.broadcast_to(np.asarray(bound, float), (self.n,))
        adjoints, totals = self._terms(X)
        shrink = {}
        for c, t in totals.items():
            seg = self.products[self.classes[c][0]][0]
            b = seg.repeat(bound)
            over = t > b
            clipped |= seg.segment_reduce(np.logical_or, over, empty=False).astype(bool)
            with np.errstate(divide="ignore"):
                shrink[c] = np.where(over, b / t, 1.0) - 1.0
        if not clipped.any():
            return correction, clipped
        for c, members in enumerate(self.classes):
            for j in members:
                _, width, _, _, blocks, var, _ = self.products[j]
                V = shrink[c][:, None] * adjoints[j]            # (s_i − 1)·u_i, record by record
                part = self._matrix(j).T @ (V[:, 0] if width == 1 else V)    # Σ_i a_i ⊗ (…)
                lo, hi = self.offsets[var], self.offsets[var + 1]
                correction[:, lo:hi] += np.asarray(part).reshape(self.n, hi - lo)
        return correction, clipped


def _adjoint_plan(records: RecordGradients) -> Plan:
    """The plan of u_j = ∂f/∂S_j for every product j, with each S_j replaced by its product
    A_j @ w: a function of the shared variables only."""
    products = {p.rows.uid: p.product for p in records.products}
    memo: dict[int, Expression] = {}

    def substitute(node: Expression) -> Expression:
        if id(node) not in memo:
            if isinstance(node, Leaf):
                memo[id(node)] = products.get(node.uid, node)
            else:
                args = [substitute(a) for a in node.args]
                memo[id(node)] = node if all(a is b for a, b in zip(args, node.args)) \
                    else node.with_args(*args)
        return memo[id(node)]

    adjoints = [substitute(u) for u in records._adjoint.outputs]     # as derived per node
    return Plan(adjoints, records._shared_vars)


def _classes(rows: list[int]) -> tuple[tuple[int, ...], ...]:
    """The products' indices grouped by row count, in order of first appearance."""
    order: dict[int, list[int]] = {}
    for j, m in enumerate(rows):
        order.setdefault(m, []).append(j)
    return tuple(tuple(v) for v in order.values())


class NodeRecordGradients:
    """`GroupRecordGradients` of one client (`client_step.NodeRows`, a group of one row): the
    program's own `RecordGradients` (`privacy`'s, the per-node numbers)."""

    def __init__(self, program):
        self.program, self.records = program, _record_gradients(program)

    def max_l1(self, X: np.ndarray) -> np.ndarray:
        return np.array([self.records.max_l1(self.program.shared.unpack(X[0]))])

    def clipping_correction(self, X: np.ndarray, bound) -> tuple[np.ndarray, np.ndarray]:
        shared = self.program.shared
        correction = self.records.clipping_correction(shared.unpack(X[0]), float(np.ravel(bound)[0]))
        if correction is None:          # no term over the bound: ∇f is kept as it is
            return np.zeros((1, X.shape[1])), np.zeros(1, dtype=bool)
        return shared.pack(correction)[None, :], np.ones(1, dtype=bool)


def group_record_gradients(group: Group) -> GroupRecordGradients | NodeRecordGradients | None:
    """The group's `GroupRecordGradients` of the clients' objectives, built once and kept in
    `group.memo`; None when the per-record gradients are not known for these clients (not
    record-separable, or laid out differently): the caller then takes the per-node path, which
    raises the per-node error where there is one. A group of one client (`NodeRows`) gets its
    program's own terms (`NodeRecordGradients`; the per-node error raised here)."""
    if isinstance(group, NodeRows):
        return NodeRecordGradients(group.program)
    if "record_gradients" not in group.memo:
        try:
            group.memo["record_gradients"] = GroupRecordGradients(group)
        except FedModelError:           # NotRecordSeparable included
            group.memo["record_gradients"] = None
    return group.memo["record_gradients"]
