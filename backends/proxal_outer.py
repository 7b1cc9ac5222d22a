"""The outer loop shared by ProxAL (Algorithm 1) and cProx-AL (Algorithm 3) of He, Peng, Sun,
"Federated learning with convex global and local constraints" (equation numbers: that paper):
their common options, the starting point, the penalty update β_k → β_{k+1} (`beta_growth`), the
stop, and the node-side list of violated constraints that an infeasible verdict names (the
verdicts "infeasible" / "stalled" / "unbounded" read from the outer records: `proxal_verdict`)."""
from __future__ import annotations

import time
import warnings

import numpy as np

from fedmodel.errors import FedModelError
from .common import check_choice, check_count, check_number
from . import proxal_flat
from .outcome import Status
from .proxal_admm import needed_multipliers
from . import proxal_certificate
from .proxal_certificate import MARGIN
from .proxal_private import private_settled, slack_verdict
from .proxal_verdict import RUNAWAY, beta_cap, hints, runaway, slow_rise_cap, verdict

SOLVERS = ("auto", "newton", "exact", "lbfgs", "gd", "prox")


def check_options(beta, s_bar, tol, max_outer, beta_growth, beta_max, local_solver, w0) -> dict:
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


def start_point(w0, size: int) -> np.ndarray:
    """The starting point: zeros, or w0 when it has the model's size."""
    if w0 is None:
        return np.zeros(size)
    if w0.size != size:
        raise FedModelError(f"w0 has {w0.size} entries but the shared variables have {size}")
    return w0.copy()


TAU_RULES = ("paper", "progress")


def next_tau(backend, k: int, history: list[dict]) -> float:
    """τ_k, the tolerance of outer iteration k's subproblem (Algorithm 1, step 2).

    "paper": s̄/(k+1)². "progress": never above it, so Σ_k τ_k < ∞ and the paper's convergence
    theory hold, and (22)–(23) and the stop rule (11) are untouched, but no smaller than the
    last outer step says is needed: τ_k = min(s̄/(k+1)², ε1·max(1/2, r/10)) with
    r = max(‖Δ(w, y)‖∞/(β ε1), ‖Δμ‖∞/(β ε2)) of the previous outer iteration (r ≤ 1: (11)
    held but for its τ term). Far from the stop, r is large and τ_k is the paper's; once the
    steps are small, τ_k = ε1/2 and (11) can hold at the next iteration. The paper's schedule
    needs τ_k < ε1, i.e. (k+1)² > s̄/ε1 — at least 11 outer iterations (s̄ = 1e-3, ε1 = 1e-5)
    whatever the model, each a full ADMM run (docs/BENCHMARKS.md). With a distance test
    (`dist_tol`) "progress" also tightens τ_k to what that test needs once the steps are small."""
    paper = backend.s_bar / (k + 1) ** 2
    if backend.tau_rule == "paper" or not history:
        return paper
    last = history[-1]
    ratio = max(last["primal_change"] / (last["beta"] * backend.eps1),
                last["multiplier_change"] / (last["beta"] * backend.eps2))
    tau = min(paper, backend.eps1 * max(0.5, 0.1 * ratio))
    tol = getattr(backend, "dist_tol", np.inf)
    if tol < np.inf and ratio <= 10 and "size" in last:     # (records saved before dist_tol lack it)
        # near (11): the distance test needs √d τ/μ ≤ dist_tol‖w‖/2 (`distance_left`)
        # (where the steps read no curvature, the nodes' own once asked: `proxal_flat.reading`;
        # raw power-plant data with an intercept stood still at τ_k ~ 3e-7, 1.4e-2 from the
        # answer, μ = 1.1e-6: τ_k 2e-10 → converged 1.7e-5 from it)
        mu = curvature(history) or last.get("nodes_curvature", 0.0)
        if mu > 0:
            root_d, beta = np.sqrt(last["dimension"]), last["beta"]
            target = max(0.5 * tol * mu * _reach(last) / root_d, 1e-3 * tau * last.get("metric", 1.0))
            # but far from that test (the next outer step's tail — the last step shrunk by
            # r = 1/(1 + βμ), over βμ — above FAR·dist_tol‖w‖), an inexact proximal point step
            # needs its stationarity error small beside its own step only:
            # √d τ ≤ INEXACT·‖Δw‖₂/β (MNIST d = 784: 447 → 276 ADMM iterations)
            if last["step"] / (beta * mu * (1 + beta * mu)) > FAR * tol * _reach(last):
                target = max(target, INEXACT * last["step"] / (beta * root_d))
            tau = min(tau, target)
    if tol < np.inf:        # the Newton reading refused the stop (`proxal_certificate.tau_for`)
        tau = proxal_certificate.tau_for(tau, last, MARGIN * tol * _reach(last))
    if tol < np.inf and ratio <= 10 and last.get("gradient_scale", 0.0) > 0:
        tau = min(tau, 0.5 * RELATIVE * last["gradient_scale"])      # (`relative` can hold)
    return tau


INEXACT = 0.1   # the tightened τ_k's floor, as a fraction of the last outer step (`next_tau`),
FAR = 10.0      # taken while the predicted distance left is above FAR·dist_tol·‖w‖₂ (bench_rounds'
# logistic-ball n = 5 with FAR = 1: one more outer iteration, 29 → 34 round trips, where β rose
# ×4 and the next step was 1/70 of the last, not the 0.77 the curvature read before predicted)


# the outer steps' contraction above which β rises (`next_beta`) once the constraints are met:
# 0.5 let the built-in NP model (WDBC, n = 5) run 11 outer iterations at 0.36 a step, 133 round
# trips; at 0.1, 5 outer / 81 (bench_rounds' synthetic models and bench_verdicts' NP seeds: the
# same iterations)
SLOW_CONTRACTION = 0.1


def next_beta(backend, beta: float, dmu: float, last_change: float,
              history: list[dict] | None = None) -> tuple[float, float]:
    """The AL penalty update after outer iteration k: (β_{k+1}, the constraint change
    ‖Δμ‖∞/β_k ≈ the violation). β rises ×`beta_growth` (up to `beta_max`) when that change is
    above ε2 and fell by less than 4× since the previous outer iteration (`last_change`), or,
    with a distance test (`dist_tol`), when the constraints are met (change ≤ ε2) but the outer
    steps shrink by less than 10× (`contraction` > SLOW_CONTRACTION): the proximal weight
    1/β_k then dominates the objective's curvature μ (steps shrink by 1/(1 + β_k μ)), and a
    smaller weight is what makes the outer loop converge (the a9a model of docs/BENCHMARKS.md: μ ≈ 10⁻⁴ after
    equilibration, 0.97 a step at β = 300)."""
    change = dmu / beta
    # (after an unsolved subproblem only for a violation above its certificate (22): below it
    # the violation may be the ADMM run's own inexactness, and a larger β makes the next run
    # harder still — `fedmodel run --clients 20` raised β 300 → 1e6 on violations 4.5e-5 beside
    # certificates 6e-2 and ended "infeasible" on a model CVXPY solves; an infeasible model's
    # violation stays above what the runs leave)
    if backend.beta_growth > 1 and change > backend.eps2 and change > 0.25 * last_change \
            and (not history or _solved(history[-1]) or change > history[-1].get("certificate", 0.0)):
        return min(backend.beta_growth * beta, beta_cap(backend)), change
    # under Newton steps, β from the server's Hessian reading (`proxal_certificate.beta_for`)
    jump = history and change <= backend.eps2 and _solved(history[-1]) and backend.beta_growth > 1 \
        and proxal_certificate.beta_for(backend, beta, history[-1],
                                        MARGIN * getattr(backend, "dist_tol", np.inf) * _reach(history[-1]))
    if jump:
        return jump, change
    # (the contraction is read only from a solved subproblem, (23) met: an ADMM run stopped by
    # its stall rule or max_inner leaves a step that says nothing of the curvature — on the
    # sweep's np-barely seed 0 (docs/BENCHMARKS.md) two such steps, 1.9e-5 then 2.1e-5 at a
    # violation of 1e-7, raised β 1.9e4 → 1e6, the ADMM could not solve at that β and the run
    # walked off its answer to end "stalled" 0.22 away after 11,899 round trips)
    if backend.beta_growth > 1 and history and getattr(backend, "dist_tol", np.inf) < np.inf \
            and change <= backend.eps2 and _solved(history[-1]) \
            and SLOW_CONTRACTION < contraction(history) < np.inf \
            and not _still(history, backend.dist_tol):
        return max(beta, min(backend.beta_growth * beta, slow_rise_cap(backend, history))), change
    return beta, change


def _solved(record: dict) -> bool:
    """The outer iteration's subproblem met (23): its last certificate ≤ its τ_k (records
    saved before they held both: True)."""
    return record.get("certificate", 0.0) <= record.get("tau", np.inf)


def contraction(history: list[dict]) -> float:
    """How much the outer steps shrink: the larger of the last two ratios ‖Δw_k‖₂/‖Δw_{k−1}‖₂
    taken at one β (∞ with fewer such steps). Algorithm 1 is a proximal point method with
    weight 1/β_k: along a direction of curvature μ its steps shrink by 1/(1 + β_k μ), so on a
    flat model (a small ridge, many features) they shrink slowly and the distance still to go,
    Σ of the remaining steps, is many times the last one."""
    recent = [r for r in history[-3:] if r["beta"] == history[-1]["beta"]]
    ratios = [_ratio(a, b) for a, b in zip(recent, recent[1:])]
    return max(ratios) if ratios else np.inf


ROUNDOFF = 1e-10      # a step this small relative to ‖w‖₂ is round-off: the iteration stood still


def _ratio(a: dict, b: dict) -> float:
    """‖Δw‖₂ of record b over record a's (∞ without steps); 0 when b's step is at round-off
    level: at a vertex or on an active set the proximal steps fall to 10⁻¹⁷ at once, and the
    noise after it (1e-17, 2e-17) must not read as growing steps."""
    if "step" not in a or "step" not in b:
        return np.inf
    if b["step"] <= ROUNDOFF * max(b.get("size", 0.0), a["step"]):
        return 0.0
    return b["step"] / a["step"] if a["step"] > 0 else np.inf


def curvature(history: list[dict], window: int = 6) -> float:
    """An estimate of the objective's curvature μ near the answer from the outer steps: a
    proximal point step with weight 1/β shrinks the steps by r = 1/(1 + βμ), so
    μ = (1/r − 1)/β; the smallest over the last `window` pairs of steps at one β (0 when a step
    grew or is unknown). Steps the inner loop barely moved (its certificate met on arrival)
    shrink for no reason of the model, so the smallest, not the last, is kept."""
    recent = history[-window - 1:]
    estimates = []
    for a, b in zip(recent, recent[1:]):
        r = _ratio(a, b)
        if a["beta"] == b["beta"] and r > 0:         # (r = 0: round-off, no reading)
            estimates.append((1.0 / r - 1.0) / b["beta"] if r < 1 else 0.0)
    return min(estimates) if estimates else 0.0


def distance_left(history: list[dict], dimension: int) -> float:
    """An estimate of ‖w_k − w*‖₂ from the outer records: ‖∇f(w_k)‖₂/μ with ∇f(w_k) =
    ∇ℓ_k(w_k) − Δw_k/β_k, ‖∇ℓ_k(w_k)‖∞ ≤ τ_k by (23) (so ‖·‖₂ ≤ √d τ_k) and μ = `curvature`:
    (‖Δw_k‖₂/β_k + √d τ_k)/μ (∞ while μ is unknown). (11) alone bounds the stationarity
    ‖Δw‖∞/β_k + τ_k, which allows a distance of order ε1/μ: 6 % on the a9a model with hashed
    pairs (d = 16,507, ridge 10⁻³, docs/BENCHMARKS.md) while the objective was within 3e-4."""
    last = history[-1]
    mu = curvature(history)
    gradient = last.get("step", np.inf) / last["beta"] + np.sqrt(dimension) * last["tau"]
    return gradient / mu if mu > 0 else np.inf


def _reach(record: dict) -> float:
    """‖w‖₂ as the distance test reads it: times the record's `common.user_metric`."""
    return record.get("size", 0.0) * record.get("metric", 1.0)


def _near(backend, history: list[dict], ex=None, info: dict | None = None) -> bool:
    """The distance test beside (11): `distance_left` ≤ dist_tol·‖w‖₂ (`_reach`: in the user's
    units), or the standstill (`_still`) where the steps say why they stand still (`_explained`),
    at w = 0 (exact steps of 0: a lasso's answer 0, which no bound relative to ‖w‖ can meet),
    or the nodes' curvature (`proxal_flat.reading`, on `ex`) does not refute it: a positive
    curvature whose bound fails (none, or one ≤ 0 — a concave model's maximum, which
    `finish_result`'s second-order check then calls "stalled" — bounds nothing) (always true
    without a finite dist_tol: cProx-AL, `ProxAL.paper()`)."""
    tol = getattr(backend, "dist_tol", np.inf)
    if tol == np.inf or distance_left(history, history[-1]["dimension"]) <= tol * _reach(history[-1]):
        return True
    return _still(history, tol) and (_explained(history) or not _reach(history[-1]) > 0
                                     or proxal_flat.reading(backend, ex, history, info or {}) is not False
                                     or not history[-1].get("nodes_curvature", 0.0) > 0)


def _distance_met(backend, history: list[dict], ex, info: dict, x: np.ndarray) -> bool:
    """The distance test beside (11), where the server has the summed Hessian (`proxal_certificate`)
    its bound ≤ MARGIN·dist_tol·‖w‖₂ (`_reach`) alone: under Newton steps the subproblem's last
    one, under Algorithm 2 the clients' asked at x where they fit (`confirmed`, a round trip).
    The step-history curvature and the nodes' (`_near`, `proxal_flat`), which decide elsewhere,
    read 0.024 on a collinear model whose least is 7.6e-8 and let it stop 0.75 off."""
    last, tol = history[-1], getattr(backend, "dist_tol", np.inf)
    if tol < np.inf and np.isfinite(last.get("newton_distance", np.inf)):
        target = MARGIN * tol * _reach(last)      # (and where its step lands: `landed`)
        return proxal_certificate.landed(backend, ex, x, last, target) is not False and last["newton_distance"] <= target
    found = proxal_certificate.confirmed(backend, ex, x, last, MARGIN * tol * _reach(last)) if tol < np.inf else None
    if found is not None:
        return found
    return _near(backend, history, ex, info) or proxal_flat.near(backend, ex, history, info, _near, curvature)


def _explained(history: list[dict]) -> bool:
    """The standstill's last two steps follow the multipliers (both moved: an active constraint
    of the augmented Lagrangian, whose updates the steps track) or are round-off after ADMM
    runs of more than SHORT iterations (the fixed point itself: a vertex, an active set). Else
    a standstill shows only that the runs met (23) on arrival, ‖∇f(w)‖ ≲ τ_k, which leaves
    √d τ_k/μ to go along a direction of curvature μ: raw power-plant data with an intercept
    beside the pressure column (~1013 ± 6; equilibrated eigenvalues 2.3e-6 … 0.98) stood still
    at β_max, steps 3e-6 of ‖w‖₂ = 4.7, 1.4e-2 from the answer in the user's units."""
    last = history[-2:]
    return all(r.get("multiplier_change", 0.0) > 0 for r in last) \
        or all(r.get("step", np.inf) <= ROUNDOFF * r.get("size", 0.0) and r.get("inner", 0) > SHORT for r in last)


def settled(backend, record: dict) -> bool:
    """The multipliers' test beside (11): the complementarity Σ_j |μ_j c_j(w)| the nodes report
    ("proxal_report", μ just updated) ≤ dist_tol × the objective's size. At a point stationary
    for the Lagrangian at μ ≥ 0 (what (11)'s first test certifies) weak duality gives
    f(w) − f* ≤ −μᵀc(w) + (stationarity)·‖w − w*‖, so this bounds the objective still to go.
    (11)'s ‖Δμ‖∞ ≤ β_k ε2 only asks |c_j| ≤ ε2, and a step moves μ_j by β_k|c_j|: multipliers
    still on their way pass it (bench_verdicts' np-barely seed 5, CVXPY's μ 3.4–37: (11) at β =
    1.9e4 with ‖Δμ‖∞ 0.033 → 0.14 → 0.53 → 1.5 a step, 1.05e-3 above CVXPY's objective, its
    complementarity 1.05e-3·|f|, f equilibrated; 8.6e-5·|f| three steps later, stopped at outer
    11, 1e-5 from CVXPY's). True without a finite dist_tol (`ProxAL.paper()`) or the nodes' reading."""
    tol = getattr(backend, "dist_tol", np.inf)
    if tol == np.inf or "complementarity" not in record:
        return True
    scale = max(abs(record["objective"]), sum(map(abs, record.get("client_objective", {}).values())), backend.eps1)
    return record["complementarity"] <= tol * scale


# (11)'s stationarity bound ‖Δ(w, y)‖∞/β_k + τ_k at most this fraction of the gradients' size
# at the point (`relative`): a tenth of fm.verify's default rtol
RELATIVE = 1e-4


def relative(backend, record: dict) -> bool:
    """The stationarity (11) bounds, ‖Δ(w, y)‖∞/β_k + τ_k, ≤ RELATIVE × the size of the
    objective's gradients at the point, as the nodes report it ("proxal_report":
    `proxal_nodes.gradient_scale`, the scale fm.verify's relative stationarity divides by).
    (11)'s ε1 is absolute in the equilibrated units, whose objective scale the compiler reads
    at the origin (fedmodel/compiler/scaling.py); a saturated loss (logistic on separable data
    in units of 10³, tests/test_proxal_saturated.py) has gradients 10⁶ smaller near its answer
    than there, and (11) and the distance test's standstill held at loose τ_k, one-iteration
    ADMM runs, 53 % from the optimum. True without a finite dist_tol (`ProxAL.paper()`: (11)
    alone), without the nodes' reading (cProx-AL) or where every gradient is 0 (x stationary
    for every f_i: nothing to be relative to)."""
    if getattr(backend, "dist_tol", np.inf) == np.inf or not record.get("gradient_scale", 0.0) > 0:
        return True
    return record["primal_change"] / record["beta"] + record["tau"] <= RELATIVE * record["gradient_scale"]


def _still(history: list[dict], tol: float) -> bool:
    """The last two outer steps were each ≤ tol/100 of ‖w‖₂: the iterates stand still whatever
    the contraction reads. On an active constraint the steps follow the multiplier updates
    (10⁻¹⁷, then 6e-7, 3e-7, 1e-7 on bench_rounds' logistic-ball model with its ball in the
    augmented Lagrangian) and say nothing of the curvature, but they are far below the
    tolerance. Not when those two subproblems were solved to a τ_k above LOOSER × the least
    τ_k before them: an ADMM run whose certificate (23) holds after an iteration or two leaves w
    where it was, so that standstill shows the tolerance (880-fold smaller steps after τ_k rose on
    a saturated loss, tests/test_proxal_saturated.py) — unless both runs took more than SHORT
    iterations on steps modulo the flat directions (`proxal_flat`; NP monks-1 n = 5: τ_k stayed
    above LOOSER× for 60 outer iterations of 10–90-iteration runs after rising at outer 17)."""
    if len(history) < 2 or not all(r.get("step", np.inf) <= 1e-2 * tol * _reach(r) for r in history[-2:]):
        return False
    worked = all(r.get("across") and r["inner"] > SHORT for r in history[-2:])
    return len(history) == 2 or worked or max(r["tau"] for r in history[-2:]) <= LOOSER * min(r["tau"] for r in history[:-2])


LOOSER, SHORT = 10.0, 2   # (`_still`) the τ_k rise above which a standstill shows nothing; a short run


VERDICTS = {"infeasible": "the largest violation stayed at {v:.3g} while the multipliers grew "
                          "(a solution's would be ≥ {m:.3g} in norm): the model is "
                          "infeasible (no point satisfies every constraint); "
                          "the returned point is the least violating one found",
            "stalled": "the violation stayed above ε2 (at {v:.3g}) at β = β_max: the model may be "
                       "infeasible or badly scaled (fm.verify with a CVXPY reference can tell)",
            "unbounded": "the objective fell by about the same amount at each of the last {k} "
                         "outer iterations (now {o:.4g}) while the iterates moved without slowing: "
                         "the model is unbounded below"}


def outer_stop(backend, history: list[dict], ex, x: np.ndarray, info: dict,
               solved: bool = True) -> str | None:
    """Why the outer loop stops after its last record, or None. "converged": the stop rule (11)
    with that iteration's β_k, τ_k, ‖Δ(w, y)‖∞ and ‖Δμ‖∞ — it certifies a KKT point only if the
    subproblem was solved to τ_k (`solved`: (23) held; an inner loop stopped by max_inner
    leaves w barely moved and (11) would hold vacuously). Else the verdict (`verdict`):
    "infeasible", "stalled" or "unbounded" ("diverged": `runaway`), with `info` saying why and
    naming every node's constraints violated at x (message "proxal_violations"). `proxal_flat.near`: modulo N."""
    last = history[-1]
    beta, tau = last["beta"], last["tau"]
    proxal_flat.track(ex, history, x)
    newton = getattr(getattr(backend, "inner", None), "reading", None)
    found = newton(ex, x) if callable(newton) else None
    if found is not None:
        last.update(newton_distance=found["distance"], newton_curvature=found["curvature"],
                    newton_gradient=found["gradient"], newton_flat=found.get("flat", 0.0))
    away = newton is not None and getattr(backend, "dist_tol", np.inf) < np.inf and runaway(history, backend.eps2)
    if solved and not away and last["primal_change"] + beta * tau <= beta * backend.eps1 \
            and last["multiplier_change"] <= beta * backend.eps2 \
            and settled(backend, last) and relative(backend, last) \
            and _distance_met(backend, history, ex, info, x) \
            and private_settled(backend, history, ex, _still, distance_left):
        return hints(backend, history, info, Status.CONVERGED)
    found = Status.DIVERGED if away else verdict(history, backend.beta_growth, beta_cap(backend), backend.eps1,
                                                 backend.eps2, getattr(backend, "known_feasible", False))
    if found == Status.DIVERGED:        # (feasible: no constraint to name)
        return _conclude(found, history, {}, info, RUNAWAY) or found
    if found:
        replies = ex.map("proxal_violations", {node: {"x": x, "tol": backend.eps2} for node in ex.nodes})
        violated = {name: v for r in replies.values() for name, v in r["violated"].items()}
        found, template = slack_verdict(found, {n for r in replies.values() for n in r["slack_met"]}, violated)
        _conclude(found, history, violated, info, template)
    return hints(backend, history, info, found)


def _conclude(status: str, history: list[dict], violated: dict[str, float], info: dict,
              template: str | None = None) -> None:
    """info[status] (a readable message: `template`, else VERDICTS') and info["violated"] for a
    detected verdict; warns, attributed to the caller of the backend's `run`."""
    last = history[-1]
    message = (template or VERDICTS[status]).format(v=last["violation"], k=len(history), o=last["objective"],
                                      m=needed_multipliers(history))
    info[status] = f"stopped after {len(history)} outer iterations: {message}"
    if violated:
        info["violated"] = dict(sorted(violated.items(), key=lambda item: -item[1]))
        info[status] += "; violated: " + ", ".join(f"{name} (by {v:.3g})" for name, v in
                                                    list(info["violated"].items())[:5])
    warnings.warn(info[status], RuntimeWarning, stacklevel=4)


def outer_record(ex, w, k, trace, tau, dw, dmu, start, reports: dict | None = None) -> dict:
    """Outer iteration k's record: objective and violation reported by the nodes at w
    (`reports`: their replies, by node, already got)."""
    if reports is None:
        reports = ex.map("report", {node: {"x": w} for node in ex.nodes})
    record = {"iteration": k + 1, "objective": sum(r["objective"] for r in reports.values()),
              "violation": max(r["violation"] for r in reports.values()),
              "client_objective": {c: reports[c]["objective"] for c in ex.clients},
              "client_violation": {c: reports[c]["violation"] for c in ex.clients},
              "inner": len(trace), "certificate": trace[-1], "inner_certificates": trace, "tau": tau,
              "primal_change": dw, "multiplier_change": dmu, "time": time.perf_counter() - start}
    if all("complementarity" in r for r in reports.values()):     # ("proxal_report": `settled`)
        record["complementarity"] = sum(r["complementarity"] for r in reports.values())
    if all("gradient_scale" in r for r in reports.values()):      # (`relative`)
        record["gradient_scale"] = sum(r["gradient_scale"] for r in reports.values())
    if all("private_step" in r for r in reports.values()):       # (`proxal_private`)
        record["private_step"] = max(r["private_step"] for r in reports.values())
    return record
