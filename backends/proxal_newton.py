"""ProxAL's subproblem by a federated (proximal) Newton method: `ProxAL(inner=NewtonInner())`.

Step 3 of ProxAL's Algorithm 1 (He, Peng, Sun) minimizes ℓ_k(w) = Σ_{i=1}^n P_{i,k}(w) +
P_{0,k}(w) + h(w). Algorithm 2 (consensus ADMM) needs ~30–40 round trips per subproblem, set by
the consensus's conditioning. For a small model size d, each client can instead send its
merit's value, gradient and Hessian at the server's point z (one round trip: 1 + d + d(d+1)/2
floats up, the d floats of z down; `proxal_newton_eval`); the server sums them, adds its own
P_0 and takes a proximal Newton step (Lee, Sun, Saunders 2014):

    u = argmin_u Gᵀ(u − z) + ½(u − z)ᵀH(u − z) + h(u)        (`proxal_newton_model`, on the server)

with h the server's prox terms (λ‖w‖₁, the sets it projects on) plus the clients' λ_i‖w‖₁
(their weights, summed, `proxal_newton_terms`); a backtracking (Armijo) line search on ℓ_k
along d = u − z, each trial point one round trip whose reply is also the next step's Hessian.
The certificate is (22)–(23)'s quantity itself, with no consensus residual (every client is at z):
dist∞(0, ∇(Σ_i P_i + P_0)(z) + ∂h(z)), the clients' ℓ1 subgradients and the server's prox terms
chosen term by term (`NodeProgram.prox_remainder`): an upper bound on the distance at a point of
the server's sets — each subproblem starts from w_k projected on them (`proxal_newton_start`), and
the steps stay there — so (23) certifies as Algorithm 2's does. Newton is indifferent to the
conditioning of ℓ_k (the inequalities' AL terms are piecewise quadratic: semismooth; the line
search keeps it globally convergent, ω > 0 makes ℓ_k strongly convex — for a convex model: on a
nonconvex one an indefinite H gives no descent and the run stands still, so `backend="auto"` picks
it only on convex models).

Scope (refused with a FedModelError naming the reason, `NewtonInner.refusal`): no private
variables but epigraph slacks, which their clients eliminate (`proxal_newton_slacks`; when all
do, the exact line search on their slopes, `proxal_newton_search`), clients' prox terms only λ‖w‖₁, and a step's dense
d × d matrices within the dense Newton budget (`solvers.DENSE_NEWTON_FLOATS`, `matrices_held`: the clients' replies are summed as
they come, `Executor.map_sum`; n of them more where an executor gathers them first). The clients'
data-free balls and bounds go to the server (`sets_to_server`; `projecting.data_free_client_sets`,
as FedAvg's), whose prox projects on them in the model step, as on sets without a smooth form
(`program.moved_to_server`); the clients' other constraints are AL terms
(`ProxAL._projects_client_sets` is off with an inner).
"""
from __future__ import annotations

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime import solvers
from fedmodel.runtime.batched_group import Group, broadcast_rows, private_stack
from fedmodel.runtime.batched_procedures import common_value
from fedmodel.runtime.client_step import client_step
from fedmodel.runtime.hessian_sum import hessian_sum
from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram
from .projecting import data_free_client_sets
from . import proxal_certificate, proxal_newton_slacks as slacks
from .proxal_certificate import across_client_kinks, beyond_kinks, reading_past_kinks
from .proxal_newton_model import (MODEL_TOL, TRIALS, matrices_held, model_minimizer, prox_value as _prox_value,
                                  server_value, unpack_symmetric, upper_mask)
from .proxal_newton_search import ARMIJO, POINTS, exact_search, server_slopes
from .proxal_newton_sets import l1_remainder as _l1_remainder, l1_weights as _l1_weights, newton_set_multipliers

MAX_HALVINGS = 4        # batches of TRIALS shorter steps per Newton step before the run gives up
# a full step whose decrease was the quadratic model's Δ/2 less this fraction or more (NP adult's
# AL steps far from the constraint: 1.2–1.3×): the next full step is asked without the shorter
# steps' values (each a value of every client's merit: NP adult's 20 trial batches → 5, CPU −17 %).
# 0.05 keeps bench_verdicts' round trips (0.1: np seed 0 63 → 64; a certificate cut by 2×: 67)
CONFIDENT = 0.05


# ---- node steps ---------------------------------------------------------------------------------
@client_step("proxal_newton_eval", {"x": "x", "beta": "1", "prox_weight": "1", "direction": "x",
                                    "offsets": f"<={POINTS}"},
             {"value": "1", "grad": "x", "hessian": "tri", "values": f"<={POINTS}", "slopes": f"<={POINTS}"})
def _evaluate(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """P_i(z) + λ_i‖z‖₁, ∇P_i(z) and the upper triangle of ∇²P_i(z) of the members at the one z
    they were sent (None, served one by one, when they were sent different points); with
    `beta` and `prox_weight` P_{i,k} (13) configured first, center z (one message); with
    `direction` d and `offsets` o_j (the same for every member) also P_i + λ_i‖·‖₁ at z + o_j·d
    (`values`; and `slopes` where clients eliminate slacks). Summed: `_evaluate_sum`."""
    if (found := _configured(group, members, payloads)) is None:
        return None
    z, rows, X, Y = found
    if group.n_y:                        # clients eliminating their epigraph slacks
        return slacks.group_replies(group, members, rows, z, payloads[members[0]], summed=False)
    values, G = group.value_grad(X, Y)
    H = group.hessian(X, Y, rows)
    upper = upper_mask(group.n_x)        # (the index pairs' order, a third of their time)
    replies = {m: {"value": float(values[r]) + _prox_value(group.programs[r], z), "grad": G[r, :group.n_x].copy(),
                   "hessian": H[k][upper]} for k, (m, r) in enumerate(zip(members, rows))}
    trials = _trial_values(group, payloads[members[0]], z, Y, rows)
    for k, m in enumerate(members if trials is not None else ()):
        replies[m]["values"] = trials[k]
    return replies


def _evaluate_sum(group: Group, members: list[str], payloads: dict, fields) -> dict | None:
    """`_evaluate`'s replies summed over the members (`map_sum` on the batched executor)."""
    if (found := _configured(group, members, payloads)) is None:
        return None
    z, rows, X, Y = found
    if group.n_y:
        return slacks.group_replies(group, members, rows, z, payloads[members[0]], summed=True)
    values, G = group.value_grad(X, Y)
    total = {"value": float(sum(values[r] + _prox_value(group.programs[r], z) for r in rows)),
             "grad": G[rows, :group.n_x].sum(axis=0), "hessian": hessian_sum(group, X, Y, rows)[upper_mask(group.n_x)]}
    trials = _trial_values(group, payloads[members[0]], z, Y, rows)
    if trials is not None:
        total["values"] = trials.sum(axis=0)
    return total


_evaluate.summed = _evaluate_sum        # (`BatchedExecutor._summed`)


def _configured(group: Group, members: list[str], payloads: dict):
    """(z, rows, X, Y) of a request `_evaluate` covers, P_{i,k} configured first; else None."""
    z, first = common_value(payloads, members, "x"), payloads[members[0]]
    if z is None or (first.get("direction") is not None and (
            any(payloads[m].get("direction") is None for m in members)
            or common_value(payloads, members, "direction") is None
            or common_value(payloads, members, "offsets") is None)):
        return None
    rows = np.array([group.index[m] for m in members])
    if any(payloads[m].get("beta") is not None for m in members):
        for m, r in zip(members, rows):
            if payloads[m].get("beta") is not None:
                group.programs[r].configure(beta=payloads[m]["beta"], prox_weight=payloads[m]["prox_weight"],
                                            center=z)
        group.forget()
    return z, rows, broadcast_rows(z, group.n, group.n_x), private_stack(group)


def _trial_values(group: Group, request: dict, z: np.ndarray, Y: np.ndarray, rows) -> np.ndarray | None:
    """P_i + λ_i‖·‖₁ of the members `rows` at z + o_j·d for the request's `direction` d and
    `offsets` o_j: (members, offsets); None without a direction."""
    if request.get("direction") is None:
        return None
    d, offsets = np.asarray(request["direction"], float), np.ravel(np.asarray(request["offsets"], float))
    trials = [z + o * d for o in offsets]
    at = np.array([group.value(broadcast_rows(x, group.n, group.n_x), Y) for x in trials])  # (values alone)
    return np.array([at[:, r] + np.array([_prox_value(group.programs[r], x) for x in trials]) for r in rows])


@procedure("proxal_newton_terms", {}, {"l1": "x", "refusal": "str", "constraints": "1", "slacks": "1"},
           local=True, read_only=True)
def _terms(program: NodeProgram) -> dict:
    """What the Newton inner needs to know of a node before its first step: its λ‖w‖₁ weights
    per entry (a model term, no data), why it cannot take part ("" when it can) and how many
    constraints its augmented Lagrangian holds (`NewtonInner.jump_cap`), and its slacks."""
    refusal = slacks.program_refusal(program)
    if not refusal and program.role == "client" and any(t.kind != "norm1" or t.kinked is not None or t.constraint is not None
                                          for t in program.merit_ir.prox_terms):
        refusal = f"client {program.name!r} has a nonsmooth term other than λ‖w‖₁"
    return {"l1": _l1_weights(program) if program.role == "client" else np.zeros(program.n_shared),
            "refusal": refusal, "constraints": float(len(program.merit_ir.constraints)),
            "slacks": float(program.n_private)}


@procedure("proxal_newton_step", {"x": "x", "grad": "x", "hessian": "tri", "l1": "x", "tau": "1", "centers": "x",
                                   "weight": "1"},
           {"x": "x", "certificate": "1", "decrease": "1", "distance": "1", "curvature": "1", "gradient": "1",
            "landing": "x", "flat": "1"},
           local=True, read_only=True)
def _server_step(program: NodeProgram, x, grad, hessian, l1, tau, centers=None, weight=None) -> dict:
    """The server's part of a Newton step at z = x, given the clients' summed gradient and
    Hessian and ℓ1 weights: it adds its own P_0's, computes the certificate
    dist∞(0, ∇ℓ_k(z) + ∂h(z)) (upper bound, term by term) and, when it is above τ_k, the
    model's minimizer u with the predicted decrease Δ = Gᵀ(u − z) + h(u) − h(z) (< 0 for a
    descent direction). With the nodes' prox `centers` and `weight` (Σ_j ω c_j, (n + 1)ω), at
    a point that meets τ_k (or τ_k = ∞): the distance to the problem's minimizer at μ_k the
    summed Hessian bounds (`proxal_certificate.reading`; else ∞, curvature 0)."""
    z, l1 = np.asarray(x, float), np.asarray(l1, float)
    _, g0 = program.value_grad(z, program.y)
    G = np.asarray(grad, float) + g0[:program.n_shared]
    remainder = program.prox_remainder(z, _l1_remainder(z, G, l1))
    certificate = float(np.max(np.abs(remainder), initial=0.0))
    H = unpack_symmetric(np.asarray(hessian, float), z.size) + program.hessian(z)
    found = {"distance": np.inf, "curvature": 0.0, "gradient": np.inf}
    if weight is not None and (not certificate > tau or tau in (0.0, np.inf)):
        found = reading_past_kinks(program, z, G, H, l1, np.asarray(centers, float), float(weight), _l1_remainder)
    if not np.isfinite(certificate) or certificate <= tau:
        return {"x": z, "certificate": certificate, "decrease": 0.0, **found}
    u = model_minimizer(program, z, G, H, l1, MODEL_TOL * min(tau, certificate))
    beyond = beyond_kinks(program, z, G, H, u)
    if beyond is not None:
        v = model_minimizer(program, z, *beyond, l1, MODEL_TOL * min(tau, certificate))
        u = v if np.all(np.isfinite(v)) and float(G @ (v - z)) < 0 else u
    h = (lambda v: _prox_value(program, v) + float(l1 @ np.abs(v)))
    return {"x": u, "certificate": certificate, "decrease": float(G @ (u - z)) + h(u) - h(z), **found}


@procedure("proxal_newton_start", {"x": "x"}, {"x": "x"}, local=True, read_only=True)
def _start(program: NodeProgram, x) -> dict:
    """x projected on the server's sets (its prox terms at weight 0: sets project, λ‖w‖₁ is the
    identity)."""
    z = np.asarray(x, float)
    return {"x": program.apply_prox(z, 0.0)[:program.n_shared] if program.merit_ir.prox_terms else z.copy()}


PROCEDURES = (_evaluate, _terms, slacks.settle, server_slopes, _server_step, server_value, _start,
              newton_set_multipliers, *proxal_certificate.PROCEDURES)


def server_sets(problem) -> list:
    """The clients' data-free balls and bounds the server projects on (`sets_to_server`;
    FedAvg's, `projecting.data_free_client_sets`)."""
    return data_free_client_sets(problem)


def _prox_sums(w: np.ndarray, z: np.ndarray, n: int, settings: dict | None) -> dict:
    """The proximal terms of (13)–(14) summed over the nodes, for the distance reading: centers
    w_k (server) and z (clients, `_evaluate`), weight ω each ({} without `settings`)."""
    if not settings or "prox_weight" not in settings:
        return {}
    omega = float(settings["prox_weight"])
    return {"centers": omega * (np.asarray(w, float) + n * z), "weight": (n + 1) * omega}


# ---- the server's loop --------------------------------------------------------------------------
class NewtonInner:
    """ProxAL's subproblem solver by federated proximal Newton steps (module docstring):
    `ProxAL(inner=NewtonInner())`. Each step is one round trip (value, gradient and Hessian of
    every client's merit at the server's point; its floats are in the ledger) unless the line
    search halves it; `max_steps` Newton steps per subproblem at most."""

    procedures = PROCEDURES
    folds_configure = True      # ProxAL's "configure" rides on the first evaluation (`_evaluate`)
    # clients' data-free balls and bounds go to the server (`ProxAL.compile`), whose model step
    # projects on them: as AL terms their Hessian is 0 inside and β∇c∇cᵀ beyond, and from inside
    # every Newton step went out to be cut back (bench_rounds' logistic-ball n = 200: 40 round trips)
    sets_to_server = True
    # ProxAL's β cap with this inner (its `beta_max=None`): Newton is indifferent to the proximal
    # weight 1/β, so it may fall far below the objective's curvature (a9a ×1e3, ridge 1e-9
    # relative: max_iterations 6.6e-2 away at ProxAL's 1e6; converged at 1e12, 11 outer / 52 rt)
    beta_max = 1e12
    # its β growth: the AL's outer iterations are what is left to save (NP adult n = 5: 14 outer
    # / 81 round trips at ×4, 10 / 61 at ×100); and the constraint change "before" the first outer
    # iteration (`next_beta`): 0, β may rise after the first already (adult 44 → 39 round trips;
    # monks-1 n = 5 / 40: 64 / 82 → 58 / 74)
    beta_growth, first_change = 100.0, 0.0
    # β's cap for the rise on slow outer steps where the summed Hessian is singular (`slow_rise_cap`)
    singular_beta_max = 1e7
    # and for the reading's β jump where a merit holds AL constraints: their gradient carries β × g(w)'s
    # round-off (house prices, 2,000 rows, sum(w) ≥ 0: β 300 → 3e9, 3.1e-7 against τ 5.9e-8, 49 steps)
    constrained_beta_max = 1e7

    def __init__(self, max_steps: int = 50):
        if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
            raise FedModelError(f"NewtonInner: max_steps must be an integer ≥ 1, got {max_steps!r}")
        self.max_steps = int(max_steps)
        self._terms: tuple | None = None        # (executor, summed client ℓ1 weights)
        self._last: tuple | None = None         # (executor, last point, the clients' gradient there)
        self.last_reading: tuple | None = None  # (executor, point, distance reading): `reading`

    __repr__ = lambda self: f"NewtonInner(max_steps={self.max_steps})"  # noqa: E731

    def refusal(self, ex) -> str:
        """Why this run's nodes cannot take Newton steps ("" when they can): beyond the dense
        budget, private variables, a client's nonsmooth term other than λ‖w‖₁."""
        d, n = ex.model_size, len(ex.clients)
        held = matrices_held(n, ex.streams_sums)
        if not solvers.dense_fits(d, held):
            return (f"{held} dense {d} × {d} matrices ({n} clients) are beyond the dense Newton budget "
                    f"(fedmodel.runtime.solvers.DENSE_NEWTON_FLOATS = {solvers.DENSE_NEWTON_FLOATS:.3g})")
        replies = ex.map("proxal_newton_terms", {node: {} for node in ex.nodes})
        found = [r["refusal"] for r in replies.values() if r["refusal"]]
        self._terms = (ex, sum(replies[c]["l1"] for c in ex.clients) if ex.clients else np.zeros(d))
        self._constrained = any(r["constraints"] for r in replies.values())
        self._slacks = [c for c in ex.clients if replies[c]["slacks"]]
        return found[0] if found else ""

    def jump_cap(self) -> float:
        """β's cap for the distance reading's jump (`proxal_certificate.beta_for`)."""
        return self.constrained_beta_max if getattr(self, "_constrained", False) else self.beta_max

    def _evaluate(self, ex, z: np.ndarray, settings: dict | None = None, direction=None,
                  offsets=None) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """Σ_i of the clients' (P_i + λ_i‖·‖₁, ∇P_i, upper triangle of ∇²P_i) at z, and of their
        values at z + o_j·`direction` for the `offsets` o_j (one round trip; sums only,
        `map_sum`; `settings`: ProxAL's (β, ω), configured first), plus the server's P_0 + h."""
        d = ex.model_size
        request = {"x": z, **(settings or {})}
        if direction is not None:
            request.update(direction=direction, offsets=np.asarray(offsets, float))
        fields = ("value", "grad", "hessian") + (("values",) if direction is not None else ())
        if ex.clients:
            total = ex.map_sum("proxal_newton_eval", ex.clients, common=request, fields=fields)
        else:
            total = {"value": 0.0, "grad": np.zeros(d), "hessian": np.zeros(d * (d + 1) // 2),
                     "values": np.zeros(len(offsets if offsets is not None else ()))}
        mine = {k: v for k, v in request.items() if k not in (settings or {})}   # (ProxAL configured it)
        server = ex.call("server", "proxal_newton_value", **mine)
        values = np.asarray(total.get("values", ()), float) + np.asarray(server.get("values", ()), float)
        return (float(total["value"]) + server["value"], np.asarray(total["grad"], float),
                np.asarray(total["hessian"], float), values)

    def solve_subproblem(self, ex, w: np.ndarray, tau: float, rho: dict,
                         settings: dict | None = None) -> tuple[np.ndarray, list, dict]:
        """Step 3 of ProxAL's Algorithm 1 by proximal Newton steps from z = w_k projected on the
        server's sets to (23): (z, the certificate at each accepted point, `rho` unchanged);
        `settings` (β_k, ω_k): the clients configure P_{i,k} with the first evaluation. A
        FedModelError when the model is out of scope (`refusal`). It ends unsolved (certificate
        above τ_k) when a line search fails or `max_steps` pass."""
        if self._terms is None or self._terms[0] is not ex:
            reason = self.refusal(ex)
            if reason:
                self._terms = None
                raise FedModelError(f"ProxAL(inner=NewtonInner()): {reason}; use inner='admm' "
                                    "(Algorithm 2; ProxAL()'s default falls back to it)")
        l1 = self._terms[1]
        # from w_k's projection on the server's sets: the certificate reads a set's normal cone
        # only at its points (off the set, bounds read as active cancelled any gradient: no step)
        z = np.asarray(ex.call("server", "proxal_newton_start", x=w)["x"], float)
        value, grad, hessian, _ = self._evaluate(ex, z, settings)
        prox = _prox_sums(w, z, len(ex.clients), settings)
        trace: list[float] = []
        full = None             # the last full step's decrease over its model's (None: shorter)
        for _ in range(self.max_steps):
            step = ex.call("server", "proxal_newton_step", x=z, grad=grad, hessian=hessian, l1=l1, tau=tau, **prox)
            trace.append(step["certificate"])
            if not step["certificate"] > tau or not np.isfinite(value):
                break
            direction, decrease = step["x"] - z, step["decrease"]
            if not decrease < 0:            # the model sees no descent: round-off level
                break
            # the shorter steps' values ride along unless the last full step decreased ℓ as its model said
            trials = not full or full < 1.0 - CONFIDENT
            found = exact_search(ex, z, value, grad, direction, decrease, l1) if len(self._slacks) == len(ex.clients) > 0 else None
            found = found or self._line_search(ex, z, value, grad, hessian, direction, decrease, step["certificate"], l1, trials)
            if found is None:
                break
            full = found[0]
            z, value, grad, hessian = found[1:]
        else:
            step = ex.call("server", "proxal_newton_step", x=z, grad=grad, hessian=hessian, l1=l1, tau=np.inf, **prox)
            trace.append(step["certificate"])
        if self._slacks:        # the clients' slacks at their minimizer at z (the outer step reads them)
            ex.map("proxal_newton_settle", {c: {"x": z} for c in self._slacks})
        if prox and not np.isfinite(step["gradient"]):     # (the reading at z: read only when τ_k is met)
            step = ex.call("server", "proxal_newton_step", x=z, grad=grad, hessian=hessian, l1=l1, tau=np.inf, **prox)
        self.last_reading = (ex, z, {key: step[key] for key in ("distance", "curvature", "gradient", "landing", "flat")
                                     if key in step})
        self._last = (ex, z, grad)
        return z, trace, rho

    def reading(self, ex, x: np.ndarray) -> dict | None:
        """The distance reading of the last subproblem on `ex` (`proxal_certificate`) when it
        ended at x: {"distance", "curvature", "gradient"} (distance ∞: none at x), else None."""
        found = self.last_reading
        return None if found is None or found[0] is not ex or not np.array_equal(found[1], x) else found[2]

    def slow_rise_cap(self) -> float:
        """The largest β the outer loop's rise on slow steps may reach (`proxal_outer.next_beta`'s
        contraction rule): `beta_max` where the last subproblem's summed Hessian was positive
        definite (a distance read: a9a ×1e3 needs 1e12), else `singular_beta_max` (no β bends a
        flat direction; NP monks-1 n = 40: 3e6 → 3e8 wandered, 37 of 109 round trips); never above
        `jump_cap` (separable logistic ×1e3 at 3.1e8: a Hessian singular to round-off)."""
        found = self.last_reading
        cap = self.beta_max if found is not None and np.isfinite(found[2]["distance"]) else self.singular_beta_max
        return min(cap, self.jump_cap())

    def add_set_multipliers(self, ex, multipliers: dict) -> None:
        """The run's end (`ProxAL.conclude`): the multipliers of the sets the server projected
        on, from the last subproblem's last point (`proxal_newton_sets`), into `multipliers`."""
        if self._last is not None and self._last[0] is ex and self._terms is not None:
            _, z, grad = self._last
            multipliers.update(ex.call("server", "proxal_newton_set_multipliers", x=z, grad=grad,
                                       l1=self._terms[1])["multipliers"])
        self._last = self._terms = self.last_reading = None    # (the run's executor and programs not kept past it)

    def _line_search(self, ex, z, value, grad, hessian, direction, decrease, certificate, l1, trials=True):
        """Armijo backtracking along `direction` from z: the full step z + d evaluated (value,
        gradient, Hessian) with the values at the TRIALS shorter steps 2^-j in the same message
        (`trials`; else a failed full step costs a round trip more); if it fails, the passing
        shorter step of least value is evaluated, else the next TRIALS shorter ones. Returns
        (the full step's decrease over its model's Δ/2, None for a shorter step; the accepted z,
        value, gradient, Hessian), or None. A full step within round-off of ℓ_k(z) passes when
        its certificate is smaller; a failed one across a client's kink first tries their
        branch's step (`across_client_kinks`)."""
        t, shorter = 1.0, 0.5 ** np.arange(1, TRIALS + 1)
        for _ in range(MAX_HALVINGS + (not trials)):
            trial = z + t * direction
            found = self._evaluate(ex, trial, direction=direction, offsets=t * shorter - t) if trials or t < 1.0 \
                else self._evaluate(ex, trial)
            # a full step's decrease over the model's, Δ/2 (1 where the quadratic model holds)
            full = (found[0] - value) / (0.5 * decrease) if t == 1.0 and decrease < 0 else None
            if found[0] <= value + ARMIJO * t * decrease:
                return (full, trial, *found[:3])
            if t == 1.0 and found[0] <= value + 1e-13 * max(1.0, abs(value)):
                again = ex.call("server", "proxal_newton_step", x=trial, grad=found[1], hessian=found[2],
                                l1=l1, tau=np.inf)["certificate"]
                if again < certificate:
                    return (full, trial, *found[:3])
            far = across_client_kinks(ex, z, grad, hessian, trial, found, l1) if t == 1.0 else None
            if far is not None and (there := self._evaluate(ex, far[0]))[0] <= value + ARMIJO * far[1]:
                return (None, far[0], *there[:3])
            if not found[3].size:       # (none asked: the next message asks them, from 1/2)
                t = 0.5
                continue
            steps = t * shorter
            passed = found[3] <= value + ARMIJO * steps * decrease
            if np.any(passed):
                best = steps[passed][np.argmin(found[3][passed])]
                trial = z + best * direction
                return (None, trial, *self._evaluate(ex, trial)[:3])
            t = steps[-1] * 0.5
        return None
