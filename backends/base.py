"""The `Backend` template every algorithm follows (Flower-style: `solve` drives overridable steps)."""
from __future__ import annotations

import copy
import functools
import time
import warnings
from typing import Any

import numpy as np

from fedmodel.collector import collection_paused
from fedmodel.compiler.codegen import Plan
from fedmodel.compiler.scaling import equilibrate
from fedmodel.errors import DataError
from fedmodel.expression import Constant, Data, Parameter, is_sparse
from fedmodel.result import Result
from fedmodel.runtime.checkpoint import Checkpointer
from .watch import steady_descent


class Backend:
    """Base class. Subclasses implement `run(problem, topology, executor, callback, verbose,
    checkpoint...) -> dict` with at least `status`, `values`, `iterations`, `history`,
    `multipliers`; `solve` adds timing, objective, violation and the KKT certificate."""

    name = "backend"
    checkpointing = False   # True: `run` takes a `checkpointer` (docs/checkpoints.md)
    convergence_needs_convexity = True   # its guarantees assume a convex model (warn otherwise)
    # solve the equilibrated model (fedmodel/compiler/scaling.py) and report in the user's
    # units; False: the model as written (paper presets, whose constants are in the paper's units)
    scaling = True

    def equilibrates(self) -> bool:
        """Whether this run solves the equilibrated model (`scaling`; a private run overrides
        it: a data-dependent scaling is a release its accountant does not cover)."""
        return bool(self.scaling)

    def solve(self, problem, topology=None, executor="serial", callback=None, verbose=False,
              checkpoint=None, checkpoint_every=None, resume=False, scaling=None) -> Result:
        """Run the algorithm on `problem` (`Problem.solve` calls this). `scaling`: solve the
        equilibrated model (True), the model as written (False), or the backend's default
        (None: `self.scaling`, off in the papers' presets)."""
        if self.convergence_needs_convexity and not problem.is_convex():
            warnings.warn(f"{self.name}: the model is not convex (DCP rules), so the algorithm's "
                          "convergence guarantees do not apply and CVXPY cannot certify the "
                          "result; the KKT certificate on the Result still does", stacklevel=3)
        check_scaling(problem)
        start = time.perf_counter()
        with collection_paused():
            wanted = self.equilibrates() if scaling is None else bool(scaling) and self.equilibrates()
            model = equilibrate(problem) if wanted else None
        work, runner = problem, self
        if model is not None:      # the run sees the equilibrated copy, in its units
            work, runner = model.problem, copy.copy(self)
            if getattr(self, "w0", None) is not None:
                runner.w0 = model.shared_to_scaled(self.w0)
            if callback is not None:
                callback = functools.partial(_in_user_units, callback, model)
        checkpointer = Checkpointer.create(self, work, checkpoint, checkpoint_every, resume)
        extra = {"checkpointer": checkpointer} if self.checkpointing else {}
        try:
            outcome = checkpointer.finished()       # resuming a run that had already finished
            if outcome is None:
                outcome = runner.run(work, topology=topology, executor=executor, callback=callback,
                                     verbose=verbose, checkpoint=checkpoint,
                                     checkpoint_every=checkpoint_every, resume=resume, **extra)
                checkpointer.finish(outcome)
        finally:
            if model is not None:
                model.release()
        if model is not None:
            outcome = model.outcome_to_user(outcome)
        wall_time = time.perf_counter() - start
        return finish_result(problem, self.name, outcome, wall_time)

    def run(self, problem, **kwargs) -> dict[str, Any]:
        raise NotImplementedError


def _in_user_units(callback, model, record: dict) -> Any:
    return callback(model.record_to_user(record))


def paper_preset(backend: "Backend") -> "Backend":
    """A paper's exact setting solves the model as written: its constants (ρ, β, steps,
    tolerances) are in the paper's units, not in the equilibrated ones."""
    backend.scaling = False
    return backend


# Data whose entries exceed HUGE are refused: products of a few such entries (a squared loss of
# X w, its gradient Xᵀ(X w − b), a Hessian XᵀX) overflow double precision (1e308). Above LARGE:
# a warning. Data whose largest entry is below TINY (and not 0) are refused too: their squares
# underflow (1e-308) and every backend, CVXPY too, would return w = 0 as the answer.
HUGE, LARGE, TINY = 1e100, 1e20, 1e-100


def check_scaling(problem) -> None:
    """One pass over every block's data, constants and parameter values before a run: non-finite
    entries (e.g. data changed in place after `client.data`) or entries above HUGE raise
    DataError, entries above LARGE warn — naming the block and the item, with a hint to rescale —
    instead of a run that overflows, never ends or returns a meaningless answer."""
    seen: set[int] = set()
    for block in problem.blocks:
        leaves = list(block.data_items)
        for expr in block.terms + [c.expr for c in block.constraints]:
            leaves += [leaf for leaf in expr.leaves() if isinstance(leaf, (Constant, Parameter))]
        for leaf in leaves:
            if id(leaf) in seen or getattr(leaf, "remote", False) or leaf.value is None:
                continue
            seen.add(id(leaf))
            value = leaf.value.data if is_sparse(leaf.value) else leaf.value   # stored entries
            array = np.asarray(value, dtype=float)
            if array.size == 0:
                continue
            largest = max(float(np.max(array)), -float(np.min(array)))   # no |array| copy
            what = f"{type(leaf).__name__.lower()} {getattr(leaf, 'label', leaf.name)!r} of block {block.name!r}"
            if not np.isfinite(largest):
                raise DataError(f"{what} has non-finite entries (NaN or inf); remove or impute them "
                                "before solving")
            if largest > HUGE:
                raise DataError(f"{what} has entries as large as {largest:.3g}: squared losses and "
                                "gradients overflow in double precision. Rescale it (e.g. divide by "
                                "its largest entry or standardize its columns) and solve again")
            if 0 < largest < TINY and isinstance(leaf, Data):
                raise DataError(f"{what} has no entry larger than {largest:.3g}: squared losses and "
                                "gradients underflow in double precision. Rescale it (e.g. divide "
                                "by its largest entry) and solve again")
            if largest > LARGE:
                warnings.warn(f"{what} has entries as large as {largest:.3g}: badly scaled data make "
                              "the backends' absolute tolerances meaningless and may overflow; "
                              "consider rescaling it", RuntimeWarning, stacklevel=4)


def _evaluate(problem, values: dict[int, np.ndarray]) -> tuple[float, list[float]] | None:
    """Total objective and each constraint's violation at `values` (None: a value is missing)."""
    variables = problem.variables()
    if any(v.uid not in values for v in variables):
        return None
    outputs = [problem.objective] + [c.expr for c in problem.constraints]
    evaluated = Plan(outputs, variables)(*[values[v.uid] for v in variables])
    return float(evaluated[0]), [c.violation(val) for c, val in zip(problem.constraints, evaluated[1:])]


def objective_and_violation(problem, values: dict[int, np.ndarray]) -> tuple[float, float]:
    """Total objective and the largest constraint violation (global and local) at `values`."""
    evaluated = _evaluate(problem, values)
    if evaluated is None:
        return float("nan"), float("nan")
    return evaluated[0], max([0.0] + evaluated[1])


def violated_constraints(problem, values: dict[int, np.ndarray], tol: float = 0.0) -> dict[str, float]:
    """{"name: rendered constraint": violation} of the constraints violated by more than `tol`
    at `values`, largest first (an infeasible or stalled run names them; ProxAL's nodes report
    theirs in the same form)."""
    evaluated = _evaluate(problem, values)
    if evaluated is None:
        return {}
    pairs = [(repr(c), v) for c, v in zip(problem.constraints, evaluated[1]) if v > tol]
    return dict(sorted(pairs, key=lambda pair: -pair[1]))


# A "converged" point violating a constraint by more than CONVERGED_VIOLATION is not an answer
# ("stalled"); one with a relative KKT stationarity (`Certificate.relative_stationarity`) above
# NOT_STATIONARY is warned about. The violation is still read absolutely: the relative one
# divides by the size of the constraint's terms at the point, which is near 0 for a linear
# constraint whose terms cancel there (Table 4's LCQP: a 2.6e-6 violation read as > 1e-2), and
# a false "stalled" on a right answer is worse than a biased point in tiny units let through
# (fm.verify judges that one relatively).
CONVERGED_VIOLATION = 1e-3
NOT_STATIONARY = 1e-2


def finish_result(problem, backend_name: str, outcome: dict[str, Any], wall_time: float) -> Result:
    values = outcome["values"]
    certificate = outcome.get("certificate")
    if problem.remote_data():
        # The data lives on the workers (loaders): the driver cannot evaluate the model, so the
        # objective and violation are the nodes' own last report and there is no KKT certificate
        # here (docs/ray.md); prob.load_data() then fm.verify(result) gives both.
        last = outcome.get("history") or [{}]
        objective = float(last[-1].get("objective", float("nan")))
        violation = float(last[-1].get("violation", float("nan")))
    else:
        with collection_paused():    # whole-model plans: millions of objects at n = 10⁴
            objective, violation = objective_and_violation(problem, values)
            if certificate is None and values and np.isfinite(objective):
                certificate = problem.kkt_certificate(values, outcome.get("multipliers", {}))
            relative = certificate is not None and certificate.relative
            if violation > CONVERGED_VIOLATION and (outcome["status"] == "converged" or (
                    outcome["status"] == "max_iterations" and outcome.get("biased_fixed_point"))):
                _not_converged_when_infeasible(problem, backend_name, outcome, values)
        if outcome["status"] == "converged" and certificate is not None:
            stationarity = certificate.relative_stationarity if relative else certificate.stationarity
            if stationarity > NOT_STATIONARY:
                _warn_not_stationary(backend_name, outcome, stationarity)
    if outcome["status"] == "max_iterations":
        _judge_steady_descent(outcome)
    result = Result(status=outcome["status"], values=values, objective=objective,
                    max_violation=violation, backend=backend_name,
                    iterations=outcome.get("iterations", {}), multipliers=outcome.get("multipliers", {}),
                    ledger=outcome.get("ledger"), certificate=certificate, wall_time=wall_time,
                    info=outcome.get("info", {}), problem=problem)
    result.history.extend(outcome.get("history", []))
    return result


def _judge_steady_descent(outcome: dict[str, Any]) -> None:
    """A run at its round cap whose objective never stopped falling is reported "unbounded"
    (`watch.steady_descent`), not returned as if its last point were an answer."""
    message = steady_descent(outcome.get("history") or [])
    if message is not None:
        _say(outcome, "unbounded", message, status="unbounded")


def _not_converged_when_infeasible(problem, backend_name: str, outcome: dict[str, Any], values) -> None:
    """A run that stopped moving at a point violating constraints by more than
    CONVERGED_VIOLATION (FedAvg / FedProx on contradictory client sets: their stop test is the
    model's change only) is "stalled", naming the constraints, never "converged". So is a run
    at its round cap whose outcome says `biased_fixed_point` (FedAvg / FedProx / DGD: each
    client's constraints hold at its own iterate, not at their average, so more rounds do not
    remove the violation): "max_iterations" would suggest they might."""
    violated = violated_constraints(problem, values, CONVERGED_VIOLATION)
    worst = ", ".join(f"{name} by {v:.3g}" for name, v in list(violated.items())[:3])
    outcome.setdefault("info", {})["violated"] = violated
    how = "stopped moving" if outcome["status"] == "converged" else \
        f"reached its round cap ({_rounds(outcome)}) without removing the violation,"
    _say(outcome, "stalled", f"{backend_name} {how} at a point that violates {worst}: not a "
         "solution. The model may be infeasible (prob.solve('cvxpy') decides it), or this backend "
         "does not enforce these constraints at its fixed point (ProxAL and DALD do)", status="stalled")


def _rounds(outcome: dict[str, Any]) -> str:
    """The run's length in its own unit, for a message ("10000 rounds", "1000 inner")."""
    return ", ".join(f"{count} {unit}" for unit, count in (outcome.get("iterations") or {}).items()) \
        or "its last iteration"


def _warn_not_stationary(backend_name: str, outcome: dict[str, Any], stationarity: float) -> None:
    """The backend's stop test passed at a point that is far from a KKT point of the model:
    FedAvg / FedProx converge to their own fixed point, which is not the model's solution with
    several local steps (client drift) or client constraints (each client's constraint holds at
    its local iterate, not at their average)."""
    _say(outcome, "not_stationary",
         f"{backend_name} converged by its stop test, but the point is not a solution of the "
         f"model: relative KKT stationarity {stationarity:.3g} (result.certificate). Its fixed point "
         "differs from the model's optimum (client drift with several local steps, or client "
         "constraints); ProxAL, DALD or FedADMM solve the model, prob.solve('cvxpy') checks it")


def _say(outcome: dict[str, Any], key: str, message: str, status: str | None = None) -> None:
    """A verdict of `finish_result` on the run: `message` in a warning and in info[key]; with
    `status`, the run ends with that status instead of the backend's."""
    outcome.setdefault("info", {})[key] = message
    if status is not None:
        outcome["status"] = status
    warnings.warn(message, RuntimeWarning, stacklevel=4)
