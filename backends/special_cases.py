"""FedProx and FedAvg as special cases of Fed-DALD-CC (DALD paper, Sec. V-B2; spec §2.9).

Distributed PA (51)–(53): Fed-DALD-CC with μ_i ≡ 0 (no multiplier step (15)), uniform penalty,
inner rule B4 with v_max = 1, and the server taking x̂ = Σ p_i x_i with p_i = 1/n:

    x_i^k = argmin f_i(x_i) + (1/2α)‖x_i − x̂^{k−1}‖²        (52)   (α = 1/(2ρ²), FedProx μ = 1/α)
    x̂^k  = (1/n) Σ_i x_i^k                                  (53)

FedProx = distributed PA with a constant uniform α; FedAvg = the limit ρ → 0⁺ (no proximal term).
The local argmin is either exact (`local_steps=None`, the paper's (52)) or, as in the textbook
algorithms, `local_steps` gradient steps of size `step` started from the server model x̂^{k−1}:
    x ← x − step·(∇f_i(x) + μ(x − x̂^{k−1})).
Uniform weights p_i = 1/n keep the model Σ_i f_i unchanged (N_i/N weights would solve Σ p_i f_i).
Known limitation (not a bug): with heterogeneous clients and more than one local step, the fixed
point of FedProx / FedAvg is not the minimizer of Σ f_i (client drift); with one local step both
are gradient descent on (1/n)Σ f_i and converge to it.
Stop: ‖x̂^k − x̂^{k−1}‖∞ ≤ tol (the dual residual D of (70)); no consensus test (C ≠ 0 at the
fixed point when clients differ). Local constraints keep their AL multiplier step each round.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fedmodel.errors import FedModelError
from .dald import DALD


class _DistributedPA(DALD):
    """Fed-DALD-CC with μ ≡ 0 and x̂ = mean(x_i) (distributed PA, (51)–(53))."""

    def __init__(self, prox: float, step: float, local_steps: int | None, max_rounds: int,
                 tol: float, x0: Any = None, beta: float = 2.0):
        if prox < 0 or step <= 0 or max_rounds < 1 or tol < 0:
            raise FedModelError(f"{type(self).__name__} needs mu ≥ 0, step > 0, max_rounds ≥ 1 "
                                f"and tol ≥ 0 (got mu={prox}, step={step}, max_rounds={max_rounds})")
        if local_steps is not None and int(local_steps) < 1:
            raise FedModelError(f"local_steps must be ≥ 1 or None (exact local solve), got {local_steps}")
        super().__init__(rho=float(np.sqrt(prox / 2.0)), inner_rule="B4", v_max=1,
                         eps_primal=tol, eps_dual=tol,
                         solver="exact" if local_steps is None else "gd", step=step,
                         local_steps=1 if local_steps is None else int(local_steps),
                         max_iterations=max_rounds, warm_start=False, mode="cc", beta=beta, x0=x0)
        self.dual_updates = False
        self.require_consensus = False
        self.mu, self.max_rounds, self.tol = float(prox), int(max_rounds), float(tol)
        self.exact_local = local_steps is None

    def run(self, problem, **kwargs):
        if problem.server.terms or problem.server.constraints:
            raise FedModelError(f"{type(self).__name__} has no server step for the server block's "
                                "terms or constraints (e.g. a λ‖w‖₁ regularizer); put them on the "
                                "clients or use backends.DALD")
        if self.exact_local and self.mu == 0:
            raise FedModelError("FedAvg with exact local solves needs local_steps ≥ 1 (an exact "
                                "local argmin of f_i alone is one-shot averaging)")
        out = super().run(problem, **kwargs)
        out["iterations"] = {"rounds": out["iterations"]["inner"]}
        for record in out["history"]:
            record["round"] = record.pop("iteration")
        return out


class FedProx(_DistributedPA):
    """FedProx (Li et al.) as distributed PA: proximal weight `mu` = 1/α = 2ρ² (the DALD paper's
    ρ = 1 gives mu = 2), `local_steps` GD steps of size `step` from x̂ (None: exact prox solve),
    `max_rounds` rounds. Paper defaults: ρ = 1, α = 1e-4, one local step, 1000 iterations."""

    name = "fedprox"

    def __init__(self, mu: float = 2.0, step: float = 1e-4, local_steps: int | None = 1,
                 max_rounds: int = 1000, tol: float = 1e-8, x0: Any = None):
        super().__init__(mu, step, local_steps, max_rounds, tol, x0)


class FedAvg(_DistributedPA):
    """FedAvg (McMahan et al.) as FedProx with ρ → 0⁺: `local_steps` GD steps of size `step`
    on f_i from x̂, then x̂ = mean of the client models."""

    name = "fedavg"

    def __init__(self, step: float = 1e-4, local_steps: int = 1, max_rounds: int = 1000,
                 tol: float = 1e-8, x0: Any = None):
        if local_steps is None:
            raise FedModelError("FedAvg needs local_steps ≥ 1")
        super().__init__(0.0, step, local_steps, max_rounds, tol, x0)
