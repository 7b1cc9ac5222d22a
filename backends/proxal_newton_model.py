"""The server's part of NewtonInner's step: the minimizer of the quadratic model
Gᵀ(u − z) + ½(u − z)ᵀH(u − z) + h(u) (`model_minimizer`; h: the server's prox terms and the
clients' summed λ‖w‖₁) — a Cholesky solve without nonsmooth terms, else FISTA with adaptive
restart, finished on the face of h where its iterates lie (`face_minimizer`: the server's linear
sets — bounds, halfspaces, affine subspaces — and the ℓ1 terms' zeros and signs).

On an ill-conditioned model FISTA converges slowly: newuser12's stacking model (simplex weights
{Σ w = 1, w ≥ 0} on the server, the equality in the AL: the model's condition number 2e9 at
β = 3e6) ran its 20,000 iterations per Newton step and the Newton steps crept (no answer in
120 s; CVXPY 0.07 s). FISTA finds which bounds are active long before it converges; on that
face the model is an equality-constrained quadratic, minimized by one KKT solve, kept where it
lies in the sets and meets the model's stop test. An ℓ1 term on raw data did the same (nu17: a
server elastic net over raw power-plant data, 29 round trips and 10.6 s against CVXPY's 1.4 s):
its face is its zeros and signs, found by an active-set search from FISTA's iterate; now 9
round trips, 0.1 s."""
from __future__ import annotations

import functools

import numpy as np

from fedmodel.compiler.projection import ACTIVE, Box, Halfspace, Subspace
from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram

TRIALS = 8              # shorter steps 2^-1 … 2^-TRIALS valued beside each full Newton step (one message)
MODEL_STEPS = 20_000    # the server's accelerated proximal-gradient iterations on the model at most
MODEL_TOL = 1e-2        # the model's prox-gradient mapping to MODEL_TOL × min(τ_k, certificate)
SEARCH = 24             # the face search's passes at most (a KKT solve each), 2d + 8 to d = 200
FACE_FIRST = 20         # the first of the model iterations (then 40, 80, …) that try the face's minimizer
# d × d matrices a Newton step holds at once whatever n where replies are summed as they come
# (the sum, a member's Hessian and copies, triangles, the server's H; tracemalloc's peak over a
# subproblem at mnist-ball, d = 784: 7.6 at n = 5, 10.7 at 40, 12.0 at 200)
SERVER_MATRICES = 14


def active_faces(program, u: np.ndarray, l1: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The face of h (the node's prox terms and the clients' summed λ‖w‖₁, `l1`) holding u:
    rows E (k × d) of the affine constraints active there — a bound at its value, a halfspace on
    its boundary, every row of a subspace, an ℓ1 entry at 0 (held at 0) — and c (d,), the
    ℓ1 weights λ (d,: h's gradient on that face is λ·sign(u)), and the boxes' lower and upper
    bounds (d,); None where some prox term is no such set or ℓ1 (a ball, a norm2, …)."""
    d = program.n_shared
    weights = np.zeros(d) if l1 is None else np.array(l1, dtype=float)
    rows, lower, upper = [np.zeros((0, d))], np.full(d, -np.inf), np.full(d, np.inf)
    for term in program.merit_ir.prox_terms:
        i = program.shared.variables.index(term.variable)
        start, end = program.shared.offsets[i], program.shared.offsets[i + 1]
        if term.kind == "norm1":
            weights[start:end] += term.weight()
            continue
        if term.constraint is None or not term.pieces:
            return None
        x = np.ravel(u[start:end])
        for piece in (p.current() for p in term.pieces):
            if isinstance(piece, Box):
                low = np.ravel(np.broadcast_to(piece.lower, x.shape))
                high = np.ravel(np.broadcast_to(piece.upper, x.shape))
                lower[start:end] = np.maximum(lower[start:end], low)
                upper[start:end] = np.minimum(upper[start:end], high)
                scale = ACTIVE * np.maximum(1.0, np.abs(x))
                block = np.eye(x.size)[np.flatnonzero((x <= low + scale) | (x >= high - scale))]
            elif isinstance(piece, Halfspace):
                block = piece.a[None, :] if piece.active(x) else np.zeros((0, x.size))
            elif isinstance(piece, Subspace):
                block = piece.Q
            else:
                return None
            full = np.zeros((block.shape[0], d))
            full[:, start:end] = block
            rows.append(full)
    if not (len(rows) > 1 or np.any(weights)):
        return None
    held = (weights > 0) & (u == 0)     # (soft-thresholding leaves exact zeros)
    rows.append(np.eye(d)[held])
    return np.vstack(rows), weights, lower, upper


def face_minimizer(program, z: np.ndarray, G: np.ndarray, H: np.ndarray, u: np.ndarray,
                   l1: np.ndarray | None = None) -> np.ndarray | None:
    """argmin of Gᵀ(v − z) + ½(v − z)ᵀH(v − z) + h(v) over the face of h holding u (E v = E u,
    h linear there: `active_faces`), by an active-set search from u (feature-sign search, Lee,
    Battle, Raina, Ng 2007, with bounds): where the face's minimizer changes the sign of an ℓ1
    entry or crosses a bound, the model falls along the segment to it, so go to where the first
    such entry reaches 0 or its bound and hold it there; at a face's minimizer, free the entry
    whose exact coordinate step lowers the model most; at most SEARCH passes. Kept where it
    lies in the sets and its model value is at most u's; else None."""
    v = target = u
    for _ in range(2 * u.size + 8 if u.size <= 200 else SEARCH):
        face = active_faces(program, v, l1)
        if face is None:
            return None
        E, weights, lower, upper = face
        c, d, k = weights * np.sign(v), z.size, E.shape[0]
        kkt = np.block([[H, E.T], [E, np.zeros((k, k))]])
        target = np.linalg.lstsq(kkt, np.concatenate([H @ z - G - c, E @ v]), rcond=None)[0][:d]
        step = target - v
        with np.errstate(divide="ignore", invalid="ignore"):
            to_zero = np.where((c != 0) & (np.sign(target) != np.sign(v)), -v / step, np.inf)
            to_bound = np.where((target > upper) & (v < upper), (upper - v) / step,
                                np.where((target < lower) & (v > lower), (lower - v) / step, np.inf))
        j, i = int(np.argmin(to_zero)), int(np.argmin(to_bound))
        if min(to_zero[j], to_bound[i]) < np.inf:
            if to_zero[j] <= to_bound[i]:
                target = v + float(np.clip(to_zero[j], 0.0, 1.0)) * step
                target[j] = 0.0
            else:
                target = v + float(np.clip(to_bound[i], 0.0, 1.0)) * step
                target[i] = upper[i] if step[i] > 0 else lower[i]
            v = target
            continue
        entries = np.all(np.count_nonzero(E, axis=1) == 1)    # (bounds and ℓ1 zeros alone)
        freed = _coordinate_step(z, G, H, weights, lower, upper, target) if entries else None
        if freed is None:
            break
        v = freed
    else:
        target = v
    start, v = v, target
    bound = (np.count_nonzero(E, axis=1) == 1) & (E.max(axis=1, initial=0.0) == 1.0)
    fixed = np.argmax(E[bound], axis=1)
    v[fixed] = start[fixed]             # the bounds exactly (the solve leaves ~1e-16 there)
    inside = program.apply_prox(v, 0.0)[:d]          # the sets' projection (t = 0)
    if not np.all(np.isfinite(v)) or np.max(np.abs(inside - v), initial=0.0) > \
            1e-12 * max(1.0, float(np.max(np.abs(v), initial=0.0))):
        return None

    def model(x: np.ndarray) -> float:
        h = prox_value(program, x) + (0.0 if l1 is None else float(np.dot(l1, np.abs(x))))
        return float(G @ (x - z) + 0.5 * (x - z) @ H @ (x - z)) + h
    return inside if model(inside) <= model(u) else None


def _coordinate_step(z, G, H, weights, lower, upper, v) -> np.ndarray | None:
    """v with the one entry changed whose exact step (the model's minimum along it, with the
    ℓ1 `weights` and the bounds) lowers the model most; None where no step lowers it beyond
    round-off (v is the model's minimizer over the bounds and ℓ1)."""
    g, curvature = G + H @ (v - z), np.maximum(np.diag(H), 1e-300)
    centre = v - g / curvature
    best = np.clip(np.sign(centre) * np.maximum(np.abs(centre) - weights / curvature, 0.0), lower, upper)
    delta = best - v
    fall = g * delta + 0.5 * curvature * delta ** 2 + weights * (np.abs(best) - np.abs(v))
    j = int(np.argmin(fall))
    if not fall[j] < -1e3 * np.finfo(float).eps * (abs(float(G @ v)) + float(np.abs(v) @ weights) + 1.0):
        return None
    out = v.copy()
    out[j] = best[j]
    return out


def _prox(program, v: np.ndarray, t: float, l1: np.ndarray) -> np.ndarray:
    """prox_{t h}(v), h = Σ_j l1_j|v_j| + the server's prox terms: soft-thresholding, then the
    server's own prox (exact where they factor: ℓ1 with ℓ1, a ball, bounds; `apply_prox`)."""
    v = np.sign(v) * np.maximum(np.abs(v) - t * l1, 0.0)
    return program.apply_prox(v, t) if program.merit_ir.prox_terms else v


def _newton_point_inside(program, z: np.ndarray, G: np.ndarray, H: np.ndarray, l1: np.ndarray) -> np.ndarray | None:
    """The model's unconstrained minimizer z − H⁻¹G where h is sets alone (no λ‖w‖₁, no other
    prox term), H is positive definite and that point lies in the sets: then it is the model's
    minimizer, in one Cholesky solve; else None (FISTA). An inactive set made every step a FISTA
    run with H's eigendecomposition (mnist-ball, d = 784, an inactive ball: ~250 iterations and
    a 0.08–0.2 s `eigvalsh` a step, 2.3 of a 4 s run)."""
    terms = program.merit_ir.prox_terms
    if np.any(l1) or not terms or any(t.constraint is None for t in terms) or not np.all(np.isfinite(H)):
        return None
    from scipy.linalg import LinAlgError, cho_factor, cho_solve    # (scipy: not at import time)
    try:
        u = z - cho_solve(cho_factor(H, check_finite=False), G, check_finite=False)
    except (LinAlgError, ValueError):
        return None
    inside = program.apply_prox(u, 0.0)[:z.size]      # the sets' projection (t = 0)
    if not np.all(np.isfinite(u)) or np.max(np.abs(inside - u), initial=0.0) > \
            1e-12 * max(1.0, float(np.max(np.abs(u), initial=0.0))):
        return None
    return inside


def model_minimizer(program, z, G, H, l1, tol) -> np.ndarray:
    """argmin_u Gᵀ(u − z) + ½(u − z)ᵀH(u − z) + h(u): a Cholesky solve without nonsmooth
    terms; else FISTA with adaptive restart (O'Donoghue, Candès) to a prox-gradient mapping
    ≤ tol, at most MODEL_STEPS iterations (an inexact minimizer still gives a descent direction
    when it improves on the model at z; the line search checks it). On the server's linear sets
    the minimizer on the face the iterates found is tried now and then (`face_minimizer`)."""
    smooth = not program.merit_ir.prox_terms and not np.any(l1)
    if smooth:
        try:
            return z - np.linalg.solve(H, G) if np.all(np.isfinite(H)) else z
        except np.linalg.LinAlgError:
            pass
    inside = _newton_point_inside(program, z, G, H, l1)
    if inside is not None:
        return inside
    top = float(np.linalg.eigvalsh(H)[-1]) if H.size else 0.0
    step = 1.0 / max(top, 1e-300)
    u = _prox(program, z - step * G, step, l1)
    y, theta, face_at, moves = u.copy(), 1.0, FACE_FIRST, 0
    for k in range(MODEL_STEPS):
        u_new = _prox(program, y - step * (G + H @ (y - z)), step, l1)
        if float(np.max(np.abs(u_new - y), initial=0.0)) <= tol * step:
            return u_new
        if k == face_at:                      # the face the iterates found, in one KKT solve
            face_at *= 2                      # (at 20, 40, 80, … iterations: O(log) solves)
            v = face_minimizer(program, z, G, H, u_new, l1)
            if v is not None:
                if float(np.max(np.abs(_prox(program, v - step * (G + H @ (v - z)), step, l1) - v),
                                initial=0.0)) <= tol * step:
                    return v
                if moves < z.size:            # an active-set step: on from v, its face next
                    moves, face_at = moves + 1, k + 1
                    u, y, theta = v, v.copy(), 1.0
                    continue
        if float(np.dot(y - u_new, u_new - u)) > 0:     # restart: the momentum points uphill
            y, theta = u_new.copy(), 1.0
        else:
            theta_new = 0.5 * (1 + np.sqrt(1 + 4 * theta * theta))
            y = u_new + ((theta - 1) / theta_new) * (u_new - u)
            theta = theta_new
        u = u_new
    return u


def matrices_held(n: int, streams: bool) -> int:
    """Dense d × d matrices a Newton step on n clients holds at once (`refusal`, `auto`): n more
    where the executor gathers the replies before summing (`Executor.streams_sums`: Ray, Flower)."""
    return SERVER_MATRICES + (0 if streams else n)


def prox_value(program: NodeProgram, x: np.ndarray) -> float:
    """Σ of the node's prox terms' values at x (λ‖w‖₁; 0 for a set at a point in it)."""
    if not program.merit_ir.prox_terms:
        return 0.0
    values = program.shared.unpack(x)
    return float(sum(t.value(values[program.shared.variables.index(t.variable)])
                     for t in program.merit_ir.prox_terms))


@procedure("proxal_newton_value", {"x": "x", "direction": "x", "offsets": f"<={TRIALS}"},
           {"value": "1", "values": f"<={TRIALS}"}, local=True, read_only=True)
def server_value(program: NodeProgram, x, direction=None, offsets=None) -> dict:
    """The server's P_0 + h at x and at x + o_j·`direction` (`_evaluate`'s numbers): what
    `NewtonInner._evaluate` reads of it. Its gradient and Hessian are `_server_step`'s own (asked
    of "proxal_newton_eval" they were computed twice a step: at d = 784 a dense Hessian each)."""
    z = np.asarray(x, float)
    values = np.array([node_value(program, z + o * np.asarray(direction, float))
                       for o in np.ravel(offsets)]) if direction is not None else np.zeros(0)
    return {"value": node_value(program, z), "values": values}


def node_value(program: NodeProgram, z: np.ndarray) -> float:
    """P + h of a node at z (its value plan: `value_grad`'s value, bit for bit)."""
    merit = program.compiled
    return float(merit.value_plan(*merit.values(z, program.y))[0]) + prox_value(program, z)


@functools.lru_cache(maxsize=4)
def upper_mask(d: int) -> np.ndarray:
    """The upper triangle as a boolean d × d mask, read-only and kept: `H[upper_mask(d)]` is
    `H[np.triu_indices(d)]` (the same row-major order) at a third of the time of the kept
    index pairs it replaces (d = 784: 0.9 against 3.0 ms a reply; `proxal_newton._evaluate`
    packs each client's Hessian by it)."""
    mask = np.triu(np.ones((d, d), dtype=bool))
    mask.flags.writeable = False
    return mask


def unpack_symmetric(packed: np.ndarray, d: int) -> np.ndarray:
    """The d × d symmetric matrix of its upper triangle (as `proxal_newton._evaluate` sends it):
    by the boolean mask, twice (H and its transpose): 3.3 against 7.6 ms by index pairs."""
    H = np.zeros((d, d))
    mask = upper_mask(d)
    H[mask] = packed
    H.T[mask] = packed
    return H
