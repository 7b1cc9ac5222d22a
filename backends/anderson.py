"""Anderson acceleration (type II, windowed, with restarts) of a federated fixed-point iteration
whose state is split over clients: x = (x_1, …, x_n), x_i on client i.

The mixing coefficients γ = argmin ‖f_k − ΔF γ‖₂ (f_j = T(x_j) − x_j, the residuals of the last
m + 1 iterations) need only inner products of residuals, and ⟨f_a, f_b⟩ = Σ_i ⟨f_a,i, f_b,i⟩: each
client sends the inner products of its newest residual with the ones it keeps (≤ m + 1 numbers),
the server sums them, solves for γ (m numbers) and sends γ back; every client then mixes its own
state, x_i ← g_k,i − Σ_j γ_j (g_{j+1},i − g_j,i) with g_j = T(x_j). No state leaves its client.
For the ADMM of ProxAL, x_i = (u_i, λ_i/ρ_i), so ũ_i = u_i + λ_i/ρ_i is linear in x_i and the
server forms the mixed ũ_i from the ũ_i it has received, with the same γ.

Safeguards (Zhang, O'Donoghue, Boyd, "Globally convergent type-I Anderson acceleration for
nonsmooth fixed-point iterations", SIAM J. Optim. 2020, use a similar restart-and-fall-back
scheme): the memory is cleared when the residual grows above `growth` times the best one seen,
when γ is not finite, or when the caller says the map changed (a new ρ); after `restarts` such
restarts the iteration continues unaccelerated, so it ends as the plain method does.
"""
from __future__ import annotations

import numpy as np

MAX_MEMORY = 15   # the inner-product message is declared as "<=16" numbers
# ‖Δf_j‖² formed from Gram entries (‖f_j‖² − 2⟨f_j, f_{j+1}⟩ + ‖f_{j+1}‖², summed over clients)
# is round-off below ~ROUNDOFF·(‖f_j‖² + ‖f_{j+1}‖²) (a few hundred ulps: sums over clients and
# coordinates); the mixer's Tikhonov term is at least that, column by column
ROUNDOFF = 1e-12


def extrapolate(outputs: list[np.ndarray], gamma: np.ndarray) -> np.ndarray:
    """The Anderson mix g_k − Σ_j γ_j (g_{j+1} − g_j) of the outputs g_0..g_k."""
    x = outputs[-1].copy()
    for j, coefficient in enumerate(gamma):
        x -= coefficient * (outputs[j + 1] - outputs[j])
    return x


class ClientHistory:
    """A client's last m + 1 outputs g_j = T(x_j) and residuals f_j = g_j − x_j."""

    def __init__(self, memory: int):
        self.memory = memory
        self.outputs: list[np.ndarray] = []
        self.residuals: list[np.ndarray] = []

    def clear(self) -> None:
        self.outputs.clear()
        self.residuals.clear()

    def mix(self, gamma: np.ndarray) -> np.ndarray:
        """x = g_k − Σ_j γ_j (g_{j+1} − g_j) over the kept outputs."""
        return extrapolate(self.outputs, gamma)

    def push(self, output: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Keep g = `output` and f = g − `state`; return ⟨f, f_j⟩ for every kept f_j (f last)."""
        self.outputs.append(output)
        self.residuals.append(output - state)
        if len(self.outputs) > self.memory + 1:
            del self.outputs[0], self.residuals[0]
        f = self.residuals[-1]
        return np.array([float(f @ r) for r in self.residuals])


class ServerMixer:
    """The server's side: summed residual Gram matrix, γ, restarts, and the mixed ũ_i."""

    def __init__(self, memory: int, restarts: int = 3, growth: float = 10.0, reg: float = 1e-10):
        self.memory, self.restarts_left, self.growth, self.reg = memory, restarts, growth, reg
        self.gram = np.zeros((0, 0))
        self.points: list[dict[str, np.ndarray]] = []   # per iteration: client -> ũ_i(g_j)
        self.best = np.inf
        self.mixed = 0
        self.restarts = 0

    def step(self, points: dict[str, np.ndarray], products: np.ndarray, changed: bool
             ) -> tuple[np.ndarray, bool, dict[str, np.ndarray]]:
        """Take the clients' new ũ_i(g_k) and the summed inner products ⟨f_k, f_j⟩; return
        (γ for the clients — empty: do not mix, restart flag for the clients, ũ_i to use)."""
        if len(self.points) == self.memory + 1:
            del self.points[0]
            self.gram = self.gram[1:, 1:]
        self.points.append(points)
        size = len(self.points)
        gram = np.zeros((size, size))
        gram[:-1, :-1] = self.gram
        gram[-1, :] = gram[:, -1] = products
        self.gram = gram
        if self.restarts_left <= 0:
            return np.zeros(0), False, points
        norm = float(np.sqrt(max(products[-1], 0.0)))
        if changed or norm > self.growth * self.best:
            return self._restart(points, failed=not changed)
        self.best = min(self.best, norm)
        if size < 2:
            return np.zeros(0), False, points
        # ΔF = F D with D the difference operator: ΔFᵀΔF = DᵀGD, ΔFᵀf_k = DᵀG e_k
        diff = np.zeros((size, size - 1))
        diff[np.arange(size - 1), np.arange(size - 1)] = -1.0
        diff[np.arange(1, size), np.arange(size - 1)] = 1.0
        normal = diff.T @ gram @ diff
        rhs = diff.T @ gram[:, -1]
        # Tikhonov term: reg·‖ΔF‖², and per column Δf_j = f_{j+1} − f_j at least the round-off
        # of its norm (ROUNDOFF): a column below it carries no direction (round-off, or a drift
        # f_{j+1} ≈ f_j: an iteration moving by a fixed step). With reg·‖ΔF‖² alone a stuck
        # ProxAL ADMM (the contradictory lasso of test_infeasible as written: ‖f‖ = 5.2e-7
        # twice, ΔFᵀΔF = 0 in floating point, ΔFᵀf = −2.4e-24) got γ = −2.4e286, iterates 1e278
        # and the status "diverged"
        floor = ROUNDOFF * (np.diag(gram)[:-1] + np.diag(gram)[1:])
        try:
            gamma = np.linalg.solve(normal + np.diag(np.maximum(floor, self.reg * max(np.trace(normal), 1e-300))),
                                    rhs)
        except np.linalg.LinAlgError:
            gamma = np.full(size - 1, np.nan)
        if not np.all(np.isfinite(gamma)):
            return self._restart(points)
        self.mixed += 1
        mixed = {client: extrapolate([p[client] for p in self.points], gamma) for client in points}
        return gamma, False, mixed

    def _restart(self, points, failed: bool = True):
        """Clear the memory (both sides: the clients clear theirs on the returned flag); a
        failed extrapolation uses up one of the allowed restarts, a changed map does not."""
        self.restarts += 1
        self.restarts_left -= int(failed)
        self.points, self.gram, self.best = [], np.zeros((0, 0)), np.inf
        return np.zeros(0), True, points
