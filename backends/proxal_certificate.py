"""ProxAL's distance certificate under Newton steps (`ProxAL(inner=NewtonInner())`): how far the
point a subproblem ends at is from the minimizer of the augmented Lagrangian at the current
multipliers, read from the server's exact summed Hessian (He, Peng, Sun, "Federated learning with
convex global and local constraints": the stop (11); equation numbers that paper's).

Under NewtonInner the server holds Σ_i ∇P_{i,k}(z), Σ_i ∇²P_{i,k}(z) and its own at the one common
point z (`proxal_newton._evaluate`, every round trip). Remove the proximal term of (13)–(14)
(weight ω = 1/((n+1)β) on each of the n + 1 nodes, center w_k) and what is left is the merit φ
of the problem at μ_k: gradient G − Σ ω(z − center), Hessian H − (n+1)ω·I. Where that Hessian
is positive definite, with least eigenvalue μ:
- without nonsmooth terms the Newton step ‖H⁻¹G‖₂ (exact for a quadratic φ: z − z* itself;
  to second order otherwise);
- with them (λ‖w‖₁, the server's sets) ‖r‖₂/μ, r the element of G + ∂h(z) the certificate
  reads term by term (`remainder`, `prox_remainder`): ‖z − z*‖ ≤ ‖r‖/μ for a
  μ-strongly convex φ + h.
The step-history estimates (`proxal_outer.curvature`, 1/r − 1 over β) read the curvature of the
first outer steps, not the least: on a column 1000 ± 1 beside an intercept they read 0.024
where the least is 7.6e-8 and ProxAL said "converged" 0.75 from the answer (docs/BENCHMARKS.md,
branch newtoncert). Where the Hessian is singular or indefinite to NOISE (flat directions: NP
monks-1; a nonconvex model) there is no reading and the old tests decide.
"""
from __future__ import annotations

import numpy as np

from typing import Callable

from fedmodel.runtime.program import NodeProgram

NOISE = 1e-10       # least eigenvalue at most this × the largest: singular to round-off, no reading
MARGIN = 0.5        # the distance read at most MARGIN × dist_tol·‖w‖₂ (a Newton step is exact to
                    # second order only; the bound's ball must hold beside z)


def reading(program: NodeProgram, z: np.ndarray, G: np.ndarray, H: np.ndarray, l1: np.ndarray,
            centers: np.ndarray, weight: float, remainder: Callable) -> dict:
    """The server's distance reading at z (module docstring) from the summed gradient G and
    Hessian H of ℓ_k there (the server's P_0 included), the clients' ℓ1 weights `l1`, the
    nodes' prox centers summed with their weights (`centers`: Σ_j ω c_j), the prox weight
    summed over the nodes (`weight`: (n + 1)ω) and `remainder(z, g, l1)`, g plus the ℓ1
    subgradient closest to −g: {"distance": the bound (∞ without a reading), "curvature": the
    least eigenvalue μ of φ's Hessian (0 without one), "gradient": ‖r‖∞, the stationarity of φ
    + h the certificate reads (what a subproblem centered at z reads on arrival)}."""
    G = G - (weight * z - centers)
    H = H - weight * np.eye(z.size)
    if not (np.all(np.isfinite(G)) and np.all(np.isfinite(H))) or not z.size:
        return {"distance": np.inf, "curvature": 0.0, "gradient": np.inf}
    found = program.prox_remainder(z, remainder(z, G, l1))
    gradient = float(np.max(np.abs(found)))
    values = np.linalg.eigvalsh(H)
    mu = float(values[0])
    if not mu > NOISE * float(np.max(np.abs(values))):
        return {"distance": np.inf, "curvature": max(mu, 0.0), "gradient": gradient}
    if not program.merit_ir.prox_terms and not np.any(l1):
        return {"distance": float(np.linalg.norm(np.linalg.solve(H, G))), "curvature": mu, "gradient": gradient}
    return {"distance": float(np.linalg.norm(found)) / mu, "curvature": mu, "gradient": gradient}


def tau_for(tau: float, record: dict, target: float) -> float:
    """τ_{k+1} where the reading refused the stop (distance > `target`, MARGIN·dist_tol·‖w‖₂):
    the next subproblem, centered at w_k, reads φ's stationarity ‖r‖∞ on arrival, so τ_{k+1} ≤
    ½‖r‖∞·target/distance takes the step the distance asks for (met on arrival, the raw
    intercept sweep's seed 1 stood still 8.5e-6 > 5.6e-6 off for 100 outer iterations)."""
    distance = record.get("newton_distance", np.inf)
    if not np.isfinite(distance) or not distance > target:
        return tau
    return min(tau, 0.5 * record["newton_gradient"] * target / distance)


def beta_for(backend, beta: float, record: dict, target: float) -> float:
    """β_{k+1} where the reading refused the stop with the constraints met: a proximal step
    shrinks the distance along the least curvature μ by 1/(1 + βμ), so βμ ≥ 2·distance/target
    lands the next outer iteration within half the test (up to beta_max; 0: no reading or β
    already that large — the other rules decide). ×4 / ×100 a rise, the collinear model took
    4 outer iterations to β = 3e4 and stopped there 0.75 off."""
    mu, distance = record.get("newton_curvature", 0.0), record.get("newton_distance", np.inf)
    if not (mu > 0 and np.isfinite(distance) and target > 0 and distance > target):
        return 0.0
    wanted = min(2.0 * distance / (target * mu), backend.beta_max)
    return wanted if wanted > beta else 0.0
