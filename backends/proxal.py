"""Proximal augmented Lagrangian with inexact ADMM (He, Peng, Sun: "Federated learning with
convex global and local constraints"), Algorithms 1–3. Equation numbers refer to that paper
(../shared/seeds/fl_convex_global_local_constraints.txt); see ../shared/spec/fl_constraints.md.

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
- `adaptive_rho=True`: each client rebalances its ρ_i between ADMM steps by residual balancing.
  The certificate (22) stays valid because ε̃_{i,t+1} uses the ρ_i^t the server used in (18),
  and ũ_i^{t+1} = u_i^{t+1} + λ_i^{t+1}/ρ_i^{t+1} (21) is formed with the new ρ (see `_admm_step`).
- `beta_growth=γ > 1`: between outer iterations β_{k+1} = min(γ β_k, `beta_max`) when the
  constraint change ‖μ^{k+1} − μ^k‖∞/β_k exceeds ε2 and has not fallen below a quarter of the
  previous one (the standard augmented-Lagrangian penalty update). Iteration k uses β_k
  throughout: multiplier step, proximal weight ω_k = 1/((n+1)β_k) of (13)–(14) and rule (11),
  so (11) still certifies an (ε1, ε2)-KKT point; (22)–(23) are per subproblem and unaffected.
  If β reaches `beta_max` and the violation stops falling, ProxAL stops early with status
  "infeasible" (or "stalled"), naming the violated constraints (see `_verdict`); an objective that
  falls by the same amount at every outer iteration while the iterates move by the same distance
  (a proximal point method on a model with no minimizer) stops with "unbounded".
- `anderson=m`: Anderson acceleration of the ADMM with memory m (backends/anderson.py): the
  server mixes the last m + 1 iterates with coefficients computed from the inner products of
  the clients' residuals; each client mixes its own (u_i, λ_i/ρ_i). (22) bounds ‖∇ℓ_k(w)‖∞ for
  ANY client states (u_i, λ_i) as long as the server's (18) used ũ_i = u_i + λ_i/ρ_i of the same
  states, so the mixed iterates keep (23) sound; restarts and a fall-back to plain ADMM keep the
  iteration convergent.
"""
from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime import make_executor
from fedmodel.runtime.checkpoint import NO_CHECKPOINT, Checkpointer
from fedmodel.runtime.ledger import procedure
from fedmodel.runtime.program import NodeProgram, compile_programs
from .anderson import MAX_MEMORY, ClientHistory, ServerMixer
from .base import Backend
from .common import check_choice, check_count, check_number, gather_values, progress, require_star
from .watch import DivergenceWatch


STALL_OUTER = 3       # outer iterations at β_max with a flat violation: infeasible (see _verdict)
UNBOUNDED_OUTER = 5   # outer iterations of equal objective decrease and step: unbounded
SOLVERS = ("auto", "newton", "exact", "lbfgs", "gd", "prox")
DIVERGENCE_HINT = "lower rho or beta, or start from a smaller w0 (backends.ProxAL)"

# Presets. `PAPER_PROXAL` is Algorithm 1 exactly as the paper runs its NP experiment
# (β = 300, fixed ρ_i = 0.01, q = 0.9, s̄ = 1e-3, ε = (1e-3, 1e-3)); it needs 10³–10⁴ ADMM
# iterations per outer step. `FAST_PROXAL` keeps the algorithm, the certificate (22)–(23) and the
# stopping rule (11) and changes only parameters (docs/BENCHMARKS.md, ProxAL section):
# - q = 0.3: the certificate ε_{t+1} + Σ ε̃_i ≤ τ_k contains the local tolerance ε_{t+1} = q^t
#   itself, so every ADMM run needs at least log τ_k / log q iterations (65–110 for q = 0.9,
#   10–12 for q = 0.3); Newton local solves make the tighter tolerance almost free;
# - residual-balanced ρ_i from 0.1 (the certificate uses the ρ_i the server used, see
#   `_admm_step`);
# - ε2 = 1e-4: a violation of ε2 moves the objective by about |μ|·ε2; with the multipliers of
#   the NP models (|μ| ≈ 10 on adult) ε2 = 1e-3 leaves gaps of ~1e-2, so answers do not verify
#   at rtol 1e-3;
# - beta_growth = 4 (β_max = 1e4): β rises between outer iterations only when the violation
#   stalls (falls by less than 4×), the standard AL penalty update; iteration k uses its β_k in
#   the multiplier step, the proximal weight and (11). On near-degenerate models (adult at
#   n = 5: 36 → 6 outer iterations) it is what makes ProxAL fast; elsewhere β stays 300. On an
#   infeasible model the violation then stalls at β_max and ProxAL stops after 3 such outer
#   iterations (status "infeasible", info["infeasible"] and info["violated"]);
# - anderson = 5: Anderson acceleration of the ADMM (backends/anderson.py; ρ changes restart
#   it). The certificate (22) holds for any client state, so (23) stays sound; on the NP models
#   it cuts the ADMM iterations 2–6× (docs/BENCHMARKS.md).
# `backends.ProxAL()` defaults equal FAST_PROXAL; `backends.ProxAL.paper()` is PAPER_PROXAL (its
# fixed-ρ, fixed-β, no-Anderson options are spelled out so that changing defaults cannot touch it).
PAPER_PROXAL = dict(beta=300.0, rho=0.01, s_bar=1e-3, q=0.9, tol=(1e-3, 1e-3), adaptive_rho=False,
                    beta_growth=1.0, anderson=0)
PAPER_CPROXAL = dict(beta=300.0, s_bar=1e-3, tol=(1e-3, 1e-3), beta_growth=1.0)
FAST_PROXAL = dict(beta=300.0, rho=0.1, s_bar=1e-3, q=0.3, adaptive_rho=True, tol=(1e-3, 1e-4),
                   beta_growth=4.0, beta_max=1e4, anderson=5)


def _check_common(beta, s_bar, tol, max_outer, beta_growth, beta_max, local_solver, w0) -> dict:
    """The options ProxAL and cProx-AL share, validated (FedModelError naming the option)."""
    if isinstance(tol, (str, bytes)) or np.ndim(tol) != 1 or len(tol) != 2:
        raise FedModelError(f"tol must be a pair (eps1, eps2) of positive numbers, got {tol!r}")
    inf = float("inf")
    options = dict(beta=check_number("beta", beta, 0, inf), s_bar=check_number("s_bar", s_bar, 0, inf),
                   eps1=check_number("tol[0] (eps1)", tol[0], 0, inf),
                   eps2=check_number("tol[1] (eps2)", tol[1], 0, inf),
                   max_outer=check_count("max_outer", max_outer),
                   beta_growth=check_number("beta_growth", beta_growth, 1, inf, low_closed=True),
                   beta_max=check_number("beta_max", beta_max, 0, inf),
                   local_solver=check_choice("local_solver", local_solver, SOLVERS))
    if options["beta_max"] < options["beta"]:
        raise FedModelError(f"ProxAL needs beta_max ≥ beta (beta_growth raises β up to beta_max): "
                            f"got beta_max={beta_max}, beta={beta}")
    if w0 is not None:
        w0 = np.asarray(w0, dtype=float).ravel()
        if not np.all(np.isfinite(w0)):
            raise FedModelError("w0 (the starting point) has non-finite entries")
    options["w0"] = w0
    return options


def _start(w0, size: int) -> np.ndarray:
    """The starting point: zeros, or w0 when it has the model's size."""
    if w0 is None:
        return np.zeros(size)
    if w0.size != size:
        raise FedModelError(f"w0 has {w0.size} entries but the shared variables have {size}")
    return w0.copy()


def _next_beta(beta: float, change: float, last_change: float, growth: float, beta_max: float,
               eps2: float) -> float:
    """The AL penalty update: raise β (up to β_max) when the constraint change ‖Δμ‖∞/β is above
    ε2 and fell by less than 4× since the previous outer iteration."""
    if growth > 1 and change > eps2 and change > 0.25 * last_change:
        return min(growth * beta, beta_max)
    return beta


def _verdict(history: list[dict], growth: float, beta_max: float, eps1: float, eps2: float) -> str | None:
    """The verdict on a run from its outer records: "infeasible", "stalled", "unbounded" or None.

    Infeasible: β has reached β_max and over the last STALL_OUTER outer iterations (in which β
    was raised to β_max or stayed there) the largest violation fell by less than 1 % in each
    while staying above ε2 — the multipliers then grow by β_k·violation per iteration, faster
    and faster, which a feasible model's method of multipliers needs only when its optimal
    multipliers are huge (a nearly infeasible model: then this verdict can be premature).
    Stalled: at β_max for 3·STALL_OUTER iterations, the violation still above ε2 but
    falling by less than 2× over them. Unbounded: for UNBOUNDED_OUTER outer iterations, feasible,
    the objective fell by at least 0.9× the previous decrease (and by more than ε1) while the
    iterate moved at least 0.9× the previous distance — a proximal point step on a convex model
    only keeps its length when the model has no minimizer — and over them the objective fell by
    more than its own size (and at least 1): a loss bounded below whose infimum is not attained
    (logistic regression on separable data) keeps its steps too, but its decreases are small."""
    if growth > 1 and len(history) > STALL_OUTER and history[-1]["beta"] >= beta_max:
        recent = [r["violation"] for r in history[-STALL_OUTER - 1:]]
        if recent[-1] > eps2 and all(b > 0.99 * a for a, b in zip(recent, recent[1:])):
            return "infeasible"
        window = history[-3 * STALL_OUTER - 1:]
        if len(window) > 3 * STALL_OUTER and all(r["beta"] >= beta_max for r in window[1:]) \
                and recent[-1] > max(eps2, 0.5 * window[0]["violation"]):
            return "stalled"
    if len(history) > UNBOUNDED_OUTER:
        window = history[-UNBOUNDED_OUTER - 1:]
        drops = [a["objective"] - b["objective"] for a, b in zip(window, window[1:])]
        steps = [r["primal_change"] for r in window]
        if all(r["violation"] <= eps2 for r in window) and min(drops) > eps1 \
                and sum(drops) > max(1.0, abs(window[0]["objective"])) \
                and all(b >= 0.9 * a for a, b in zip(drops, drops[1:])) \
                and all(b >= 0.9 * a > 0 for a, b in zip(steps[1:], steps[2:])):
            return "unbounded"
    return None


VERDICTS = {"infeasible": "the largest violation stayed at {v:.3g} for {k} outer iterations at β = "
                          "β_max: the model is infeasible (no point satisfies every constraint); "
                          "the returned point is the least violating one found",
            "stalled": "the violation stayed above ε2 (at {v:.3g}) at β = β_max: the model may be "
                       "infeasible or badly scaled (fm.verify with a CVXPY reference can tell)",
            "unbounded": "the objective fell by about the same amount at each of the last {k} "
                         "outer iterations (now {o:.4g}) while the iterates moved without slowing: "
                         "the model is unbounded below"}


@procedure("proxal_violations", {"x": "x", "tol": "1"}, {"violated": "opaque"})
def _violations(program: NodeProgram, x, tol=0.0):
    """This node's constraints violated by more than `tol` at `x` (rendered form → violation)."""
    return {"violated": program.violations(x, tol)}


def _conclude(status: str, history: list[dict], violated: dict[str, float], info: dict) -> None:
    """info[status] (a readable message) and info["violated"] for a detected verdict; warns."""
    last = history[-1]
    message = VERDICTS[status].format(v=last["violation"], k=len(history), o=last["objective"])
    info[status] = f"stopped after {len(history)} outer iterations: {message}"
    if violated:
        info["violated"] = dict(sorted(violated.items(), key=lambda item: -item[1]))
        info[status] += "; violated: " + ", ".join(f"{name} (by {v:.3g})" for name, v in
                                                    list(info["violated"].items())[:5])
    warnings.warn(info[status], RuntimeWarning, stacklevel=3)


# ---- client-side procedures (run on the client; state in program.state) ---------------------
@procedure("proxal_admm_init", {"w": "x", "rho": "1", "anderson": "1"}, {"u_tilde": "x"})
def _admm_init(program: NodeProgram, w, rho, anderson=0.0):
    """Step 1 of Algorithm 2: u⁰ = w̃⁰, λ⁰ = −∇P_i(w̃⁰), ũ⁰ = w̃⁰ − ∇P_i(w̃⁰)/ρ_i."""
    grad = program.merit(w)["grad"]
    program.state["admm"] = {"u": w.copy(), "lam": -grad, "rho": float(rho), "w": w.copy(),
                             "history": ClientHistory(int(anderson)) if anderson else None}
    return {"u_tilde": w - grad / rho}


@procedure("proxal_admm_step", {"w": "x", "eps": "1", "adaptive": "1", "solver": "str",
                                "mix": f"<={MAX_MEMORY}", "restart": "1"},
           {"u_tilde": "x", "eps_tilde": "1", "rho": "1", "steps": "1", "products": f"<={MAX_MEMORY + 1}"})
def _admm_step(program: NodeProgram, w, eps, adaptive=0.0, solver="auto", mix=None, restart=0.0):
    s = program.state["admm"]
    u, lam, rho, history = s["u"], s["lam"], s["rho"], s["history"]
    if history is not None:            # Anderson acceleration (backends/anderson.py)
        if restart:
            history.clear()
        if mix is not None and len(mix):   # the state x_i = (u_i, λ_i/ρ_i) the server mixed ũ_i of
            x = history.mix(np.asarray(mix, float))
            u, lam = x[:u.size], rho * x[u.size:]
    # (22) with the OLD λ_i^t, u_i^t and the ρ_i^t the server used in (18)
    eps_tilde = float(np.max(np.abs(program.prox_remainder(   # a client's λ‖w‖₁: its ∂ counts
        w, program.gradient(w) + lam - rho * (w - u))), initial=0.0))
    # (19): u ≈ argmin P_i(u) + <λ, u − w> + (ρ/2)‖u − w‖², to ‖∇φ_i‖∞ ≤ ε_{t+1}
    out = program.solve_local(linear=lam, weight=rho, anchor=w, x0=u, tol=eps, method=solver)
    u_new = out["x"]
    lam_new = lam + rho * (u_new - w)                                  # (20)
    reply = {"eps_tilde": eps_tilde, "steps": out["steps"]}
    if history is not None:            # the iterate in the ρ it was computed with
        reply["products"] = history.push(np.concatenate([u_new, lam_new / rho]),
                                         np.concatenate([u, lam / rho]))
    if adaptive:
        rho = _balance(rho, primal=np.max(np.abs(u_new - w)), dual=rho * np.max(np.abs(w - s["w"])))
    program.state["admm"] = {"u": u_new, "lam": lam_new, "rho": rho, "w": w.copy(), "history": history}
    reply.update(u_tilde=u_new + lam_new / rho, rho=rho)                  # (21), with the new ρ
    return reply


def _stalled(trace: list[float], window: int) -> bool:
    """True when the best certificate (22) of the last `window` ADMM iterations is not 1 % below
    the best of the `window` before them (window = 0: never). Comparing window with window, not
    with the best ever, keeps a steadily falling certificate after an early transient dip going.
    The certificate then cycles instead of falling — seen when a client's nonsmooth term
    (λ‖w‖₁) is evaluated at a server iterate creeping towards its kink (w_j → 0 but not 0, so
    its subgradient stays ±λ) on an infeasible model. The outer loop reads trace[-1] > τ_k as
    an unsolved subproblem (no convergence claimed) and goes on, so `_verdict` gets its outer
    iterations in a bounded number of ADMM steps. Depends on the trace alone: deterministic."""
    if not window or len(trace) < 2 * window:
        return False
    return min(trace[-window:]) > 0.99 * min(trace[-2 * window:-window])


def _balance(rho: float, primal: float, dual: float, ratio: float = 10.0, factor: float = 2.0) -> float:
    """Residual balancing (Boyd et al. §3.4.1): keep primal and dual residuals within `ratio`."""
    if primal > ratio * dual:
        return rho * factor
    if dual > ratio * primal:
        return rho / factor
    return rho


# ---- the backend ------------------------------------------------------------------------------
class ProxAL(Backend):
    """Algorithm 1 with Algorithm 2. Defaults: the fast robust setting (β = 300, adaptive ρ_i from
    0.1, q = 0.3, ε = (1e-3, 1e-4), β growth ×4 up to 1e4, Anderson memory 5; it equals
    `FAST_PROXAL`); `ProxAL.paper()` is the paper's NP setting (fixed ρ_i = 0.01,
    q = 0.9, fixed β).

    >>> res = prob.solve(ProxAL(), topology=topologies.star(prob))  # doctest: +SKIP
    """

    name = "proxal"
    checkpointing = True

    def __init__(self, beta: float = 300.0, rho: float = 0.1, s_bar: float = 1e-3, q: float = 0.3,
                 tol: tuple[float, float] = (1e-3, 1e-4), max_outer: int = 100,
                 max_inner: int = 1000, rho_rule: str = "constant", adaptive_rho: bool = True,
                 local_solver: str = "auto", w0: Any = None, inner: Any = None,
                 check_certificate: bool = False, beta_growth: float = 4.0, beta_max: float = 1e4,
                 anderson: int = 5, inner_stall: int = 50):
        options = _check_common(beta, s_bar, tol, max_outer, beta_growth, beta_max, local_solver, w0)
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
        if inner is not None and not callable(getattr(inner, "solve_subproblem", None)):
            raise FedModelError(f"inner={inner!r} cannot solve ProxAL's subproblems; use "
                                "inner=None (Algorithm 2) or inner=backends.FedADMM(...)")
        self.inner = inner
        # diagnostic: at each ADMM stop also compute the true ‖∇ℓ_k(w)‖∞ (one extra round)
        self.check_certificate = bool(check_certificate)
        self.anderson = int(anderson)
        # the inner loop gives up when `inner_stall` ADMM iterations did not improve on the
        # certificate of the `inner_stall` before them by 1 % (0: never; see `_stalled`)
        self.inner_stall = check_count("inner_stall", inner_stall, low=0)

    @classmethod
    def paper(cls, **overrides: Any) -> "ProxAL":
        """The paper's exact NP setting (`PAPER_PROXAL`: β = 300, fixed
        ρ_i = 0.01, q = 0.9, s̄ = 1e-3, ε = (1e-3, 1e-3), no β growth, no Anderson), with
        `overrides` on top (e.g. `w0=`, `max_outer=`)."""
        return cls(**{"inner_stall": 0, **PAPER_PROXAL, **overrides})   # the paper has no stall rule

    # Algorithm 1 --------------------------------------------------------------------------------
    def run(self, problem, topology=None, executor="serial", callback=None, verbose=False,
            checkpointer: Checkpointer = NO_CHECKPOINT, **_):
        require_star(problem, topology, self.name)
        programs = compile_programs(problem)
        ex = make_executor(executor).start(programs)
        clients = ex.clients
        n = len(clients)
        d = programs["server"].n_shared
        w = _start(self.w0, d)
        rho = self._client_rhos(problem)
        watch = DivergenceWatch("ProxAL", DIVERGENCE_HINT)
        history, total_inner, status = [], 0, "max_iterations"
        beta, last_change = self.beta, np.inf          # β_k (see beta_growth), last ‖Δμ‖∞/β
        bar = progress(self.max_outer, verbose, "ProxAL")
        certificate_log, info = [], {}
        start = time.perf_counter()
        saved = checkpointer.restore(ex)               # resume: docs/checkpoints.md
        if saved:
            w, rho, total_inner = saved["w"], saved["rho"], saved["total_inner"]
            certificate_log, history = saved["certificate_log"], saved["history"]
            beta, last_change = saved.get("beta", beta), saved.get("last_change", last_change)
            watch.smallest = dict(saved.get("watch", {}))   # the growth test's memory
        # Algorithm 2, or an inner backend's solver (e.g. FedADMM, whose trace holds upper bounds
        # on dist∞(0, ∂ℓ_k) — see FedADMM.solve_subproblem)
        subproblem = self._admm if self.inner is None else self.inner.solve_subproblem
        for k in range(len(history), self.max_outer):
            tau = self.s_bar / (k + 1) ** 2                                       # step 2
            omega = 1.0 / ((n + 1) * beta)         # proximal weight of each P_{i,k} (13)–(14)
            ex.map("configure", {node: {"beta": beta, "prox_weight": omega, "center": w}
                                 for node in ex.nodes})
            w_next, trace, rho = subproblem(ex, w, tau, rho)                      # steps 3–4
            total_inner += len(trace)
            true_residual = self._true_residual(ex, w_next) if self.check_certificate else None
            certificate_log.append((tau, trace[-1]))
            changes = ex.map("update_multipliers", {node: {"x": w_next} for node in ex.nodes})  # 5, 7–8
            dmu = max(r["dmu"] for r in changes.values())
            dw = max(float(np.max(np.abs(w_next - w), initial=0.0)),
                     max(r["dy"] for r in changes.values()))
            if watch.check(k + 1, w=w_next, multiplier_change=dmu, certificate=trace[-1]):
                status = watch.report(info)     # keep the last finite iterate as the answer
                break
            w = w_next
            record = self._record(ex, w, k, trace, tau, dw, dmu, start)
            record["true_residual"], record["beta"] = true_residual, beta
            history.append(record)
            if callback:
                callback(record)
            bar.update(record)
            # (11) with β_k; it certifies a KKT point only if the subproblem was solved to τ_k
            # (23) — an inner loop stopped by max_inner leaves w barely moved and (11) would
            # hold vacuously
            solved = trace[-1] <= tau
            if solved and dw + beta * tau <= beta * self.eps1 and dmu <= beta * self.eps2:
                status = "converged"
                break
            verdict = _verdict(history, self.beta_growth, self.beta_max, self.eps1, self.eps2)
            if verdict:
                replies = ex.map("proxal_violations", {node: {"x": w, "tol": self.eps2} for node in ex.nodes})
                violated = {name: v for r in replies.values() for name, v in r["violated"].items()}
                _conclude(verdict, history, violated, info)
                status = verdict
                break
            change = dmu / beta                    # the constraint change, ≈ the violation
            beta = _next_beta(beta, change, last_change, self.beta_growth, self.beta_max, self.eps2)
            last_change = change
            checkpointer.save(ex, k + 1, {"w": w, "rho": rho, "total_inner": total_inner, "beta": beta,
                                  "last_change": last_change, "watch": dict(watch.smallest),
                                  "certificate_log": certificate_log, "history": history})
        bar.close()
        values, multipliers = gather_values(ex, problem, w)
        ex.ledger.rounds = total_inner + len(history)
        ex.close()
        return {"status": status, "values": values, "multipliers": multipliers, "history": history,
                "iterations": {"outer": len(history), "inner": total_inner}, "ledger": ex.ledger,
                "info": {"admm_certificates": certificate_log, "rho": rho, **info}}

    def _client_rhos(self, problem) -> dict[str, float]:
        if self.rho_rule == "constant":
            return {c.name: self.rho for c in problem.clients}
        rhos = {}
        for client in problem.clients:      # ρ_i = a·m_i (Remark 4.2): m_i = local sample count
            samples = max([d.shape[0] for d in client.data_items if d.ndim >= 1] or [1])
            rhos[client.name] = self.rho * samples
        return rhos

    # Algorithm 2 --------------------------------------------------------------------------------
    def _admm(self, ex, w_start, tau, rho):
        clients = ex.clients
        replies = ex.map("proxal_admm_init", {c: {"w": w_start, "rho": rho[c], "anderson": self.anderson}
                                              for c in clients})
        u_tilde = {c: r["u_tilde"] for c, r in replies.items()}
        mixer = ServerMixer(self.anderson) if self.anderson else None
        mix, restart = np.zeros(0), False
        w = w_start
        certificate, trace = np.inf, []
        for t in range(self.max_inner):
            eps = max(self.q ** t, 1e-2 * tau)  # step 3; floor: see the module docstring
            total_rho = sum(rho.values())
            anchor = sum(rho[c] * u_tilde[c] for c in clients) / total_rho if clients else w
            w = ex.call("server", "solve_local", linear=None, weight=total_rho, anchor=anchor,
                        x0=w, tol=eps, method=self.local_solver)["x"]                # (18)
            step = {"w": w, "eps": eps, "adaptive": float(self.adaptive_rho), "solver": self.local_solver}
            if mixer:
                step.update(mix=mix, restart=float(restart))
            replies = ex.map("proxal_admm_step", {c: step for c in clients})      # (19)–(22)
            u_tilde = {c: r["u_tilde"] for c, r in replies.items()}
            new_rho = {c: r["rho"] for c, r in replies.items()}
            certificate = eps + sum(r["eps_tilde"] for r in replies.values())
            trace.append(certificate)
            if not np.isfinite(certificate):      # blown up: the outer DivergenceWatch reports it
                break
            if mixer and certificate > tau:   # the clients' next states, mixed (backends/anderson.py)
                products = sum(r["products"] for r in replies.values())
                mix, restart, u_tilde = mixer.step(u_tilde, products, changed=new_rho != rho)
            rho = new_rho
            if certificate <= tau or _stalled(trace, self.inner_stall):             # (23)
                break
        return w, trace, rho

    @staticmethod
    def _true_residual(ex, w) -> float | None:
        """‖∇ℓ_k(w)‖∞ = ‖Σ_{i=0}^n ∇P_{i,k}(w)‖∞, which (23) bounds (Theorem 4.1); None when
        the server has a prox term or a projection (then ∂ℓ_k is a set)."""
        if ex.programs["server"].merit_ir.prox_terms:
            return None
        grads = ex.map("merit", {node: {"x": w} for node in ex.nodes})
        return float(np.max(np.abs(sum(r["grad"] for r in grads.values())), initial=0.0))

    def _record(self, ex, w, k, trace, tau, dw, dmu, start) -> dict:
        reports = ex.map("report", {node: {"x": w} for node in ex.nodes})
        return {"iteration": k + 1, "objective": sum(r["objective"] for r in reports.values()),
                "violation": max(r["violation"] for r in reports.values()),
                "client_objective": {c: reports[c]["objective"] for c in ex.clients},
                "client_violation": {c: reports[c]["violation"] for c in ex.clients},
                "inner": len(trace), "certificate": trace[-1], "inner_certificates": trace, "tau": tau,
                "primal_change": dw, "multiplier_change": dmu, "time": time.perf_counter() - start}


class CentralizedProxAL(Backend):
    """Algorithm 3 (cProx-AL): the same proximal AL with the subproblem solved centrally to
    dist∞(0, ∂ℓ_k) ≤ τ_k — the paper's baseline. Pools every block's data in one program.
    Defaults add ProxAL's β growth (×4 up to 1e4, which also detects infeasible / unbounded
    models) and ε2 = 1e-4; `CentralizedProxAL.paper()` is the paper's fixed-β setting."""

    name = "cproxal"
    checkpointing = True

    def __init__(self, beta: float = 300.0, s_bar: float = 1e-3, tol: tuple[float, float] = (1e-3, 1e-4),
                 max_outer: int = 100, local_solver: str = "auto", w0: Any = None,
                 beta_growth: float = 4.0, beta_max: float = 1e4):
        options = _check_common(beta, s_bar, tol, max_outer, beta_growth, beta_max, local_solver, w0)
        for key, value in options.items():
            setattr(self, key, value)

    @classmethod
    def paper(cls, **overrides: Any) -> "CentralizedProxAL":
        """The paper's cProx-AL setting (`PAPER_CPROXAL`: β = 300, s̄ = 1e-3,
        ε = (1e-3, 1e-3), fixed β), with `overrides` on top."""
        return cls(**{**PAPER_CPROXAL, **overrides})

    def run(self, problem, callback=None, verbose=False, checkpointer: Checkpointer = NO_CHECKPOINT, **_):
        shared = problem.shared_variables()
        private = [v for v in problem.variables() if v.owner is not None]
        terms = [t for b in problem.blocks for t in b.terms]
        program = NodeProgram("centralized", "server", terms, problem.constraints, shared, private)
        w = _start(self.w0, program.n_shared)
        history, status, total, info = [], "max_iterations", 0, {}
        beta, last_change = self.beta, np.inf
        watch = DivergenceWatch("cProx-AL", "lower beta or start from a smaller w0 "
                                            "(backends.CentralizedProxAL)")
        start = time.perf_counter()
        ex = make_executor("serial").start({"centralized": program})   # for the checkpointer
        saved = checkpointer.restore(ex)               # resume: docs/checkpoints.md
        if saved:
            w, history, total = saved["w"], saved["history"], saved["total"]
            beta, last_change, watch.smallest = saved["beta"], saved["last_change"], dict(saved["watch"])
        for k in range(len(history), self.max_outer):
            tau = self.s_bar / (k + 1) ** 2
            program.configure(beta, 1.0 / beta, w)
            gradient = program.merit(w)["grad"]      # a non-finite start would crash the solver
            if not np.all(np.isfinite(gradient)) and watch.check(k, merit_gradient=gradient):
                status = watch.report(info)
                break
            out = program.solve_local(None, 0.0, None, w, tau, method=self.local_solver)
            total += int(out["steps"])
            change = program.update_multipliers(out["x"])
            if watch.check(k + 1, w=out["x"], multiplier_change=change["dmu"]):
                status = watch.report(info)
                break
            dw = max(float(np.max(np.abs(out["x"] - w), initial=0.0)), change["dy"])
            w = out["x"]
            report = program.report(w)
            record = {"iteration": k + 1, "objective": report["objective"], "violation": report["violation"],
                      "inner": int(out["steps"]), "tau": tau, "primal_change": dw, "beta": beta,
                      "multiplier_change": change["dmu"], "time": time.perf_counter() - start}
            history.append(record)
            if callback:
                callback(record)
            if dw + beta * tau <= beta * self.eps1 and change["dmu"] <= beta * self.eps2:
                status = "converged"
                break
            verdict = _verdict(history, self.beta_growth, self.beta_max, self.eps1, self.eps2)
            if verdict:
                _conclude(verdict, history, _violations(program, w, self.eps2)["violated"], info)
                status = verdict
                break
            last_change, beta = change["dmu"] / beta, _next_beta(beta, change["dmu"] / beta, last_change,
                                                                  self.beta_growth, self.beta_max, self.eps2)
            checkpointer.save(ex, k + 1, {"w": w, "history": history, "total": total, "beta": beta,
                                          "last_change": last_change, "watch": dict(watch.smallest)})
        values = dict(zip([v.uid for v in shared], program.shared.unpack(w)))
        values.update(program.private_values()["values"])
        return {"status": status, "values": values, "multipliers": program.multipliers()["multipliers"],
                "history": history, "iterations": {"outer": len(history), "inner": total}, "info": info}
