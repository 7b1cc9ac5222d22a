"""DP-ADMM's set-up request on a group of clients: `dp_admm_init` asks the clients' curvature
L̂_p at z_p^1 too (its `curvature` field, non-private runs: the server's ρ floor), which was a
"local_curvature" request of its own — one set-up round trip where there were two (issue 27
item 1). On the batched and JAX executors the estimate is the one group request
"local_curvature" would have been (`common._curvature_batched`: one group gradient per power
step), so the floor, and the run, are bit for bit as before; each member's init is its own."""
from __future__ import annotations

from fedmodel.runtime.messages import with_forms
from ..common import _curvature_batched
from . import client, sampled


def _init_batched(group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """`dp_admm_init` for the group's `members` when they ask the curvature (one z_p^1 and one
    step count), else None (served member by member, as without a batched form)."""
    if not all(payloads[m].get("curvature") for m in members):
        return None
    asked = {m: {"z": payloads[m]["z0"], "iterations": payloads[m]["curvature"]} for m in members}
    estimates = _curvature_batched(group, members, asked)      # (reads the data and y_p only)
    if estimates is None:
        return None
    replies = {}
    for m in members:
        own = {k: v for k, v in payloads[m].items() if k != "curvature"}
        replies[m] = {**client._client_init(group.programs[group.index[m]], **own), "L": estimates[m]["L"]}
    group.forget()            # (the members' states are new: the group's checks of them are void)
    return replies


# every client step of DP-ADMM (`DPADMM.procedures`)
PROCEDURES = (with_forms(client._client_init, batched=_init_batched), *client.PROCEDURES, sampled._clipped)
