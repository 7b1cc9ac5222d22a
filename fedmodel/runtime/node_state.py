"""`NodeState`: everything a node program's later requests depend on, as plain typed data.

`NodeProgram.save_state` copies every field, and `load_state` writes every field back — no
field is listed by hand anywhere else, so a field added here travels with Ray snapshots, the
Flower ClientApp's `Context.state` (through `runtime/wire.py`) and checkpoints. Values are
arrays, floats, strings and dicts or lists of them (and the backends' procedure state, which
the wire codec knows).

The fields of `SETTINGS` are the merit's settings the driver sends in "configure" (β and ω):
a checkpoint leaves them out, so that β is stored once in it — in the backend's loop state —
and a resumed run gets them the way the interrupted one did: from the requests that set up its
nodes before `Checkpointer.restore` (backends/base.py) and from its next "configure".
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np


@dataclass(slots=True)
class NodeState:
    """The state of one node program (see the module docstring)."""

    y: np.ndarray                        # the private variables, flat
    y_center: np.ndarray                 # their proximal center (their value at "configure")
    mu: dict[str, np.ndarray]            # the AL multipliers, by constraint name
    centers: dict[int, np.ndarray]       # the proximal centers x̄, ȳ, by variable uid
    # β of the AL terms, as "configure" set it (None before: the merit's default β = 1 and
    # ω_y = 0); ω_y = 1/β is derived, not kept
    beta: float | None = None
    prox_weight: float = 0.0             # ω on the shared variables
    procedures: dict[str, Any] = field(default_factory=dict)   # backends' node-side state
    # the chord Hessian ∇²P_i of the last Newton solve: a resumed Newton solve must start from
    # the same (stale) matrix as the uninterrupted one to reproduce it bitwise. Its factor is
    # not kept: a deterministic function of it, recomputed bit for bit on first use
    hessian: np.ndarray | None = None

    SETTINGS: ClassVar[tuple[str, ...]] = ("beta", "prox_weight")

    def to_plain(self) -> dict[str, Any]:
        """Every field, deep-copied, by name."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}

    def updated(self, plain: dict[str, Any]) -> "NodeState":
        """A new state with the fields of `plain` (deep-copied); fields `plain` leaves out (the
        settings a checkpoint does not store) keep this state's values. Unknown names are
        refused (a state of another fedmodel version)."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(plain) - names)
        if unknown:
            from ..errors import FedModelError
            raise FedModelError(f"node state with unknown fields {unknown} (this fedmodel's "
                                f"fields: {sorted(names)}); save the state with this version")
        return NodeState(**{name: copy.deepcopy(plain[name]) if name in plain else getattr(self, name)
                            for name in names})


def without_settings(plain: dict[str, Any]) -> dict[str, Any]:
    """A saved node state (`NodeState.to_plain`) without the driver's settings (for checkpoints)."""
    return {k: v for k, v in plain.items() if k not in NodeState.SETTINGS}
