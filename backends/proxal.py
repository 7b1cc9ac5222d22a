"""Proximal augmented Lagrangian with inexact ADMM (He, Peng, Sun: "Federated learning with
convex global and local constraints"), Algorithms 1–2. Equation numbers refer to that paper
(../shared/seeds/fl_convex_global_local_constraints.txt); see ../shared/spec/fl_constraints.md.
The clients' steps are in backends/proxal_nodes.py, the outer rules ProxAL shares with cProx-AL
(Algorithm 3, the centralized baseline: backends/cproxal.py) in backends/proxal_outer.py.

Algorithm 1 (outer): τ_k = s̄/(k+1)²; w^{k+1} = Algorithm 2(τ_k, w̃⁰ = w^k); μ_i ← [μ_i + β c_i]₊ on
each node (the multipliers never leave their owner); stop on (11).
Algorithm 2 (inner, consensus ADMM on Σ_i P_i(u_i) + P_0(w) + h(w), u_i = w): server step (18),
client steps (19)–(21), certificate (22), stop (23). Client steps run on the clients as node
procedures; the server only sees ũ_i (a model-sized vector) and scalars.

Defaults are the fastest robust setting we know (adaptive ρ from `rho`, Anderson acceleration,
β growth, q = 0.3, ε2 = 1e-4, infeasibility / unboundedness detection); `ProxAL.paper()` is the
paper's exact setting (`PAPER_PROXAL`). Options beyond the paper:
- `rho_rule="samples"`: ρ_i = a·m_i (Remark 4.2), `a = rho`;
- the local tolerance ε_{t+1} = q^t is floored at τ_k/100 (the authors' code floors it at 1e-10):
  solving far below the certificate's own tolerance only burns local steps at round-off level;
- `adaptive_rho=True`: each client rebalances its ρ_i by residual balancing, every RHO_PERIOD-th
  ADMM step (all clients at the same steps: a change restarts the Anderson memory).
  The certificate (22) stays valid because ε̃_{i,t+1} uses the ρ_i^t the server used in (18),
  and ũ_i^{t+1} = u_i^{t+1} + λ_i^{t+1}/ρ_i^{t+1} (21) is formed with the new ρ (`proxal_nodes._admm_step`).
- `beta_growth=γ > 1`: between outer iterations β_{k+1} = min(γ β_k, `beta_max`) when the
  constraint change ‖μ^{k+1} − μ^k‖∞/β_k exceeds ε2 and has not fallen below a quarter of the
  previous one (the standard augmented-Lagrangian penalty update). Iteration k uses β_k
  throughout: multiplier step, proximal weight ω_k = 1/((n+1)β_k) of (13)–(14) and rule (11),
  so (11) still certifies an (ε1, ε2)-KKT point; (22)–(23) are per subproblem and unaffected.
  If β reaches `beta_max` and the violation stops falling, ProxAL stops early with status
  "infeasible" (or "stalled"), naming the violated constraints (`proxal_verdict.verdict`); an objective that
  falls by the same amount at every outer iteration while the iterates move by the same distance
  (a proximal point method on a model with no minimizer) stops with "unbounded".
- `tau_rule="progress"`: τ_k = min(s̄/(k+1)², ε1·max(1/2, r/10)), r the last outer step's
  distance to (11) (`proxal_outer.next_tau`): never above the paper's summable schedule, so
  its theory, (22)–(23) and (11) hold as they are, but ε1/2 as soon as the steps are small —
  the paper's τ_k < ε1 needs ≥ 11 outer iterations whatever the model;
- `local_tol_cap=κ`: ε_{t+1} = min(q^t, κ τ_k) (κ = ∞: the paper's q^t). ε_{t+1} is part of
  the certificate, so q^t alone makes every ADMM run at least log τ_k / log q iterations long,
  even one that starts at its answer; capped, the local solves (Newton: a step or two more)
  are as exact as the certificate needs from the first iteration. The n clients then solve (19)
  to ε_{t+1}/n (the server (18) to ε_{t+1}): each ε̃_i of (22) carries client i's local solve
  error, so n clients stopping at ε_{t+1} each could leave n·ε_{t+1} in Σ_i ε̃_i, above τ_k
  for n > 10, and the certificate stood still above τ_k (logistic n = 200: 604 round trips,
  ADMM runs ended by the stall rule; solving to ε_{t+1}/n: 53). A tighter local solve
  satisfies the looser tolerance, so (22)–(23) hold as before;
- `client_sets=True`: a client's simple sets on the shared variables (norm balls, bounds) are
  projected in its local solve (19) instead of entering P_i as augmented-Lagrangian terms,
  whose curvature β‖∇c‖² (300 at β = 300) made the consensus ADMM ill-conditioned (logistic
  with client balls at n = 40: 300–400 ADMM iterations per outer step). (22) then reads the
  set's normal cone (`prox_remainder`); the server's w meets the sets only up to the consensus
  residual, so the stop also asks for the largest violation ≤ ε2 (implied by (11) for the AL's
  constraints). The multipliers come from each client's last local point
  (`proxal_nodes._set_multipliers`). Off with FedADMM as inner solver and with an explicit
  Newton / L-BFGS / GD local solver (neither projects);
- `client_constraints="local"`: a client's smooth convex inequalities on the shared variables
  (NP's class-1 loss ≤ γ) are held in its solve (19) by a local method of multipliers
  (`local_al.solve`), not in the AL: the consensus ADMM is over ∩ X_i, (22) reads
  their normal cones (`NodeProgram.constraint_remainder`), the outer loop keeps the rest (NP
  adult n = 5: 16 outer / 374 round trips → 4 / 56). A client that cannot meet them, ∩ X_i looking
  empty or an unsolved run that went nowhere (`proxal_admm`) puts them back in the AL (its verdicts);
- `dist_tol=δ`: "converged" needs (11), an estimate of ‖w − w*‖₂ ≤ δ‖w‖₂ from the outer
  records (`proxal_outer.distance_left`: the stationarity (11) bounds, divided by the curvature
  the outer steps' contraction shows), the nodes' complementarity Σ|μ_j c_j| ≤ δ|f| (`settled`)
  and (11)'s bound relative to the gradients at w (`relative`; δ = ∞: the paper's (11) alone).
  Near the stop τ_k is tightened to what these need, and β rises ×`beta_growth` when the constraints are
  met but the outer steps shrink by less than 10× (a flat objective, where the proximal weight
  1/β_k sets the pace). Where the clients' Hessians fit, the distance is read from their sum
  instead (`proxal_certificate`: one round trip at a point the other tests accept; refused,
  the run goes on from the Newton point);
- `anderson=m`: Anderson acceleration of the ADMM with memory m (backends/anderson.py): the
  server mixes the last m + 1 iterates with coefficients computed from the inner products of
  the clients' residuals; each client mixes its own (u_i, λ_i/ρ_i). (22) bounds ‖∇ℓ_k(w)‖∞ for
  ANY client states (u_i, λ_i) as long as the server's (18) used ũ_i = u_i + λ_i/ρ_i of the same
  states, so the mixed iterates keep (23) sound; restarts and a fall-back to plain ADMM keep the
  iteration convergent. A run whose certificate stalled (`_stalled`) without ever halving
  (`went_nowhere`) also falls back, for the rest of that run: residual balancing's ρ_i changes
  every RHO_PERIOD-th step each restart the mixer's memory and its growth test with it, and
  mixed so, a run can cycle (constrained_model(0, ball=True): 513 → ~1e3 over 100 iterations,
  every other outer iteration, β 300 → 7.7e4, then "diverged" 0.53 from CVXPY; plain ADMM
  from there: 6e-4 ≤ τ 1e-3 in 55 more, converged 2.5e-7 off in 3 outer iterations).
- `inner`: step 3's solver. "auto" (the default, backends/proxal_inner.py): federated Newton
  steps where they fit, Algorithm 2 otherwise or where an Algorithm 2 option (rho, anderson, q,
  max_inner, local_solver, …) is given; `res.info["inner"]` says which ran and why. "admm" or
  None: Algorithm 2. "newton" / `NewtonInner()` (backends/proxal_newton.py): a client gets the
  server's point (d floats), sends P_i's value, gradient and Hessian triangle there (1 + d +
  d(d + 1)/2 floats, 8 line-search values; in the ledger). Client balls and bounds go to the
  server's prox, the rest into the AL; β ×100 to 1e12. Refused: private variables, client
  nonsmooth terms but λ‖w‖₁, Hessians beyond the dense budget (docs/BENCHMARKS.md).
"""
from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime.executor import Rider
from fedmodel.runtime.program import compile_programs
from . import proxal_certificate, proxal_flat, proxal_inner, proxal_newton, proxal_nodes, proxal_private
from .anderson import MAX_MEMORY, ServerMixer
from .base import Backend, Run, paper_preset
from .common import check_choice, check_count, check_number, progress, require_star, user_metric, variable_sizes
from .outcome import Outcome, Status
from .proxal_admm import (_stalled, client_rhos, no_consensus, penalties_note, server_step, subproblem_residual,
                          went_nowhere)
from .proxal_outer import TAU_RULES, check_options, next_beta, next_tau, outer_record, outer_stop, start_point
# the presets (why each value: backends/proxal_presets.py), imported from here too
from .proxal_presets import FAST_PROXAL, PAPER_PROXAL, PAPER_RULES
from .watch import DivergenceWatch


# Adaptive ρ_i is rebalanced only at ADMM steps t ≡ 0 (mod RHO_PERIOD), all clients together:
# any ρ_i change restarts the Anderson memory, and rebalancing at every step restarted it at 286
# of 547 steps at n = 200. bench_rounds round trips (docs/BENCHMARKS.md), period 1 → 3:
# logistic-ball n = 5/40/200: 37/95/735 → 35/37/363; lasso 48/64/483 → 52/58/150; ridge 31/40 →
# 27/31; logistic 46/94 → 42/97. Period 5 raised lasso n = 5 to 62.
RHO_PERIOD = 3
DIVERGENCE_HINT = "lower rho or beta, or start from a smaller w0 (backends.ProxAL)"
NO_CONSENSUS = "(consensus)"     # `_admm`'s key in `failed` when ∩ X_i looks empty


# ---- the backend ------------------------------------------------------------------------------
class ProxAL(Backend):
    """Algorithm 1, its subproblems by `inner`: "auto" (default) federated Newton steps where
    they fit, else Algorithm 2; "admm" (or None) Algorithm 2; "newton"; or a solver object
    (module docstring, backends/proxal_inner.py). Algorithm 2's defaults: the fast robust setting (β = 300,
    adaptive ρ_i from 0.1, q = 0.3, ε = (1e-5, 1e-4), β growth ×4 up to 1e6, Anderson memory 5,
    τ_k tied to the measured progress, local tolerances ≤ τ_k/10, client sets projected; it
    equals `FAST_PROXAL`); `ProxAL.paper()` is the paper's NP setting with Algorithm 2 (fixed ρ_i = 0.01,
    q = 0.9, fixed β, τ_k = s̄/(k+1)², ε_{t+1} = q^t, client constraints in the AL).

    >>> res = prob.solve(ProxAL(), topology=topologies.star(prob))  # doctest: +SKIP
    """

    name = "proxal"
    checkpointing = solves_epigraph = True      # (`Backend.solves_epigraph`)
    # the clients' "configure" of each outer iteration rides on the inner solver's first message
    configure_with_init = True      # (Algorithm 2's "proxal_admm_init", NewtonInner's evaluation; False: two)
    # Algorithm 2's client steps (with their vectorized forms), the verdict's report, the Newton inner's
    procedures = (*proxal_nodes.PROCEDURES, proxal_private._violations, *proxal_flat.PROCEDURES, *proxal_newton.PROCEDURES)

    @proxal_inner.records_given      # (which options the caller gave: `proxal_inner.choose`)
    def __init__(self, beta: float = 300.0, rho: float = 0.1, s_bar: float = 1e-3, q: float = 0.3,
                 tol: tuple[float, float] = (1e-5, 1e-4), max_outer: int = 100,
                 max_inner: int = 1000, rho_rule: str = "constant", adaptive_rho: bool = True,
                 local_solver: str = "auto", w0: Any = None, inner: Any = "auto",
                 check_certificate: bool = False, beta_growth: float | None = None, beta_max: float | None = None,
                 anderson: int = 5, inner_stall: int = 50, tau_rule: str = "progress",
                 local_tol_cap: float = 0.1, client_sets: bool = True, dist_tol: float = 1e-4,
                 client_constraints: str = "local"):
        inner = proxal_inner.normalized(inner)
        # β growth and cap not given: the inner's own (NewtonInner's), else ×4 to 1e6 (`with_inner`)
        self._inner_betas = tuple(key for key, value in (("beta_growth", beta_growth), ("beta_max", beta_max))
                                  if value is None)
        beta_growth, beta_max = (getattr(inner, key, FAST_PROXAL[key]) if value is None else value
                                 for key, value in (("beta_growth", beta_growth), ("beta_max", beta_max)))
        options = check_options(beta, s_bar, tol, max_outer, beta_growth, beta_max, local_solver, w0)
        for key, value in options.items():         # beta, s_bar, eps1, eps2, max_outer, ..., w0
            setattr(self, key, value)
        self.rho = check_number("rho (the initial ADMM penalty ρ_i)", rho, 0, float("inf"))
        self.q = check_number("q (the local tolerance ratio)", q, 0, 1)
        self.max_inner = check_count("max_inner", max_inner)
        if not isinstance(anderson, (int, np.integer)) or isinstance(anderson, bool) \
                or not 0 <= anderson <= MAX_MEMORY:
            raise FedModelError(f"anderson (the Anderson memory) must be an integer in 0..{MAX_MEMORY}, "
                                f"got {anderson!r}")
        self.rho_rule = check_choice("rho_rule", rho_rule, ("constant", "samples"))
        self.adaptive_rho = bool(adaptive_rho)
        self.inner = inner
        if inner not in (None, "auto"):       # its rounds run on this run's executor: its steps too
            self.procedures = type(self).procedures + tuple(getattr(inner, "procedures", ()))
        # diagnostic: at each ADMM stop also compute the true ‖∇ℓ_k(w)‖∞ (one extra round)
        self.check_certificate = bool(check_certificate)
        self.anderson = int(anderson)
        # the inner loop gives up when `inner_stall` ADMM iterations did not improve on the
        # certificate of the `inner_stall` before them by 1 % (0: never; see `_stalled`)
        self.inner_stall = check_count("inner_stall", inner_stall, low=0)
        self.tau_rule = check_choice("tau_rule", tau_rule, TAU_RULES)
        self.local_tol_cap = check_number("local_tol_cap (ε_{t+1} ≤ local_tol_cap·τ_k)", local_tol_cap, 0,
                                          float("inf"), closed=True)
        self.client_sets = bool(client_sets)
        # "local": a client's smooth convex inequalities on the shared variables are held in its
        # local solves (19) (module docstring); "al": in the augmented Lagrangian (the paper)
        self.client_constraints = check_choice("client_constraints", client_constraints, ("al", "local"))
        # (11) also waits for the outer steps' geometric tail to be ≤ dist_tol·‖w‖₂
        # (`proxal_outer.distance_left`; ∞: (11) alone, the paper's rule)
        self.dist_tol = check_number("dist_tol (the relative distance left at the stop)", dist_tol, 0,
                                     float("inf"), closed=True)

    @classmethod
    def paper(cls, **overrides: Any) -> "ProxAL":
        """The paper's exact NP setting (`PAPER_PROXAL`: β = 300, fixed ρ_i = 0.01, q = 0.9, s̄ =
        1e-3, ε = (1e-3, 1e-3), no β growth, no Anderson) with Algorithm 2, `overrides` on top
        (`w0=`, `max_outer=`; not `inner`: the paper's is Algorithm 2)."""
        if "inner" in overrides:
            raise FedModelError("ProxAL.paper() runs the paper's Algorithm 2; for another inner solver "
                                "use ProxAL(inner=...)")
        return paper_preset(cls(**{"inner_stall": 0, **PAPER_RULES, **PAPER_PROXAL, **overrides,  # (no stall rule)
                                   "inner": None}))

    def with_inner(self, inner: Any) -> "ProxAL":
        """A copy that runs `inner` (None: Algorithm 2), with its β growth and cap where none was given."""
        runner = copy.copy(self)
        runner.inner, runner.procedures = inner, type(self).procedures + tuple(getattr(inner, "procedures", ()))
        for key in self._inner_betas:
            setattr(runner, key, getattr(inner, key, FAST_PROXAL[key]))
        return runner

    # Algorithm 1 --------------------------------------------------------------------------------
    def run(self, problem, topology=None, executor=None, **options) -> Outcome:
        """`Backend.run` with the inner solver `inner` names, "auto" decided here
        (`proxal_inner.run`: which ran and why in `info["inner"]`)."""
        return proxal_inner.run(self, problem, topology, executor, options)

    def prepare(self, problem, topology):
        return require_star(problem, topology, self.name)

    def compile(self, problem) -> dict:
        """One program per block; with `client_sets` (and Algorithm 2 as the inner solver, local
        solver "auto" or "prox"), a client's simple sets on the shared variables (norm balls,
        bounds; `compile_programs(client_sets=True)`) are projected in its local solve (19)
        instead of its AL (module docstring); with an inner's `sets_to_server`, by the server."""
        moved = proxal_newton.server_sets(problem) if getattr(self.inner, "sets_to_server", False) else []
        return compile_programs(problem, client_sets=self._projects_client_sets(),
                                client_constraints=self._holds_client_constraints(), to_server=moved)

    def conclude(self, problem, ex, run: Run, outcome: Outcome) -> None:
        """The multipliers of the sets the clients or an inner's server projected (`proxal_set_multipliers`)."""
        if self._projects_client_sets():
            for reply in ex.map("proxal_set_multipliers", {c: {} for c in ex.clients if c not in ex.lost}).values():
                outcome.multipliers.update(reply["multipliers"])
        elif getattr(self.inner, "sets_to_server", False):      # (NewtonInner's, at the server)
            self.inner.add_set_multipliers(ex, outcome.multipliers)

    def _projects_client_sets(self) -> bool:
        # FedADMM as inner solver has its own certificate, which reads client sets as AL terms;
        # an explicit Newton / L-BFGS / GD local solver would not project
        return self.client_sets and self.inner is None and self.local_solver in ("auto", "prox")

    def _holds_client_constraints(self) -> bool:
        # as client sets: Algorithm 2's own local solves ("auto" / "prox") hold them
        return self.client_constraints == "local" and self._projects_client_sets()

    def loop(self, problem, ex, run: Run) -> Outcome:
        callback, verbose, checkpointer = run.callback, run.verbose, run.checkpointer
        n, clients, sizes = len(ex.clients), set(ex.clients), variable_sizes(problem)
        w = start_point(self.w0, ex.model_size)
        rho = rho_start = client_rhos(ex, self.rho, self.rho_rule)
        watch = DivergenceWatch("ProxAL", DIVERGENCE_HINT)
        history, total_inner, status = [], 0, Status.MAX_ITERATIONS
        # β_k (see beta_growth) and the last ‖Δμ‖∞/β; before the first, the inner's reading
        # (`NewtonInner.first_change`: under Newton steps β may rise after the first)
        beta, last_change = self.beta, getattr(self.inner, "first_change", np.inf)
        local = self._holds_client_constraints()       # the clients' solves hold their constraints
        bar = progress(self.max_outer, verbose, "ProxAL")
        certificate_log, info, marks = [], {}, []     # marks: `_admm`'s, across its runs
        inner = proxal_inner.name_of(self.inner)
        start = time.perf_counter()
        saved = checkpointer.restore(ex)               # resume: docs/checkpoints.md
        if saved:
            if saved.get("inner", inner) != inner:      # (another inner's state: `proxal_inner.run`)
                raise proxal_inner.InnerMismatch(saved["inner"], inner)
            w, rho, total_inner, last_change = saved["w"], saved["rho"], saved["total_inner"], saved["last_change"]
            certificate_log, history, beta = saved["certificate_log"], saved["history"], saved["beta"]
            local = saved.get("local", local)
            watch.smallest = dict(saved["watch"])           # the growth test's memory
            proxal_flat.resume(ex, history, saved.get("flat"))  # the distance test's iterates and bases
        # Algorithm 2, or an inner backend's solver (e.g. FedADMM, whose trace holds upper bounds
        # on dist∞(0, ∂ℓ_k) — see FedADMM.solve_subproblem)
        subproblem = self._admm if self.inner is None else self.inner.solve_subproblem
        proxal_certificate.forget(ex)
        for k in range(len(history), self.max_outer):
            tau = next_tau(self, k, history)                                      # step 2
            omega = 1.0 / ((n + 1) * beta)         # proximal weight of each P_{i,k} (13)–(14)
            settings = {"beta": beta, "prox_weight": omega}
            folds = self.inner is None or getattr(self.inner, "folds_configure", False)  # (its first message)
            folded = {"settings": settings} if self.configure_with_init and folds else {}
            ex.map("configure", {node: {**settings, "center": w} for node in ex.nodes
                                 if not (folded and node in clients)})
            failed: dict = {}           # clients' unmet constraints; NO_CONSENSUS: ∩ X_i looks empty
            if self._holds_client_constraints():
                folded.update(local=local, failed=failed, marks=marks if local else None)
            w_next, trace, rho = subproblem(ex, w, tau, rho, **folded)            # steps 3–4
            if local and (failed or (trace[-1] > tau and went_nowhere(trace))):   # unmet, apart or stuck: to the AL
                local, info["client_constraints"] = False, f"held locally until outer iteration {k + 1}, " \
                    f"then in the augmented Lagrangian (local violation {max(failed.values(), default=0):.3g})"
            total_inner += len(trace)
            true_residual = subproblem_residual(ex, w_next) if self.check_certificate else None
            certificate_log.append((tau, trace[-1]))
            # the history's report at w_{k+1} rides on the multipliers' update (after it, as
            # when it was a request of its own: one message per node; `Rider`)
            rider = Rider("proxal_report", {"x": w_next}) if np.all(np.isfinite(w_next)) else None
            changes = ex.map("update_multipliers", {node: {"x": w_next} for node in ex.nodes},  # 5, 7–8
                             rider=rider)
            dmu = max(r["dmu"] for r in changes.values())
            dw = max(float(np.max(np.abs(w_next - w), initial=0.0)),
                     max(r["dy"] for r in changes.values()))
            # (the multipliers' step at the first β, as cProx-AL's: βc rises with β — ×100 an outer
            # iteration under Newton steps — on an infeasible model too, which the verdict names)
            if watch.check(k + 1, w=w_next, multiplier_change=dmu * self.beta / beta, certificate=trace[-1]):
                status = watch.report(info, penalties_note(rho, rho_start))   # the last finite iterate kept
                break
            previous, w = w, w_next
            record = outer_record(ex, w, k, trace, tau, dw, dmu, start, rider and rider.replies)
            record.update(true_residual=true_residual, beta=beta, step=float(np.linalg.norm(w - previous)),
                          size=float(np.linalg.norm(w)), dimension=w.size,           # (proxal_outer._near)
                          metric=user_metric(self.user_scales, w, sizes))
            history.append(record)
            if callback:
                callback(record)
            bar.update(record)
            # (11) or a verdict. The violation test is implied by (11) for the AL's constraints
            # (Δμ = βc where c > 0); it binds for the sets clients project, which the server's
            # w meets only up to the ADMM's consensus residual
            solved = trace[-1] <= tau and record["violation"] <= self.eps2
            stop = outer_stop(self, history, ex, w, info, solved=solved)
            if stop:
                status = stop
                break
            if k + 1 < self.max_outer:      # (a stop the clients' Hessians refused: their Newton point)
                w = proxal_certificate.finish(ex, w)
            beta, last_change = next_beta(self, beta, dmu, last_change, history)
            checkpointer.save(ex, k + 1, {"w": w, "rho": rho, "total_inner": total_inner, "beta": beta,
                                  "last_change": last_change, "watch": dict(watch.smallest), "local": local, "inner": inner,
                                  "certificate_log": certificate_log, "history": history,
                                  "flat": proxal_flat.memo(ex)})
        bar.close()
        ex.ledger.rounds = total_inner + len(history)
        return Outcome(status, shared=w, history=history,
                       iterations={"outer": len(history), "inner": total_inner},
                       info={"admm_certificates": certificate_log, "rho": rho, **info})

    # Algorithm 2 --------------------------------------------------------------------------------
    def _admm(self, ex, w_start, tau, rho, settings=None, local=None, failed=None, marks=None):
        """Algorithm 2 from w̃⁰ = w_start to (23) with τ_k = `tau`: returns the last server
        iterate, the certificates (22) of its iterations and the clients' ρ_i. `settings`
        (β, ω): the clients configure P_{i,k} with the init (center w_start). `local`: whether
        the clients' solves hold their constraints (`client_constraints`); a client that
        reports it cannot meet them ends the run, its violation in `failed`, as does a consensus
        residual that shows ∩ X_i empty (`proxal_admm.no_consensus`, read from `marks`, the ADMM
        iterations' ρ_i and residuals, kept across runs): failed[NO_CONSENSUS]."""
        clients = ex.clients
        mode = {"local": 0.0} if local is False else {}     # (held is a node's default)
        replies = ex.map("proxal_admm_init", {c: {"w": w_start, "rho": rho[c], "anderson": self.anderson,
                                                  **(settings or {}), **mode} for c in clients})
        u_tilde = {c: r["u_tilde"] for c, r in replies.items()}
        mixer = ServerMixer(self.anderson) if self.anderson else None
        mix, restart = np.zeros(0), False
        w = w_start
        certificate, trace, plain = np.inf, [], 0
        # with a capped tolerance the clients solve (19) to ε_{t+1}/n (module docstring)
        split = max(len(clients), 1) if np.isfinite(self.local_tol_cap) else 1
        for t in range(self.max_inner):
            # step 3: ε_{t+1} = q^t, capped at local_tol_cap·τ_k and floored at τ_k/100 (module docstring)
            eps = max(min(self.q ** t, self.local_tol_cap * tau), 1e-2 * tau)
            total_rho = sum(rho.values())
            anchor = sum(rho[c] * u_tilde[c] for c in clients) / total_rho if clients else w
            w, server_residual = server_step(ex, linear=None, weight=total_rho, anchor=anchor,
                                             x0=w, tol=eps, method=self.local_solver)   # (18)
            adaptive = self.adaptive_rho and t % RHO_PERIOD == 0      # batched ρ changes (RHO_PERIOD)
            step = {"w": w, "eps": eps / split, "adaptive": float(adaptive), "solver": self.local_solver}
            if mixer:
                step.update(mix=mix, restart=float(restart))
            replies = ex.map("proxal_admm_step", {c: step for c in clients})      # (19)–(22)
            u_tilde = {c: r["u_tilde"] for c, r in replies.items()}
            new_rho = {c: r["rho"] for c, r in replies.items()}
            certificate = server_residual + sum(r["eps_tilde"] for r in replies.values())
            trace.append(certificate)
            if marks is not None:
                marks.append((np.array([new_rho[c] for c in clients]),
                              np.array([replies[c]["primal"] for c in clients])))
            lost = {c: r["local_failed"] for c, r in replies.items() if "local_failed" in r}
            if not lost and marks and certificate > tau:
                apart = no_consensus(marks, max(tau, self.eps2))
                if apart is not None:
                    lost[NO_CONSENSUS] = apart
            if lost and failed is not None:
                failed.update(lost)
                break
            if not np.isfinite(certificate):      # blown up: the outer DivergenceWatch reports it
                break
            # a mixed run that stalled where it started (`went_nowhere`) goes on as plain ADMM, its
            # states unmixed from here (`anderson=m` in the module docstring); `_stalled` then
            # judges the plain part alone
            if mixer and certificate > tau and _stalled(trace, self.inner_stall) and went_nowhere(trace):
                mixer, plain = None, len(trace)
            if mixer and certificate > tau:   # the clients' next states, mixed (backends/anderson.py)
                products = sum(r["products"] for r in replies.values())
                mix, restart, u_tilde = mixer.step(u_tilde, products, changed=new_rho != rho)
            rho = new_rho
            if certificate <= tau or _stalled(trace[plain:], self.inner_stall):     # (23)
                break
        return w, trace, rho
