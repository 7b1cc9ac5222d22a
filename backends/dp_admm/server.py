"""DP-IADMM's server loop (backends/dp_admm, `DPADMM.run`): the rounds of Algorithms 1–2 and
OutP as the server runs them. The server keeps its per-client quantities — z_p, λ_p — as (n, d)
stacks in client order, so a round's (4a), (4c) and residuals are a few array passes, and it sends
each round's client step as one group request (`Executor.map_stacked`: common w^{t+1} and step
sizes, λ_p (and OutP's per-client 1/η̂, σ) as blocks). The batched and JAX executors serve it as
one block (`client._step_stacked`); the serial, Ray and Flower executors split it into the same
per-node messages, in client order, each served by the same step on one client, so every client
draws its noise as before.
"""
from __future__ import annotations

import math
import warnings
import time

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime.checkpoint import NO_CHECKPOINT
from fedmodel.runtime.executor import Rider
from ..common import complete_record, progress, stacked_report
from ..watch import DivergenceWatch, steady_descent
from ..projecting import projects_affine, server_set_multipliers
from .accounting import privacy_report
from .constrained import has_local_terms
from .pace import pace_message
from .sampled import clipped_fraction, noise_ratio
from ..outcome import Outcome, Status

# The weight ω_p (`sampled.shrinkage`) below which the knob's run names the client in a warning:
# ν_p > 3, its noise three times its clipped gradient (a9a, E = 8: fewer than 40 records).
WEIGHT_WARNING = 0.1
# What a "stalled" non-private run with local constraints says (`DivergenceWatch.check_shrinking`).
STALL_HINT = ("the model may be infeasible — its local constraints without a common feasible point, "
              "whose multipliers then grow by the least violation every round — or this run too "
              "slow for it: prob.solve('cvxpy') decides feasibility, and ProxAL or DALD solve "
              "constrained models with a feasibility verdict")


class RoundLoop:
    """The server side of `DPADMM` (mixed into it): initialization, rounds, history, info."""

    def _init_clients(self, ex, w, local, curvature: int | None = None):
        """z_p^1 and the DP layers on the clients (`dp_admm_init`); their record counts, the
        shares of ε̄, and — `curvature` power steps — the largest L̂_p at w (else None)."""
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
            if mechanism == "sampled_gaussian":
                payloads[c].update(noise=self.gradient_noise, noise_c=self.value_noise,
                                   rate=self.sample_rate, clip=self.clip, shrink=float(self.shrink))
            if local:
                payloads[c].update(share=self.constraint_share, value_clip=self.value_clip)
            if curvature:
                payloads[c]["curvature"] = curvature
        replies = ex.map("dp_admm_init", payloads)
        releases = int(max(r["constraint_releases"] or 0 for r in replies.values()))
        largest = max(float(r["L"]) for r in replies.values()) if curvature else None
        return {c: r["records"] for c, r in replies.items()}, self._shares(releases), largest

    def _client_weights(self, records: dict, d: int) -> dict | None:
        """The weights ω_p of the clients' releases in the knob's rounds (`sampled.shrinkage`;
        each client computes its own from the same public values), or None without the
        sampled mechanism; warns naming the clients whose data it weights below WEIGHT_WARNING."""
        if not self.sampled:
            return None
        names = list(records)
        ratio = noise_ratio(self.gradient_noise, d, self.sample_rate, [records[c] for c in names])
        weights = dict(zip(names, map(float, self.weights(ratio))))
        low = [(c, records[c], weights[c]) for c in names if weights[c] < WEIGHT_WARNING]
        if low:
            listed = ", ".join(f"{c} ({n:.0f} records: ω = {w:.2g})" for c, n, w in low[:5])
            warnings.warn(
                f"dp-admm: at epsilon_total={self.epsilon_total:g} over {self.max_rounds} rounds, one "
                f"round's noise on the releases of {listed}{' …' if len(low) > 5 else ''} is over "
                "three times their clipped gradient (ν = σ·√d/(q·I_p) > 3), so the run weights each "
                "such release by ω = 1/(1 + ν²): their records barely inform the model (the point "
                "the run tends to is the model's as the noise falls, ω → 1). Alternatives: merge "
                "small clients' data, raise epsilon_total, lower max_rounds, or shrink=False (every "
                "release in full, whose noise then sets ρ for all clients: a9a, one 1-record "
                "client beside five of 5,000, E = 8: 23.8 % test error against 15.8 %)",
                UserWarning, stacklevel=6)
        return weights

    def _server_step(self, ex, Z, LAM, rho, w, server_used):
        """(4a): w = mean_p(z_p − λ_p/ρ); with server terms/sets, argmin h(w) + Pρ/2‖w − that‖²."""
        anchor = np.mean(Z - LAM / rho, axis=0)
        if not server_used:
            return anchor
        self._server_step_inputs = (anchor, len(Z) * rho)   # the last one: its multipliers (`_loop`)
        return ex.call("server", "solve_local", linear=None, weight=len(Z) * rho, anchor=anchor,
                       x0=w, tol=1e-12, method="auto")["x"]

    def _start(self, d: int) -> np.ndarray:
        """w⁰: zeros, or the `w0` option (a scalar or d numbers)."""
        w = np.zeros(d)
        if self.w0 is not None:
            w0 = np.asarray(self.w0, float).ravel()
            if w0.size not in (1, d) or not np.all(np.isfinite(w0)):
                raise FedModelError(f"w0 must be finite, a scalar or {d} numbers (the shared "
                                    f"variables, flattened); got {w0.size}")
            w[:] = w0
        return w

    def _loop(self, problem, ex, d, callback, verbose, checkpointer):
        clients = tuple(ex.clients)        # (a tuple: the batched executor finds it by identity)
        w = self._start(d)
        local = any(has_local_terms(c) for c in problem.clients)
        # the ρ floor reads the clients' curvature at w (data-dependent: never in private runs),
        # asked in the set-up request (`setup`)
        floor = self.auto_rho and math.isinf(self.epsilon)
        records, shares, largest = self._init_clients(ex, w, local, curvature=20 if floor else None)
        self.knob_rho = self.knob_penalty(np.array(list(records.values())), d)  # (None: the schedule)
        weights = self._client_weights(records, d)
        rho_floor = 2.2 * largest if floor else 0.0
        self._server_step_inputs = None
        Z = np.tile(w, (len(clients), 1))                               # z_p^1, one row per client
        LAM = np.zeros_like(Z)                                          # λ_p^1 = 0
        server_used = bool(problem.server.terms or problem.server.constraints)
        history, status, t, rho, diverged = [], Status.MAX_ITERATIONS, 0, math.nan, {}
        bar = progress(self.max_rounds, verbose, "DP-ADMM")
        start = time.perf_counter()
        watch = DivergenceWatch("DP-ADMM", hint=self._hint() + (
            "; with local constraints, check they have a common feasible point: on an infeasible "
            "model the multipliers grow without bound" if local else ""), stall_hint=STALL_HINT)
        saved = checkpointer.restore(ex)    # client RNGs and noise logs come back with the nodes
        if saved:
            t, w, Z, LAM, rho, history = (saved[key] for key in ("t", "w", "z", "lam", "rho", "history"))
            if isinstance(Z, dict):         # a checkpoint from before the stacks: {client: row}
                Z, LAM = (np.array([rows[c] for c in clients], dtype=float) for rows in (Z, LAM))
            watch.smallest = dict(saved["watch"])
        # a non-private run's residuals, one a round: `pace` stops one too slow for max_rounds
        trace = list(saved.get("pace", [])) if saved else []
        last = self.budget_rounds(shares)   # < max_rounds: the budget ends the run
        records_column = np.array([records[c] for c in clients], dtype=float)
        # OutP: a logged round's record, whose report at w^{t+1} rides on round t + 1's step (it
        # carries w^{t+1}; before it: the state the report would have seen), completed — and
        # handed to the callback — then; by itself at the end, or where a checkpoint follows
        # (round t's callback runs before checkpoint t is written: docs/checkpoints.md)
        pending = None
        defer = self.variant == "outP" and checkpointer is NO_CHECKPOINT

        def complete(reports=None):
            nonlocal pending
            if pending is not None:
                record, at = pending
                complete_record(record, self._report(ex, clients, at, server_used, reports), callback, bar)
            pending = None

        for t in range(t + 1, last + 1):
            rho = self.rho(t, rho_floor)                                       # (21)
            # (a logged round's report rides on its client step where that carries w^{t+1})
            rider = None if pending is None else Rider("report", {"x": pending[1]}, before=True)
            step, w_new, Z_new, reports = self._round(ex, clients, t, rho, w, Z, LAM, records_column,
                                                      server_used, local, t % self.log_every == 0 or t == last,
                                                      rider)
            if rider is not None:
                complete(rider.replies)
            if watch.check(t, **{"w (server model)": w_new, "z_p (client models)": Z_new}):
                status = watch.report(diverged)
                break
            LAM, residuals = self._dual_step(rho, w, w_new, Z, Z_new, LAM)    # (4c)
            w, Z = w_new, Z_new
            residual = step.get("multiplier_residual", 0.0)      # local constraints' KKT residual
            # an infeasible model: its multipliers grow by its least violation every round (a
            # noisy run's released values never settle, so only the non-private one is judged)
            if local and math.isinf(self.epsilon) and watch.check_shrinking(
                    t, "the residual (consensus, local constraints)", max(residual, residuals["primal_residual"]),
                    max(100.0 * self.tol, 1e-6)):
                # "stalled", not "diverged": nothing was shown to grow (`check_shrinking`)
                watch.message += (f" (now: consensus max_p ‖w − z_p‖∞ = {residuals['primal_residual']:.3g}, "
                                  f"the local constraints' violation {residual:.3g})")
                status = watch.report(diverged)    # (the point returned: the last round's)
                break
            done = self.tol > 0 and max(residuals["primal_residual"], residuals["dual_residual"],
                                        residual) <= self.tol
            if t % self.log_every == 0 or done or t == last:
                record = self._record(t, rho, step, residuals, start, len(clients), residual if local else None)
                history.append(record)
                pending = (record, w)
                if not defer:
                    complete(reports)
            if done:
                status = Status.CONVERGED
                break
            if math.isinf(self.epsilon):    # (a private run's residuals carry its noise)
                trace.append(max(residuals["primal_residual"], residuals["dual_residual"], residual))
                slow = pace_message(trace, self.tol, self.max_rounds)
                if slow and steady_descent(history):    # no minimum: the cap's verdict, "unbounded"
                    break                               # (`base.finish_result`), now
                if slow:
                    diverged[Status.STALLED.value], status = slow, Status.STALLED
                    warnings.warn(slow, RuntimeWarning, stacklevel=5)
                    break
            checkpointer.save(ex, t, {"t": t, "w": w, "z": Z, "lam": LAM, "rho": rho, "history": history,
                                      "watch": dict(watch.smallest), "pace": trace})
        complete()                  # (OutP: the last logged round's report, by itself)
        bar.close()
        status = Status.BUDGET_EXHAUSTED if status == Status.MAX_ITERATIONS and last < self.max_rounds else status
        rounds = t if status != Status.DIVERGED else t - 1
        # the clipped records' count at w, released (and accounted for, `_noised`) by a private sampled run
        clipped = clipped_fraction(self, ex, clients, w) \
            if self.clip_counts and status != Status.DIVERGED else None
        info = self._info(ex, clients, Z, LAM, rho, records, t, history, shares) | diverged  # t rounds: z out
        if clipped is not None:
            info["privacy"]["clipped"] = clipped
        if weights is not None:
            info["privacy"]["shrinkage"] = weights
        info["rho_floor"] = rho_floor        # ρ^t = max(schedule, floor): `self.rho(t, floor)`
        projected = {}      # (they override the gathered ones of the same names)
        if math.isinf(self.epsilon) and projects_affine(problem):   # (a private run releases nothing more)
            projected = self._set_multipliers(ex, clients, w, LAM, server_used)
        ex.ledger.rounds = rounds
        return Outcome(status, shared=w, multipliers=projected, history=history,
                       iterations={"rounds": rounds}, info=info)

    def _set_multipliers(self, ex, clients, w, LAM, server_used) -> dict:
        """The multipliers of the affine constraints the nodes projected on (the KKT certificate
        reads affine constraints through them): each client's from its step's optimality at
        z_p with λ_p (`client._set_multipliers`), the server's from its last (4a)."""
        out: dict = {}
        replies = ex.map("dp_admm_set_multipliers", {c: {"lam": LAM[i]} for i, c in enumerate(clients)})
        for reply in replies.values():
            out.update(reply["multipliers"])
        inputs = getattr(self, "_server_step_inputs", None)
        if server_used and inputs is not None:
            out.update(server_set_multipliers(ex, w, inputs))
        return out

    def _dual_step(self, rho, w, w_new, Z, Z_new, LAM) -> tuple[np.ndarray, dict]:
        """(4c) λ_p += ρ(w^{t+1} − z_p^{t+1}) on the stack, and the round's residuals: the largest
        ‖Δz_p‖ (ObjT's trust norm), primal max_p ‖w − z_p‖∞, dual ρ‖Δw‖∞, and Σ_p‖w − z_p‖₁."""
        gap = w_new - Z_new
        size = np.abs(gap)
        moved_norm = np.inf if self.trust_norm == "inf" or self.variant != "objT" else 2
        moved = np.linalg.norm(Z_new - Z, moved_norm, axis=1)
        return LAM + rho * gap, {
            "step": float(np.max(moved, initial=0.0)),
            "primal_residual": float(np.max(size, initial=0.0)),
            "dual_residual": rho * float(np.max(np.abs(w_new - w), initial=0.0)),
            "consensus_violation": float(np.sum(size))}

    def _record(self, t, rho, step, residuals, start, n, residual) -> dict:
        """One history record, without the objective and violation at w on every node (`_loop`
        adds them: `_report`)."""
        privacy = self.privacy(t)
        return {"round": t, "rho": rho, "radius": step["radius"],
                "prox": step["prox"] if self.variant == "objP" else None, "step": residuals["step"],
                "primal_residual": residuals["primal_residual"],
                "dual_residual": residuals["dual_residual"],
                **({"constraint_residual": residual} if residual is not None else {}),
                "consensus_violation": residuals["consensus_violation"],
                "consensus_violation_mean": residuals["consensus_violation"] / n,
                "epsilon": self.epsilon, "epsilon_basic": privacy["basic"][0],
                "epsilon_advanced": privacy["advanced"][0],
                "time": time.perf_counter() - start}

    def _round(self, ex, clients, t, rho, w, Z, LAM, records, server_used, local, report=False,
               rider: Rider | None = None):
        """One round's (4a) and client steps, in the variant's order; returns the client step's
        parameters, w^{t+1}, the stack of z^{t+1} (λ is updated by the caller, (4c)) and, with
        `report`, the clients' stacked reports at w^{t+1} (None where it cannot ride: OutP's
        step carries w^t — its report rides on the next round's step instead, `rider` —, or
        w^{t+1} is not finite). With `local` constraints the step also takes the multipliers'
        step η_t = dual_step/√t, and the returned parameters hold the clients' largest
        multiplier residual."""
        step = {"rho": rho, "prox": 0.0, "radius": None, "sigma": 0.0}
        if self.variant == "objP":
            step["prox"] = self.prox(t)                                        # 1/η^t
            if local:
                # (0: the non-private default's curvature step, `DPADMM.curvature_dual`)
                step["dual_step"] = 0.0 if self.curvature_dual() else self.dual_step / math.sqrt(t)
        elif self.variant == "objT":
            step["radius"] = self.radius(t)                                    # δ^t
        if self.variant == "outP":          # z(w^t) → w → λ; 1/η̂^t and σ^t per client (I_p)
            prox, sigma = self.outp_parameters(t, rho, records)
            column = lambda value: np.broadcast_to(np.asarray(value, float), (len(clients),))  # noqa: E731
            rows = {"lam": LAM, "prox": column(prox), "sigma": column(sigma)}
            common = {k: v for k, v in step.items() if k not in rows}
            Z_new = ex.map_stacked("dp_admm_step", clients, rows=rows, common={"w": w, **common},
                                   rider=rider)["z"]
            w_new = self._server_step(ex, Z_new, LAM, rho, w, server_used)      # (4a)
            return step, w_new, Z_new, None
        w_new = self._server_step(ex, Z, LAM, rho, w, server_used)              # (4a)
        # the record's report at w^{t+1} in the step's own message (after it, as when asked alone)
        rider = Rider("report", {"x": w_new}) if report and np.all(np.isfinite(w_new)) else None
        replies = ex.map_stacked("dp_admm_step", clients, rows={"lam": LAM},
                                 common={"w": w_new, **step}, rider=rider)      # (8) / (9)
        if local:
            step["multiplier_residual"] = max(v or 0.0 for v in replies["multiplier_residual"])
        return step, w_new, replies["z"], rider and rider.replies

    def _hint(self) -> str:
        """What to change when a run diverges: the z-step is stable when ρ^t (plus ObjP's √t/a)
        dominates the clients' gradient Lipschitz constants."""
        if self.variant == "objT":
            return ("raise rho_schedule so that ρ^t > 2·L_p (L_p: Lipschitz constant of the "
                    "clients' gradients) or lower a (the trust radius)")
        return (f"raise rho_schedule above the clients' gradient Lipschitz constants, or lower a "
                f"(now {self.a:g}) so the proximal weight √t/a dominates them sooner")

    def _report(self, ex, clients, w, server_used, reports=None) -> tuple[float, float]:
        """Objective and violation at w: the clients' reports as one group request (or their
        stacked `reports`, got as a rider), plus the server's when it holds terms or
        constraints (else it is 0, 0)."""
        return stacked_report(ex, clients, w, server_used and "server" in ex.programs, reports)

    def _info(self, ex, clients, Z, LAM, rho, records, rounds, history, shares) -> dict:
        logs = {c: r["log"] for c, r in ex.map("dp_admm_log", {c: {} for c in clients}).items()}
        for record in history:          # the paper's average noise magnitude (1/PJK)Σ|ξ|
            i = record["round"] - 1
            drawn = [lg["noise_abs"][i] for lg in logs.values() if i < len(lg["noise_abs"])]
            record["noise_magnitude"] = float(np.mean(drawn)) if drawn else 0.0
        formal = self.outp_std == "sigma" if self.variant == "outP" else \
            self.sensitivity == "clip" or not isinstance(self.sensitivity, str)
        formal = formal or self.sampled
        privacy = self.privacy(rounds) | privacy_report(
            self._mechanism(), self.epsilon, rounds, self.composition_delta, self._round_delta(),
            shares, formal, self.accountant(rounds, shares)) | {"epsilon_total": self.epsilon_total}
        if self.sampled:
            privacy |= {"noise_multiplier": self.noise_multiplier, "gradient_noise": self.gradient_noise,
                        "value_noise": self.value_noise, "sample_rate": self.sample_rate, "clip": self.clip}
        elif math.isfinite(self.epsilon) and privacy["pld"][0] > 10.0:
            warnings.warn(
                f"dp-admm: the run's total privacy loss is ε = {privacy['pld'][0]:.3g} (PLD, δ = "
                f"{self.composition_delta:g}; per client, over {rounds} rounds at ε̄ = {self.epsilon:g} "
                "per round). To ask for a total instead, use DPADMM(epsilon_total=E) without epsilon "
                "(the sampled Gaussian mechanism, calibrated to spend E)", UserWarning, stacklevel=4)
        scales = {c: np.asarray(lg["scale"]) for c, lg in logs.items()}
        info = {"variant": self.variant, "privacy": privacy, "client_values": dict(zip(clients, Z)),
                "dual_variables": dict(zip(clients, LAM)), "rho": rho, "records": records,
                "sensitivity" if self.variant != "outP" else "noise_std": scales,
                "readings": {"trust_radius": self.trust_radius if isinstance(self.trust_radius, str)
                             else "callable", "trust_norm": self.trust_norm,
                             "sensitivity": self.sensitivity if isinstance(self.sensitivity, str)
                             else "bound", "outp_std": self.outp_std}}
        if self.record_noise:
            info["noise"] = {c: lg["noise"] for c, lg in logs.items()}
        return info
