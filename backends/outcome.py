"""What a backend's run hands to the framework: a `Status` and an `Outcome` (`Backend.run`).

`Backend.solve` turns an `Outcome` into the public `Result` (`base.finish_result`); the
statuses are the `Result.status` strings of API.md §5, as a str-valued enum so that
`res.status == "converged"` keeps working and a misspelt status is an AttributeError, not a
silent new string.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np


class Status(str, Enum):
    """How a run ended (API.md §5)."""

    CONVERGED = "converged"
    MAX_ITERATIONS = "max_iterations"
    DIVERGED = "diverged"
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    STALLED = "stalled"
    BUDGET_EXHAUSTED = "budget_exhausted"     # a DP run whose privacy budget ended it

    # printed, formatted and repr'd as the plain string, as the literals were (messages such
    # as "the run ended 'infeasible'" read the same)
    __str__ = str.__str__
    __format__ = str.__format__

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass
class Outcome:
    """A run's outcome before `finish_result` judges it: the status, the solution `values` by
    variable uid (gathered from the nodes by the framework at the flat shared vector `shared`
    when the loop leaves them None), the multipliers by constraint name, the per-iteration
    `history`, the `iterations` counts, the communication `ledger` and backend-specific `info`.
    `biased_fixed_point`: the backend's fixed point does not enforce client constraints at the
    average (FedAvg / FedProx / DGD; `finish_result` reads it). `certificate`: a KKT
    certificate the backend computed itself (None: `finish_result` computes it)."""

    status: Status
    values: dict[int, np.ndarray] | None = None
    multipliers: dict[str, Any] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    iterations: dict[str, int] = field(default_factory=dict)
    ledger: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    certificate: Any = None
    biased_fixed_point: bool = False
    shared: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)     # a string that is no status: ValueError here

    # read access by key, as the dicts these outcomes replace were read (`out["values"]`)
    def __getitem__(self, key: str) -> Any:
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default) if key in _FIELDS else default

    def as_dict(self) -> dict[str, Any]:
        """The outcome as the dict a checkpoint stores (`Checkpointer.finish`) and the scaling
        layer maps (`ScaledModel.outcome_to_user`): the status as its plain string."""
        out = {f: getattr(self, f) for f in _FIELDS if f != "shared"}
        out["status"] = self.status.value
        return out

    @classmethod
    def of(cls, outcome: "Outcome | dict[str, Any]") -> "Outcome":
        """`outcome` itself, or the Outcome of a dict with its keys (a checkpoint written
        before this class, a test's hand-made outcome); an unknown key is refused."""
        if isinstance(outcome, Outcome):
            return outcome
        unknown = set(outcome) - set(_FIELDS)
        if unknown:
            raise TypeError(f"outcome keys {sorted(unknown)} are not Outcome fields {list(_FIELDS)}")
        return cls(**outcome)


_FIELDS = tuple(f.name for f in dataclasses.fields(Outcome))
