"""`verify`'s `Report`: the measures it holds and its readable table (docs/api.md §5).

Split from `fedmodel.verification` (which computes the measures) so that each module stays one job."""
from __future__ import annotations

from dataclasses import dataclass, field

from .result import Certificate, Result

# the measures `ok` needs, in the order the report shows them
MEASURES = ("objective gap", "solution distance", "feasibility", "KKT stationarity",
            "KKT complementarity", "second order")
KKT_MEASURES = MEASURES[2:5]   # the result's certificate: all there is without a reference


@dataclass
class Report:
    """What `verify` measured. `measures` maps each name in MEASURES that applies to its value
    (nan: it could not be measured, which fails); `failed` lists the names beyond `rtol`
    (and "status" when the run did not converge)."""

    objective_gap: float
    solution_distance: float
    max_violation: float
    kkt: Certificate | None
    ok: bool
    rtol: float
    result: Result = field(repr=False)
    reference: Result | None = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)
    measures: dict[str, float] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    where: dict[str, str] = field(default_factory=dict)   # measure -> worst variable/constraint

    @property
    def feasibility(self) -> float:
        """The largest violation relative to its constraint's terms."""
        return self.measures.get("feasibility", float("nan"))

    @property
    def stationarity(self) -> float:
        """KKT stationarity relative to the gradients that must cancel."""
        return self.measures.get("KKT stationarity", float("nan"))

    @property
    def complementarity(self) -> float:
        """Σ μ·|c| relative to the Lagrangian's size."""
        return self.measures.get("KKT complementarity", float("nan"))

    def __str__(self) -> str:
        ref = self.reference
        rows = [("", self.result.backend, ref.backend if ref else "-"),
                ("status", self.result.status, ref.status if ref else "-"),
                ("objective", f"{self.result.objective:.8g}", f"{ref.objective:.8g}" if ref else "-"),
                ("max violation", f"{self.result.max_violation:.2e}", f"{ref.max_violation:.2e}" if ref else "-")]
        if self.kkt:   # absolute, in the data's units (paper 1, Definition 1)
            rows.append(("KKT stationarity", f"{self.kkt.stationarity:.2e}",
                         f"{ref.certificate.stationarity:.2e}" if ref and ref.certificate else "-"))
            rows.append(("KKT feasibility", f"{self.kkt.feasibility:.2e}",
                         f"{ref.certificate.feasibility:.2e}" if ref and ref.certificate else "-"))
        width = max(len(r[0]) for r in rows + [(m,) for m in MEASURES])
        lines = [f"{a:<{width}}  {b:>16}  {c:>16}" for a, b, c in rows]
        lines.append(f"relative measures (each on its own scale; ok when ≤ {self.rtol:g}):")
        for name in MEASURES:
            if name == "second order" and name not in self.measures:   # convex: not needed
                continue
            if name not in self.measures:   # e.g. no reference: the KKT measures decide
                lines.append(f"{name:<{width}}  {'-':>16}  {'-':>8}  not measured")
                continue
            value = self.measures[name]
            verdict = "FAILED" if name in self.failed else "ok"
            where = f"  [{self.where[name]}]" if self.where.get(name) else ""
            lines.append(f"{name:<{width}}  {value:>16.2e}  {verdict:>8}  {SCALES[name]}{where}")
        if ref is not None and ref.info.get("solver"):
            lines.append(f"reference solver: {ref.info['solver']}")
        lines.extend(f"note: {n}" for n in self.notes)
        if self.failed:
            lines.append(f"failed: {', '.join(self.failed)}")
        lines.append(f"verdict (rtol {self.rtol:g}): {'OK' if self.ok else 'NOT OK'}")
        return "\n".join(lines)


SCALES = {"objective gap": "|f − f*| / the objective's scale at the reference",
          "solution distance": "max over variables of ‖x − x*‖∞ / ‖x*‖∞",
          "feasibility": "violation / size of the constraint's terms",
          "KKT stationarity": "remainder / size of the gradients that cancel",
          "KKT complementarity": "Σ μ·|c| / size of the Lagrangian",
          "second order": "−(least curvature of the Lagrangian along the active constraints) / "
                          "its pieces' curvature"}
