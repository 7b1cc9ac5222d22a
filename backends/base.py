"""The `Backend` template every algorithm follows (Flower-style: `solve` drives overridable steps)."""
from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from fedmodel.certificate import kkt_certificate
from fedmodel.compiler.codegen import Plan
from fedmodel.result import Result


class Backend:
    """Base class. Subclasses implement `run(problem, topology, executor, callback, verbose,
    checkpoint...) -> dict` with at least `status`, `values`, `iterations`, `history`,
    `multipliers`; `solve` adds timing, objective, violation and the KKT certificate."""

    name = "backend"
    checkpointing = False   # True: `run` takes a `checkpointer` (docs/checkpoints.md)
    convergence_needs_convexity = True   # its guarantees assume a convex model (warn otherwise)

    def solve(self, problem, topology=None, executor="serial", callback=None, verbose=False,
              checkpoint=None, checkpoint_every=None, resume=False) -> Result:
        from fedmodel.runtime.checkpoint import Checkpointer
        if self.convergence_needs_convexity and not problem.is_convex():
            warnings.warn(f"{self.name}: the model is not convex (DCP rules), so the algorithm's "
                          "convergence guarantees do not apply and CVXPY cannot certify the "
                          "result; the KKT certificate on the Result still does", stacklevel=3)
        checkpointer = Checkpointer.create(self, problem, checkpoint, checkpoint_every, resume)
        extra = {"checkpointer": checkpointer} if self.checkpointing else {}
        start = time.perf_counter()
        outcome = checkpointer.finished()       # resuming a run that had already finished
        if outcome is None:
            outcome = self.run(problem, topology=topology, executor=executor, callback=callback,
                               verbose=verbose, checkpoint=checkpoint,
                               checkpoint_every=checkpoint_every, resume=resume, **extra)
            checkpointer.finish(outcome)
        wall_time = time.perf_counter() - start
        return finish_result(problem, self.name, outcome, wall_time)

    def run(self, problem, **kwargs) -> dict[str, Any]:
        raise NotImplementedError


def objective_and_violation(problem, values: dict[int, np.ndarray]) -> tuple[float, float]:
    """Total objective and the largest constraint violation (global and local) at `values`."""
    variables = problem.variables()
    if any(v.uid not in values for v in variables):
        return float("nan"), float("nan")
    outputs = [problem.objective] + [c.expr for c in problem.constraints]
    evaluated = Plan(outputs, variables)(*[values[v.uid] for v in variables])
    violation = max([0.0] + [c.violation(val) for c, val in zip(problem.constraints, evaluated[1:])])
    return float(evaluated[0]), violation


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
        objective, violation = objective_and_violation(problem, values)
        if certificate is None and values and np.isfinite(objective):
            certificate = kkt_certificate(problem, values, outcome.get("multipliers", {}))
    result = Result(status=outcome["status"], values=values, objective=objective,
                    max_violation=violation, backend=backend_name,
                    iterations=outcome.get("iterations", {}), multipliers=outcome.get("multipliers", {}),
                    ledger=outcome.get("ledger"), certificate=certificate, wall_time=wall_time,
                    info=outcome.get("info", {}), problem=problem)
    result.history.extend(outcome.get("history", []))
    return result
