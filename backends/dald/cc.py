"""Fed-DALD-CC (Algorithm 2, star): clients solve (13) in parallel, the server takes the closed
form (29) (or, when the server block has terms/constraints, the exact argmin of (14) plus its own
terms), the multipliers take step (15) μ_i += 2ρ_i∘ρ_i∘(x̂ − x_i). The coordinator keeps the
clients' models as one (n, d) array and sends each request to all clients as one group request
(`Executor.map_stacked`), so the batched executor can serve it as one block; the serial and Ray
executors split it into the same per-node messages. Client steps: `cc_nodes`.
"""
from __future__ import annotations

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime.checkpoint import NO_CHECKPOINT
from fedmodel.runtime.executor import Rider
from ..common import complete_record, progress, stacked_report, user_metric, variable_sizes
from . import kernels, spectral
from .distance import distance_at, distance_left, kept, last_change
from .penalty import PENALTY_CAP, PENALTY_EVERY, PENALTY_RAISE, PENALTY_RULE, ServerPenalty, balance, penalty_slow
from ..outcome import Outcome, Status

__all__ = ["FedDALDCC", "distance_at", "distance_left"]     # (the distance rule's home is `distance`)

ADAPT_UNTIL = 200      # adaptive ρ: outer iterations that may change it (then fixed: convergence)
ADAPT_RANGE = 1e4      # ... and ρ∘ρ stays within [1/ADAPT_RANGE, ADAPT_RANGE] × its initial value
LARGEST = float(np.finfo(float).max)     # `_stall_reads`' probe: the largest finite violation


def _weighted_sum(RHO2, A, uniform) -> np.ndarray:
    """Σ_i ρ_i∘ρ_i∘a_i over the rows of A."""
    if uniform:
        return RHO2[0] * A.sum(axis=0)
    return (RHO2 * A).sum(axis=0)


class FedDALDCC:
    """The Fed-DALD-CC loop of `DALD` (a mixin: options and shared steps live in `DALD`)."""

    def _cc(self, problem, G, U, ex, xhat, d, server_used, callback, verbose, start, ckpt):
        """The server's view is kept as (n, d) arrays in client order: X (the x_i it received),
        RHO2 (ρ_i∘ρ_i); every request to the clients is one group request (`map_stacked`)."""
        clients, beta = tuple(ex.clients), self._beta()   # (a tuple: the executor may key it by identity)
        row, sizes = {c: i for i, c in enumerate(clients)}, variable_sizes(problem)   # (sizes: `user_metric`)
        RHO2 = np.array([self._rho(c, d) ** 2 for c in clients]).reshape(len(clients), d)
        uniform = bool(np.all(RHO2 == RHO2[:1]))          # one ρ for all: Σρ_i²x_i = ρ²Σx_i
        twice_rho2 = 2.0 * (RHO2[:, :1] if np.all(RHO2 == RHO2[:, :1]) else RHO2)   # (n, 1): scalar ρ_i
        # the clients' set-up (`dald_cc_init` at x⁰ = x̂) travels in the first solve request, which
        # reaches every client with x⁰ (`init`; cc_nodes): no round trip of its own. By itself
        # before a resumed run's restore (which replaces what it set: docs/checkpoints.md)
        first = {"rho": np.sqrt(RHO2)} if ckpt.iteration == 0 and self.coordination == "full" else None
        if first is None:
            ex.map_stacked("dald_cc_init", clients, rows={"rho": np.sqrt(RHO2)}, common={"x0": xhat, "beta": beta})
        ex.call("server", "configure", beta=beta, prox_weight=0.0, center=xhat)
        total_rho2 = RHO2.sum(axis=0)
        initial_rho2 = RHO2[0, 0] if RHO2[0, 0] > 0 else 1.0
        if self.dual_updates and np.any(total_rho2 <= 0):
            raise FedModelError("Fed-DALD-CC needs Σ_i ρ_i∘ρ_i > 0 in every coordinate")
        X = np.tile(xhat, (len(clients), 1))
        mu_sum = np.zeros(d)           # server's mirror of Σ_i μ_i (each term is known to it)
        history, total, status, k, info = [], 0, Status.MAX_ITERATIONS, 0, {}
        bar = progress(self.max_iterations, verbose, getattr(self, "bar_label", "DALD-CC"))
        opts = self._opts()
        inexact = self.dual_updates and self.local_tol is None and self.solver == "auto"
        if inexact and min(self.eps_primal, self.eps_dual) > 0.0:
            # the first solves' residual: ε, the rule's floor below — L-BFGS nodes take the kept L-BFGS
            # from the start, not scipy's (its import: 0.28 of 3.7 CPU s on MNIST, d = 784); Newton 1e-8
            opts["residual"] = min(self.eps_primal, self.eps_dual)
        constrained = bool(problem.constraints)     # (a list over every block: once, not per iteration)
        # Step 2 has nothing to do on the clients without (15) (FedAvg, FedProx: μ ≡ 0) and without
        # constraints of their own: not sent (it was a round trip every round, half of FedAvg's)
        send_dual = self.dual_updates or any(block.constraints for block in problem.clients)
        # ... and without (15) what is left of it, the clients' own multipliers at their new x_i,
        # is asked in (13)'s own request (`own`, one inner step per outer one): one round trip per
        # round where FedAvg / FedProx with client constraints had two, the same iterates
        own = send_dual and not self.dual_updates and self.one_message and \
            self.inner_rule == "B4" and self.v_max == 1
        if own:
            opts["own"], send_dual = 1.0, False
        # every client in every round and no checkpoints: outer step k's report at x̂^k rides on
        # the solve request of k + 1, which carries x̂^k (`Rider`, before (13) and before the Step 2
        # it may carry: the state a report by itself would have seen), and the record is
        # completed — and handed to the callback — then; the last one's goes alone. Not where
        # the stall rule may read this record's violation when it decides (`_stall_reads`: then
        # the report goes at once, as before), nor with checkpoints (written after the callback)
        ride = self.coordination == "full" and ckpt is NO_CHECKPOINT
        pending, quiet = None, progress(0, False, "")
        # the server's report is asked for when it has terms or constraints (else it is 0, 0)
        has_server = "server" in ex.programs and server_used
        # one message per iteration (`one_message`): Step 2 (and a penalty rescale) of outer
        # iteration k travels with the solve request of k + 1, which carries the same x̂ — the
        # iterates are those of the two-message loop; `owed`: that Step 2 is not sent yet,
        # `owed_factor`: nor the penalty rescale decided after it
        fuse = self.one_message and self.dual_updates and self.coordination == "full" and send_dual
        client_constrained = any(block.constraints for block in problem.clients)
        owed, owed_factor, dmu_sent = False, 1.0, 0.0
        # the clients' β now and a raise not sent yet (`PENALTY_EVERY`); their dmu are read in β₀'s units
        adapt_beta = self.raise_beta and self.dual_updates and self.coordination == "full" and client_constrained \
            and self.beta is None
        client_beta, owed_penalty, last_raise = beta, 1.0, 0
        # the server's constraint penalty β_s, raised while its violation fails to fall (`ServerPenalty`)
        server_beta = ServerPenalty(beta, self.beta is None and self.dual_updates and bool(problem.server.constraints)
                                    and getattr(self, "_has_point", False))
        # the clients' own multipliers still letting go (`local.unwinding`), for the stall rule
        unwind_sent = 0.0
        # the distance rule (`dist_tol`): the outer steps ‖Δx̂‖₂, whose contraction bounds how
        # far x̂ still is from the answer (a flat objective has small residuals far from it)
        steps, weights, outer_start = [], [], xhat      # (weights: 2ρ² of each step, `distance_at`)
        changed = None          # the index of the last step at a weight unlike the current one
        # spectral penalty (`spectral`): the server's mirror of every μ_i, and the iterates of the
        # step the next estimate compares with (X, λ̂, x̂, μ at k0)
        # (reads: the largest client estimate and the server's curvature, `spectral.floor`)
        MU, anchor, reads = np.zeros((len(clients), d)), None, (0.0, 0.0)
        watch, saved = self._resume(ckpt, ex)   # docs/checkpoints.md
        if saved:
            k, total, xhat, X, mu_sum = saved["k"], saved["total"], saved["xhat"], saved["x"], saved["mu_sum"]
            history = saved["history"]
            # adaptive ρ: the weights the run had reached (bitwise, not recomputed)
            RHO2, total_rho2, twice_rho2 = saved["rho2"], saved["total_rho2"], saved["twice_rho2"]
            owed, owed_factor, dmu_sent = saved.get("owed", (False, 1.0, 0.0))
            client_beta, owed_penalty, last_raise = saved.get("penalty", (beta, 1.0, 0))
            unwind_sent = saved.get("unwind", 0.0)
            server_beta.restore(saved.get("server_beta"))
            if server_beta.beta != beta:     # (a setting: checkpoints leave it out, `NodeState.SETTINGS`)
                ex.call("server", "configure", beta=server_beta.beta, prox_weight=0.0, center=xhat)
            steps, outer_start = list(saved.get("steps", [])), xhat
            weights = list(saved.get("weights", [1.0] * len(steps)))
            changed = last_change(weights) if weights else None
            MU, anchor, reads = (saved.get("spectral", (MU, None)) + ((0.0, 0.0),))[:3]
            if saved.get("residual") is not None:
                opts["residual"] = saved["residual"]
        while total < self.max_iterations:
            k += 1
            v, dual, active = 0, np.inf, set()
            while True:                                                  # inner loop (Step 1)
                v += 1
                total += 1
                part = self._participants(clients, total)
                if len(part) == len(clients):
                    active = clients                # every client has taken part: nothing to add
                elif len(active) < len(clients):
                    active.update(part)
                sent = xhat
                common = {"xhat": xhat, **opts}
                if owed:                     # the last outer iteration's Step 2 first, then (13)
                    common["dual"] = 1.0
                if owed_factor != 1.0:
                    common["factor"], owed_factor = owed_factor, 1.0
                if first is not None:
                    common["init"] = beta
                unit = client_beta           # (the owed Step 2's dmu: at the β before a raise)
                if owed_penalty != 1.0:
                    common["penalty"], client_beta, owed_penalty = owed_penalty, client_beta * owed_penalty, 1.0
                rider = None if pending is None else Rider("report", {"x": xhat}, before=True)
                reply = ex.map_stacked("dald_cc_solve", part, rows=first, common=common, rider=rider)   # (13)
                first = None
                if rider is not None:
                    pending = self._complete(ex, clients, pending, has_server, callback, bar, rider.replies)
                if owed:
                    owed, dmu_sent = False, float(np.max(reply["dmu"], initial=0.0)) * beta / unit
                    unwind_sent = float(np.max(reply["unwind"], initial=0.0))
                if own:
                    dmu_own, unwind_own = (float(np.max(reply[f], initial=0.0)) for f in ("dmu", "unwind"))
                if len(part) == len(clients):
                    X = reply["x"]                   # never written in place (may be read-only)
                else:
                    X = X.copy()
                    X[[row[c] for c in part]] = reply["x"]
                new = self._server_step(ex, X, RHO2, uniform, total_rho2, mu_sum, xhat, server_used)  # (14)/(29)
                sound = not watch.check(total, **{"x̂ (server model)": new, "x_i (client models)": X})
                if not sound:
                    break
                dual = float(np.max(np.abs(new - xhat), initial=0.0))       # D = x̂^{k,v} − x̂^{k,v−1}
                xhat = new
                if self._inner_done(k, v, dual) or total >= self.max_iterations:
                    break
            if not sound:          # keep the last sound iterate x̂; the caller sees "diverged"
                status = watch.report(info)
                break
            # C_i = x̂ − x_i: ‖C‖∞, and the server's mirror of Step 2: Σμ_i += Σ_(active) 2ρ_i∘ρ_i∘C_i
            everyone = len(active) == len(clients)
            member = np.ones(len(clients), dtype=bool) if everyone else np.array([c in active for c in clients])
            gap, primal = kernels.consensus_gap(X, xhat, twice_rho2, member)
            # Step 2: multiplier step (15) on the clients
            active = clients if everyone else [c for c in clients if c in active]
            dmu, unwind = 0.0, 0.0
            if fuse:           # sent with the next solve; its dmu (own constraints) comes back then
                owed, dmu, unwind = True, dmu_sent, unwind_sent
            elif send_dual:
                # (μ ≡ 0: the clients' own multipliers at the x̂ of the round's solve, as `own` reads it)
                replies = ex.map_stacked("dald_cc_dual", active, common={
                    "xhat": xhat if self.dual_updates else sent, "consensus": float(self.dual_updates)})
                dmu = float(np.max(replies["dmu"], initial=0.0)) * beta / client_beta
                unwind = float(np.max(replies["unwind"], initial=0.0))
            if own:                          # (asked with (13): `opts["own"]`)
                dmu, unwind = dmu_own, unwind_own
            if self.dual_updates:
                mu_sum += gap
            # the stop test's D at the weights of this step: stationarity ≈ n·2ρ²·D (69), so once
            # adaptive ρ has changed ρ∘ρ F-fold, D must be F times smaller (larger) to certify the
            # same point — ε_dual is read in the units of the initial ρ (at ρ ×100 an unscaled
            # D ≤ 1e-6 passed points with KKT stationarity 1e-2; at ρ∘ρ ÷8 it asked 8× more)
            stiff = dual * (float(RHO2[0, 0]) / initial_rho2 if RHO2[0, 0] > 0 else 1.0)   # (ρ = 0: FedAvg)
            # ... but never more leniently than D itself: at ρ∘ρ ÷1000 (the spectral rule on MNIST
            # 3v7, d = 784, a flat loss) D/1000 ≤ 1e-6 passed a point 1.2e-3 from CVXPY at step 64;
            # D ≤ 1e-6 stops at 102, 6.1e-5 away (bench_rounds' models: the same iterations)
            stiff = max(stiff, dual)
            steps.append(float(np.linalg.norm(xhat - outer_start)))
            weights.append(float(twice_rho2.flat[0]))
            if len(weights) > 1 and weights[-1] != weights[-2]:
                changed = len(weights) - 2
            if inexact:
                # the next solves' inexactness (`local.INEXACT`: "auto" nodes that take L-BFGS)
                opts["residual"] = max(min(self.eps_primal, self.eps_dual), min(primal, dual))
            outer_start = xhat
            # ... and, with `dist_tol`, x̂ within dist_tol·‖x̂‖₂ of the answer by the steps' contraction,
            # in the user's units (`common.user_metric`: 1 with equal column scales)
            near = self.dist_tol is None or not self.dual_updates or distance_at(steps, weights, changed=changed) <= \
                self.dist_tol * float(np.linalg.norm(xhat)) * user_metric(self.user_scales, xhat, sizes)
            gate = stiff if near else np.inf         # the stop tests' D
            # not with gd / prox-grad: a larger ρ would make their fixed step unstable
            # (ADAPT_UNTIL counts from β's last raise: ρ frozen at step 200 where a raise had left it
            # kept NP adult oscillating to the cap, 2.5e-4 away; counted from the raise: converged)
            if self.adaptive_rho and self.dual_updates and k - last_raise <= ADAPT_UNTIL and \
                    self.solver not in ("gd", "prox-grad"):
                if PENALTY_RULE == "spectral":
                    # (the floor with server terms only: a ball alone on the server took logistic
                    # from converged in 765 steps to the cap, review17b)
                    factor, MU, anchor, reads = self._spectral(k, X, xhat, sent, MU, anchor, twice_rho2, member, reads,
                                                                  bool(problem.server.terms))
                else:
                    # Boyd et al.'s residuals: the clients' RMS ‖x_i − x̂‖₂ against 2ρ²‖Δx̂‖₂
                    spread = float(np.sqrt(np.mean(np.sum(np.square(X - xhat), axis=1))))
                    factor = balance(spread, float(np.max(twice_rho2)) * steps[-1])
                scale = float(RHO2[0, 0] / initial_rho2) * factor
                if factor != 1.0 and 1.0 / ADAPT_RANGE <= scale <= ADAPT_RANGE:
                    # weights on the server and the clients; μ stays as it is (unscaled)
                    RHO2, total_rho2, twice_rho2 = RHO2 * factor, total_rho2 * factor, twice_rho2 * factor
                    if fuse:
                        owed_factor *= factor
                    else:
                        ex.map_stacked("dald_cc_rescale", clients, common={"factor": factor})
            if owed and client_constrained and self._converged(primal, gate, 0.0):
                # the stop also needs this Step 2's change of the clients' own multipliers
                dmu, owed = self._settle(ex, clients, xhat) * beta / client_beta, False
            if problem.server.constraints:
                dmu = max(dmu, server_beta.read(ex.call("server", "update_multipliers", x=xhat)["dmu"]))
            last = self._converged(primal, gate, dmu) or total >= self.max_iterations
            report = last or k % self.report_every == 0
            record = self._record(k, v, total, primal, stiff, dmu / beta, start)
            record["unwinding"], record["weight"] = unwind, float(twice_rho2.flat[0])   # (`_swing`)
            # (its report rides on the next solve, unless the stall rule may read it now)
            later = ride and report and not last and not self._stall_reads(history, record, constrained)
            if report and not later:
                record["objective"], record["violation"] = stacked_report(ex, clients, xhat, has_server)
            # Σμ_i as the clients hold it (μ ≡ 0 without (15)): a diagnostic, on reported records
            record["sum_mu"] = 0.0 if not self.dual_updates else float("nan") if not report else \
                float(np.max(np.abs(np.sum(ex.map_stacked("dald_state", clients)["mu"], axis=0)), initial=0.0))
            stop = self._outer_step_done(record, history, None if later else callback, quiet if later else bar,
                                         clients, X, constrained, primal, gate, dmu)
            if later:
                pending = (record, xhat)
            if stop:
                status = stop
                break
            if adapt_beta and k % PENALTY_EVERY == 0 and client_beta * owed_penalty * PENALTY_RAISE <= \
                    beta * PENALTY_CAP and penalty_slow(history, floor=self.eps_primal):
                owed_penalty *= PENALTY_RAISE
                anchor, reads, last_raise = None, (0.0, reads[1]), k     # (no spectral estimate across a change of P_i)
            if server_beta.slow(k, primal, self.eps_primal):
                ex.call("server", "configure", beta=server_beta.raise_at(k), prox_weight=0.0, center=xhat)
            self._save(ckpt, ex, k, watch, k=k, total=total, xhat=xhat, x=X, mu_sum=mu_sum, history=history,
                       rho2=RHO2, total_rho2=total_rho2, twice_rho2=twice_rho2,
                       owed=(owed, owed_factor, dmu_sent), unwind=unwind_sent, steps=steps[-kept(weights, changed=changed):],
                       weights=weights[-kept(weights, changed=changed):],
                       penalty=(client_beta, owed_penalty, last_raise), server_beta=server_beta.state(),
                       spectral=(MU, anchor, reads), residual=opts.get("residual"))
        if owed:          # the clients' μ_i end as in the two-message loop (a last rescale of
            self._settle(ex, clients, xhat)     # ρ_i, owed_factor, changes no result: not sent)
        self._complete(ex, clients, pending, has_server, callback, bar)     # (by itself)
        bar.close()
        ex.ledger.rounds = total
        mus = ex.map_stacked("dald_state", clients)["mu"]
        consensus = {c: np.array(m, float) for c, m in zip(clients, mus)}
        info.update(consensus_multipliers=consensus,
                    client_values={c: X[i].copy() for i, c in enumerate(clients)})
        return Outcome(status, shared=xhat, history=history, iterations={"outer": k, "inner": total},
                       info=info)

    @staticmethod
    def _spectral(k: int, X, xhat, sent, MU, anchor, twice_rho2, member: np.ndarray, reads: tuple,
                  server: bool):
        """The spectral rule's factor for ρ∘ρ after outer step k (`spectral.penalty`, every
        `spectral.EVERY` steps; 1 in between), the server's mirror of μ_i after this step's (15),
        and the estimate's anchor (X, λ̂, x̂, μ at the step the next estimate compares with).
        λ̂_i = μ_i + 2ρ_i²(x̂_sent − x_i) is the gradient (13) certifies at x_i. A step some client
        skipped (partial participation, `member` False) has no new gradient: the client side's
        estimate reads the clients that took part in both steps compared. `reads`: the largest
        client estimate and the server's curvature so far (`spectral.floor`), returned updated."""
        weight = np.broadcast_to(twice_rho2, X.shape)
        grad = MU + weight * (sent - X)                 # λ̂_i: client i's gradient at x_i
        MU = MU + weight * (xhat - X) * member[:, None]     # (15), as the clients do it
        if anchor is not None and k % spectral.EVERY:
            return 1.0, MU, anchor, reads
        now = (X, grad, xhat, MU, member)
        if anchor is None:
            return 1.0, MU, now, reads
        X0, G0, XHAT0, MU0, member0 = anchor
        both = member & member0
        if not both.any():
            return 1.0, MU, now, reads
        tau = float(np.mean(weight))
        client = (X[both] - X0[both], grad[both] - G0[both])
        new = spectral.penalty(tau, client, (np.broadcast_to(xhat - XHAT0, X.shape), MU0 - MU))
        peak, m = spectral.client_peak(reads[0], client), reads[1]
        if server:     # (without server terms Σμ_i is 0 but for rounding)
            # not below `spectral.floor` (τ already below it stays or rises): the server's gradient is
            # −Σμ_i (its step (14) with (15)), its change against Δx̂ per client gives its curvature
            m = spectral.server_curvature(m, ((xhat - XHAT0)[None, :], (MU0 - MU).sum(axis=0)[None, :] / len(X)))
            new = max(new, min(tau, spectral.floor(peak, m)))
        return (new / tau if np.isfinite(new) and new > 0.0 else 1.0), MU, now, (peak, m)

    def _settle(self, ex, clients, xhat) -> float:
        """Step 2 owed to the clients (`one_message`), sent on its own: (15) and their own
        constraint multipliers at x̂; the largest dmu."""
        replies = ex.map_stacked("dald_cc_dual", clients, common={"xhat": xhat, "consensus": 1.0})
        return float(np.max(replies["dmu"], initial=0.0))

    def _server_step(self, ex, X, RHO2, uniform, total_rho2, mu_sum, xhat, server_used):
        if not self.dual_updates:                                   # distributed PA (53), p_i = 1/n
            return X.sum(axis=0) / len(X)
        weighted = _weighted_sum(RHO2, X, uniform)                 # Σ_i ρ_i∘ρ_i∘x_i
        if not server_used:                                           # closed form (29)
            return (weighted - 0.5 * mu_sum) / total_rho2
        # argmin P_0(x̂) + (Σμ_i)ᵀx̂ + Σ‖ρ_i∘(x̂ − x_i)‖²  (14) with the server's own terms
        return ex.call("server", "solve_local", linear=mu_sum, weight=2.0 * total_rho2,
                       anchor=weighted / total_rho2, x0=xhat, method="auto",
                       tol=1e-10 if self.local_tol is None else float(self.local_tol))["x"]

    @staticmethod
    def _complete(ex, clients, pending, has_server: bool, callback, bar, reports=None) -> None:
        """A record whose report rode on the next request (`pending`: the record and its x̂, or
        None): its objective and violation (`reports`: the clients' stacked replies, else asked
        now), then handed to the callback and the progress bar. Returns None (nothing pending)."""
        if pending is not None:
            record, x = pending
            complete_record(record, stacked_report(ex, clients, x, has_server, reports), callback, bar)

    def _stall_reads(self, history: list, record: dict, constrained: bool) -> bool:
        """Whether the stall rule (`_stall`), judging `record` after `history`, may read its
        violation: whether it gives a verdict with the largest violation a report can give.
        `_stall` reads violations only in its last test (3: violated at every reported point of
        the window, min > floor), which a larger violation passes whenever a smaller one or NaN
        does: None here is its verdict whatever the report says (tests/test_dald_rounds.py)."""
        if not constrained or self.stall_window is None:
            return False
        return self._stall([*history, {**record, "violation": LARGEST}]) is not None

    def _record_cc(self, ex, clients, xhat, k, v, total, primal, dual, constraint, start, report: bool,
                   has_server: bool) -> dict:
        """One history record; objective and violation at x̂ on every node (the clients' reports
        as one group request; the server's when `has_server`) when `report`, else NaN."""
        if not report:
            return self._record(k, v, total, primal, dual, constraint, start)
        objective, violation = stacked_report(ex, clients, xhat, has_server)
        return self._record(k, v, total, primal, dual, constraint, start, objective, violation)
