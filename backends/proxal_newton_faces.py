"""The exact minimizer of NewtonInner's quadratic model on the face of the server's linear sets
(bounds, halfspaces, affine subspaces) where an iterate lies — the finish of the model's
accelerated proximal-gradient loop (`proxal_newton._model_minimizer`).

On an ill-conditioned model that loop converges slowly: newuser12's stacking model (simplex
weights {Σ w = 1, w ≥ 0} on the server; the model's condition number 2e9 at β = 3e6) ran its
20,000 iterations per Newton step, the Newton steps crept (no answer in 120 s; CVXPY 0.07 s).
The loop finds which bounds are active long before it converges; on that face the model is an
equality-constrained quadratic, minimized by one KKT solve. Its point is kept where it lies in
the sets and lowers the model (the active set was right); then the loop's stop test decides."""
from __future__ import annotations

import numpy as np

from fedmodel.compiler.projection import ACTIVE, Box, Halfspace, Subspace


def active_faces(program, u: np.ndarray) -> np.ndarray | None:
    """Rows E (k × d) of the affine constraints of the node's sets active at u — a bound at its
    value, a halfspace on its boundary, every row of a subspace — when each prox term of the node
    is such a set (None otherwise: a ball, λ‖w‖₁, …)."""
    d = program.n_shared
    if not program.merit_ir.prox_terms:
        return None
    rows = [np.zeros((0, d))]
    for term in program.merit_ir.prox_terms:
        if term.constraint is None or not term.pieces:
            return None
        i = program.shared.variables.index(term.variable)
        start, end = program.shared.offsets[i], program.shared.offsets[i + 1]
        x = np.ravel(u[start:end])
        for piece in (p.current() for p in term.pieces):
            if isinstance(piece, Box):
                scale = ACTIVE * np.maximum(1.0, np.abs(x))
                on = np.flatnonzero((x <= np.ravel(np.broadcast_to(piece.lower, x.shape)) + scale)
                                    | (x >= np.ravel(np.broadcast_to(piece.upper, x.shape)) - scale))
                block = np.eye(x.size)[on]
            elif isinstance(piece, Halfspace):
                block = piece.a[None, :] if piece.active(x) else np.zeros((0, x.size))
            elif isinstance(piece, Subspace):
                block = piece.Q
            else:
                return None
            full = np.zeros((block.shape[0], d))
            full[:, start:end] = block
            rows.append(full)
    return np.vstack(rows)


def face_minimizer(program, z: np.ndarray, G: np.ndarray, H: np.ndarray, u: np.ndarray) -> np.ndarray | None:
    """argmin of Gᵀ(v − z) + ½(v − z)ᵀH(v − z) over the face of the server's linear sets holding
    u (E v = E u, `active_faces`), where it lies in the sets and its model value is at most u's;
    else None."""
    E = active_faces(program, u)
    if E is None:
        return None
    d, k = z.size, E.shape[0]
    kkt = np.block([[H, E.T], [E, np.zeros((k, k))]])
    v = np.linalg.lstsq(kkt, np.concatenate([H @ z - G, E @ u]), rcond=None)[0][:d]
    bound = (np.count_nonzero(E, axis=1) == 1) & (E.max(axis=1, initial=0.0) == 1.0)
    fixed = np.argmax(E[bound], axis=1)
    v[fixed] = u[fixed]                 # the bounds exactly (the solve leaves ~1e-16 there)
    inside = program.apply_prox(v, 0.0)[:d]          # the sets' projection (t = 0)
    if not np.all(np.isfinite(v)) or np.max(np.abs(inside - v), initial=0.0) > \
            1e-12 * max(1.0, float(np.max(np.abs(v), initial=0.0))):
        return None

    def model(x: np.ndarray) -> float:
        return float(G @ (x - z) + 0.5 * (x - z) @ H @ (x - z))
    return inside if model(inside) <= model(u) else None
