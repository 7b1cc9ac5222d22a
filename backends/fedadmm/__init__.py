"""FedADMM, FedADMM-In and FedADMM-InSa (Song, Wang, Zuazua, "FedADMM-InSa: an inexact and
self-adaptive ADMM for federated learning", arXiv 2402.13989). Equation numbers refer to that
paper (../shared/seeds/fedadmm_insa.txt); see ../shared/spec/fedadmm_insa.md.

Consensus form (2.5) of min Σ_i α_i f̃_i(z) with the augmented Lagrangian (2.6)
    L_{β_i}(u_i, λ_i, z) = f̃_i(u_i) − λ_iᵀ(u_i − z) + (β_i/2)‖u_i − z‖².
One round k (Algorithms 1 and 3):
  client i ∈ M^k: u_i^{k+1} ≈ argmin_u L_{β_i^k}(u, λ_i^k, z^k) by gradient steps started at z^k
      — E fixed steps (2.9, vanilla) or until ‖e_i^k(u)‖ ≤ σ_i^k ‖e_i^k(ref)‖ (3.7) with at most
      `local_steps` steps (In / InSa), where e_i^k(u) = ∇_u L_{β_i^k}(u, λ_i^k, z^k) (3.6);
      λ_i^{k+1} = λ_i^k − β_i^k(u_i^{k+1} − z^k) (2.8b); send w_i = β_i^k u_i^{k+1} − λ_i^{k+1}, β_i^k;
      InSa: β_i^{k+1} from the residuals (3.14)–(3.15), σ_i^{k+1} from (3.18).
  server: ẑ = Σ_i α_i w_i / Σ_i α_i β_i over ALL clients (absent ones' cached messages) (3.1a);
      z^{k+1} = (ẑ + δ z^k)/(1 + δ) (3.1b).

The model as written is solved: the paper's α_i (Σ α_i = 1) only sets the scale of each client's
local function f̃_i = f_i / α_i, in which β, lr and σ are defined, so Σ_i α_i f̃_i = Σ_i f_i for
every choice of α. Server terms h(z) (λ‖z‖₁, a ball, smooth server terms) enter the z-step (3.2):
z^{k+1} = argmin_z P_0(z) + h(z) + ((1+δ) Σα_iβ_i / 2) ‖z − (ẑ + δ z^k)/(1+δ)‖².
Client constraints that are simple sets C_i on the shared variables (‖·‖₂/‖·‖₁/‖·‖∞ balls,
bounds, halfspaces, affine subspaces; several on one variable: their intersection, by Dykstra's
algorithm, `compiler.projection`) are kept on the client and projected: f̃_i + ι_{C_i} is the local function, the local steps
are projected gradient steps u ← Π_{C_i}(u − η e) and e is the projected-gradient mapping, so the
consensus converges to a minimizer over ∩C_i. A client λ‖w‖₁ term is handled the same way, by
its prox (soft-thresholding) in place of the projection: proximal gradient steps, and e the
proximal-gradient mapping. Other client constraints are refused (ProxAL's).

Readings where the paper and its experiments differ (defaults: the paper's experiments):
- `reference="z"`: the criterion's right-hand side uses z^k (Remark 3.4, all experiments);
  `reference="u"` uses the previous local model u_i^k (3.7), the setting of Theorem 3.3;
- `sigma=None`: σ_i = sigma_factor·√2/(√2 + √(β_i/c_i)) (3.9)/(3.18), the bound itself as in
  Algorithm 3 line 21 (sigma_factor = 0.999 reproduces the authors' code); a number fixes σ;
- `penalty_rule="paper"`: p = ‖u^{k+1} − u^k‖; "code": p = β‖u^{k+1} − u^k‖ (authors' code);
- `memory=None`: δ = 0 for vanilla, 0.01 for In / InSa (as in the experiments).
Algorithm 2 (In) has no body in the text; it is Algorithm 3 with β fixed (spec §2.4).

The clients' steps are in `client` (each written once over rows of clients: one node, or a
whole group on the batched and JAX executors), the server's loop in `server`, InSa's rules and the safeguards in `insa`, FedADMM as ProxAL's subproblem solver in
`composition`.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedmodel.errors import FedModelError
from ..base import Backend, Run, paper_preset
from ..common import progress, require_star
from ..outcome import Outcome
from ..projecting import _server_set_multipliers, compile_projecting, projects_affine, server_set_multipliers
from . import client
from .composition import _certificate, solve_subproblem
from .server import rounds


LOCAL_SOLVERS = ("gd-auto", "gd", "auto", "newton", "exact", "lbfgs")


# ---- the backend ------------------------------------------------------------------------------
class FedADMM(Backend):
    """FedADMM (Algorithm 1), FedADMM-In (`inexact=True`), FedADMM-InSa (`inexact=True,
    adaptive=True`).

    Defaults: FedADMM-InSa with the safeguards (docs/fedadmm.md): the automatic local step
    η_i = 1/(L̂_i + β_i) (`lr=None`, L̂_i estimated on the client), rejected steps that increase
    the local residual, β_i within `beta_range` = β⁰·[1e-3, 1e3], and a stop at `tol` (relative:
    ‖z^{k+1} − z^k‖∞ and the drift ≤ tol·max(1, ‖z‖∞), `server.stop_level`). Local
    solver `"gd-auto"`: gradient steps (2.9), except for a client whose local problem they
    cannot solve within `local_steps` = E steps — E·η_i·β_i < 1, i.e. its condition bound
    (L̂_i + β_i)/β_i above E, as when InSa lowers β_i far below the curvature — which takes
    the node's "auto" solver that round (Newton / Newton-CG; `client._Round.run`).
    `FedADMM.paper()` is the paper's experimental setting (vanilla, β = 2, E = 10, η = 0.01,
    no safeguards, no stop): the reproductions use it. Full participation unless
    `participation` < 1 (paper: 0.1).

    >>> res = prob.solve(FedADMM())                                          # doctest: +SKIP
    >>> res = prob.solve(FedADMM.paper(inexact=True, adaptive=True, participation=0.1))  # doctest: +SKIP
    """

    name = "fedadmm"
    checkpointing = True
    # the client steps (the set-up, the round, the node-local bookkeeping), the composition's
    # certificate and the server's multipliers of projected sets
    procedures = (*client.PROCEDURES, _certificate, _server_set_multipliers)
    #: the paper's experiments (spec §2.7): what `FedADMM.paper()` starts from
    PAPER = {"beta": 2.0, "local_steps": 10, "lr": 0.01, "inexact": False, "adaptive": False,
             "tol": None, "max_rounds": 100, "beta_range": (0.0, math.inf), "safeguard": False,
             "local_solver": "gd"}

    @classmethod
    def paper(cls, **overrides) -> "FedADMM":
        """The paper's setting (β = 2, E = 10, η = 0.01, vanilla, 100 rounds, no stop, no
        safeguards), with `overrides` (e.g. `inexact=True, adaptive=True` for its InSa)."""
        return paper_preset(cls(**{**cls.PAPER, **overrides}))

    def __init__(self, beta: float = 1.0, local_steps: int = 50, lr: float | None = None,
                 inexact: bool = True, sigma: float | None = None, adaptive: bool = True,
                 mu: float = 20.0, tau: float = 2.0, memory: float | None = None,
                 participation: float = 1.0, max_rounds: int = 1000, seed: int | None = 0,
                 reference: str = "z", sigma_factor: float = 1.0, strong_convexity: float = 1.0,
                 penalty_rule: str = "paper", alpha: Any = "uniform", tol: float | None = 1e-8,
                 w0: Any = None, server_tol: float = 1e-10,
                 beta_range: tuple[float, float] | None = None, local_solver: str = "gd-auto",
                 local_start: str = "z", safeguard: bool = True, report_every: int = 1):
        problems = []
        for label, value in (("beta", beta), ("lr", 1.0 if lr is None else lr), ("mu", mu), ("tau", tau),
                             ("sigma_factor", sigma_factor), ("strong_convexity", strong_convexity),
                             ("server_tol", server_tol)):
            if not _positive(value):
                problems.append(f"{label} must be a positive finite number (got {value!r})")
        for label, value in (("local_steps", local_steps), ("max_rounds", max_rounds),
                             ("report_every", report_every)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                problems.append(f"{label} must be an integer ≥ 1 (got {value!r})")
        if sigma is not None and not (_positive(sigma) and sigma < 1):
            problems.append(f"sigma must be None (the bound (3.9)) or in (0, 1) (got {sigma!r})")
        if memory is not None and not (_positive(memory) or memory == 0):
            problems.append(f"memory δ must be None or a number ≥ 0 (got {memory!r})")
        if not (_positive(participation) and participation <= 1):
            problems.append(f"participation must be a fraction in (0, 1] (got {participation!r})")
        if _positive(mu) and mu <= 1 or _positive(tau) and tau <= 1:
            problems.append(f"the adaptive penalty (3.15) needs mu > 1 and tau > 1 (got mu={mu}, tau={tau})")
        if reference not in ("z", "u"):
            problems.append(f"reference must be 'z' (Remark 3.4) or 'u' (criterion (3.7)), got {reference!r}")
        if local_solver not in LOCAL_SOLVERS:
            problems.append(f"local_solver must be one of {LOCAL_SOLVERS}, got {local_solver!r}")
        if local_start not in ("z", "u"):
            problems.append(f"local_start must be 'z' (the paper) or 'u' (warm start), got {local_start!r}")
        if penalty_rule not in ("paper", "code"):
            problems.append(f"penalty_rule must be 'paper' or 'code', got {penalty_rule!r}")
        if tol is not None and not _positive(tol):
            problems.append(f"tol must be None or a positive number (got {tol!r})")
        for label, value in (("inexact", inexact), ("adaptive", adaptive), ("safeguard", safeguard)):
            if not isinstance(value, (bool, np.bool_)):
                problems.append(f"{label} must be True or False (got {value!r})")
        if beta_range is None:       # safeguard: β stays within 1e±3 of β⁰ (the paper: unbounded)
            beta_range = (1e-3 * beta, 1e3 * beta) if safeguard and _positive(beta) else (0.0, math.inf)
        try:
            low, high = (float(v) for v in beta_range)
            assert 0 <= low < high
        except (TypeError, ValueError, AssertionError):
            problems.append(f"beta_range must be (low, high) with 0 ≤ low < high (got {beta_range!r})")
            low, high = 0.0, math.inf
        if problems:
            raise FedModelError("FedADMM: " + "; ".join(problems))
        self.beta_range, self.local_solver, self.local_start = (low, high), local_solver, local_start
        self.beta, self.local_steps = float(beta), int(local_steps)
        self.lr, self.safeguard = None if lr is None else float(lr), bool(safeguard)
        # the history's objective / violation (the harness's metric, one "report" request per
        # round: booked local by the ledger, but a round trip of its own on a deployment) every
        # `report_every` rounds, NaN in between (DALD's option of the same name)
        self.report_every = int(report_every)
        self.inexact, self.adaptive = bool(inexact), bool(adaptive)
        self.sigma = None if sigma is None else float(sigma)
        self.mu, self.tau = float(mu), float(tau)
        # vanilla FedADMM has no server memory; In / InSa use δ = 0.01 (spec §2.1, §2.7)
        self.memory = float(memory) if memory is not None else (0.01 if self.inexact else 0.0)
        self.participation, self.max_rounds, self.seed = float(participation), int(max_rounds), seed
        self.reference, self.sigma_factor = reference, float(sigma_factor)
        self.strong_convexity, self.penalty_rule = float(strong_convexity), penalty_rule
        self.alpha, self.tol, self.w0, self.server_tol = alpha, tol, w0, float(server_tol)
        # the executor of the ProxAL solve that `subproblem_log` describes (composition)
        self._log_executor = None

    @property
    def variant(self) -> str:
        """Which algorithm the options select: inexact local solves (In, Algorithm 3's criterion
        (3.7)) and / or self-adaptive penalties (Sa, (3.14)–(3.15))."""
        return "FedADMM-InSa" if self.inexact and self.adaptive else \
            "FedADMM-In" if self.inexact else "FedADMM" + ("-Sa" if self.adaptive else "")

    # ---- set-up ---------------------------------------------------------------------------------
    def _weights(self, m: int, clients: list | None = None) -> np.ndarray:
        """α_i of the m clients, normalized to sum 1: uniform, the `weight`s of the model's
        `clients` (None inside ProxAL: its composition has no model at hand), or given numbers."""
        if isinstance(self.alpha, str):
            if self.alpha == "uniform":
                return np.full(m, 1.0 / m)
            if self.alpha == "weights" and clients is None:
                raise FedModelError("inside ProxAL, FedADMM's alpha must be 'uniform' or numbers "
                                    "(got 'weights')")
            if self.alpha == "weights":
                missing = [c.name for c in clients if c.weight is None]
                if missing:
                    raise FedModelError(f"alpha='weights' needs a weight on every client; "
                                        f"missing on {missing} (prob.add_client(name, weight=N_i))")
                raw = np.array([c.weight for c in clients], float)
                return raw / raw.sum()
            raise FedModelError(f"alpha must be 'uniform', 'weights' or {m} positive numbers, "
                                f"got {self.alpha!r}")
        raw = np.asarray(self.alpha, float).ravel()
        if raw.shape != (m,) or not np.all(np.isfinite(raw)) or np.any(raw <= 0):
            raise FedModelError(f"alpha must be {m} positive finite numbers (one per client), "
                                f"got {self.alpha!r}")
        return raw / raw.sum()

    def _check_model(self, ex) -> None:
        """Refuse a model FedADMM cannot run — client or server constraints that are not simple
        sets on the shared variables, λ‖w‖₁ with a set its prox does not factor with — as each
        node reports it (local request "fedadmm_refusal", `client._refusal`); clients first."""
        replies = ex.map("fedadmm_refusal", {node: {} for node in ex.clients + ["server"]})
        for reply in replies.values():
            if reply["refusal"]:
                raise FedModelError(reply["refusal"])

    def _client_config(self, z, beta, lam_start="zero") -> dict:
        """The clients' "fedadmm_init" options (α_i is sent per client)."""
        return {"z": z, "beta": beta, "lam_start": lam_start, "lr": self.lr,
                "local_steps": float(self.local_steps), "inexact": float(self.inexact),
                "sigma": self.sigma, "sigma_factor": self.sigma_factor, "c": self.strong_convexity,
                "reference": self.reference, "adaptive": float(self.adaptive), "mu": self.mu,
                "tau": self.tau, "penalty_rule": self.penalty_rule, "beta_min": self.beta_range[0],
                "beta_max": self.beta_range[1], "solver": self.local_solver,
                "start": self.local_start, "safe": float(self.safeguard)}

    @staticmethod
    def _set_multipliers(ex, z: np.ndarray, server_step: tuple | None) -> dict:
        """The multipliers of the affine constraints the nodes projected on (the KKT certificate
        reads affine constraints through them): the clients' at their last local points, the
        server's at its last z-step (anchor, weight)."""
        out: dict = {}
        for reply in ex.map("fedadmm_set_multipliers", {c: {} for c in ex.clients if c not in ex.lost}).values():
            out.update(reply["multipliers"])
        if server_step is not None:
            out.update(server_set_multipliers(ex, z, server_step))
        return out

    def _hint(self) -> str:
        """What to change when a run diverges (the divergence message's last part)."""
        guard = "" if self.safeguard else "; or turn the safeguards on (safeguard=True, beta_range=None)"
        if self.lr is not None:
            return (f"lower lr (now {self.lr:g}) or leave lr=None for the automatic step "
                    f"1/(L̂+β), or raise beta (now {self.beta:g}){guard}")
        return f"raise beta (now {self.beta:g}) or check the model's scaling{guard}"

    # ---- the rounds -----------------------------------------------------------------------------
    def prepare(self, problem, topology):
        topology = require_star(problem, topology, self.name)
        if not problem.clients:
            raise FedModelError("FedADMM needs at least one client")
        return topology

    def compile(self, problem) -> dict:
        # clients project onto their sets in their local solves, the server in its z-step
        return compile_projecting(problem)

    def loop(self, problem, ex, run: Run) -> Outcome:
        self._check_model(ex)
        alpha = self._weights(len(problem.clients), problem.clients)
        z = np.zeros(ex.model_size) if self.w0 is None else _start_point(self.w0, ex.model_size)
        bar = progress(self.max_rounds, run.verbose, self.variant)
        try:
            info = {"variant": self.variant, "alpha": alpha, "memory": self.memory}
            z, history, status, steps = self.rounds(ex, z, alpha, self.max_rounds, run.callback, bar,
                                                    checkpointer=run.checkpointer, info=info)
        finally:
            bar.close()
        ex.ledger.rounds = len(history)
        return Outcome(status, shared=z, history=history,
                       iterations={"rounds": len(history), "local_steps": steps}, info=info)

    def conclude(self, problem, ex, run: Run, outcome: Outcome) -> None:
        """The multipliers of the projected affine sets, the clients' final β_i and steps."""
        info = outcome.info
        server_step = info.pop("server_step", None)
        if projects_affine(problem):
            outcome.multipliers.update(self._set_multipliers(ex, outcome.shared, server_step))
        final = ex.map("fedadmm_beta", {c: {} for c in ex.clients if c not in ex.lost})
        if ex.lost:
            info["lost"] = sorted(ex.lost)
        info["final_beta"] = {c: r["beta"] for c, r in final.items()}
        info["final_lr"] = {c: r["lr"] for c, r in final.items()}    # after the safeguard's halvings

    def rounds(self, ex, z: np.ndarray, alpha: np.ndarray, max_rounds: int, callback=None, bar=None,
               **options) -> tuple[np.ndarray, list[dict], str, int]:
        """At most `max_rounds` rounds of Algorithms 1/3 on the started executor `ex` (its node
        programs compiled for this model), from z^0 = z with weights α = `alpha`; returns
        (z, history, status, total local steps) (`server.rounds`). `run` calls it, and so does
        ProxAL's composition (`composition.solve_subproblem`) on ProxAL's executor.

        State: round k, z, the server's caches of w_i and β_i, the sampling rng — saved by
        `checkpointer` after every round (docs/checkpoints.md). `bar`: a progress display
        (`common.progress`; None: silent). Keyword `options`: `lam_start`, `keep_beta`: the
        clients' λ_i^0 and whether they keep their β_i (client "fedadmm_init"). `report`:
        objective / violation in the records (one "report" per node every `report_every` rounds;
        NaN in the others).
        `stop(z, record, z_bar, weight, residual) -> bool` replaces the `tol` test (ProxAL's
        composition; z_bar, weight: the z-step's anchor and quadratic weight (3.2); residual: the
        ∞-norm residual of the server's solve). `server_tol`, `checkpointer`, `info`.
        Divergence (non-finite or 1e6-fold growth of z, the clients' messages
        w_i = β_i u_i − λ_i or their drift ‖u_i − z‖∞) stops the loop with status "diverged",
        the last sound z, a RuntimeWarning and `info["diverged"]`."""
        return rounds(self, ex, z, alpha, max_rounds, callback, bar, **options)

    # ---- composition: FedADMM as ProxAL's subproblem solver -------------------------------------
    def solve_subproblem(self, ex, w: np.ndarray, tau: float, rho: dict) -> tuple[np.ndarray, list, dict]:
        """Step 3 of ProxAL's Algorithm 1 by FedADMM rounds (`composition.solve_subproblem`):
        (w^{k+1}, the certificate per round, `rho` unchanged — FedADMM uses its own β). Each
        subproblem adds an entry to `subproblem_log`, which a new ProxAL solve (another
        executor) starts afresh."""
        z, trace, entry = solve_subproblem(self, ex, w, tau)
        if self._log_executor is not ex:
            self._log_executor, self.subproblem_log = ex, []
        self.subproblem_log.append(entry)
        return z, trace, rho


def _positive(value) -> bool:
    try:
        return bool(np.isfinite(value) and value > 0) and not isinstance(value, bool)
    except TypeError:
        return False


def _start_point(w0, d: int) -> np.ndarray:
    z = np.asarray(w0, float).ravel().copy()
    if z.shape != (d,) or not np.all(np.isfinite(z)):
        raise FedModelError(f"w0 must be {d} finite numbers (the flattened shared variables)")
    return z
