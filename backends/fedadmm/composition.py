"""FedADMM as ProxAL's subproblem solver (`ProxAL(inner=FedADMM(...))`): step 3 of ProxAL's
Algorithm 1 (He, Peng, Sun) by FedADMM rounds, with the certificate that ProxAL's stop needs."""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram
from ..outcome import Status


def solve_subproblem(backend, ex, w: np.ndarray, tau: float) -> tuple[np.ndarray, list[float], dict]:
    """Step 3 of ProxAL's Algorithm 1: w^{k+1} ≈ argmin ℓ_k = Σ_{i=0}^n P_{i,k} (+ h), by
    FedADMM rounds on the merit functions P_{i,k} that ProxAL has configured on the nodes
    (client i's local function is P_{i,k}/α_i; the server's P_0 + h enter the z-step (3.2)),
    started at z^0 = w^k with λ_i^0 = ∇P_{i,k}(w^k)/α_i and, for InSa, the β_i adapted in
    the previous subproblems.

    Certificate (returned per round in `trace`; the loop stops once it is ≤ τ_k): at the new
    z with the clients' private variables y_i,
        max(‖Σ_{i≥1} ∇_x P_i(z, y_i) − W (z − z̄)‖∞ + r_0, max_i ‖∇_y P_i(z, y_i)‖∞),
    where z = argmin P_0 + h + (W/2)‖· − z̄‖² up to the server solve's residual r_0, so
    −W(z − z̄) + r ∈ ∇P_0(z) + ∂h(z) with ‖r‖∞ ≤ r_0: the certificate bounds
    dist∞(0, ∂ℓ_k(z, y)) from above, which is what Theorem 4.1 and ProxAL's stop (11) need.
    It costs one gradient of P_i per client and round (message `fedadmm_certificate`).
    Returns (z, the certificates, the subproblem's entry for `FedADMM.subproblem_log`)."""
    clients = ex.clients
    alpha = backend._weights(len(clients))
    keep = all(r["beta"] is not None for r in ex.map("fedadmm_beta", {c: {} for c in clients}).values())
    trace: list[float] = []

    def certified(z, record, z_bar, weight, residual) -> bool:
        replies = ex.map("fedadmm_certificate", {c: {"x": z} for c in clients})
        g = sum(r["grad"] for r in replies.values()) - weight * (z - z_bar)
        private = max([r["private"] for r in replies.values()], default=0.0)
        certificate = max(float(np.max(np.abs(g), initial=0.0)) + residual, private)
        record["certificate"] = certificate
        trace.append(certificate)
        return certificate <= tau

    info: dict = {}
    z, history, status, steps = backend.rounds(ex, np.asarray(w, float), alpha, backend.max_rounds,
                                               lam_start="zero", keep_beta=keep and backend.adaptive,
                                               stop=certified, report=False,
                                               server_tol=max(backend.server_tol, 0.01 * tau), info=info)
    entry = {"tau": tau, "rounds": len(history), "local_steps": steps,
             "certificate": trace[-1] if trace else np.inf,
             "solved": status == Status.CONVERGED, Status.DIVERGED: info.get(Status.DIVERGED)}
    return z, trace or [np.inf], entry


@procedure("fedadmm_certificate", {"x": "x"}, {"grad": "x", "private": "1"}, read_only=True)
def _certificate(program: NodeProgram, x):
    """∇_x P_i(x, y_i) and ‖∇_y P_i(x, y_i)‖∞ at the client's current private variables."""
    g = program.value_grad(np.asarray(x, float), program.y)[1]
    return {"grad": g[:program.n_shared], "private": float(np.max(np.abs(g[program.n_shared:]), initial=0.0))}
