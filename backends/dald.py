"""DALD: distributed augmented-Lagrangian decomposition (Guo, Qu, Pan, Huang, "Distributed
optimization: designed for federated learning"). Equation numbers refer to that paper
(../shared/seeds/dald_distributed_al_decomposition.txt); see ../shared/spec/dald.md.

Fed-DALD-CC (Algorithm 2, star): clients solve (13) in parallel, the server takes the closed
form (29) (or, when the server block has terms/constraints, the exact argmin of (14) plus its own
terms), the multipliers take step (15) μ_i += 2ρ_i∘ρ_i∘(x̂ − x_i).
Fed-DALD-DC (Algorithm 3, any other connected graph): nodes solve (20) one after another in the
coordination sequence S (Gauss–Seidel; nodes with no edge between them run in one parallel
batch), each edge {i, j} with i before j in S carries C_ij = x_i − x_j and μ_ij, updated by (21).

Penalty convention exactly as the paper: ‖ρ∘C‖² with per-coordinate ρ vectors, μ += 2ρ∘ρ∘C.
In the node's local problem this is `linear`ᵀx + ½Σ_j weight_j (x_j − anchor_j)² with
weight = Σ 2ρ∘ρ (completing the square), solved by `NodeProgram.solve_local`.

Inner stop rules (§2.5): B1 ‖D‖∞ ≤ ε_dual; B2 ‖D‖∞ ≤ ε_dual^k; B3 v = v_max^k or ‖D‖∞ ≤ ε_dual;
B4 v = v_max or ‖D‖∞ ≤ ε_dual (paper default, v_max = 1). Outer stop: ‖C‖∞ ≤ ε_pri and
‖D‖∞ ≤ ε_dual (and the nodes' own constraint residuals ≤ ε_pri). The B2 / B3 schedules
(ε_dual^k = max(ε_dual, ε₀θ^k), v_max^k = v_max + k) are NOT from the paper (it gives none).

Constraints: a node's own constraints enter its merit P_i as augmented-Lagrangian terms with
penalty β (default β = 2ρ², the paper's ‖ρ∘h‖² ⇔ (β/2)‖h‖²); their multipliers are updated
by the owner at every outer step (Step 2) with `update_multipliers`. Global (server-block)
constraints and terms on a peer-to-peer graph: the server block's program becomes one more DC
node, co-located with a designated client (`server_host`, default: the last client of S), joined
to it by one consensus edge and solved right after it in S.

Messages between peers are relayed by the coordinator (the executor has no peer-to-peer
channel), so the ledger books a peer message i → j as coordinator → j.

The node side (solver layer and the procedures behind the messages) is in dald_nodes.py. The
coordinator keeps the clients' models as one (n, d) array and sends each request to all clients
as one group request (`Executor.map_stacked`; a DC inner iteration is one `Executor.sweep`),
so the batched executor can serve it as one block; the serial and Ray executors split it into
the same per-node messages.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Sequence

import networkx as nx
import numpy as np

from fedmodel.errors import FedModelError, TopologyError
from fedmodel.runtime import kernels, make_executor
from fedmodel.runtime.checkpoint import NO_CHECKPOINT, Checkpointer
from fedmodel.runtime.program import compile_programs
from . import dald_nodes  # noqa: F401  (the node-side procedures: solver layer, (13), (15), (20), (21))
from .base import Backend, violated_constraints
from .watch import DivergenceWatch
from .common import check_callable, check_choice, check_count, check_number, gather_values, progress

SOLVERS = ("auto", "exact", "gd", "newton", "prox-grad")
RULES = ("B1", "B2", "B3", "B4")
# `DALD.paper()`: the paper's exact setting. The constructor's defaults differ in three ways, for
# speed and robustness: adaptive ρ on a star (residual balancing; no fixed ρ is good for every
# model's scale: ρ = 1 needs 68 iterations on a lasso but > 3000 on a logistic model where ρ = 0.1
# needs 94), ε = 1e-6 (ε = 1e-5 stops 2e-4 away from CVXPY there), and stall detection.
PAPER_DALD = dict(rho=1.0, inner_rule="B4", v_max=1, eps_primal=1e-5, eps_dual=1e-5, step=1e-4,
                  local_steps=1, max_iterations=1000, stall_window=None, adaptive_rho=False)




def _weighted_sum(RHO2, A, uniform) -> np.ndarray:
    """Σ_i ρ_i∘ρ_i∘a_i over the rows of A."""
    if uniform:
        return RHO2[0] * A.sum(axis=0)
    return (RHO2 * A).sum(axis=0)


def _check_rho(rho) -> None:
    """ρ: a positive scalar, a vector of positive entries (one per model coordinate), or a dict
    client → ρ_i (CC) / edge (u, v) → ρ_uv (DC) of those (0 only for the μ ≡ 0 special cases)."""
    values = rho.values() if isinstance(rho, dict) else [rho]
    for value in values:
        try:
            array = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            array = None
        if array is None or array.ndim > 1 or array.size == 0 or isinstance(value, (bool, str)) \
                or not np.all(np.isfinite(array)) or np.any(array < 0):
            raise FedModelError(
                f"rho must be positive and finite: a scalar, a vector with one entry per model "
                f"coordinate, or a dict client → ρ_i (star) / edge (u, v) → ρ_uv (other graphs); "
                f"got {value!r}")


def _check_options(o: dict) -> None:
    """Every DALD option, checked when the backend is built (FedModelError naming the option)."""
    _check_rho(o["rho"])
    check_choice("inner_rule", o["inner_rule"], RULES)
    check_choice("solver", o["solver"], SOLVERS)
    check_choice("coordination", o["coordination"], ("full", "partial"))
    check_choice("mode", o["mode"], ("auto", "cc", "dc"))
    check_count("v_max", o["v_max"])
    check_count("max_iterations", o["max_iterations"])
    check_count("local_steps", o["local_steps"])
    check_count("report_every", o["report_every"])
    if o["stall_window"] is not None:
        check_count("stall_window", o["stall_window"])
    check_number("participation", o["participation"], 0.0, 1.0, closed=True)
    check_number("eps_primal", o["eps_primal"], 0.0, np.inf, low_closed=True)
    check_number("eps_dual", o["eps_dual"], 0.0, np.inf, low_closed=True)
    check_number("step", o["step"], 0.0, np.inf)
    if o["beta"] is not None:
        check_number("beta (penalty of the nodes' own constraints)", o["beta"], 0.0, np.inf)
    if o["local_tol"] is not None:
        check_number("local_tol", o["local_tol"], 0.0, np.inf)
    if o["seed"] is not None:
        check_count("seed", o["seed"], low=0)
    for name in ("eps_schedule", "v_max_schedule", "monitor", "availability"):
        check_callable(name, o[name])
    if o["server_host"] is not None and not isinstance(o["server_host"], str):
        raise FedModelError(f"server_host must be a client name or None, got {o['server_host']!r}")
    if o["order"] is not None and (isinstance(o["order"], str) or
                                   not all(isinstance(n, str) for n in o["order"])):
        raise FedModelError(f"order must be a sequence of node names or None, got {o['order']!r}")
    if o["x0"] is not None:
        try:
            x0 = np.asarray(o["x0"], dtype=float)
        except (TypeError, ValueError):
            x0 = np.array(np.nan)
        if not np.all(np.isfinite(x0)):
            raise FedModelError(f"x0 must be finite numbers (a scalar or the shared variables, "
                                f"flattened), got {o['x0']!r}")


ADAPT_UNTIL = 200      # adaptive ρ: outer iterations that may change it (then fixed: convergence)
ADAPT_RANGE = 1e4      # ... and ρ∘ρ stays within [1/ADAPT_RANGE, ADAPT_RANGE] × its initial value


def _balance(primal: float, dual: float, ratio: float = 10.0, factor: float = 2.0) -> float:
    """Residual balancing (Boyd et al. 2011, §3.4.1) for the weights 2ρ∘ρ: ×factor when the
    consensus residual is `ratio` times the dual residual 2ρ²‖Δx̂‖∞, ÷factor in the opposite case."""
    if primal > ratio * dual:
        return factor
    if dual > ratio * primal:
        return 1.0 / factor
    return 1.0


class ClientModels(dict):
    """{client: x_i} (rows of one (n, d) array, which `array` holds in client order) — what a
    DALD `monitor` receives. Read-only: the rows may be the nodes' own state (batched executor)."""

    def __init__(self, names, array):
        array = array.view()
        array.flags.writeable = False
        super().__init__(zip(names, array))
        self.array = array


# ---- the backend ------------------------------------------------------------------------------
class DALD(Backend):
    """Fed-DALD-CC on a star (Algorithm 2), Fed-DALD-DC on any other connected graph (Algorithm 3).

    Defaults: ρ = 1 (all ones), μ¹ = 0, x⁰ = 0, inner rule B4 with v_max = 1, step α = 1e-4 for
    the GD / prox-grad solver layer with W = 1, as in the paper; and, not in the paper,
    ε_pri = ε_dual = 1e-6 (paper 1e-5), `adaptive_rho` (Fed-DALD-CC: ρ rescaled by residual
    balancing for the first ADAPT_UNTIL outer steps, with exact local solves only (a larger ρ
    would make the fixed gd / prox-grad step unstable); a given ρ is the initial value) and
    `stall_window` (constrained models: "infeasible" / "stalled"). `DALD.paper()` is the
    paper's exact setting.

    rho: scalar, per-coordinate vector, or dict (CC: client → ρ_i; DC: (u, v) edge → ρ_uv).
    solver: "auto" (exact per the node: linear solve for quadratics, prox method for λ‖w‖₁,
    Newton / L-BFGS otherwise), "exact", "newton", "gd" (`local_steps` steps of size `step`),
    "prox-grad" (BCPG (63)–(64)). coordination: "full" (full cycle) or "partial" (each node
    takes part in an inner iteration with probability `participation` (seeded by `seed`); a dropped
    node keeps its iterate and its multipliers; a DC edge multiplier moves only when both ends took
    part — client dropout; `availability(t)` names the nodes reachable at inner iteration t, e.g.
    a client that drops out and returns). `monitor(t, {node: x})` sees the iterates after every
    outer step. report_every: the history's objective / violation (the harness's metric, not the
    algorithm's traffic: one more pass over every node's data) and, for CC, "sum_mu" (‖Σμ_i‖∞
    as the clients hold it) every k-th outer step and at the last, NaN in between. order: the
    coordination sequence S
    for DC (default: a hierarchy DiGraph's solve order, else the problem's client order).
    """

    name = "dald"
    checkpointing = True

    def __init__(self, rho: Any = 1.0, inner_rule: str = "B4", v_max: int = 1,
                 eps_primal: float = 1e-6, eps_dual: float = 1e-6, solver: str = "auto",
                 step: float = 1e-4, local_steps: int = 1, coordination: str = "full",
                 max_iterations: int = 1000, beta: float | None = None, local_tol: float | None = None,
                 warm_start: bool = True, mode: str = "auto", order: Sequence[str] | None = None,
                 server_host: str | None = None, participation: float = 1.0, seed: int | None = None,
                 eps_schedule: Callable[[int], float] | None = None,
                 v_max_schedule: Callable[[int], int] | None = None, x0: Any = None,
                 monitor: Callable[[int, dict], None] | None = None,
                 availability: Callable[[int], Sequence[str]] | None = None, report_every: int = 1,
                 stall_window: int | None = 20, adaptive_rho: bool = True):
        _check_options(locals())
        self.rho, self.inner_rule, self.v_max = rho, inner_rule, int(v_max)
        self.eps_primal, self.eps_dual = float(eps_primal), float(eps_dual)
        self.solver, self.step, self.local_steps = solver, float(step), int(local_steps)
        self.coordination, self.max_iterations = coordination, int(max_iterations)
        self.beta, self.local_tol, self.warm_start, self.mode = beta, local_tol, bool(warm_start), mode
        self.order, self.server_host = order, server_host
        self.participation, self.seed = float(participation), seed
        self.eps_schedule = eps_schedule or (lambda k: max(self.eps_dual, 1e-2 * 0.5 ** k))
        self.v_max_schedule = v_max_schedule or (lambda k: self.v_max + k)
        self.x0 = x0
        # monitor(inner_total, {node: x_node}) after every outer step: the coordinator's view of
        # the model iterates (e.g. per-client accuracy curves) without storing them in history
        self.monitor = monitor
        # availability(t) → the nodes reachable at inner iteration t (partial cycle: a client
        # that drops out keeps its iterate and multipliers until it returns); None: all nodes
        self.availability = availability
        # the history's objective / violation (the harness's metric, one more pass over every
        # node's data) every `report_every` outer iterations and at the last; NaN in between
        self.report_every = int(report_every)
        # constrained models: residuals flat for 2 × stall_window outer steps → "infeasible" /
        # "stalled" (not in the paper; None: off, as in DALD.paper())
        self.stall_window = stall_window
        # Fed-DALD-CC: residual balancing of ρ (not in the paper) while k ≤ ADAPT_UNTIL
        self.adaptive_rho = bool(adaptive_rho)
        self.dual_updates = True          # False: distributed PA / FedProx (μ ≡ 0), see special_cases
        self.require_consensus = True     # outer stop also needs ‖C‖∞ ≤ ε_pri

    @classmethod
    def paper(cls, **overrides) -> "DALD":
        """The paper's setting (Guo et al., §VI): ρ = 1, inner rule B4 with v_max = 1,
        ε_pri = ε_dual = 1e-5, step α = 1e-4 for gd / prox-grad, 1000 iterations, and no stall
        detection (not in the paper). `overrides` change any option, e.g. solver="prox-grad"."""
        return cls(**{**PAPER_DALD, **overrides})

    # -- parameters ---------------------------------------------------------------------------
    def _rho(self, key, d: int) -> np.ndarray:
        rho = self.rho
        if isinstance(rho, dict):
            if key in rho:
                rho = rho[key]
            elif isinstance(key, tuple) and key[::-1] in rho:
                rho = rho[key[::-1]]
            else:
                raise FedModelError(f"rho has no entry for {key!r}; give one per client (CC) or "
                                    "per edge (u, v) (DC), or a single scalar / vector")
        rho = np.asarray(rho, float)
        _check_rho(rho)
        if self.dual_updates and not np.any(rho > 0):
            raise FedModelError(f"rho must be positive: ρ for {key!r} is 0, so that "
                                f"{'client' if isinstance(key, str) else 'edge'} is never coupled")
        if rho.size not in (1, d):
            raise FedModelError(f"rho for {key!r} has {rho.size} entries but the model has {d} "
                                f"shared coordinates: give a positive scalar or {d} positive entries")
        return np.broadcast_to(rho.ravel() if rho.size == d else rho.reshape(()), (d,)).copy()

    def _beta(self) -> float:
        if self.beta is not None:
            return float(self.beta)
        if isinstance(self.rho, dict):
            return 2.0
        return max(2.0 * float(np.mean(np.square(np.asarray(self.rho, float)))), 1e-12)

    def _watch(self) -> DivergenceWatch:
        """The divergence watch, with the settings a user should change in its message."""
        if self.solver in ("gd", "prox-grad"):
            hint = (f"lower step (now {self.step:g}) below 1/L of the local objectives, or use "
                    "solver='auto' (exact local solves)")
        else:
            hint = f"raise rho (now {self.rho!r}) or check the model's scaling"
        return DivergenceWatch("DALD", hint=hint)

    def _stall(self, history: list[dict]) -> str | None:
        """"infeasible" / "stalled" when the consensus and constraint residuals have not improved
        by 0.1% over the last `stall_window` outer steps and stay well above the tolerance, and
        the model's constraints are violated at the last reported point:
        the augmented-Lagrangian signature of an infeasible model (the iterates settle at a
        least-violation point while the multipliers grow linearly). "infeasible" needs the
        iterates settled and exact local solves; with gd / prox-grad a slow run looks the same,
        so it says "stalled"."""
        W = self.stall_window
        if W is None or len(history) < 2 * W:
            return None
        r = [max(h["primal_residual"], h["constraint_residual"]) for h in history[-2 * W:]]
        before, recent = min(r[:W]), min(r[W:])
        floor = max(100.0 * self.eps_primal, 1e-6)
        if recent < (1.0 - 1e-3) * before or recent <= floor:
            return None
        # and a constraint is violated at the model itself: a feasible model whose consensus
        # converges slowly (adaptive ρ still moving) shows the same plateau without a violation
        reported = [h["violation"] for h in history[-W:] if np.isfinite(h["violation"])]
        if not reported or reported[-1] <= floor:
            return None
        settled = max(h["dual_residual"] for h in history[-W:]) <= 1e-3 * recent
        return "infeasible" if settled and self.solver not in ("gd", "prox-grad") else "stalled"

    def _stall_report(self, problem, status: str, values: dict, info: dict, k: int) -> None:
        """For an infeasible / stalled run: the violated constraints by name (at the returned
        point, the least-violation point found) in info["violated"], a message and a warning."""
        if status not in ("infeasible", "stalled"):
            return
        violated = violated_constraints(problem, values, tol=self.eps_primal)
        what = ("the model looks infeasible (the iterates settled while the multipliers grow)"
                if status == "infeasible" else "no progress")
        info["violated"] = violated
        info[status] = (f"DALD stopped at outer iteration {k}: the consensus / constraint residuals "
                        f"did not improve over {2 * self.stall_window} outer iterations — {what}. "
                        f"Violated at the point returned: "
                        + (", ".join(f"{n} (by {v:.3g})" for n, v in violated.items()) or "none")
                        + ". Check these constraints together (and against the other clients' "
                        "constraints: the model variables are shared), or pass stall_window=None")
        warnings.warn(info[status], RuntimeWarning, stacklevel=4)

    def _inner_done(self, k: int, v: int, dual: float) -> bool:
        rule = self.inner_rule
        if rule == "B1":
            return dual <= self.eps_dual
        if rule == "B2":
            return dual <= self.eps_schedule(k)
        if rule == "B3":
            return v >= self.v_max_schedule(k) or dual <= self.eps_dual
        return v >= self.v_max or dual <= self.eps_dual

    def _opts(self) -> dict:
        return {"tol": -1.0 if self.local_tol is None else float(self.local_tol), "solver": self.solver, "step": self.step,
                "local_steps": self.local_steps, "warm": float(self.warm_start)}

    # -- topology -----------------------------------------------------------------------------
    def _topology(self, problem, topology):
        import topologies
        G = topologies.star(problem) if topology is None else topology
        topologies.validate(G, problem)             # TopologyError: disconnected, unknown nodes …
        server = topologies.server_node(G)
        if server is not None and server != "server":
            G = nx.relabel_nodes(G, {server: "server"})
        U = G.to_undirected() if G.is_directed() else G
        star = server is not None and all("server" in e for e in U.edges) and \
            U.degree("server") == len(problem.clients)
        mode = self.mode if self.mode != "auto" else ("cc" if star else "dc")
        if mode == "cc" and not star:
            raise TopologyError("Fed-DALD-CC needs a star: a 'server' node joined to every client "
                                "and no client–client edges; use topologies.star(problem) or mode='dc'")
        return G, U, mode

    def run(self, problem, topology=None, executor="serial", callback=None, verbose=False,
            checkpointer: Checkpointer = NO_CHECKPOINT, **_):
        G, U, mode = self._topology(problem, topology)
        programs = compile_programs(problem)
        d = programs["server"].n_shared
        x0 = np.zeros(d) if self.x0 is None else np.broadcast_to(np.asarray(self.x0, float).ravel(), (d,)).copy()
        server_used = bool(problem.server.terms or problem.server.constraints)
        ex = make_executor(executor).start(programs)
        self._prepare(ex, x0)
        self._rng = np.random.default_rng(self.seed)
        start = time.perf_counter()
        try:
            loop = self._cc if mode == "cc" else self._dc
            out = loop(problem, G, U, ex, x0, d, server_used, callback, verbose, start, checkpointer)
        finally:
            ex.close()
        out["info"]["mode"] = mode
        return out

    def _prepare(self, ex, x0: np.ndarray) -> None:
        """Settings the nodes must be asked for before the first iteration (none for DALD)."""

    def _participants(self, nodes: list[str], total: int = 0) -> list[str]:
        if self.coordination == "full":
            return list(nodes)
        if self.availability is not None:
            up = set(self.availability(total))
            nodes = [n for n in nodes if n in up or n == "server"] or list(nodes)
        if self.participation >= 1.0:
            return list(nodes)
        keep = [n for n in nodes if self._rng.random() < self.participation]
        return keep or [nodes[int(self._rng.integers(len(nodes)))]]

    # -- Algorithm 2: Fed-DALD-CC --------------------------------------------------------------
    def _cc(self, problem, G, U, ex, xhat, d, server_used, callback, verbose, start, ckpt):
        """The server's view is kept as (n, d) arrays in client order: X (the x_i it received),
        RHO2 (ρ_i∘ρ_i); every request to the clients is one group request (`map_stacked`)."""
        clients, beta = ex.clients, self._beta()
        row = {c: i for i, c in enumerate(clients)}
        RHO2 = np.array([self._rho(c, d) ** 2 for c in clients]).reshape(len(clients), d)
        uniform = bool(np.all(RHO2 == RHO2[:1]))          # one ρ for all: Σρ_i²x_i = ρ²Σx_i
        twice_rho2 = 2.0 * (RHO2[:, :1] if np.all(RHO2 == RHO2[:, :1]) else RHO2)   # (n, 1): scalar ρ_i
        ex.map_stacked("dald_cc_init", clients, rows={"rho": np.sqrt(RHO2)}, common={"x0": xhat, "beta": beta})
        ex.call("server", "configure", beta=beta, prox_weight=0.0, center=xhat)
        total_rho2 = RHO2.sum(axis=0)
        initial_rho2 = RHO2[0, 0] if RHO2[0, 0] > 0 else 1.0
        if self.dual_updates and np.any(total_rho2 <= 0):
            raise FedModelError("Fed-DALD-CC needs Σ_i ρ_i∘ρ_i > 0 in every coordinate")
        X = np.tile(xhat, (len(clients), 1))
        mu_sum = np.zeros(d)           # server's mirror of Σ_i μ_i (each term is known to it)
        history, total, status, k, info = [], 0, "max_iterations", 0, {}
        constrained = bool(problem.constraints)
        bar = progress(self.max_iterations, verbose, "DALD-CC")
        opts = self._opts()
        watch = self._watch()
        saved = ckpt.restore(ex)   # resume: docs/checkpoints.md
        if saved:
            k, total, xhat, X, mu_sum = saved["k"], saved["total"], saved["xhat"], saved["x"], saved["mu_sum"]
            if isinstance(X, dict):
                X = np.array([X[c] for c in clients])
            history, self._rng.bit_generator.state = saved["history"], saved["rng"]
            watch.smallest = dict(saved.get("watch", {}))
            if "rho2" in saved:                  # adaptive ρ: the weights the run had reached
                RHO2, total_rho2, twice_rho2 = saved["rho2"], saved["total_rho2"], saved["twice_rho2"]
        while total < self.max_iterations:
            k += 1
            v, dual, active = 0, np.inf, set()
            while True:                                                  # inner loop (Step 1)
                v += 1
                total += 1
                part = self._participants(clients, total)
                active.update(part)
                reply = ex.map_stacked("dald_cc_solve", part, common={"xhat": xhat, **opts})   # (13)
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
            replies = ex.map_stacked("dald_cc_dual", active,
                                     common={"xhat": xhat, "consensus": float(self.dual_updates)})
            if self.dual_updates:
                mu_sum += gap
            dmu = max(float(np.max(replies["dmu"], initial=0.0)), 0.0)
            # not with gd / prox-grad: a larger ρ would make their fixed step unstable
            if self.adaptive_rho and self.dual_updates and k <= ADAPT_UNTIL and \
                    self.solver not in ("gd", "prox-grad"):
                factor = _balance(primal, float(np.max(twice_rho2)) * dual)
                scale = float(RHO2[0, 0] / initial_rho2) * factor
                if factor != 1.0 and 1.0 / ADAPT_RANGE <= scale <= ADAPT_RANGE:
                    # weights on the server and the clients; μ stays as it is (unscaled)
                    RHO2, total_rho2, twice_rho2 = RHO2 * factor, total_rho2 * factor, twice_rho2 * factor
                    ex.map_stacked("dald_cc_rescale", clients, common={"factor": factor})
            if problem.server.constraints:
                dmu = max(dmu, ex.call("server", "update_multipliers", x=xhat)["dmu"])
            last = self._converged(primal, dual, dmu) or total >= self.max_iterations
            report = last or k % self.report_every == 0
            record = self._record_cc(ex, clients, xhat, k, v, total, primal, dual, dmu / self._beta(), start,
                                     report)
            # Σμ_i as the clients hold it (μ ≡ 0 without (15)): a diagnostic, on reported records
            record["sum_mu"] = 0.0 if not self.dual_updates else float("nan") if not report else \
                float(np.max(np.abs(np.sum(ex.map_stacked("dald_state", clients)["mu"], axis=0)), initial=0.0))
            history.append(record)
            if callback:
                callback(record)
            if self.monitor:
                self.monitor(total, ClientModels(clients, X))
            bar.update(record)
            if self._converged(primal, dual, dmu):
                status = "converged"
                break
            if constrained and (stop := self._stall(history)):
                status = stop
                break
            ckpt.save(ex, k, {"k": k, "total": total, "xhat": xhat, "x": X, "mu_sum": mu_sum,
                                    "history": history, "rng": self._rng.bit_generator.state,
                                    "watch": dict(watch.smallest), "rho2": RHO2,
                                    "total_rho2": total_rho2, "twice_rho2": twice_rho2})   # bitwise, not recomputed
        bar.close()
        values, multipliers = gather_values(ex, problem, xhat)
        ex.ledger.rounds = total
        mus = ex.map_stacked("dald_state", clients)["mu"]
        consensus = {c: np.array(m, float) for c, m in zip(clients, mus)}
        self._stall_report(problem, status, values, info, k)
        info.update(consensus_multipliers=consensus,
                    client_values={c: X[i].copy() for i, c in enumerate(clients)})
        return {"status": status, "values": values, "multipliers": multipliers, "history": history,
                "iterations": {"outer": k, "inner": total}, "ledger": ex.ledger, "info": info}

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

    def _converged(self, primal, dual, dmu) -> bool:
        ok_primal = primal <= self.eps_primal or not self.require_consensus
        return ok_primal and dual <= self.eps_dual and dmu / self._beta() <= self.eps_primal

    # -- Algorithm 3: Fed-DALD-DC --------------------------------------------------------------
    def _dc_graph(self, problem, G, U, server_used):
        """Coordination sequence S, the undirected DC graph, and the batches of S that can run
        in parallel (consecutive nodes with no edge between them)."""
        import topologies
        H = nx.Graph(U)
        clients = [c.name for c in problem.clients]
        if self.order is not None:
            order = list(self.order)
        elif G.is_directed() and all("level" in data for _, data in G.nodes(data=True)):
            order = topologies.solve_order(G)
        else:
            order = clients + (["server"] if "server" in H else [])
        if "server" not in H and server_used:                        # host the server block
            host = self.server_host or [n for n in order if n != "server"][-1]
            if host not in H:
                raise TopologyError(f"server_host {host!r} is not a node of the topology")
            H.add_edge(host, "server")
            order = order[:order.index(host) + 1] + ["server"] + order[order.index(host) + 1:]
        if sorted(order, key=str) != sorted(H.nodes, key=str):
            raise TopologyError(f"coordination order {order} must list every node of the DC graph "
                                f"{sorted(H.nodes, key=str)} exactly once")
        batches: list[list[str]] = []
        for node in order:
            if batches and not any(H.has_edge(node, other) for other in batches[-1]):
                batches[-1].append(node)
            else:
                batches.append([node])
        return H, order, batches

    def _dc(self, problem, G, U, ex, x0, d, server_used, callback, verbose, start, ckpt):
        """The coordinator's view of the iterates is one (N, d) array X, rows in the order S;
        each inner iteration is one Gauss–Seidel sweep request (`Executor.sweep`)."""
        H, order, batches = self._dc_graph(problem, G, U, server_used)
        beta = self._beta()
        position = {n: i for i, n in enumerate(order)}
        neighbors = {n: list(H.neighbors(n)) for n in order}
        ex.map("dald_dc_init", {n: {"x0": x0, "beta": beta} for n in order})
        for n in order:
            for j in neighbors[n]:
                edge = (n, j) if position[n] < position[j] else (j, n)
                ex.call(n, "dald_dc_link", neighbor=j, rho=self._rho(edge, d),
                        after=float(position[j] > position[n]), x=x0)
        moving = np.array([any(position[j] < position[n] for j in neighbors[n]) for n in order], dtype=bool)
        X = np.tile(x0, (len(order), 1))          # not the bottom nodes: they enter D (80)
        history, total, status, k, info = [], 0, "max_iterations", 0, {}
        constrained = bool(problem.constraints)
        bar = progress(self.max_iterations, verbose, "DALD-DC")
        opts = self._opts()
        watch = self._watch()
        saved = ckpt.restore(ex)   # resume: docs/checkpoints.md
        if saved:
            k, total, X, history = saved["k"], saved["total"], saved["x"], saved["history"]
            if isinstance(X, dict):
                X = np.array([X[n] for n in order])
            self._rng.bit_generator.state = saved["rng"]
            watch.smallest = dict(saved.get("watch", {}))
        while total < self.max_iterations:
            k += 1
            v = 0
            while True:                                                  # inner loop (Step 1)
                v += 1
                total += 1
                previous = X
                part = set(self._participants(order, total))
                sweep = [[n for n in batch if n in part] for batch in batches]
                sweep = [batch for batch in sweep if batch]
                reply = ex.sweep("dald_dc_solve", sweep, opts, "dald_dc_receive", neighbors)  # (20) in S
                solved = [n for batch in sweep for n in batch]
                if len(solved) == len(order):
                    X = reply["x"]                   # never written in place (may be read-only)
                else:
                    X = X.copy()
                    X[[position[n] for n in solved]] = reply["x"]
                dual, _ = kernels.largest_change(X, previous, moving)   # D (80)
                sound = not watch.check(total, **{"x_i (node models)": X})   # non-finite or growth
                if not sound or self._inner_done(k, v, dual) or total >= self.max_iterations:
                    break
            if not sound:          # keep the last sound sweep; the caller sees "diverged"
                status, X = watch.report(info), previous
                break
            replies = ex.map_stacked("dald_dc_dual", order, common={"consensus": float(self.dual_updates)})  # (21)
            primal = float(np.max(replies["primal"]))
            dmu = float(np.max(replies["dmu"]))
            last = self._converged(primal, dual, dmu) or total >= self.max_iterations
            record = self._record_dc(ex, order, X, k, v, total, primal, dual, dmu / beta, start,
                                     last or k % self.report_every == 0)
            history.append(record)
            if callback:
                callback(record)
            if self.monitor:
                self.monitor(total, ClientModels(order, X))
            bar.update(record)
            if self._converged(primal, dual, dmu):
                status = "converged"
                break
            if constrained and (stop := self._stall(history)):
                status = stop
                break
            ckpt.save(ex, k, {"k": k, "total": total, "x": X, "history": history,
                                    "rng": self._rng.bit_generator.state, "watch": dict(watch.smallest)})
        bar.close()
        clients = [n for n in order if n != "server"]
        rows = [position[c] for c in clients]
        shared = X[position["server"]].copy() if "server" in position and server_used else \
            X[rows].sum(axis=0) / len(clients)
        values, multipliers = gather_values(ex, problem, shared)
        ex.ledger.rounds = total
        consensus = {}
        for n, m in ex.map("dald_state", {n: {} for n in order}).items():
            for j, mu in (m["mu"] or {}).items():
                if position[n] < position[j]:
                    consensus[(n, j)] = mu
        self._stall_report(problem, status, values, info, k)
        info.update(consensus_multipliers=consensus, order=order,
                    client_values={n: X[i].copy() for i, n in enumerate(order)})
        return {"status": status, "values": values, "multipliers": multipliers, "history": history,
                "iterations": {"outer": k, "inner": total}, "ledger": ex.ledger, "info": info}

    # -- bookkeeping ---------------------------------------------------------------------------
    def _record_cc(self, ex, clients, xhat, k, v, total, primal, dual, constraint, start, report=True) -> dict:
        """One history record; objective and violation at x̂ on every node (the clients' reports
        as one group request) when `report`, else NaN."""
        objective = violation = float("nan")
        if report:
            reports = ex.map_stacked("report", clients, common={"x": xhat})
            objective, violation = float(np.sum(reports["objective"])), float(np.max(reports["violation"], initial=0.0))
            if "server" in ex.programs:
                server = ex.call("server", "report", x=xhat)
                objective, violation = objective + server["objective"], max(violation, server["violation"])
        return {"iteration": k, "inner": v, "inner_total": total, "objective": objective,
                "violation": violation, "primal_residual": primal, "dual_residual": dual,
                "constraint_residual": constraint, "time": time.perf_counter() - start}

    def _record_dc(self, ex, order, X, k, v, total, primal, dual, constraint, start, report=True) -> dict:
        """`_record_cc` at each node's own iterate (the rows of X)."""
        objective = violation = float("nan")
        if report:
            reports = ex.map_stacked("report", order, rows={"x": X})
            objective, violation = float(np.sum(reports["objective"])), float(np.max(reports["violation"], initial=0.0))
        return {"iteration": k, "inner": v, "inner_total": total, "objective": objective,
                "violation": violation, "primal_residual": primal, "dual_residual": dual,
                "constraint_residual": constraint, "time": time.perf_counter() - start}
