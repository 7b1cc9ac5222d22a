"""The batched plan's per-atom rules (`BATCHED_RULES`): how one step of a `BatchedPlan` runs
for every client at once on the flat layout (`segments`), or None where the step's layout has
no vectorized form (it then runs client by client)."""
from __future__ import annotations

import numpy as np

from .. import atoms as A
from ..atoms.elementwise import Elementwise
from ..errors import FedModelError
from ..lowering.rules import RuleTable

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
