"""`verify`: how far a result is from the exact answer (docs/api.md §5)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from .result import Certificate, Result


@dataclass
class Report:
    objective_gap: float
    solution_distance: float
    max_violation: float
    kkt: Certificate | None
    ok: bool
    rtol: float
    result: Result = field(repr=False)
    reference: Result | None = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        ref = self.reference
        rows = [("", self.result.backend, ref.backend if ref else "-"),
                ("status", self.result.status, ref.status if ref else "-"),
                ("objective", f"{self.result.objective:.8g}", f"{ref.objective:.8g}" if ref else "-"),
                ("max violation", f"{self.result.max_violation:.2e}", f"{ref.max_violation:.2e}" if ref else "-")]
        if self.result.certificate:
            rows.append(("KKT stationarity", f"{self.result.certificate.stationarity:.2e}",
                         f"{ref.certificate.stationarity:.2e}" if ref and ref.certificate else "-"))
            rows.append(("KKT feasibility", f"{self.result.certificate.feasibility:.2e}",
                         f"{ref.certificate.feasibility:.2e}" if ref and ref.certificate else "-"))
        width = max(len(r[0]) for r in rows)
        lines = [f"{a:<{width}}  {b:>16}  {c:>16}" for a, b, c in rows]
        lines.append(f"{'objective gap':<{width}}  {self.objective_gap:>16.2e}  (relative)")
        lines.append(f"{'solution distance':<{width}}  {self.solution_distance:>16.2e}  (∞-norm, relative)")
        if ref is not None and ref.info.get("solver"):
            lines.append(f"reference solver: {ref.info['solver']}")
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append(f"verdict (rtol {self.rtol:g}): {'OK' if self.ok else 'NOT OK'}")
        return "\n".join(lines)


def verify(result: Result, reference: Result | None = None, rtol: float = 1e-3) -> Report:
    """Compare `result` with `reference` (default: a fresh CVXPY solve when the model is convex).

    >>> report = verify(prob.solve("proxal"))   # doctest: +SKIP
    >>> report.ok
    True
    """
    problem = result.problem
    notes: list[str] = []
    if reference is None and problem is not None:
        reference = _reference(problem, notes) if problem.is_convex() else None
        if reference is None and not notes:
            notes.append("the model is not convex: CVXPY cannot certify it; only the KKT "
                         "certificate applies")
            warnings.warn("verify: nonconvex model — no CVXPY reference, KKT certificate only")
    gap, distance = float("nan"), float("nan")
    if reference is not None and reference.status == "converged" and result.values:
        gap = abs(result.objective - reference.objective) / max(1.0, abs(reference.objective))
        distances = []
        for uid, ref_value in reference.values.items():
            if uid in result.values and not getattr(_variable(problem, uid), "is_slack", False):
                scale = max(1.0, float(np.max(np.abs(ref_value), initial=0.0)))
                distances.append(float(np.max(np.abs(result.values[uid] - ref_value), initial=0.0)) / scale)
        distance = max(distances, default=0.0)
    elif reference is not None:
        notes.append(f"the reference ended {reference.status!r} "
                     f"({reference.info.get('cvxpy_status', '')})")
    ok = result.status == "converged" and result.max_violation <= rtol
    if reference is not None and reference.status == "converged":
        ok = ok and gap <= rtol
    elif reference is not None:
        ok = _same_verdict(result, reference, notes)
    if result.certificate is not None and reference is None:
        ok = ok and max(result.certificate.stationarity, result.certificate.feasibility) <= rtol
    return Report(objective_gap=gap, solution_distance=distance, max_violation=result.max_violation,
                  kkt=result.certificate, ok=bool(ok), rtol=rtol, result=result,
                  reference=reference, notes=notes)


VERDICTS = ("infeasible", "unbounded")


def _same_verdict(result: Result, reference: Result, notes: list[str]) -> bool:
    """Both say the model is infeasible (or both unbounded): they agree, there is nothing to
    compare numerically. Anything else against a reference without an answer is not ok."""
    if reference.status in VERDICTS and result.status == reference.status:
        notes.append(f"both say the model is {reference.status}: they agree")
        return True
    if reference.status in VERDICTS and result.status == "stalled":
        notes.append(f"the reference says {reference.status}; this run stalled without deciding")
    return False


def _reference(problem, notes: list[str]) -> Result | None:
    """A fresh CVXPY solve, or None (with a note and a warning) when CVXPY rejects the model."""
    from .problem import make_backend   # a backend by its registered name
    from .errors import CurvatureError
    try:   # through the backend, not problem.solve: the variables keep the result's values
        problem.validate()
        return make_backend("cvxpy").solve(problem)
    except CurvatureError as exc:   # our rules said convex, CVXPY's lowering disagrees
        notes.append(f"CVXPY cannot certify the model ({exc}); only the KKT certificate applies")
        warnings.warn(f"verify: CVXPY rejected the model — KKT certificate only: {exc}")
        return None


def _variable(problem, uid):
    if problem is None:
        return None
    for var in problem.variables():
        if var.uid == uid:
            return var
    return None
