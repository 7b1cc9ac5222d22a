"""cProx-AL, Algorithm 3 of He, Peng, Sun, "Federated learning with convex global and local
constraints" (equation numbers: that paper): the proximal augmented Lagrangian of ProxAL with
each subproblem solved centrally, to dist∞(0, ∂ℓ_k) ≤ τ_k. It is the paper's centralized
baseline, not a federated algorithm: one program pools every block's terms and constraints.

It runs through the executor all the same — a serial one on the driver whose single node is
that pooled program, named "server" — so that it reaches the program only by declared requests,
and checkpoints and resumes like the federated backends. Every request is the server's own
step, so no message crosses a network and the ledger stays empty (`info["centralized"]`).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from fedmodel.compiler.feasibility import feasible_by_its_sets
from fedmodel.runtime import local_solvers
from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram
from . import proxal_flat, proxal_private
from .base import Backend, Run, paper_preset
from .outcome import Outcome, Status
from .common import check_number
from .proxal_outer import check_options, next_beta, next_tau, outer_stop, start_point
from .watch import DivergenceWatch

# The paper's cProx-AL setting (β = 300, s̄ = 1e-3, ε = (1e-3, 1e-3), fixed β, (11) alone):
# `CentralizedProxAL.paper()`.
PAPER_CPROXAL = dict(beta=300.0, s_bar=1e-3, tol=(1e-3, 1e-3), beta_growth=1.0, dist_tol=float("inf"))
BETA_MAX = 1e4     # the default beta_max (`proxal_outer.beta_cap`: higher on a model known to have a point)
CENTRALIZED = ("cProx-AL is the paper's centralized baseline: it pooled every block's terms and "
               "constraints in one program on the driver (one node, no clients), so no message "
               "crossed a network and its ledger is empty")


@procedure("cproxal_solve", {"x0": "x", "tol": "1", "method": "str"}, {"x": "x", "steps": "1", "grad_norm": "1"},
           local=True)
def _solve(program: NodeProgram, x0, tol, method="auto") -> dict:
    """Step 3 on the pooled program: its subproblem to ‖∇‖∞ ≤ tol by `method`; where "auto"
    took L-BFGS-B (smooth, 200 < unknowns within the dense budget) and it stopped above tol,
    Newton from where it stopped. L-BFGS-B's line search has a floor at double precision: on
    a9a with hashed pairs (d = 1,610, ridge 1e-3) it returned at 2–3e-7 against τ_k = 1e-7,
    often after 0 steps, so (11) never counted a subproblem as solved and the run hit its
    100-iteration cap 2.4e-6 from the answer; with Newton after it, converged after 16 outer
    iterations, 1e-5 off (docs/BENCHMARKS.md, branch dald15)."""
    out = program.solve_local(None, 0.0, None, x0, tol, method=method)
    if out["grad_norm"] > tol and method == "auto" and local_solvers.choose(program, "auto") == "lbfgs":
        y = program.y.copy()
        more = program.solve_local(None, 0.0, None, out["x"], tol, method="newton")
        if more["grad_norm"] < out["grad_norm"]:
            out = {**more, "steps": out["steps"] + more["steps"]}
        else:                                   # (kept: L-BFGS-B's end, its private part too)
            program.y = y
    return out


class CentralizedProxAL(Backend):
    """Algorithm 3 (cProx-AL), the paper's CENTRALIZED BASELINE: the proximal AL of ProxAL with
    the subproblem solved to dist∞(0, ∂ℓ_k) ≤ τ_k by one program that pools every block's data
    (so no data stays with its owner). Runs on the driver as the only node of a serial executor
    (`topology` and `executor` are ignored); its result has an empty ledger and says so in
    `info["centralized"]`. Defaults add ProxAL's β growth (×4 up to 1e4, which also detects
    infeasible / unbounded models; a default beta_max is 1e16 where the model's constraints are
    sets that meet and the violation does not fall: `proxal_outer.beta_cap`), ε2 = 1e-4 and its distance test (`dist_tol`,
    `proxal_outer.distance_left`: "converged" also needs the distance the outer steps'
    contraction predicts ≤ dist_tol·‖w‖₂; τ_k on ProxAL's "progress" schedule, tightened near
    that test; β raised on a flat objective — (11) alone stopped 0.9 % from CVXPY's point on
    tests/test_proxal_flat.py's model); `CentralizedProxAL.paper()` is the paper's fixed-β
    setting with (11) alone."""

    name = "cproxal"
    checkpointing = True
    solves_epigraph = True   # (`Backend.solves_epigraph`)
    centralized = True   # a baseline that pools every block's data in one place (not federated)
    # `proxal_flat`: the outer stop (`proxal_outer.outer_stop`, shared with ProxAL) asks the
    # nodes for their flat directions once its distance test has failed a few times
    procedures = (proxal_private._violations, proxal_private._private_step,
                  proxal_flat._flat, _solve)

    def __init__(self, beta: float = 300.0, s_bar: float = 1e-3, tol: tuple[float, float] = (1e-5, 1e-4),
                 max_outer: int = 100, local_solver: str = "auto", w0: Any = None,
                 beta_growth: float = 4.0, beta_max: float | None = None, dist_tol: float = 1e-4):
        given = beta_max is not None
        options = check_options(beta, s_bar, tol, max_outer, beta_growth, beta_max if given else BETA_MAX,
                                local_solver, w0)
        for key, value in options.items():
            setattr(self, key, value)
        self.dist_tol = check_number("dist_tol (the relative distance left at the stop)", dist_tol, 0,
                                     float("inf"), closed=True)
        # ProxAL's schedule (`proxal_outer.next_tau`): τ_k tied to the last outer step, tightened
        # near the distance test; the paper's s̄/(k+1)² without a distance test
        self.tau_rule = "paper" if self.dist_tol == float("inf") else "progress"
        # a default beta_max rises FEASIBLE_HEADROOM-fold on a model known to have a point (`loop`)
        self.free_cap, self.known_feasible = not given, False

    @classmethod
    def paper(cls, **overrides: Any) -> "CentralizedProxAL":
        """The paper's cProx-AL setting (`PAPER_CPROXAL`: β = 300, s̄ = 1e-3, ε = (1e-3, 1e-3),
        fixed β), with `overrides` on top."""
        return paper_preset(cls(**{**PAPER_CPROXAL, **overrides}))

    def compile(self, problem) -> dict:
        """One program pooling every block's terms and constraints, as the node "server"."""
        shared = problem.shared_variables()
        private = [v for v in problem.variables() if v.owner is not None]
        terms = [t for b in problem.blocks for t in b.terms]
        return {"server": NodeProgram("centralized", "server", terms, problem.constraints, shared, private)}

    def executor_for(self, executor):
        return "serial"         # the pooled program runs on the driver, whatever was asked

    def loop(self, problem, ex, run: Run) -> Outcome:
        callback, checkpointer = run.callback, run.checkpointer
        w = start_point(self.w0, ex.model_size)
        history, status, total, info = [], Status.MAX_ITERATIONS, 0, {}
        beta, last_change = self.beta, np.inf
        # (`proxal_outer.beta_cap`: β may rise past beta_max where the violation stays on a feasible model)
        self.known_feasible = self.free_cap and feasible_by_its_sets(problem)
        watch = DivergenceWatch("cProx-AL", "lower beta or start from a smaller w0 "
                                            "(backends.CentralizedProxAL)")
        start = time.perf_counter()
        saved = checkpointer.restore(ex)               # resume: docs/checkpoints.md
        if saved:
            w, history, total = saved["w"], saved["history"], saved["total"]
            beta, last_change, watch.smallest = saved["beta"], saved["last_change"], dict(saved["watch"])
        for k in range(len(history), self.max_outer):
            tau = next_tau(self, k, history)                                      # step 2
            ex.call("server", "configure", beta=beta, prox_weight=1.0 / beta, center=w)
            gradient = ex.call("server", "merit", x=w)["grad"]   # a non-finite start would crash the solver
            if not np.all(np.isfinite(gradient)) and watch.check(k, merit_gradient=gradient):
                status = watch.report(info)
                break
            out = ex.call("server", "cproxal_solve", x0=w, tol=tau, method=self.local_solver)   # step 3, centrally
            total += int(out["steps"])
            change = ex.call("server", "update_multipliers", x=out["x"])          # steps 4–5
            # (the multipliers' step in β₀'s units, β₀·violation: β's own rise, up to 1e12-fold on a
            # feasible model (`proxal_outer.beta_cap`), is no divergence)
            if watch.check(k + 1, w=out["x"], multiplier_change=change["dmu"] * self.beta / beta):
                status = watch.report(info)
                break
            dw = max(float(np.max(np.abs(out["x"] - w), initial=0.0)), change["dy"])
            previous, w = w, out["x"]
            report = ex.call("server", "report", x=w)
            record = {"iteration": k + 1, "objective": report["objective"], "violation": report["violation"],
                      "inner": int(out["steps"]), "tau": tau, "certificate": float(out["grad_norm"]),
                      "primal_change": dw, "beta": beta, "multiplier_change": change["dmu"],
                      "time": time.perf_counter() - start,
                      # for the distance test (proxal_outer._near)
                      "step": float(np.linalg.norm(w - previous)), "size": float(np.linalg.norm(w)),
                      "dimension": w.size}
            history.append(record)
            if callback:
                callback(record)
            # (11) only after a subproblem solved to τ_k, as ProxAL's: Newton stuck on an AL
            # kink left 5e-4 against 1e-8, (11) held at step 0, "converged" 8 % away (issue 25)
            stop = outer_stop(self, history, ex, w, info, solved=record["certificate"] <= tau)
            if stop:
                status = stop
                break
            beta, last_change = next_beta(self, beta, change["dmu"], last_change, history)
            checkpointer.save(ex, k + 1, {"w": w, "history": history, "total": total, "beta": beta,
                                          "last_change": last_change, "watch": dict(watch.smallest)})
        return Outcome(status, shared=w, history=history,
                       iterations={"outer": len(history), "inner": total},
                       info={**info, "centralized": CENTRALIZED})
