"""NewtonInner's line search where clients eliminate their epigraph slacks
(`proxal_newton_slacks`): the minimum along the Newton direction, found exactly, not the first
step that decreases enough.

ψ (the merit with the slacks minimized out) is convex and piecewise quadratic, and its
generalized Newton direction from one piece is often far too long or too short for the next.
Measured on bcw's hinge SVM (docs/BENCHMARKS.md, branch hinge): Armijo backtracking
(`NewtonInner._line_search`) 239 Newton steps; a parabola through the lowest of ψ's values on
the grid 2^-j, 269; the exact minimum along d (a prototype), 59 to a distance of 2e-8 — the
exact step lands on a row's kink, and the next generalized Hessian sees it.

Along d, φ(a) = ψ(z + a d) + the server's P_0 + h is convex piecewise quadratic, so its
derivative φ'(a) is increasing and piecewise linear. Each message evaluates one point z + a d
(value, gradient, Hessian: the next step's, if it is taken) and the derivatives φ' at TRIALS
points spread over the bracket [lo, hi] that holds the minimum (the clients' directional
derivatives, summed; the server's own); the root of φ' by linear interpolation across the
bracket's ends is exact where no kink lies between them. The first message is at the full step
a = 1 (taken at once where φ'(1) ≤ 0); then at the interpolated root until |φ'| is round-off.
"""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram
from .proxal_newton_model import TRIALS, node_value
from .proxal_newton_sets import l1_weights

ARMIJO = 1e-4           # sufficient decrease: ℓ(z + t d) ≤ ℓ(z) + ARMIJO·t·Δ (NewtonInner's too)
POINTS = 32             # φ' at this many points a message at most (the Armijo search's TRIALS values: 8)
NARROW = 1e-6           # a bracket this narrow (relative): its interpolated root is taken as φ's minimizer
ROUNDS = 6              # messages a line search takes at most
FLAT = 1e-4             # |φ'(a)| ≤ FLAT·|φ'(0)|: a is φ's minimizer (round-off)


def l1_slope(x: np.ndarray, d: np.ndarray, l1: np.ndarray) -> float:
    """The right derivative of Σ_j l1_j|x_j| along d."""
    return float(l1 @ np.where(x != 0, np.sign(x) * d, np.abs(d)))


@procedure("proxal_newton_server_slopes", {"x": "x", "direction": "x", "offsets": f"<={POINTS + 1}"},
           {"values": f"<={POINTS + 1}", "slopes": f"<={POINTS + 1}"}, local=True, read_only=True)
def server_slopes(program: NodeProgram, x, direction, offsets) -> dict:
    """The server's P_0 + h and its derivative along `direction` at x + o_j·direction."""
    d, own = np.asarray(direction, float), l1_weights(program)
    points = [np.asarray(x, float) + o * d for o in np.ravel(offsets)]
    slopes = [float(program.value_grad(p, program.y)[1][:program.n_shared] @ d) + l1_slope(p, d, own) for p in points]
    return {"values": np.array([node_value(program, p) for p in points]), "slopes": np.array(slopes)}


def _message(ex, z, a, direction, inside, l1):
    """One round trip: (ψ + P_0 + h, summed gradient, Hessian at z + a·d; φ' there; the points
    `inside` with their φ')."""
    x = z + a * direction
    offsets = np.asarray(inside, float) - a
    total = ex.map_sum("proxal_newton_eval", ex.clients, common={"x": x, "direction": direction, "offsets": offsets},
                       fields=("value", "grad", "hessian", "slopes"))
    server = ex.call("server", "proxal_newton_server_slopes", x=x, direction=direction,
                     offsets=np.concatenate([[0.0], offsets]))
    grad = np.asarray(total["grad"], float)
    here = float(grad @ direction) + server["slopes"][0] + l1_slope(x, direction, l1)
    slopes = np.asarray(total["slopes"], float) + server["slopes"][1:] + \
        np.array([l1_slope(z + b * direction, direction, l1) for b in inside])
    return (float(total["value"]) + server["values"][0], grad, np.asarray(total["hessian"], float)), here, slopes


def exact_search(ex, z, value, grad, direction, decrease, l1):
    """(None, the accepted z, value, gradient, Hessian) at φ's minimizer along `direction` in
    (0, 1] (module docstring), or None where none was found that decreases φ enough."""
    own = ex.call("server", "proxal_newton_server_slopes", x=z, direction=direction, offsets=np.zeros(1))
    start = float(grad @ direction) + own["slopes"][0] + l1_slope(z, direction, l1)
    if not start < 0:
        return None
    lo, hi, s_lo, s_hi = 0.0, 1.0, start, None
    a, best = 1.0, None
    inside = 0.5 ** np.arange(TRIALS, 0, -1)        # first: geometric (the minimum is often near 0)
    for _ in range(ROUNDS):
        found, here, slopes = _message(ex, z, a, direction, inside, l1)
        if found[0] <= value + ARMIJO * a * decrease and (best is None or found[0] < best[1][0]):
            best = (a, found)
        if (a == 1.0 and here <= 0) or abs(here) <= FLAT * abs(start):
            break
        for b, s in zip(np.append(inside, a), np.append(slopes, here)):
            if s < 0 and b > lo:
                lo, s_lo = b, s
            if s >= 0 and (s_hi is None or b < hi):
                hi, s_hi = b, s
        if s_hi is None or not hi > lo:
            break
        a = lo - s_lo * (hi - lo) / (s_hi - s_lo)
        inside = lo + (hi - lo) * np.arange(1, POINTS + 1) / (POINTS + 1)
    if best is None:
        return None
    return (None, z + best[0] * direction, *best[1])
