"""The numba-compiled loops of DALD's kernels (`backends.dald.kernels`, imported on first use).
Module-level functions, so that numba's on-disk cache finds them again in the next process.
Bounds are not checked here: the wrappers in `kernels` check every shape and index."""
import numpy as np

from fedmodel.runtime.compiled_loops import jit, larger, max_abs_diff, pick, prox_grad_step


@jit
def consensus_dual(MU, X, xhat, weight, out):
    """out[i] ← μ_i + w_i∘(x̂[i] − x_i) (DALD-CC (15): w = 2ρ_i∘ρ_i)."""
    wide = weight.shape[1] > 1
    for i in range(X.shape[0]):
        m, x, h, w, o = MU[i], X[i], pick(xhat, i), pick(weight, i), out[i]
        if wide:
            for c in range(X.shape[1]):
                o[c] = (h[c] - x[c]) * w[c] + m[c]
        else:
            w0 = w[0]
            for c in range(X.shape[1]):
                o[c] = (h[c] - x[c]) * w0 + m[c]


@jit
def edge_dual(X, MU, tail, head, weight, move, out, size):
    """Per edge e = (tail, head): C = x_tail − x_head, size[e] = ‖C‖∞, out[e] ← μ_e + w_e∘C
    where move[e] (DALD-DC (21)), else μ_e."""
    wide = weight.shape[1] > 1
    for e in range(tail.shape[0]):
        xi, xj, m, w, o = X[tail[e]], X[head[e]], MU[e], pick(weight, e), out[e]
        size[e] = max_abs_diff(xi, xj)
        if not move[e]:
            for c in range(X.shape[1]):
                o[c] = m[c]
        elif wide:
            for c in range(X.shape[1]):
                o[c] = m[c] + (xi[c] - xj[c]) * w[c]
        else:
            w0 = w[0]
            for c in range(X.shape[1]):
                o[c] = m[c] + (xi[c] - xj[c]) * w0


@jit
def edge_terms_row(i, X, B, rank, ptr, edge, nbr, sign, MU, weight, linear, total, anchor):
    """Node i's consensus terms of (20), from its edges edge[ptr[i]:ptr[i+1]] to nbr[…] in that
    order: linear ← Σ_e sign_e μ_e, total ← Σ_e w_e, anchor ← Σ_e w_e∘x_e / total, where x_e is
    the neighbour's newest model: B[nbr] when it comes earlier in the sweep
    (0 ≤ rank[nbr] < rank[i]), else X[nbr]. A node without edges: 0, 0 and x_i."""
    d = X.shape[1]
    wide = weight.shape[1] > 1
    if ptr[i] == ptr[i + 1]:
        for c in range(d):
            linear[c], total[c], anchor[c] = 0.0, 0.0, X[i, c]
        return
    t = 0.0                                  # Σ_e w_e when each w_e is one number
    for k in range(ptr[i], ptr[i + 1]):
        e, j = edge[k], nbr[k]
        other = B[j] if 0 <= rank[j] < rank[i] else X[j]
        m, sg, w = MU[e], sign[k], pick(weight, e)
        first = k == ptr[i]                  # (0 + a = a: the first edge is assigned)
        if wide:
            for c in range(d):
                linear[c] = sg * m[c] if first else linear[c] + sg * m[c]
                total[c] = w[c] if first else total[c] + w[c]
                anchor[c] = w[c] * other[c] if first else anchor[c] + w[c] * other[c]
        else:
            w0 = w[0]
            t = w0 if first else t + w0
            for c in range(d):
                linear[c] = sg * m[c] if first else linear[c] + sg * m[c]
                anchor[c] = w0 * other[c] if first else anchor[c] + w0 * other[c]
    if wide:
        for c in range(d):
            anchor[c] /= total[c]
    else:
        for c in range(d):
            total[c] = t
            anchor[c] /= t


@jit
def edge_terms(X, MU, rows, rank, ptr, edge, nbr, sign, weight, out):
    """out[:, k] ← (linear, total, anchor) of node rows[k] (`edge_terms_row`, neighbours from X)."""
    for k in range(rows.shape[0]):
        edge_terms_row(rows[k], X, X, rank, ptr, edge, nbr, sign, MU, weight, out[0, k], out[1, k], out[2, k])


@jit
def gauss_seidel_sweep(X, G, MU, order, rank, ptr, edge, nbr, sign, weight, step, threshold,
                       lo, hi, B):
    """Nodes `order` of a sweep of (20), one proximal-gradient step each, into B: node i's
    consensus terms from the newest copies (`edge_terms_row`), then the step of its local problem
    B[i] ← shrink(x_i − α(∇P_i + total∘(x_i − anchor) + linear)) (the runtime's
    `prox_grad_step`: the arithmetic of a node's own step, `local.local_argmin`)."""
    d = X.shape[1]
    terms = np.empty((3, d))                 # node i's linear, total, anchor
    for s in range(order.shape[0]):
        i = order[s]
        edge_terms_row(i, X, B, rank, ptr, edge, nbr, sign, MU, weight, terms[0], terms[1], terms[2])
        prox_grad_step(X[i:i + 1], G[i:i + 1], terms[1:2], terms[2:3], terms[0:1], 1.0, step, d,
                       threshold[i:i + 1], lo, hi, B[i:i + 1])


@jit
def consensus_gap(X, xhat, weight, member, total):
    """total ← Σ_(member i) w_i∘(x̂ − x_i) (rows in order); returns max_i ‖x̂ − x_i‖∞."""
    n, d = X.shape
    wide = weight.shape[1] > 1
    h = xhat[0]
    largest = 0.0
    for i in range(n):
        x = X[i]
        largest = larger(largest, max_abs_diff(h, x))
        if member[i]:
            w = pick(weight, i)
            if wide:
                for c in range(d):
                    total[c] += w[c] * (h[c] - x[c])
            else:
                w0 = w[0]
                for c in range(d):
                    total[c] += w0 * (h[c] - x[c])
    return largest


@jit
def largest_change(X, previous, member):
    """(max_(member i) ‖x_i − previous_i‖∞, whether every entry of X is finite)."""
    bad, largest = False, 0.0
    for i in range(X.shape[0]):
        x = X[i]
        for c in range(X.shape[1]):
            bad |= x[c] * 0.0 != 0.0            # an inf or NaN entry
        if member[i]:
            largest = larger(largest, max_abs_diff(x, previous[i]))
    return largest, not bad
