"""FedProx, FedAvg, distributed GD and the proximal algorithm as special cases of Fed-DALD-CC
(DALD paper, Sec. V-B; spec §2.9).

Distributed PA (51)–(53): Fed-DALD-CC with μ_i ≡ 0 (no multiplier step (15)), uniform penalty,
inner rule B4 with v_max = 1, and the server taking x̂ = Σ p_i x_i with p_i = 1/n:

    x_i^k = argmin f_i(x_i) + (1/2α)‖x_i − x̂^{k−1}‖²        (52)   (α = 1/(2ρ²), FedProx μ = 1/α)
    x̂^k  = (1/n) Σ_i x_i^k                                  (53)

FedProx = distributed PA with a constant uniform α; FedAvg = the limit ρ → 0⁺ (no proximal term).
The local argmin is either exact (`local_steps=None`, the paper's (52)) or, as in the textbook
algorithms, `local_steps` gradient steps of size `step` started from the server model x̂^{k−1}:
    x ← x − step·(∇f_i(x) + μ(x − x̂^{k−1})).
Uniform weights p_i = 1/n keep the model Σ_i f_i unchanged (N_i/N weights would solve Σ p_i f_i).
Known limitation (not a bug): with heterogeneous clients and more than one local step, the fixed
point is not the minimizer of Σ f_i (client drift): such a stop is "stalled"
(`base._warn_not_stationary`); with one local step both are gradient descent on (1/n)Σ f_i.
Stop: ‖x̂^k − x̂^{k−1}‖∞ ≤ tol (the dual residual D of (70)); no consensus test (C ≠ 0 at the
fixed point when clients differ). Client constraints: balls and bounds that read no client data
are projected on by the server's step (53) (`_server_sets`); one a client holds keeps its AL
multiplier step each round, read at x̂ (`cc_nodes._own_at_xhat`): with one local step the fixed
point is then the model's KKT point.

Defaults (issue 13): `step=None` picks 1/max_i L̂_i from the clients' curvature at x⁰
(`common.local_curvature`), halved where the rounds' steps grow (`step_guard`), one local step
(GD on (1/n)Σ f_i: no drift), a stop at `tol`; `FedProx.paper()` / `FedAvg.paper()`: the DALD
paper's baseline (α = 1e-4, one step, 1000 rounds). Divergence (non-finite or 1e6-fold growth):
"diverged" (DALD's DivergenceWatch; its message names the backend and its `step`).
"""
from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime.checkpoint import NO_CHECKPOINT
from fedmodel.runtime.program import compile_programs
from .base import paper_preset
from .common import check_count, check_number, progress
from .dald import DALD
from .projecting import (_server_set_multipliers, affine_only, data_free_client_sets as _server_sets,
                         project_server_sets, projectable, server_set_multipliers)
from .dp_fedavg import CLIENT_DP_ROUNDS, ClientPrivacy, check_model, private_rounds
from .step_guard import StepGuard
from .watch import DivergenceWatch
from .outcome import Outcome, Status

#: the DALD paper's FedProx / FedAvg baseline (Sec. V-B): ρ = 1 (μ = 2), α = 1e-4, one step, 1000 rounds
PAPER_FEDPROX = {"mu": 2.0, "step": 1e-4, "local_steps": 1, "max_rounds": 1000, "tol": 1e-8}


class _DistributedPA(StepGuard, DALD):
    """Fed-DALD-CC with μ ≡ 0 and x̂ = mean(x_i) (distributed PA, (51)–(53))."""

    procedures = (*DALD.procedures, _server_set_multipliers)
    bar_label = property(lambda self: type(self).__name__)    # (the progress bar's: FedAvg, not DALD-CC)
    _moved, _held = False, []    # clients' sets projected by the server (`_server_sets`), the others

    # Equilibrated by default, as every backend (docs/scaling.md): it diverged on the ball-lasso at
    # round 13 when fixed β = 2 (clients' constraints) and μ = 2 met the step 1/L̂ that follows the
    # data (step·β = 14); both follow L̂ now (`_prepare`). A step the user gives is in the model's units.

    def __init__(self, prox: float, step: float | None, local_steps: int | None, max_rounds: int | None,
                 tol: float, x0: Any = None, beta: float | None = None, warm_start: bool = False,
                 privacy: ClientPrivacy | None = None):
        name = type(self).__name__
        self.client_privacy = privacy        # client-level DP (`dp_fedavg`), or None
        if max_rounds is None:
            max_rounds = CLIENT_DP_ROUNDS if privacy is not None else 10000
        check_number(f"{name}: mu", prox, 0.0, np.inf, low_closed=True)
        if step is not None:
            check_number(f"{name}: step", step, 0.0, np.inf)
        elif privacy is not None and local_steps is not None:
            raise FedModelError(f"{name}(epsilon_total=...) needs step=α, the local gradient step in "
                                "the model's units (about 1/L for L-smooth client objectives): the "
                                "automatic step reads every client's curvature, a release the "
                                "client-level accountant does not cover")
        if local_steps is not None:
            check_count(f"{name}: local_steps", local_steps)
        check_count(f"{name}: max_rounds", max_rounds)
        check_number(f"{name}: tol", tol, 0.0, np.inf, low_closed=True)
        if not isinstance(warm_start, (bool, np.bool_)):
            raise FedModelError(f"{name}: warm_start must be True or False, got {warm_start!r}")
        self.step_option = step          # None: 1/max_i L̂_i, chosen at each run
        self.beta_option = beta          # None: 2, or min(2, L̂/2) with the automatic step (`_prepare`)
        self.scaling = step is None      # a step of the user's is in the model's units
        step = 1.0 if step is None else step
        super().__init__(rho=float(np.sqrt(prox / 2.0)), inner_rule="B4", v_max=1,
                         eps_primal=tol, eps_dual=tol,
                         solver="exact" if local_steps is None else "gd", step=step,
                         local_steps=1 if local_steps is None else int(local_steps),
                         max_iterations=max_rounds, warm_start=warm_start, mode="cc",
                         beta=2.0 if beta is None else beta,
                         x0=x0, adaptive_rho=False, stall_window=None)
        # a fixed proximal weight μ = 2ρ² is the algorithm (no adaptive ρ); no stall verdict: the
        # consensus residual C does not vanish at FedProx's fixed point when clients differ
        self.dual_updates = False
        self.require_consensus = False
        self.mu, self.max_rounds, self.tol = float(prox), int(max_rounds), float(tol)
        self.exact_local = local_steps is None

    @classmethod
    def paper(cls, **overrides):
        """The DALD paper's baseline setting (ρ = 1, α = 1e-4, one local step, 1000 rounds), with
        `overrides`; the reproductions use it."""
        options = inspect.signature(cls.__init__).parameters      # FedAvg has no mu
        allowed = {k: v for k, v in PAPER_FEDPROX.items() if k in options}
        return paper_preset(cls(**{**allowed, **overrides}))

    def _watch(self) -> DivergenceWatch:
        """DALD's watch, with this backend's name and the settings to change."""
        hint = (f"lower step (now {self.step:g}; step=None picks 1/L̂ from the data) or use "
                "local_steps=None (exact local solves)" if not self.exact_local else
                "raise mu or check the model's scaling")
        if self._held:     # an infeasible one's multipliers grow without bound: the AL term diverges
            hint += f"; or the clients' constraints {self._held[:3]} leave no feasible point, or " \
                "are too tight for this step: prob.solve('cvxpy') decides it, 'proxal' or 'dald' solve it"
        return DivergenceWatch(type(self).__name__, hint=hint)

    def equilibrates(self) -> bool:
        """As every backend, unless client-level DP: factors computed from the data would be a
        release that `dp_fedavg`'s accountant does not cover."""
        return super().equilibrates() and self.client_privacy is None

    def _prepare(self, ex, x0: np.ndarray) -> None:
        """step=None: a gradient step every client's local objective tolerates, from L̂ = max_i L̂_i
        (L̂_i: client i's largest curvature near x0, estimated on the client:
        `backends.common.local_curvature`). The local objective adds to f_i the proximal term
        μ‖x − x̂‖²/2 — zero at the start of one step from x̂, else curvature μ — and the penalty
        β·c_j² of the client's own constraints, of curvature β‖∇c_j‖² once one is active
        (‖∇c_j‖ ≈ 1: a norm ball's, or an equilibrated row's). So the step is 1/(L̂ + μ) when the
        proximal term counts, else 1/L̂, and β = min(2, L̂/2) (unless given): fixed numbers there
        made step·β and step·μ follow the data's units, and diverge past 2 (class comment). The
        cap 2 (the old fixed β) is for rows as written, whose ‖∇c_j‖² may be far above 1 (Σw ≤ b,
        d = 5: L̂/2 = 3.2 made step·β·‖∇c‖² = 2.5, never settled; β = 2: 57 rounds). The step
        then halves where the rounds' steps grow (`step_guard`)."""
        if self.step_option is None and not self.exact_local:   # (one group request)
            estimates = ex.map_stacked("local_curvature", tuple(ex.clients), common={"z": x0, "iterations": 8})
            largest = float(np.max(estimates["L"], initial=0.0))
            proximal = self.mu if self.local_steps > 1 or self.warm_start else 0.0
            self.step = 1.0 / (largest + proximal) if largest + proximal > 0 else 1.0
            if self.beta_option is None and largest > 0:
                self.beta = min(2.0, 0.5 * largest)
        self.start_guard(self.step_option is None and not self.exact_local and self.client_privacy is None)

    def _client_step(self) -> float:
        """α, the step one round's client update takes along −∇f_i at x̂: x_i ≈ x̂ − α∇f_i(x̂)
        (exact prox solve: 1/μ; K gradient steps of size s with proximal weight μ:
        s·Σ_{j<K}(1 − sμ)^j)."""
        if self.exact_local:
            return 1.0 / self.mu
        decay = 1.0 - self.step * self.mu
        if self.mu == 0.0 or decay == 1.0:
            return self.step * self.local_steps
        return (1.0 - decay ** self.local_steps) / self.mu

    def _server_step(self, ex, X, RHO2, uniform, total_rho2, mu_sum, xhat, server_used):
        """(53), x̂ = (1/n)Σ x_i, then — when the server block has terms h (a regularizer) — the
        proximal step x̂ = argmin h(x) + (n/2α)‖x − (1/n)Σ x_i‖² on the server, α the clients'
        step (`_client_step`). With one local gradient step this is proximal gradient descent
        on Σ_i f_i + h with step α/n, so its fixed point is the model's minimizer: h is
        neither dropped nor reweighted. It is the server's step rather than h/n handed to every
        client because h may read server data, which the clients never see; a smooth h is
        solved by Newton, a prox-able one (λ‖w‖₁) by its prox."""
        return self._with_server_terms(ex, X.sum(axis=0) / len(X), len(X), xhat, server_used)

    def _with_server_terms(self, ex, mean, n: int, xhat, server_used: bool) -> np.ndarray:
        """`_server_step`'s proximal step on the server's terms at `mean` (n clients)."""
        if not (server_used or self._moved):
            return mean
        weight = n / self._client_step()
        self._server_step_inputs = (mean, weight)
        return ex.call("server", "solve_local", linear=None, weight=weight,
                       anchor=mean, x0=xhat, method="auto", tol=1e-12)["x"]

    def _cc(self, problem, G, U, ex, xhat, d, server_used, callback, verbose, start, ckpt):
        """DALD-CC's loop; with client-level DP, `dp_fedavg.private_rounds`; on an executor whose
        server may see only sums (`ex.sum_only`: secure aggregation), `_cc_summed`."""
        if self.client_privacy is not None:
            if ex.sum_only or ckpt is not NO_CHECKPOINT:
                raise FedModelError(f"{type(self).__name__} with client-level DP runs on an executor "
                                    "that shows the server the clients' updates (central DP), without "
                                    "checkpoints")
            return private_rounds(self, self.client_privacy, ex, xhat, server_used, callback, verbose)
        if not ex.sum_only:
            return super()._cc(problem, G, U, ex, xhat, d, server_used, callback, verbose, start, ckpt)
        return self._cc_summed(problem, ex, xhat, d, server_used, callback, verbose, start, ckpt)

    def _cc_summed(self, problem, ex, xhat, d, server_used, callback, verbose, start, ckpt):
        """(52)–(53) with x̂ = (1/n)·Σ_i x_i from `ex.map_sum`: the server never holds an x_i, so
        the consensus residual max_i‖x̂ − x_i‖∞ is not known (NaN in the history; the stop test
        of distributed PA does not use it) and info has no client models. Every client takes
        part in every round (a sum over a sample would need its size hidden as well)."""
        name = type(self).__name__
        if self.participation < 1.0 or self.availability is not None or self.monitor is not None \
                or ckpt is not NO_CHECKPOINT:
            raise FedModelError(f"{name} on an executor that shows the server only sums runs every "
                                "client in every round, without a monitor or checkpoints")
        clients, beta = ex.clients, self._beta()
        rho = np.array([self._rho(c, d) for c in clients])
        # one ρ for all (one μ): the clients' set-up travels in the first sum's request, whose
        # fields every client gets alike (`init`; cc_nodes), x⁰ its x̂ — no round trip of its own
        first = {"init": beta, "rho": rho[0]} if np.all(rho == rho[:1]) else {}
        if not first:
            ex.map_stacked("dald_cc_init", clients, rows={"rho": rho}, common={"x0": xhat, "beta": beta})
        ex.call("server", "configure", beta=beta, prox_weight=0.0, center=xhat)
        watch, history, status, k, info, opts = self._watch(), [], Status.MAX_ITERATIONS, 0, {}, self._opts()
        has_server = "server" in ex.programs
        client_constrained = any(block.constraints for block in problem.clients)
        bar = progress(self.max_iterations, verbose, name)
        while k < self.max_iterations:
            k += 1
            total = ex.map_sum("dald_cc_solve", clients, common={"xhat": xhat, **opts, **first})["x"]
            first = {}
            new = self._with_server_terms(ex, total / len(clients), len(clients), xhat, server_used)
            if watch.check(k, **{"x̂ (server model)": new}):
                status = watch.report(info)
                break
            dual = float(np.max(np.abs(new - xhat), initial=0.0))
            # the clients' own constraint multipliers (no consensus step: μ ≡ 0), when they have any,
            # at the x̂ of the round's solve (as the serial loop's `own`: the same iterates)
            dmu = float(np.max(ex.map_stacked("dald_cc_dual", clients,
                                              common={"xhat": xhat, "consensus": 0.0})["dmu"],
                               initial=0.0)) if client_constrained else 0.0
            xhat = new
            report = k % self.report_every == 0 or self._converged(np.nan, dual, dmu) or \
                k >= self.max_iterations
            record = self._record_cc(ex, clients, xhat, k, 1, k, float("nan"), dual, dmu / beta, start, report,
                                     has_server)
            record["sum_mu"] = 0.0
            stop = self._outer_step_done(record, history, callback, bar, clients, None,
                                         bool(problem.constraints), np.nan, dual, dmu)
            if stop:
                status = stop
                break
        bar.close()
        ex.ledger.rounds = k
        info.update(secure_sum=True)
        return Outcome(status, shared=xhat, history=history, iterations={"outer": k, "inner": k},
                       info=info)

    def prepare(self, problem, topology):
        if self.client_privacy is not None:
            check_model(type(self).__name__, problem)
        unprojectable = [c.name for c in problem.server.constraints if not projectable(c)]
        if unprojectable:
            raise FedModelError(f"{type(self).__name__} enforces the server block's constraints by "
                                f"projecting the average on them, and {unprojectable} are not sets "
                                "it can project on (balls, bounds, halfspaces, affine sets with "
                                "constant coefficients); use backends.DALD or backends.ProxAL "
                                "(prob.solve('dald') / 'proxal')")
        if self.exact_local and self.mu == 0:
            raise FedModelError("FedAvg with exact local solves needs local_steps ≥ 1 (an exact "
                                "local argmin of f_i alone is one-shot averaging)")
        return super().prepare(problem, topology)

    def compile(self, problem) -> dict:
        """The server's sets, affine ones included, are projected in its step (53), and so are
        the clients' data-free balls and bounds (`_server_sets`)."""
        self._server_step_inputs = None
        moved = _server_sets(problem)
        self._moved = bool(moved)
        self._held = [c.name for b in problem.clients for c in b.constraints if not any(c is m for m in moved)]
        return project_server_sets(problem, compile_programs(problem, to_server=moved), moved)

    def conclude(self, problem, ex, run, outcome: Outcome) -> None:
        """The multipliers of the server's projected affine sets (the KKT certificate reads
        affine constraints through them), from its last step (53)'s anchor and weight."""
        super().conclude(problem, ex, run, outcome)
        inputs = self._server_step_inputs
        if inputs is not None and any(affine_only(c) for c in problem.server.constraints):
            outcome.multipliers.update(server_set_multipliers(ex, outcome.shared, inputs))

    def loop(self, problem, ex, run) -> Outcome:
        automatic = self.step_option is None and not self.exact_local
        try:
            out = super().loop(problem, ex, run)
        finally:
            step, self.step = self.step, (1.0 if automatic else self.step)
            self.beta = 2.0 if self.beta_option is None else self.beta_option
        out.info.update(step=step, step_halvings=self.halvings)   # the local step used (`step_guard`)
        # drift (several local steps) biases the fixed point: `base.finish_result` says "stalled"
        out.biased_fixed_point = True
        out.iterations = {"rounds": out.iterations["inner"]}
        for record in out.history:
            record["round"] = record.pop("iteration")
        return out


class FedProx(_DistributedPA):
    """FedProx (Li et al.) as distributed PA: proximal weight `mu` = 1/α = 2ρ² (the DALD paper's
    ρ = 1 gives mu = 2), `local_steps` GD steps of size `step` from x̂ (None: exact prox solve),
    `max_rounds` rounds. Defaults: the step 1/max_i L̂_i from the data (`step=None`), one local
    step, a stop at `tol`; `FedProx.paper()`: ρ = 1, α = 1e-4, one local step, 1000 iterations.
    `warm_start=True` starts the local steps from the client's own previous x_i instead of x̂
    (the DALD solver layer's x^{k,v,0} = x^{k,v−1}; Fed-DALD-CC with μ ≡ 0 — the reading of the
    paper's FedProx baseline in Table II). With one local step from x̂ the proximal term is
    zero at the start point, so `mu` would have no effect. Client-level DP: `epsilon_total`,
    `delta`, `clip`, `sample_rate`, `seed` (`dp_fedavg`; max_rounds then defaults to 100)."""

    name = "fedprox"

    def __init__(self, mu: float = 2.0, step: float | None = None, local_steps: int | None = 1,
                 max_rounds: int | None = None, tol: float = 1e-8, x0: Any = None,
                 warm_start: bool = False, epsilon_total: float | None = None, delta: float = 1e-6,
                 clip: float | None = None, sample_rate: float = 1.0, seed: int | None = None):
        privacy = ClientPrivacy.from_options("FedProx", epsilon_total, delta, clip, sample_rate, seed)
        super().__init__(mu, step, local_steps, max_rounds, tol, x0, warm_start=warm_start, privacy=privacy)


class FedAvg(_DistributedPA):
    """FedAvg (McMahan et al.) as FedProx with ρ → 0⁺: `local_steps` GD steps of size `step`
    on f_i from x̂, then x̂ = mean of the client models. Defaults as FedProx's (`step=None`:
    1/max_i L̂_i); `FedAvg.paper()`: α = 1e-4, one local step, 1000 rounds. Client-level DP
    (DP-FedAvg): `epsilon_total`, `delta`, `clip`, `sample_rate`, `seed` (`dp_fedavg`; max_rounds
    then defaults to 100).

    >>> res = prob.solve(FedAvg(step=0.5, epsilon_total=4.0, clip=0.1, sample_rate=0.5))  # doctest: +SKIP
    """

    name = "fedavg"

    def __init__(self, step: float | None = None, local_steps: int = 1, max_rounds: int | None = None,
                 tol: float = 1e-8, x0: Any = None, epsilon_total: float | None = None,
                 delta: float = 1e-6, clip: float | None = None, sample_rate: float = 1.0,
                 seed: int | None = None):
        if local_steps is None:
            raise FedModelError("FedAvg needs local_steps ≥ 1")
        privacy = ClientPrivacy.from_options("FedAvg", epsilon_total, delta, clip, sample_rate, seed)
        super().__init__(0.0, step, local_steps, max_rounds, tol, x0, privacy=privacy)


class DistributedGD(_DistributedPA):
    """Distributed gradient descent (DGD, (55)/(81), App. D): distributed PA with one local
    gradient step whose size equals the proximal parameter α, warm-started at the client's own
    iterate. The step x_i − α(∇f_i(x_i) + (x_i − x̂)/α) = x̂ − α∇f_i(x_i) gives

        x_i^{k+1} = Σ_j p_ij x_j^k − α∇f_i(x_i^k),   p_ij = 1/n  (averaging through the server).

    With a constant α the clients settle at an O(α) neighbourhood of the optimum (textbook DGD)."""

    name = "dgd"

    def __init__(self, step: float | None = None, max_rounds: int = 1000, tol: float = 1e-8,
                 x0: Any = None):
        # step=None: α = 1e-2 on the equilibrated model (the same run in any units); a step the
        # user gives is in the model's units, so that run solves the model as written
        given = step
        step = 1e-2 if step is None else step
        check_number("DistributedGD: step", step, 0.0, np.inf)
        super().__init__(1.0 / step, step, 1, max_rounds, tol, x0, warm_start=True)
        self.scaling = given is None

    def loop(self, problem, ex, run) -> Outcome:
        """`_DistributedPA.loop`; at the round cap, why more rounds do not help (newuser13: DGD
        ended max_iterations 0.16–0.92 off on every probe and said nothing)."""
        out = super().loop(problem, ex, run)
        if out.status is Status.MAX_ITERATIONS and out.history:
            spread = out.history[-1].get("primal_residual", float("nan"))
            out.info["max_iterations"] = (
                f"DGD reached max_rounds={self.max_iterations} with its clients' models still "
                f"{spread:.3g} apart (the consensus residual): with a constant step (α = "
                f"{out.info['step']:g}) DGD settles in an O(α) neighbourhood of the "
                "optimum, not at it, so more rounds do not remove that; a smaller step gets closer "
                "in more rounds; prob.solve('dald') or prob.solve('proxal') solve the model")
        return out


class ProximalAlgorithm(DALD):
    """The proximal algorithm (PA, (30)–(33)) as Fed-DALD-CC with a single client: with n = 1,
    (68) forces μ ≡ 0 and (29) gives x̂ = x, so each inner iteration is

        x^{k+1} = argmin_x f(x) + (1/2α)‖x − x^k‖²,     α = 1/(2ρ²).

    Exact local solves; stops when ‖x^{k+1} − x^k‖∞ ≤ tol."""

    name = "pa"

    def __init__(self, alpha: float | None = None, max_iterations: int = 1000, tol: float = 1e-8,
                 x0: Any = None):
        # alpha=None: α = 1 on the equilibrated model; a given α is in the model's units (as
        # DistributedGD's step)
        self.scaling = alpha is None
        alpha = 1.0 if alpha is None else alpha
        check_number("ProximalAlgorithm: alpha", alpha, 0.0, np.inf)
        check_number("ProximalAlgorithm: tol", tol, 0.0, np.inf, low_closed=True)
        check_count("ProximalAlgorithm: max_iterations", max_iterations)
        super().__init__(rho=float(np.sqrt(1.0 / (2.0 * alpha))), inner_rule="B4", v_max=1, adaptive_rho=False,
                         eps_primal=tol, eps_dual=tol, solver="exact", max_iterations=max_iterations,
                         mode="cc", x0=x0)      # adaptive_rho=False: α = 1/(2ρ²) is the algorithm
        self.alpha = float(alpha)

    def prepare(self, problem, topology):
        if len(problem.clients) != 1 or problem.server.terms or problem.server.constraints:
            why = (f"this problem has {len(problem.clients)} clients (use backends.DALD or FedProx for several)"
                   if len(problem.clients) != 1 else "its server block is not (use backends.DALD)")
            raise FedModelError(f"ProximalAlgorithm is DALD with one client and an empty server block; {why}")
        return super().prepare(problem, topology)
