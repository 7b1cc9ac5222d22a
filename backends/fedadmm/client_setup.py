"""FedADMM's client set-up (`fedadmm_init`; Song, Wang, Zuazua, arXiv 2402.13989, Algorithm 1's
initialization): each client's state `program.state["fedadmm"]` — u_i^0, λ_i^0, β_i^0 and its
options — and the automatic local step η_i = 1/(L̂_i + β_i), written once over rows of clients
as the rounds are (`client`)."""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.batched_group import Group
from fedmodel.runtime.batched_procedures import common_value, same_options
from fedmodel.runtime.client_step import client_step
from fedmodel.runtime.program import NodeProgram
from ..common import group_curvature

_CONFIG = {"z": "x", "beta": "1", "alpha": "1", "lam_start": "str", "lr": "1", "local_steps": "1",
           "inexact": "1", "sigma": "1", "sigma_factor": "1", "c": "1", "reference": "str",
           "adaptive": "1", "mu": "1", "tau": "1", "penalty_rule": "str", "beta_min": "1", "beta_max": "1",
           "solver": "str", "start": "str", "safe": "1"}
# the options of a client's state (its `config`): every field but the start point and weights
_OPTIONS = tuple(k for k in _CONFIG if k not in ("z", "beta", "alpha", "lam_start"))


def start_state(program: NodeProgram, z, beta, alpha, lam_start: str, config: dict) -> dict:
    """The client's FedADMM state at the start of a run, without its automatic step (L̂_i: the
    caller's `automatic_step`). β = None keeps the β_i of a previous run (composition)."""
    z = np.asarray(z, float)
    old = program.state.get("fedadmm")
    if beta is None:
        beta = old["beta"] if old else 1.0
    lam = np.zeros_like(z)
    if lam_start == "gradient":
        lam = program.value_grad(z, program.y)[1][:program.n_shared] / alpha
    return {"u": z.copy(), "lam": lam, "beta": float(beta), "alpha": float(alpha), **config, "last": {},
            "auto_lr": config.get("lr") is None, "curvature": None}


def automatic_step(s: dict, curvature: float) -> None:
    """η_i = 1/(L̂_i + β_i) from the client's curvature estimate L̂_i."""
    s["curvature"] = float(curvature)
    s["lr"] = 1.0 / (s["curvature"] + s["beta"])


def _init_rows(group: Group, rows: np.ndarray, z: np.ndarray, beta, alpha, lam_start: str,
               config: dict) -> tuple[np.ndarray, np.ndarray]:
    """u_i^0 = z^0, λ_i^0 = 0 (the authors' code) or ∇f̃_i(z^0) ("gradient", used by ProxAL's
    composition: the multiplier's value at a solution, λ_i* = ∇f̃_i(z*)); β_i^0; the automatic
    step from L̂_i of f̃_i = f_i/α_i near the start (`common.group_curvature`: one gradient of
    the rows per power-iteration step; on one node the program's own, `local_curvature`'s
    numbers). Returns the server's first cache entries (w_i, β_i), one row per client."""
    group.sync()                # β = None keeps each client's β_i: read from its state
    states = [start_state(group.programs[r], z, beta, a, lam_start, config) for r, a in zip(rows, alpha)]
    if states[0]["auto_lr"]:
        for s, curvature in zip(states, group_curvature(group, rows, z, np.asarray(alpha, float))):
            automatic_step(s, curvature)
    for r, s in zip(rows, states):
        group.programs[r].state["fedadmm"] = s
    group.forget()              # new state dicts: the rounds' check of them (`_clients`) is void
    betas = np.array([s["beta"] for s in states])
    return betas[:, None] * z - np.array([s["lam"] for s in states]).reshape(len(rows), -1), betas


def _init_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """`fedadmm_init` as a group request (common z and options, α_i as a block or common)."""
    if set(blocks) - {"alpha"} or "z" not in common:
        return None
    alpha = blocks["alpha"] if "alpha" in blocks else np.full(len(rows), common["alpha"])
    config = {k: v for k, v in common.items() if k in _OPTIONS}
    w, beta = _init_rows(group, rows, np.asarray(common["z"], float), common.get("beta"), alpha,
                         common.get("lam_start", "zero"), config)
    return {"w": w, "beta": beta}


@client_step("fedadmm_init", _CONFIG, {"w": "x", "beta": "1"}, stacked=_init_stacked)
def _init(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """The clients' start (`_init_rows`) for the members (per-node payloads: one z and options,
    α_i each its own); None for a group sent different ones (served member by member)."""
    z = common_value(payloads, members, "z")
    opts = same_options(payloads, members, _OPTIONS + ("beta", "lam_start"))
    if z is None or opts is None:
        return None
    rows = np.array([group.index[m] for m in members])
    config = {k: v for k, v in opts.items() if k in _OPTIONS}
    w, beta = _init_rows(group, rows, z, opts.get("beta"), [float(payloads[m]["alpha"]) for m in members],
                         opts.get("lam_start", "zero"), config)
    return {m: {"w": w[j], "beta": float(beta[j])} for j, m in enumerate(members)}
