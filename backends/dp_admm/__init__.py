"""DP-IADMM: differentially private inexact ADMM (Ryu & Kim, "Differentially private federated
learning via inexact ADMM"), Algorithms 1 (ObjP) and 2 (ObjT), and the output-perturbation
baseline OutP of Huang et al. Equation numbers refer to ../shared/seeds/dp_inexact_admm.txt;
readings and discrepancies: ../shared/spec/dp_iadmm.md.

One round t (all clients, star topology), ρ = ρ̂^t from (21):
  ObjP / ObjT  (4a) server w^{t+1} = argmin_w Σ_p <λ_p, w> + ρ/2‖w − z_p‖²  = mean_p(z_p − λ_p/ρ)
               (8)/(9) client z_p^{t+1} = IADMM step at w^{t+1} with f'_p(z_p^t) + ξ̃_p^t
               (4c) server λ_p += ρ(w^{t+1} − z_p^{t+1})
  OutP         client z_p^{t+1} = IADMM-Prox step (5a) at the OLD w^t, proximity η̂^t, plus
               Gaussian noise on the output; then (4a) with z^{t+1}, then (4c)   [spec 2.6]

The client step and its DP layers (objective / output perturbation) are in `client`, the
schedules and presets in `options`, the composition of the per-round guarantees in
`accounting`. With ε̄ = ∞ the mechanism is the identity, so the run is exactly IADMM
(Remark 1(ii)). Noise is drawn on each client from its own generator, spawned from `seed`
(SeedSequence(seed, spawn_key=(client index,))) or from the client's OS entropy; Δ̄ is computed
on the client from its own objective (fedmodel.runtime.privacy); only z_p leaves it.

Readings (the issue: default to the paper, expose the code's):
  ObjT radius   trust_radius="paper": δ^t = a/t² (A.11; default); "code": δ^t = a (precedence bug)
  ObjT norm     trust_norm="inf" (Sec. 4, default) or "2" (6b as written)
  Δ̄ (11b)/(20)  sensitivity="clip" (default; formal): each record's gradient term clipped to L1
                norm C/I_p in the step itself, Δ̄ = 2C/I_p over all neighbours (derivation:
                `client.LaplaceObjective`); "paper" (`paper()`; nominal): max over the client's own
                records of the L1 norm of the record's gradient term (no factor 2, data-dependent,
                as (20) and the code); "replace": twice that; a number (or {client: number}): a
                data-independent bound, see `glm_sensitivity_bound`. Loss scaling is the model's.
  OutP noise    outp_std="sigma": N(0, σ²) (Huang et al., default); "sigma2": std σ² (the code)
  W             local constraints and prox-able terms of a client enter its ObjP step (`constrained`:
                their prox after the step, the Lagrangian with multipliers from released values);
                simple server constraints (bounds, norm ball) and server terms h(w) enter (4a).
  CV            history has both Σ_p‖w − z_p‖₁ (paper) and that divided by P (code).

Privacy (per client, over the rounds run; `accounting`, docs/privacy.md): basic and advanced
composition of the per-round (ε̄, 0) (ObjP/ObjT, Theorems 1, 3) or (ε̄, δ̄) (OutP), and ε from
dp-accounting's RDP and PLD accountants (Laplace / Gaussian events) at δ = `composition_delta`
(default: `delta` = 1e-6); `epsilon_total` stops the run within a PLD budget. The guarantee is
formal only when Δ̄ bounds (11b) over every neighbouring data set, i.e. with sensitivity="clip"
or a data-independent bound (and for OutP with outp_std="sigma" and correct constants); the
paper's data-dependent Δ̄ (20) is reported as nominal (`info["privacy"]["formal"]`).
"""
from __future__ import annotations

import copy
import math
import time
from typing import Any

import numpy as np

from fedmodel.compiler.sets import simple_set
from fedmodel.errors import FedModelError
from fedmodel.runtime import make_executor
from fedmodel.runtime.checkpoint import NO_CHECKPOINT, Checkpointer
from fedmodel.runtime.privacy import glm_sensitivity_bound
from fedmodel.runtime.program import compile_programs
from ..base import Backend
from ..common import check_count, check_number as _number, gather_values, progress, require_star
from ..watch import DivergenceWatch
from .accounting import RunAccounting, calibrated_epsilon, composition, privacy_report
from .batched import iadmm_step     # registers the client procedures (client) and the batched step
from .constrained import check_clients, has_local_terms
from .options import (DEFAULT_CLIP, DEFAULT_VALUE_CLIP, PAPER_DPADMM, RHO_PRESETS, VARIANTS,
                      RhoSchedule, as_rho_schedule, check_clip, check_readings, check_sensitivity,
                      outp_parameters)

__all__ = ["DPADMM", "PAPER_DPADMM", "RHO_PRESETS", "RhoSchedule", "composition",
           "glm_sensitivity_bound", "iadmm_step"]


class DPADMM(RunAccounting, Backend):
    """DP-IADMM: ObjT (Algorithm 2), ObjP (Algorithm 1, default) and the OutP baseline.

    Defaults: the fastest robust non-private configuration (ε̄ = ∞, ObjP, a = 10, stop at tol);
    the paper's exact setting is `DPADMM.paper(epsilon=...)` (ObjT, a = 1, δ^t = a/t², T = 2e4).
    epsilon: ε̄ per round and client (∞: non-private IADMM). delta: OutP's δ̄ (1e-6).
    rho_schedule: "auto" (default: "mnist", floored at 2.2·max_p L̂_p, the clients' measured
    curvature, when ε̄ = ∞; a private run never releases L̂_p, so there it is "mnist") |
    "mnist" (c1=2, c2=5, T_c=1e4; the paper) | "femnist" | a RhoSchedule | a number
    (static ρ) | a callable (t, ε̄) -> ρ. a: scales η^t = a/√t (ObjP; default 10, paper 1), δ^t (ObjT)
    and η̂^t (OutP).
    max_rounds: T (paper: 2e4). seed: per-client generators spawned from it (None: each client
    seeds itself). trust_radius: "paper" (a/t²) | "code" (a) | callable t -> δ^t.
    trust_norm: "inf" | "2". sensitivity: "clip" (default; formal: per-record clipping) | "paper"
    (nominal; `paper()`) | "replace" | number | {client: number}. clip: C of "clip" (default 1, see
    `options.DEFAULT_CLIP`), the L1 clip norm of a record's gradient in the mean-loss scale.
    ObjT's step has no proximal term: as an iteration it is stable only when ρ^t > 2·L_p
    (L_p: Lipschitz constant of ∇f_p); the paper's ρ̂^t meets this at its 1/I loss scaling.
    outp_std: "sigma" | "sigma2". outp_constants: (c1, c3) of η̂ and σ (default (I_p, I_p/4) as
    the code). composition_delta: δ' of advanced composition and the δ at which the RDP and
    PLD accountants report ε. epsilon_total: a total budget (PLD ε at that δ): the run stops
    before a round that would exceed it (status "budget_exhausted"); with epsilon="budget", ε̄ is
    calibrated so that max_rounds rounds spend it (ObjP/ObjT). tol: stop when the primal
    ‖w − z_p‖∞ and dual ρ‖Δw‖∞ residuals are ≤ tol (0: run all rounds). log_every: history
    stride. record_noise: keep every noise draw on the clients (info["noise"], for tests).
    Local constraints (ObjP; `constrained`): dual_step (multipliers' step η_t = dual_step/√t),
    constraint_share (the fraction of ε̄ a round spends on releasing the constraints' values) and
    value_clip (B: a record's term of a constraint's value, in the mean scale, clipped to [−B, B]).
    """

    name = "dp-admm"
    checkpointing = True

    def __init__(self, epsilon: float = float("inf"), variant: str = "objP", delta: float = 1e-6,
                 rho_schedule: Any = "auto", a: float = 10.0, max_rounds: int = 20000,
                 seed: int | None = None, trust_radius: Any = "paper", trust_norm: str = "inf",
                 sensitivity: Any = "clip", clip: float = DEFAULT_CLIP, outp_std: str = "sigma",
                 outp_constants: tuple[float, float] | None = None,
                 composition_delta: float | None = None, tol: float = 1e-8, log_every: int = 1,
                 record_noise: bool = False, w0: Any = None, epsilon_total: float | None = None,
                 dual_step: float = 10.0, constraint_share: float = 0.2,
                 value_clip: float = DEFAULT_VALUE_CLIP):
        names = {v.lower(): v for v in VARIANTS}
        if not isinstance(variant, str) or variant.lower() not in names:
            raise FedModelError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.calibrate = epsilon == "budget"            # ε̄ from epsilon_total and max_rounds
        if self.calibrate and (epsilon_total is None or str(variant).lower() == "outp"):
            raise FedModelError("epsilon='budget' calibrates ObjP/ObjT's ε̄ to epsilon_total over "
                                "max_rounds: give epsilon_total (and a Laplace variant)")
        epsilon = 1.0 if self.calibrate else _number(
            "epsilon (ε̄ per round; float('inf') for non-private IADMM; 'budget')", epsilon,
            0.0, math.inf, closed=True)
        delta = _number("delta", delta, 0.0, 1.0)
        if composition_delta is not None:
            composition_delta = _number("composition_delta", composition_delta, 0.0, 1.0)
        if epsilon_total is not None and math.isinf(epsilon):
            raise FedModelError("epsilon_total is a budget of a private run: give a finite epsilon")
        self.epsilon_total = epsilon_total if epsilon_total is None else \
            _number("epsilon_total", epsilon_total, 0.0, math.inf, low_closed=True)
        a, tol = _number("a", a, 0.0, math.inf), _number("tol", tol, 0.0, math.inf, low_closed=True)
        max_rounds, log_every = check_count("max_rounds", max_rounds), check_count("log_every", log_every)
        outp_constants = check_readings(trust_radius, trust_norm, outp_std, outp_constants, seed)
        self.epsilon, self.variant, self.delta = epsilon, names[variant.lower()], delta
        # "auto": the "mnist" schedule (21), floored (ε̄ = ∞ only) at 2.2·max_p L̂_p, measured by
        # the clients at w⁰, where the linearized z-step is stable for every variant
        self.auto_rho = isinstance(rho_schedule, str) and rho_schedule.lower() == "auto"
        self.rho_schedule = as_rho_schedule("mnist" if self.auto_rho else rho_schedule)
        self.a, self.max_rounds, self.seed = a, max_rounds, seed
        self.trust_radius, self.trust_norm = trust_radius, trust_norm
        self.sensitivity, self.clip = check_sensitivity(sensitivity), check_clip(clip)
        self.outp_std, self.outp_constants = outp_std, outp_constants
        self.composition_delta = composition_delta if composition_delta is not None else delta
        self.tol, self.log_every = tol, log_every
        self.record_noise, self.w0 = bool(record_noise), w0
        self.dual_step = _number("dual_step", dual_step, 0.0, math.inf)
        self.constraint_share = _number("constraint_share", constraint_share, 0.0, 1.0)
        self.value_clip = check_clip(value_clip)
        if w0 is not None:
            try:
                finite = bool(np.all(np.isfinite(np.asarray(w0, dtype=float))))
            except (TypeError, ValueError):
                finite = False
            if not finite:
                raise FedModelError(f"w0 must be finite numbers (a scalar or the shared variables, "
                                    f"flattened), got {w0!r}")

    @classmethod
    def paper(cls, **overrides) -> "DPADMM":
        """The paper's setting (Ryu & Kim, MNIST experiments): ObjT (Algorithm 2), ρ̂^t of (21)
        with the MNIST constants, a = 1, trust radius δ^t = a/t², T = 20,000 rounds run in full
        (tol = 0). ε̄ is the experiment's variable: pass `epsilon=` (default ∞, IADMM)."""
        return cls(**{**PAPER_DPADMM, **overrides})

    # -- public schedules ---------------------------------------------------------------------
    def rho(self, t: int, floor: float = 0.0) -> float:
        """ρ^t of the schedule, at least `floor` (rho_schedule="auto": 2.2·max_p L̂_p of the run)."""
        rho = self.rho_schedule(t, self.epsilon)
        rho = max(rho, floor) if isinstance(rho, (int, float)) else rho
        if not isinstance(rho, (int, float)) or not 0 < rho < math.inf:
            raise FedModelError(f"rho_schedule gave ρ^{t} = {rho}; it must be positive and finite")
        return float(rho)

    def radius(self, t: int) -> float:
        """ObjT's trust radius δ^t."""
        if not callable(self.trust_radius):
            return self.a / t ** 2 if self.trust_radius == "paper" else self.a
        radius = self.trust_radius(t)
        if not isinstance(radius, (int, float)) or not 0 <= radius < math.inf:
            raise FedModelError(f"trust_radius gave δ^{t} = {radius!r}; it must be finite and ≥ 0")
        return float(radius)

    def outp_parameters(self, t: int, rho: float, records: float) -> tuple[float, float]:
        """OutP's 1/η̂^t and σ^t (spec 2.6, the code's Theorem-4 calibration of Huang et al.):
        1/η̂ = (c3 + 2(c1/I_p)√(t ln(1.25/δ̄))/ε̄)/a, σ = 2(c1/I_p)√(2 ln(1.25/δ̄))/(ε̄(ρ + 1/η̂));
        non-private: 1/η̂ = c3/a, σ = 0."""
        return outp_parameters(t, rho, records, self.epsilon, self.delta, self.a, self.outp_constants)

    # -- run ------------------------------------------------------------------------------------
    def run(self, problem, topology=None, executor="serial", callback=None, verbose=False,
            checkpointer: Checkpointer = NO_CHECKPOINT, **_):
        require_star(problem, topology, self.name)
        self._check_model(problem)
        ex = make_executor(executor).start(compile_programs(problem, client_sets=True))
        try:
            run = self._calibrated(ex) if self.calibrate else self
            return run._loop(problem, ex, ex.model_size, callback, verbose, checkpointer)
        finally:
            ex.close()

    def _calibrated(self, ex) -> "DPADMM":
        """A copy of this backend whose ε̄ spends `epsilon_total` (PLD) in max_rounds rounds."""
        releases = ex.map("dp_admm_releases", {c: {} for c in ex.clients})
        shares = self._shares(int(max(r["releases"] for r in releases.values())))
        run = copy.copy(self)
        run.epsilon = calibrated_epsilon(self.epsilon_total, self.composition_delta,
                                         self.max_rounds, shares)
        run.calibrate = False
        return run

    def _check_model(self, problem) -> None:
        if not problem.clients:
            raise FedModelError("DPADMM needs at least one client")
        check_clients(problem, self.variant)
        hard = [c.name for c in problem.server.constraints if simple_set(c) is None]
        if hard:
            raise FedModelError(f"server constraints {hard} are not simple sets: DPADMM's server "
                                "step (4a) handles bounds and norm balls on a shared variable "
                                "(by projection) only; use ProxAL for general global constraints")
        if isinstance(self.sensitivity, dict):
            missing = sorted({c.name for c in problem.clients} - set(self.sensitivity))
            if missing:
                raise FedModelError(f"sensitivity has no bound for clients {missing}")

    def _init_clients(self, ex, w, local):
        mechanism = "none" if math.isinf(self.epsilon) else self._mechanism()
        payloads = {}
        for i, c in enumerate(ex.clients):
            bound = self.sensitivity.get(c) if isinstance(self.sensitivity, dict) else \
                None if isinstance(self.sensitivity, str) else self.sensitivity
            payloads[c] = {"z0": w, "mechanism": mechanism, "epsilon": self.epsilon,
                           "sensitivity": self.sensitivity if isinstance(self.sensitivity, str) else "bound",
                           "bound": bound, "clip": self.clip if self.sensitivity == "clip" else None,
                           "std": self.outp_std, "norm": self.trust_norm,
                           "seed": self.seed, "index": i, "record": float(self.record_noise)}
            if local:
                payloads[c].update(share=self.constraint_share, value_clip=self.value_clip)
        replies = ex.map("dp_admm_init", payloads)
        releases = int(max(r["constraint_releases"] or 0 for r in replies.values()))
        return {c: r["records"] for c, r in replies.items()}, self._shares(releases)

    def _shares(self, releases: int) -> tuple[float, ...]:
        """The fractions of ε̄ one round spends per release: the gradient's, then each of the
        `releases` constraint values' (the most of any client; `constrained`)."""
        if not releases:
            return (1.0,)
        return (1.0 - self.constraint_share,) + (self.constraint_share / releases,) * releases

    def _server_step(self, ex, z, lam, rho, w, server_used):
        """(4a): w = mean_p(z_p − λ_p/ρ); with server terms/sets, argmin h(w) + Pρ/2‖w − that‖²."""
        anchor = sum(z[c] - lam[c] / rho for c in z) / len(z)
        if not server_used:
            return anchor
        return ex.call("server", "solve_local", linear=None, weight=len(z) * rho, anchor=anchor,
                       x0=w, tol=1e-12, method="auto")["x"]

    def _loop(self, problem, ex, d, callback, verbose, checkpointer):
        clients = ex.clients
        w = np.zeros(d)
        if self.w0 is not None:
            w0 = np.asarray(self.w0, float).ravel()
            if w0.size not in (1, d) or not np.all(np.isfinite(w0)):
                raise FedModelError(f"w0 must be finite, a scalar or {d} numbers (the shared "
                                    f"variables, flattened); got {w0.size}")
            w[:] = w0
        local = any(has_local_terms(c) for c in problem.clients)
        records, shares = self._init_clients(ex, w, local)
        rho_floor = 0.0
        if self.auto_rho and math.isinf(self.epsilon):     # data-dependent: never in private runs
            curvature = ex.map("local_curvature", {c: {"z": w, "iterations": 20} for c in clients})
            rho_floor = 2.2 * max(r["L"] for r in curvature.values())
        z = {c: w.copy() for c in clients}                              # z_p^1
        lam = {c: np.zeros(d) for c in clients}                         # λ_p^1 = 0
        server_used = bool(problem.server.terms or problem.server.constraints)
        history, status, t, rho, diverged = [], "max_iterations", 0, math.nan, {}
        bar = progress(self.max_rounds, verbose, "DP-ADMM")
        start = time.perf_counter()
        watch = DivergenceWatch("DP-ADMM", hint=self._hint() + (
            "; with local constraints, check they have a common feasible point: on an infeasible "
            "model the multipliers grow without bound" if local else ""))
        moved_norm = np.inf if self.trust_norm == "inf" or self.variant != "objT" else 2   # ‖Δz_p‖
        saved = checkpointer.restore(ex)    # client RNGs and noise logs come back with the nodes
        if saved:
            t, w, z, lam, rho, history = (saved[key] for key in ("t", "w", "z", "lam", "rho", "history"))
            watch.smallest = dict(saved["watch"])
        last = self.budget_rounds(shares)   # < max_rounds: the budget ends the run
        for t in range(t + 1, last + 1):
            rho = self.rho(t, rho_floor)                                       # (21)
            step, w_new, z_new = self._round(ex, t, rho, w, z, lam, records, server_used, local)
            if watch.check(t, **{"w (server model)": w_new,
                                 "z_p (client models)": np.array(list(z_new.values()))}):
                status = watch.report(diverged)
                break
            for c in clients:
                lam[c] = lam[c] + rho * (w_new - z_new[c])                      # (4c)
            moved = max(float(np.linalg.norm(z_new[c] - z[c], moved_norm)) for c in clients)
            primal = max(float(np.max(np.abs(w_new - z_new[c]), initial=0.0)) for c in clients)
            dual = rho * float(np.max(np.abs(w_new - w), initial=0.0))
            cv = sum(float(np.sum(np.abs(w_new - z_new[c]))) for c in clients)
            w, z = w_new, z_new
            residual = step.get("multiplier_residual", 0.0)      # local constraints' KKT residual
            done = self.tol > 0 and max(primal, dual, residual) <= self.tol
            if t % self.log_every == 0 or done or t == last:
                privacy = self.privacy(t)
                record = {"round": t, "rho": rho, "radius": step["radius"],
                          "prox": step["prox"] if self.variant == "objP" else None,
                          "step": moved, "primal_residual": primal, "dual_residual": dual,
                          **({"constraint_residual": residual} if local else {}),
                          "consensus_violation": cv, "consensus_violation_mean": cv / len(clients),
                          "epsilon": self.epsilon, "epsilon_basic": privacy["basic"][0],
                          "epsilon_advanced": privacy["advanced"][0],
                          "time": time.perf_counter() - start, **self._report(ex, w)}
                history.append(record)
                if callback:
                    callback(record)
                bar.update(record)
            if done:
                status = "converged"
                break
            checkpointer.save(ex, t, {"t": t, "w": w, "z": z, "lam": lam, "rho": rho, "history": history,
                                      "watch": dict(watch.smallest)})
        bar.close()
        status = "budget_exhausted" if status == "max_iterations" and last < self.max_rounds else status
        rounds = t if status != "diverged" else t - 1
        info = self._info(ex, z, lam, rho, records, t, history, shares) | diverged   # t rounds released z
        info["rho_floor"] = rho_floor        # ρ^t = max(schedule, floor): `self.rho(t, floor)`
        values, multipliers = gather_values(ex, problem, w)
        ex.ledger.rounds = rounds
        return {"status": status, "values": values, "multipliers": multipliers, "history": history,
                "iterations": {"rounds": rounds}, "ledger": ex.ledger, "info": info}

    def _round(self, ex, t, rho, w, z, lam, records, server_used, local):
        """One round's (4a) and client steps, in the variant's order; returns the client step's
        parameters, w^{t+1} and z^{t+1} (λ is updated by the caller, (4c)). With `local`
        constraints the step also takes the multipliers' step η_t = dual_step/√t, and the
        returned parameters hold the clients' largest multiplier residual."""
        clients = ex.clients
        step = {"rho": rho, "prox": 0.0, "radius": None, "sigma": 0.0}
        if self.variant == "objP":
            step["prox"] = math.sqrt(t) / self.a                               # 1/η^t, η^t = a/√t
            if local:
                step["dual_step"] = self.dual_step / math.sqrt(t)
        elif self.variant == "objT":
            step["radius"] = self.radius(t)                                    # δ^t
        if self.variant == "outP":          # z(w^t) → w → λ
            payloads = {}
            for c in clients:
                step["prox"], step["sigma"] = self.outp_parameters(t, rho, records[c])
                payloads[c] = {"w": w, "lam": lam[c], **step}
            z_new = {c: r["z"] for c, r in ex.map("dp_admm_step", payloads).items()}
            w_new = self._server_step(ex, z_new, lam, rho, w, server_used)      # (4a)
        else:                               # w → z → λ (Algorithms 1–2, lines 3–7)
            w_new = self._server_step(ex, z, lam, rho, w, server_used)          # (4a)
            replies = ex.map("dp_admm_step", {c: {"w": w_new, "lam": lam[c], **step}
                                              for c in clients})                # (8) / (9)
            z_new = {c: r["z"] for c, r in replies.items()}
            if local:
                step["multiplier_residual"] = max(r["multiplier_residual"] or 0.0 for r in replies.values())
        return step, w_new, z_new

    def _hint(self) -> str:
        """What to change when a run diverges: the z-step is stable when ρ^t (plus ObjP's √t/a)
        dominates the clients' gradient Lipschitz constants."""
        if self.variant == "objT":
            return ("raise rho_schedule so that ρ^t > 2·L_p (L_p: Lipschitz constant of the "
                    "clients' gradients) or lower a (the trust radius)")
        return (f"raise rho_schedule above the clients' gradient Lipschitz constants, or lower a "
                f"(now {self.a:g}) so the proximal weight √t/a dominates them sooner")

    def _report(self, ex, w) -> dict:
        reports = ex.map("report", {n: {"x": w} for n in ex.nodes})
        return {"objective": sum(r["objective"] for r in reports.values()),
                "violation": max(r["violation"] for r in reports.values())}

    def _info(self, ex, z, lam, rho, records, rounds, history, shares) -> dict:
        logs = {c: r["log"] for c, r in ex.map("dp_admm_log", {c: {} for c in ex.clients}).items()}
        for record in history:          # the paper's average noise magnitude (1/PJK)Σ|ξ|
            i = record["round"] - 1
            drawn = [lg["noise_abs"][i] for lg in logs.values() if i < len(lg["noise_abs"])]
            record["noise_magnitude"] = float(np.mean(drawn)) if drawn else 0.0
        formal = self.outp_std == "sigma" if self.variant == "outP" else \
            self.sensitivity == "clip" or not isinstance(self.sensitivity, str)
        privacy = self.privacy(rounds) | privacy_report(
            self._mechanism(), self.epsilon, rounds, self.composition_delta, self._round_delta(),
            shares, formal) | {"epsilon_total": self.epsilon_total}
        scales = {c: np.asarray(lg["scale"]) for c, lg in logs.items()}
        info = {"variant": self.variant, "privacy": privacy, "client_values": dict(z),
                "dual_variables": dict(lam), "rho": rho, "records": records,
                "sensitivity" if self.variant != "outP" else "noise_std": scales,
                "readings": {"trust_radius": self.trust_radius if isinstance(self.trust_radius, str)
                             else "callable", "trust_norm": self.trust_norm,
                             "sensitivity": self.sensitivity if isinstance(self.sensitivity, str)
                             else "bound", "outp_std": self.outp_std}}
        if self.record_noise:
            info["noise"] = {c: lg["noise"] for c, lg in logs.items()}
        return info
