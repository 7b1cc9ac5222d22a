"""DALD: distributed augmented-Lagrangian decomposition (Guo, Qu, Pan, Huang, "Distributed
optimization: designed for federated learning"). Equation numbers refer to that paper
(../shared/seeds/dald_distributed_al_decomposition.txt); see ../shared/spec/dald.md.

Fed-DALD-CC (Algorithm 2, star; `cc`, client steps `cc_nodes`) and Fed-DALD-DC (Algorithm 3,
any other connected graph; `dc`, node steps `dc_nodes`), as one backend `DALD` (`backend`).

Penalty convention exactly as the paper: ‖ρ∘C‖² with per-coordinate ρ vectors, μ += 2ρ∘ρ∘C.
In the node's local problem this is `linear`ᵀx + ½Σ_j weight_j (x_j − anchor_j)² with
weight = Σ 2ρ∘ρ (completing the square), solved by the node's solver layer (`local`).

Inner stop rules (§2.5): B1 ‖D‖∞ ≤ ε_dual; B2 ‖D‖∞ ≤ ε_dual^k; B3 v = v_max^k or ‖D‖∞ ≤ ε_dual;
B4 v = v_max or ‖D‖∞ ≤ ε_dual (paper default, v_max = 1). Outer stop: ‖C‖∞ ≤ ε_pri and
‖D‖∞ ≤ ε_dual (and the nodes' own constraint residuals ≤ ε_pri). The B2 / B3 schedules
(ε_dual^k = max(ε_dual, ε₀θ^k), v_max^k = v_max + k) are NOT from the paper (it gives none).

Constraints: a node's own constraints enter its merit P_i as augmented-Lagrangian terms with
penalty β (default β = 2ρ², the paper's ‖ρ∘h‖² ⇔ (β/2)‖h‖²); their multipliers are updated
by the owner at every outer step (Step 2) with `update_multipliers`.

Each client step is written once, over rows of clients (`fedmodel.runtime.client_step`): the
serial, Ray and Flower executors run it on one node, the batched and JAX executors on a group
(`cc_nodes`, `dc_nodes`, the local solver layer `local`, compiled loops in `kernels`).
"""
from .backend import DALD
from .options import PAPER_DALD, ClientModels

__all__ = ["DALD", "PAPER_DALD", "ClientModels"]
