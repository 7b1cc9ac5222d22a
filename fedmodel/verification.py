"""`verify`: how far a result is from the exact answer (docs/api.md §5).

Every measure is relative to its own scale, never to max(1, ·), so multiplying a model's data
by a power of ten changes no verdict, and `ok` needs all of them within `rtol`:

- objective gap |f(x) − f*| / S, S the objective's scale at the reference (`Certificate.
  objective_scale`: Σ over its terms of |t(x*)| ∨ |t(x*) − t(0)|, so a least-squares optimum
  near 0 is measured against the loss at the origin, not against 1);
- solution distance, per variable, ‖x − x*‖∞ / ‖x*‖∞ (slacks excluded); when the optimum is
  0 (or below ZERO_LENGTH of the variable's natural length, `Certificate.lengths`), that
  length's ZERO_LENGTH part takes its place; where the minimizers are not a point (the
  objective constant along the null space of the maps through which the variables enter:
  one-hot columns), measured from the minimizer x* + P_N(x − x*) when it is one — its objective
  the reference's and its constraints met (`fedmodel.solution_set`) — and the report says so;
- feasibility, KKT stationarity and complementarity: the result's certificate's relative
  measures (`fedmodel.certificate`), computed at the result's point;
- second order, for a model that is not convex (no reference): the Lagrangian's most negative
  curvature along the active constraints relative to its pieces' (`fedmodel.second_order`),
  so that a maximum or a saddle where the KKT conditions hold is not OK.
"""
from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np

from .compiler.codegen import Plan
from .errors import FedModelError
from .result import Certificate, Result
from .second_order import negative_curvature
from .solution_set import solution_nearby
from .verify_report import FAR, KKT_MEASURES, Report, why_failed

# a variable whose optimum is smaller than ZERO_LENGTH × its natural length (the Lagrangian's
# size over its gradients' size) counts as 0: its distance is measured against that much. A
# CVXPY optimum that is exactly 0 comes back as ~1e-12, which would make any backend's 1e-8
# look infinitely far.
ZERO_LENGTH = 1e-6


def verify(result: Result, reference: Result | None = None, rtol: float = 1e-3) -> Report:
    """Compare `result` with `reference` (default: a fresh CVXPY solve when the model is convex).

    Each measure is relative to its own scale (module docstring); `ok` holds only when the run
    converged and every measure is within `rtol`; `failed` names the others.

    A result is checked against the model it solved: when Parameters changed since the solve
    (`Result.parameters` holds the values it was solved with), verify sets them back to those
    values for every measure and the fresh reference, puts the current ones back afterwards
    (also on an error), and names each changed Parameter (old → new) in `notes`. A reference
    solved at other Parameter values than the result is noted too.

    >>> report = verify(prob.solve("proxal"))   # doctest: +SKIP
    >>> report.ok
    True
    """
    _check_arguments(result, reference, rtol)
    notes: list[str] = []
    with _solved_parameters(result, reference, notes):
        return _verify(result, reference, rtol, notes)


def _verify(result: Result, reference: Result | None, rtol: float, notes: list[str]) -> Report:
    """`verify` with the result's Parameter values in place."""
    problem = result.problem
    if reference is None and problem is not None:
        reference = _reference(problem, notes) if problem.is_convex() else None
        if reference is None and not notes:
            notes.append("the model is not convex: CVXPY cannot certify it; only the KKT "
                         "certificate applies")
            warnings.warn("verify: nonconvex model — no CVXPY reference, KKT certificate only")
    measures: dict[str, float] = {}
    where: dict[str, str] = {}
    gap, distance = float("nan"), float("nan")
    answered = reference is not None and reference.status == "converged"
    reference_off = 0.0     # the reference's own worst relative KKT measure, where beyond rtol
    reference_kkt = float("nan")   # the same measure, whatever its size
    if reference is not None and not answered:
        said = reference.info.get("cvxpy_status")
        notes.append(f"the reference ended {reference.status!r}" + (f" ({said})" if said else ""))
    certificate = _certificate(result, notes) if result.values else None
    if answered and result.values:
        reference_certificate = _certificate(reference, notes)
        if reference_certificate is not None and reference_certificate.relative:
            worst = max(reference_certificate.relative_stationarity,
                        reference_certificate.relative_feasibility,
                        reference_certificate.relative_complementarity)
            reference_kkt = worst
            if not worst <= rtol:   # CVXPY's tolerances are absolute: data far from unit scale
                reference_off = worst
                notes.append(f"the reference itself fails its KKT check ({worst:.2g} relative): "
                             f"the {reference.backend} answer may be inaccurate, so the gap and "
                             "distance measure against an inexact point")
        gap = _objective_gap(result, reference, reference_certificate)
        distance, worst = _distance(problem, result, reference, reference_certificate, rtol, notes)
        measures["objective gap"], measures["solution distance"] = gap, distance
        where["solution distance"] = worst
    if result.values and (answered or reference is None):
        cert = certificate if certificate is not None and certificate.relative else None
        measures["feasibility"] = cert.relative_feasibility if cert else float("nan")
        measures["KKT stationarity"] = cert.relative_stationarity if cert else float("nan")
        measures["KKT complementarity"] = cert.relative_complementarity if cert else float("nan")
        if cert:
            where.update({"feasibility": cert.worst.get("feasibility"),
                          "KKT stationarity": cert.worst.get("stationarity"),
                          "KKT complementarity": cert.worst.get("complementarity")})
    if result.values and problem is not None and not problem.is_convex():   # with or without a reference
        _second_order(problem, result, certificate, measures, notes, rtol)
    failed = [name for name, value in measures.items() if not value <= rtol]   # nan fails
    if answered or reference is None:
        if result.status != "converged" or not result.values:
            failed.insert(0, "status")
        ok = not failed
    else:    # the reference has no answer: only the same verdict (infeasible, unbounded) agrees
        ok = _same_verdict(result, reference, notes, certificate, rtol)
        if not ok:
            failed.insert(0, "status")
    kkt = max([measures[m] for m in KKT_MEASURES if m in measures], default=0.0)
    notes.extend(why_failed(failed, rtol, distance, kkt, reference_off, reference_kkt))
    return Report(objective_gap=gap, solution_distance=distance, max_violation=result.max_violation,
                  kkt=certificate if certificate is not None else result.certificate, ok=bool(ok),
                  rtol=rtol, result=result, reference=reference, notes=notes, measures=measures,
                  failed=failed, where={k: v for k, v in where.items() if v})


@contextlib.contextmanager
def _solved_parameters(result: Result, reference: Result | None, notes: list[str]):
    """The model's Parameters at the values `result` was solved with while verify runs, the
    current ones put back after (a stored certificate of one λ beside a reference of another
    would say nothing true about either)."""
    problem = result.problem
    now = {p.uid: p for p in problem.parameters()} if hasattr(problem, "parameters") else {}
    solved = result.parameters
    changed = [(p, solved[uid], p.value) for uid, p in now.items()
               if uid in solved and not _same_value(p.value, solved[uid])]
    if changed:
        notes.append("Parameters changed since the solve: " + ", ".join(
            f"{p.name} {_shown(old)} → {_shown(new)}" for p, old, new in changed)
            + "; verified against the model at the values it was solved with")
    if reference is not None and reference.problem is problem:
        other = [now[uid].name for uid, value in reference.parameters.items()
                 if uid in now and uid in solved and not _same_value(value, solved[uid])]
        if other:
            notes.append(f"the reference was solved at other values of {', '.join(other)} than "
                         "the result: it answers another model")
    try:
        for param, old, _ in changed:
            param.value = old
        yield
    finally:
        for param, _, new in changed:
            param.value = new


def _same_value(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _shown(value) -> str:
    """A Parameter's value in a note: the number, or its shape for an array."""
    if value is None:
        return "None"
    array = np.asarray(value)
    return f"{float(array.reshape(-1)[0]):g}" if array.size == 1 else f"(array {array.shape})"


def _second_order(problem, result: Result, certificate: Certificate | None,
                  measures: dict[str, float], notes: list[str], rtol: float) -> None:
    """A nonconvex model's point: the KKT conditions hold at a maximum or a saddle as well, so
    the Lagrangian's curvature along the active constraints is measured too (`second_order`)."""
    if certificate is None or not certificate.relative or problem.remote_data():
        return
    curvature = negative_curvature(problem, result.values, certificate.lengths)
    if curvature is None:
        notes.append("the second-order check could not be made at this point (no length to "
                     "step by, or the model is undefined next to it)")
        return
    measures["second order"] = curvature
    if curvature > rtol:
        notes.append(f"the Lagrangian curves down along the active constraints ({curvature:.2g} "
                     "of its pieces' curvature): a saddle or maximum, not a minimum")


def _check_arguments(result, reference, rtol) -> None:
    """A FedModelError for what verify cannot read (an AttributeError deep inside otherwise)."""
    for what, value in (("result", result), ("reference", reference)):
        if not isinstance(value, Result) and (what == "result" or value is not None):
            hint = " (a Problem: solve it first, e.g. verify(prob.solve(), prob.solve('cvxpy')))" \
                if type(value).__name__ == "Problem" else " (leave reference out for a fresh " \
                "CVXPY solve)" if isinstance(value, str) else ""
            raise FedModelError(f"verify's {what} must be a Result from prob.solve(...), got "
                                f"{type(value).__name__}{hint}")
    if not (isinstance(rtol, (int, float, np.integer, np.floating)) and 0 < rtol < math.inf):
        raise FedModelError(f"verify's rtol must be a positive number, got {rtol!r}")


def _certificate(result: Result, notes: list[str]) -> Certificate | None:
    """The result's certificate with its relative measures: the backend's own when it has
    them, else computed from the result's point (a backend's own certificate, a hand-made
    Result, or data that lives on the workers until `prob.load_data()`)."""
    if result.certificate is not None and result.certificate.relative:
        return result.certificate
    problem = result.problem
    if problem is None or problem.remote_data() \
            or any(v.uid not in result.values for v in problem.variables()):
        notes.append(f"the {result.backend} result has no KKT certificate to measure"
                     + (" (its data are on the workers: prob.load_data() first)"
                        if problem is not None and problem.remote_data() else ""))
        return result.certificate
    return problem.kkt_certificate(result.values, result.multipliers)


def _objective(result: Result) -> float:
    """The objective at the result's point, evaluated again (a backend's report could be of
    another point); the reported value where the model cannot be evaluated here."""
    problem = result.problem
    if problem is None or problem.remote_data():
        return float(result.objective)
    variables = problem.variables()
    if any(v.uid not in result.values for v in variables):
        return float(result.objective)
    value = Plan([problem.objective], variables)(*[result.values[v.uid] for v in variables])[0]
    return float(np.sum(value))


def _objective_gap(result: Result, reference: Result, certificate: Certificate | None) -> float:
    f, f_star = _objective(result), _objective(reference)
    if f == f_star:
        return 0.0
    scale = certificate.objective_scale if certificate is not None and certificate.relative \
        else abs(f_star)
    return abs(f - f_star) / scale if scale > 0 else float("inf")


def _distance(problem, result: Result, reference: Result, certificate: Certificate | None,
              rtol: float, notes: list[str]) -> tuple[float, str | None]:
    """The largest relative distance over the variables (not slacks), and its variable.

    The reference is itself known only to about its relative KKT stationarity ε times each
    variable's natural length ℓ: an optimum within FAR·ε·ℓ of 0 is 0 as far as the reference
    can tell (CVXPY's exp cones give w* = 0 as −3.5e-6 of a length 2, ε = 1.8e-6), and a
    difference FAR·ε·ℓ from it reads rtol — only where FAR·ε ≤ rtol: a reference that fails
    or nearly fails its own check excuses nothing."""
    lengths = _by_this_problem(problem, reference, certificate.lengths if certificate is not None else {})
    uncertain = FAR * certificate.relative_stationarity / rtol \
        if certificate is not None and certificate.relative else 0.0
    if not uncertain <= 1.0:     # a reference that cannot place its point within rtol·ℓ excuses nothing
        uncertain = 0.0
    variables = {v.uid: v for v in problem.variables()} if problem is not None else {}
    reference_values = _reference_values(problem, reference)
    worst, name = _largest(variables, result, reference_values, reference_values, lengths,
                           uncertain, rtol, notes)
    if worst > rtol and problem is not None and certificate is not None and certificate.relative \
            and not problem.remote_data():
        nearby = solution_nearby(problem, result.values, reference_values, certificate.objective_scale, rtol)
        if nearby is not None:       # the model cannot tell x* from z: measure from z
            point, dimension, which = nearby
            worst, name = _largest(variables, result, reference_values, point, lengths, uncertain,
                                   rtol, [])
            notes.append(f"solution set not a point: distance measured modulo a {dimension}-"
                         f"dimensional subspace (along it {which} is constant; the point there "
                         "has the reference's objective and meets the constraints)")
    return worst, name


def _largest(variables: dict, result: Result, reference_values: dict, target: dict,
             lengths: dict, uncertain: float, rtol: float, notes: list[str]) -> tuple[float, str | None]:
    """`_distance`'s largest relative distance of the result's point from `target` (the
    reference's point, or a minimizer as good), each variable on the reference's scale."""
    worst, name = 0.0, None
    for uid, ref_value in reference_values.items():
        var = variables.get(uid)
        if getattr(var, "is_slack", False):
            continue
        label = getattr(var, "label", str(uid))
        if uid not in result.values:
            return math.inf, label
        ref_value = np.asarray(ref_value, dtype=float)
        difference = float(np.max(np.abs(np.asarray(result.values[uid], dtype=float)
                                         - np.asarray(target[uid], dtype=float)), initial=0.0))
        size = max(float(np.max(np.abs(ref_value), initial=0.0)), ZERO_LENGTH * lengths.get(uid, 0.0))
        within = float(np.max(np.abs(ref_value), initial=0.0)) <= uncertain * rtol * lengths.get(uid, 0.0)
        scale = max(size, uncertain * lengths.get(uid, 0.0)) if within else size
        if scale > size and difference > 0:
            notes.append(f"{label}'s optimum is within the reference's own uncertainty of 0 "
                         f"({uncertain * rtol / FAR:.1e} of its length {lengths[uid]:.2g}): "
                         f"its distance is measured against {scale:.2g}")
        distance = 0.0 if difference == 0 else difference / scale if scale > 0 else math.inf
        if not distance <= worst:     # nan (a nan entry) is the worst
            worst, name = distance, label
    return worst, name


def _by_this_problem(problem, reference: Result, by_uid: dict) -> dict:
    """`by_uid` (keyed by the reference's variables) keyed by this problem's, matched by label
    as `_reference_values` matches the values (a reference solved on another build)."""
    other = reference.problem
    if problem is None or other is None or other is problem:
        return by_uid
    theirs = {v.label: v.uid for v in other.variables()}
    return {v.uid: by_uid[theirs[v.label]] for v in problem.variables()
            if theirs.get(v.label) in by_uid}


def _reference_values(problem, reference: Result) -> dict:
    """The reference's point keyed by this problem's variables. A reference solved on another
    build of the same model (a function called twice) has other variable objects: its values
    are matched by label and shape; a variable without its counterpart is a clear error, not an
    infinite distance."""
    other = reference.problem
    if problem is None or other is None or other is problem:
        return reference.values
    theirs = {v.label: v for v in other.variables() if v.uid in reference.values}
    matched = {}
    for var in problem.variables():
        if getattr(var, "is_slack", False):    # the compiler's own: not compared (`_distance`)
            continue
        twin = theirs.get(var.label)
        if twin is None or twin.shape != var.shape:
            found = f"of shape {twin.shape}" if twin is not None else "none" if var.name != \
                f"{var._prefix}{var.uid}" else "none; unnamed, its label is new in each build: name it"
            raise FedModelError(
                f"verify: the reference solves another model — this problem's variable "
                f"{var.label!r} of shape {var.shape} has no counterpart there ({found}); solve "
                f"the reference on the same problem: fm.verify(res, prob.solve('cvxpy'))")
        matched[var.uid] = reference.values[twin.uid]
    return matched


VERDICTS = ("infeasible", "unbounded")


def _same_verdict(result: Result, reference: Result, notes: list[str], certificate, rtol) -> bool:
    """Both say infeasible (or unbounded): they agree; else not ok. A feasible point refutes "infeasible"."""
    ours, theirs = result.problem, reference.problem   # one model, or builds of it: the same names
    names = lambda p: {x.name for x in p.constraints} | {v.label for v in p.variables()}  # noqa: E731
    one_model = ours is theirs or None not in (ours, theirs) and names(ours) == names(theirs)
    if reference.status == "infeasible" and certificate is not None and certificate.relative \
            and certificate.relative_feasibility <= rtol and one_model:
        notes.append(f"the reference says infeasible, but this point meets every constraint (relative "
                     f"violation {certificate.relative_feasibility:.1e}): the model is feasible, the "
                     "reference wrong; solve it again (prob.solve('cvxpy', solver='SCS'))")
    if reference.status in VERDICTS and result.status == reference.status:
        notes.append(f"both say the model is {reference.status}: they agree")
        return True
    if reference.status in VERDICTS and result.status == "stalled":
        notes.append(f"the reference says {reference.status}; this run stalled without deciding")
    return False


def _reference(problem, notes: list[str]) -> Result | None:
    """A fresh CVXPY solve, or None (with a note and a warning) when CVXPY rejects the model."""
    from .problem import make_backend   # a backend by its registered name
    from .compiler.epigraph import solve_as_user     # (hinge losses: certified in that form)
    from .errors import CurvatureError
    try:   # through the backend, not problem.solve: the variables keep the result's values
        problem.validate()
        reference = solve_as_user(problem, make_backend("cvxpy"))
        reference.parameters = problem.parameter_values()
        return reference
    except CurvatureError as exc:   # our rules said convex, CVXPY's lowering disagrees
        notes.append(f"CVXPY cannot certify the model ({exc}); only the KKT certificate applies")
        warnings.warn(f"verify: CVXPY rejected the model — KKT certificate only: {exc}")
        return None
