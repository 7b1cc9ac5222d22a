"""`Result`: what every backend returns (docs/api.md §5)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import FedModelError
from .expression import Expression, Parameter, Variable, postorder


@dataclass
class Certificate:
    """KKT residuals in the ∞-norm (paper 1, Definition 1): `stationarity` and `feasibility`
    are absolute, in the data's units. The `relative_*` fields are the same conditions each
    divided by its own scale at the point (the gradients that must cancel, each constraint's
    terms, the Lagrangian's size), unchanged when the data are multiplied by a power of ten;
    `fm.verify` decides on them (`fedmodel.certificate` defines each). `objective_scale` and
    `lengths` (per variable uid) are the scales verify measures gaps and distances against;
    `worst` names the variable or constraint where each relative measure is largest."""

    stationarity: float
    feasibility: float
    relative_stationarity: float | None = None
    relative_feasibility: float | None = None
    relative_complementarity: float | None = None
    objective_scale: float | None = None
    lengths: dict[int, float] = field(default_factory=dict, repr=False)
    worst: dict[str, str | None] = field(default_factory=dict, repr=False)

    @property
    def relative(self) -> bool:
        """Whether the relative measures were computed (not for a backend's own certificate)."""
        return None not in (self.relative_stationarity, self.relative_feasibility,
                            self.relative_complementarity, self.objective_scale)

    def __str__(self) -> str:
        text = f"stationarity {self.stationarity:.2e}, feasibility {self.feasibility:.2e}"
        if self.relative:
            text += (f" (relative: {self.relative_stationarity:.2e}, "
                     f"{self.relative_feasibility:.2e}, complementarity "
                     f"{self.relative_complementarity:.2e})")
        return text


class History(list):
    """One dict per outer iteration / round; `.to_frame()` gives a pandas DataFrame.

    It stays a list (backends append records); `to_frame()` builds the table on demand."""

    def to_frame(self):
        """One row per record, one column per key. Per-client dicts (e.g. `client_objective`)
        become one column per client, `client_objective[c0]`; lists stay as cells."""
        import pandas as pd
        rows = []
        for record in self:
            row = {}
            for key, value in record.items():
                if isinstance(value, dict):
                    row.update({f"{key}[{k}]": v for k, v in value.items()})
                else:
                    row[key] = value
            rows.append(row)
        return pd.DataFrame(rows)


@dataclass
class Result:
    status: str
    values: dict[int, np.ndarray]
    objective: float
    max_violation: float
    backend: str
    iterations: dict[str, int] = field(default_factory=dict)
    history: History = field(default_factory=History)
    multipliers: dict[str, np.ndarray] = field(default_factory=dict)
    ledger: Any = None
    certificate: Certificate | None = None
    wall_time: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    problem: Any = field(default=None, repr=False)
    # the Parameters' values the model was solved with (uid -> a copy), recorded by
    # `Problem.solve`: `fm.verify` checks the result against that model, not a later one
    parameters: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def value(self, var: Variable | Expression) -> np.ndarray | float:
        """The solution value of a variable (shared, private or slack) of the solved problem, or
        of an expression of them (`res.value(fm.norm2(w))`, `res.value(X @ w)`) at this result's
        point, its Parameters at the values it was solved with (`parameters`).

        Values are keyed by the variable object (its uid), never by name: each client's private
        `s` has its own value."""
        if isinstance(var, Expression) and not isinstance(var, Variable):
            return self._evaluate(var)
        if not isinstance(var, Variable):
            raise FedModelError(f"Result.value takes a Variable or an expression of the problem's "
                                f"variables, got {type(var).__name__}")
        if var.uid not in self.values:
            if not self.values and self.status != "converged":
                raise FedModelError(f"no value for {var.label!r}: the {self.backend} run ended "
                                    f"{self.status!r} without a point (see result.info)")
            raise FedModelError(f"variable {var.label!r} is not part of the problem this result "
                                "solves")
        return self.values[var.uid]

    def _evaluate(self, expr: Expression) -> np.ndarray | float:
        """`expr` at this result's variables and solved-with Parameters (not at the leaves'
        current values, which a later solve or assignment may have changed)."""
        from .compiler.codegen import Plan
        leaves = [node for node in postorder([expr]) if isinstance(node, (Variable, Parameter))]
        values = []
        for leaf in leaves:
            value = self.value(leaf) if isinstance(leaf, Variable) else self.parameters.get(leaf.uid, leaf.value)
            if value is None:
                raise FedModelError(f"parameter {leaf.label!r} has no value")
            values.append(value)
        out = Plan([expr], leaves)(*values)[0]
        return float(out) if np.ndim(out) == 0 else np.asarray(out)

    def values_by_label(self) -> dict[str, np.ndarray]:
        """{label: value} for display: `w` for a shared variable, `c3.s` for client c3's `s`."""
        if self.problem is None:
            raise FedModelError("this result does not know its problem; use result.value(var)")
        return {v.label: self.values[v.uid] for v in self.problem.variables() if v.uid in self.values}

    def __str__(self) -> str:
        lines = [f"{self.backend}: {self.status} in {self._iterations()} ({self.wall_time:.3g} s)",
                 f"  objective      {self.objective:.6g}",
                 f"  max violation  {self.max_violation:.2e}"]
        if self.certificate is not None:
            lines.append(f"  KKT            {self.certificate}")
        auto = self.info.get("auto") if isinstance(self.info, dict) else None
        if isinstance(auto, dict):      # backend="auto": what it picked and the deciding reason
            lines.append(f"  auto           picked {auto['backend']}: {auto['reasons'][0]}")
        communication = self.info.get("communication") if isinstance(self.info, dict) else None
        if isinstance(communication, dict):
            lines.append(f"  communication  {communication_line(communication)}")
        privacy = self.info.get("privacy") if isinstance(self.info, dict) else None
        if isinstance(privacy, dict) and "pld" in privacy:   # a private run's accounting, per client
            (pld, delta), rdp = privacy["pld"], privacy["rdp"][0]
            lines.append(f"  privacy        ε = {pld:.4g} (PLD), {rdp:.4g} (RDP), "
                         f"{privacy['advanced'][0]:.4g} (advanced), {privacy['basic'][0]:.4g} (basic) "
                         f"at δ = {delta:g} per client, {'formal' if privacy.get('formal') else 'nominal'}")
        return "\n".join(lines)

    def _iterations(self) -> str:
        return ", ".join(f"{v} {k}" for k, v in self.iterations.items()) or "-"


def communication_line(summary: dict[str, Any]) -> str:
    """One line of a run's communication (`Ledger.summary`): round trips, then the floats (and
    bytes) a client received and sent, the mean over the clients, and the max where it differs."""
    per, nbytes = summary["floats_per_client"], summary["bytes_per_client"]
    trips = summary["round_trips"]
    text = (f"{trips} round trip{'' if trips == 1 else 's'}; per client "
            f"{per['down']['mean']:.4g} floats down ({_size(nbytes['down']['mean'])}), "
            f"{per['up']['mean']:.4g} up ({_size(nbytes['up']['mean'])})")
    if any(per[d]["max"] != per[d]["mean"] for d in ("down", "up")):   # clients differ
        text += f", mean; max {per['down']['max']:.4g} down, {per['up']['max']:.4g} up"
    return text


def _size(count: float) -> str:
    """A byte count for reading: B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.3g} {unit}"
        count /= 1024
    return f"{count:.3g} GiB"
