"""`CVXPY`: the centralized exact solve of the same model, used as the reference.

CVXPY's solvers are fragile on some models (Clarabel can fail outright on large logistic
models, SCS can stop inaccurate), so this backend tries a chain of solvers, tightens SCS, and
records which one produced the answer in `result.info["solver"]`.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from fedmodel.constraints import Equality
from fedmodel.errors import CurvatureError
from .base import Backend

FALLBACK_CHAIN = ("CLARABEL", "ECOS", "SCS")
SOLVER_OPTIONS = {"SCS": {"eps": 1e-9, "max_iters": 200_000}}
STATUS = {"optimal": "converged", "optimal_inaccurate": "converged",
          "infeasible": "infeasible", "infeasible_inaccurate": "infeasible",
          "unbounded": "unbounded", "unbounded_inaccurate": "unbounded"}


class CVXPY(Backend):
    """Centralized exact solve. `solver=None` tries Clarabel, ECOS, then SCS until one succeeds.

    >>> backend = CVXPY(solver="SCS", eps=1e-8)
    """

    name = "cvxpy"

    def __init__(self, solver: str | None = None, **solver_options: Any):
        self.solver = solver
        self.solver_options = solver_options

    def run(self, problem, **_: Any) -> dict[str, Any]:
        import cvxpy as cp
        from fedmodel.lowering.problem import lower_problem
        cvx_problem, context, lowered = lower_problem(problem)
        if not cvx_problem.is_dcp():
            raise CurvatureError(
                f"CVXPY cannot solve problem {problem.name!r}: it is not DCP (convex) — "
                f"{_nonconvex_parts(problem)}. Use a federated backend (the KKT certificate still "
                "applies) or reformulate")
        installed = set(cp.installed_solvers())
        chain = [self.solver] if self.solver else [s for s in FALLBACK_CHAIN if s in installed]
        attempts = []
        for solver in chain:
            options = {**SOLVER_OPTIONS.get(solver, {}), **self.solver_options} \
                if not self.solver else self.solver_options
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cvx_problem.solve(solver=solver, **options)
            except (cp.error.SolverError, ValueError, ArithmeticError) as exc:
                attempts.append(f"{solver}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                continue
            attempts.append(f"{solver}: {cvx_problem.status}")
            if cvx_problem.status in ("optimal", "infeasible", "unbounded"):
                break
            if cvx_problem.status.endswith("inaccurate") and solver == chain[-1]:
                break
        status = STATUS.get(cvx_problem.status, "failed")
        values, multipliers = {}, {}
        if status == "converged":
            for var in problem.variables():
                values[var.uid] = np.asarray(context.variable(var).value, dtype=float).reshape(var.shape)
            for constraint in problem.constraints:
                dual = lowered[constraint.name].dual_value
                if dual is not None:
                    dual = np.asarray(dual, dtype=float).reshape(constraint.shape)
                    multipliers[constraint.name] = dual if isinstance(constraint, Equality) \
                        else np.maximum(dual, 0.0)
        return {"status": status, "values": values, "multipliers": multipliers,
                "iterations": {"solver": int(getattr(cvx_problem.solver_stats, "num_iters", 0) or 0)},
                "info": {"solver": cvx_problem.solver_stats.solver_name if cvx_problem.solver_stats else None,
                         "cvxpy_status": cvx_problem.status, "attempts": attempts}}


def _nonconvex_parts(problem) -> str:
    parts = []
    for block in problem.blocks:
        for term in block.terms:
            if not term.is_convex():
                parts.append(f"objective term {term} of {block.name!r} is not convex")
        for constraint in block.constraints:
            if not constraint.is_dcp():
                parts.append(f"constraint {constraint.name!r} ({constraint!r}) is not convex")
    return "; ".join(parts[:3]) or "see cvxpy's is_dcp()"
