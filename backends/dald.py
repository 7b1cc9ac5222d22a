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
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import networkx as nx
import numpy as np

from fedmodel.errors import FedModelError, TopologyError
from fedmodel.runtime import make_executor
from fedmodel.runtime.checkpoint import NO_CHECKPOINT, Checkpointer
from fedmodel.runtime.ledger import MessageKind, procedure, register
from fedmodel.runtime.program import NodeProgram, compile_programs
from .base import Backend
from .common import gather_values, progress

SOLVERS = ("auto", "exact", "gd", "newton", "prox-grad")
RULES = ("B1", "B2", "B3", "B4")
_OPTS = {"tol": "1", "solver": "str", "step": "1", "local_steps": "1", "warm": "1"}


# ---- solver layer (runs on the node) ----------------------------------------------------------
def _apply_prox(program: NodeProgram, z: np.ndarray, t: float) -> np.ndarray:
    n_x = program.n_shared
    out = z.copy()
    parts = program.shared.unpack(out[:n_x])
    for term in program.merit_ir.prox_terms:
        i = program.shared.variables.index(term.variable)
        parts[i] = term.prox(parts[i], t)
    out[:n_x] = program.shared.pack(parts)
    return out


def _prox_grad(program, linear, weight, anchor, x0, step, steps):
    """W proximal-gradient steps (63)/(64): z ← prox_{αΠ}(z − α∇Ψ(z)) (Ψ: smooth part + AL)."""
    n_x = program.n_shared
    z = np.concatenate([x0, program.y])
    weight = np.broadcast_to(weight, (n_x,))
    for _ in range(steps):
        _, g = program.value_grad(z[:n_x], z[n_x:])
        g = g.copy()
        g[:n_x] += linear + weight * (z[:n_x] - anchor)
        z = _apply_prox(program, z - step * g, step)
    program.y = z[n_x:].copy()
    return z[:n_x], steps


def local_argmin(program: NodeProgram, linear, weight, anchor, x0, tol, solver, step, local_steps):
    """x_i ≈ argmin P_i(x) + linearᵀx + ½Σ weight_j(x_j − anchor_j)² by the chosen solver layer.
    "gd" on a node with a prox-able term (λ‖w‖₁) becomes prox-gradient steps (GD would ignore it);
    "newton" on such a node uses the node's exact prox solver."""
    if tol is None or tol < 0:  # default: 1e-10 for quadratic nodes (one linear solve); 1e-8
        # otherwise — Newton's Armijo test cannot see decreases below rounding (|f|·1e-16)
        tol = 1e-10 if program.quadratic else 1e-8
    if program.n_private:      # re-center the private variables' proximal term (weight 1/β)
        program.configure(float(program.merit_ir.beta.value), 0.0, x0)
    has_prox = bool(program.merit_ir.prox_terms)
    if solver == "prox-grad" or (solver == "gd" and has_prox):
        x, steps = _prox_grad(program, linear, weight, anchor, x0, float(step), int(local_steps))
        return x, steps
    method = {"auto": "auto", "exact": "auto", "newton": "prox" if has_prox else "newton",
              "gd": "gd"}[solver]
    out = program.solve_local(linear=linear, weight=weight, anchor=anchor, x0=x0, tol=float(tol),
                              method=method, max_steps=int(local_steps) if solver == "gd" else 1000,
                              lr=float(step))
    return out["x"], out["steps"]


def _init_state(program, x0, beta, rho2):
    program.configure(float(beta), 0.0, x0)
    program.state["dald"] = {"x": np.array(x0, float), "rho2": rho2, "edges": {}, "mu": np.zeros_like(x0)}


# ---- Fed-DALD-CC client procedures ------------------------------------------------------------
@procedure("dald_cc_init", {"x0": "x", "beta": "1", "rho": "x|1"}, {})
def _cc_init(program, x0, beta, rho):
    _init_state(program, np.asarray(x0, float), beta, np.asarray(rho, float) ** 2)
    return {}


@procedure("dald_cc_solve", {"xhat": "x", **_OPTS}, {"x": "x", "steps": "1"})
def _cc_solve(program, xhat, tol, solver, step, local_steps, warm=1.0):
    """(13): x_i = argmin f_i(x_i) + μ_iᵀ(x̂ − x_i) + ‖ρ_i∘(x̂ − x_i)‖², warm-started at x_i."""
    s = program.state["dald"]
    x0 = s["x"] if warm else xhat
    x, steps = local_argmin(program, -s["mu"], 2.0 * s["rho2"], xhat, x0, tol, solver, step, local_steps)
    s["x"] = x
    return {"x": x, "steps": steps}


@procedure("dald_cc_dual", {"xhat": "x", "consensus": "1"}, {"dmu": "1"})
def _cc_dual(program, xhat, consensus=1.0):
    """(15): μ_i += 2ρ_i∘ρ_i∘(x̂ − x_i); the node's own constraint multipliers likewise (Step 2)."""
    s = program.state["dald"]
    if consensus:
        s["mu"] = s["mu"] + 2.0 * s["rho2"] * (xhat - s["x"])
    change = program.update_multipliers(s["x"])["dmu"] if program.constraints else 0.0
    return {"dmu": change}


# ---- Fed-DALD-DC node procedures --------------------------------------------------------------
@procedure("dald_dc_init", {"x0": "x", "beta": "1"}, {})
def _dc_init(program, x0, beta):
    _init_state(program, np.asarray(x0, float), beta, None)
    return {}


@procedure("dald_dc_link", {"neighbor": "str", "rho": "x|1", "after": "1", "x": "x"}, {})
def _dc_link(program, neighbor, rho, after, x):
    """Edge to `neighbor`; `after` = 1 when the neighbour comes later in S (C = x_self − x_nbr)."""
    program.state["dald"]["edges"][neighbor] = {
        "rho2": np.asarray(rho, float) ** 2, "sign": 1.0 if after else -1.0,
        "mu": np.zeros_like(x, dtype=float), "x": np.array(x, float)}
    return {}


@procedure("dald_dc_receive", {"neighbor": "str", "x": "x"}, {})
def _dc_receive(program, neighbor, x):
    edge = program.state["dald"]["edges"][neighbor]
    edge["x"], edge["fresh"] = np.array(x, float), True
    return {}


@procedure("dald_dc_solve", dict(_OPTS), {"x": "x", "steps": "1"})
def _dc_solve(program, tol, solver, step, local_steps, warm=1.0):
    """(20): argmin f_s + Σ_{j>s}[μ_sjᵀ(x_s − x_j) + ‖ρ_sj∘(x_s − x_j)‖²]
                       + Σ_{e<s}[μ_esᵀ(x_e − x_s) + ‖ρ_es∘(x_e − x_s)‖²], newest neighbour copies."""
    s = program.state["dald"]
    edges = s["edges"].values()
    linear = sum(e["sign"] * e["mu"] for e in edges)
    weight = sum(2.0 * e["rho2"] * np.ones_like(e["x"]) for e in edges)
    anchor = sum(2.0 * e["rho2"] * e["x"] for e in edges) / weight
    x0 = s["x"] if warm else anchor
    x, steps = local_argmin(program, linear, weight, anchor, x0, tol, solver, step, local_steps)
    s["x"], s["solved"] = x, True
    return {"x": x, "steps": steps}


@procedure("dald_dc_dual", {"consensus": "1"}, {"primal": "1", "dmu": "1"})
def _dc_dual(program, consensus=1.0):
    """(21) on every incident edge (the edge multiplier is mirrored at both ends; both ends hold
    the same x_i, x_j after a full sweep, so the copies stay equal)."""
    s = program.state["dald"]
    primal = 0.0
    for e in s["edges"].values():
        c = e["sign"] * (s["x"] - e["x"])                   # C_ij = x_i − x_j, i before j
        primal = max(primal, float(np.max(np.abs(c), initial=0.0)))
        if consensus and s.get("solved") and e.get("fresh"):   # both ends took part (dropout)
            e["mu"] = e["mu"] + 2.0 * e["rho2"] * c
        e["fresh"] = False
    s["solved"] = False
    change = program.update_multipliers(s["x"])["dmu"] if program.constraints else 0.0
    return {"primal": primal, "dmu": change}


def _state(program):
    s = program.state.get("dald", {})
    mu = {k: e["mu"].copy() for k, e in s.get("edges", {}).items()} if s.get("edges") else s.get("mu")
    return {"mu": mu}


register(MessageKind("dald_state", {}, {"mu": "opaque"}, local=True), _state)


# ---- the backend ------------------------------------------------------------------------------
class DALD(Backend):
    """Fed-DALD-CC on a star (Algorithm 2), Fed-DALD-DC on any other connected graph (Algorithm 3).

    Paper defaults: ρ = 1 (all ones), μ¹ = 0, x⁰ = 0, inner rule B4 with v_max = 1,
    ε_pri = ε_dual = 1e-5, step α = 1e-4 for the GD / prox-grad solver layer with W = 1.

    rho: scalar, per-coordinate vector, or dict (CC: client → ρ_i; DC: (u, v) edge → ρ_uv).
    solver: "auto" (exact per the node: linear solve for quadratics, prox method for λ‖w‖₁,
    Newton / L-BFGS otherwise), "exact", "newton", "gd" (`local_steps` steps of size `step`),
    "prox-grad" (BCPG (63)–(64)). coordination: "full" (full cycle) or "partial" (each node
    takes part in an inner iteration with probability `participation` (seeded by `seed`); a dropped
    node keeps its iterate and its multipliers; a DC edge multiplier moves only when both ends took
    part — client dropout; `availability(t)` names the nodes reachable at inner iteration t, e.g.
    a client that drops out and returns). `monitor(t, {node: x})` sees the iterates after every
    outer step. order: the coordination sequence S
    for DC (default: a hierarchy DiGraph's solve order, else the problem's client order).
    """

    name = "dald"
    checkpointing = True

    def __init__(self, rho: Any = 1.0, inner_rule: str = "B4", v_max: int = 1,
                 eps_primal: float = 1e-5, eps_dual: float = 1e-5, solver: str = "auto",
                 step: float = 1e-4, local_steps: int = 1, coordination: str = "full",
                 max_iterations: int = 1000, beta: float | None = None, local_tol: float | None = None,
                 warm_start: bool = True, mode: str = "auto", order: Sequence[str] | None = None,
                 server_host: str | None = None, participation: float = 1.0, seed: int | None = None,
                 eps_schedule: Callable[[int], float] | None = None,
                 v_max_schedule: Callable[[int], int] | None = None, x0: Any = None,
                 monitor: Callable[[int, dict], None] | None = None,
                 availability: Callable[[int], Sequence[str]] | None = None):
        if inner_rule not in RULES:
            raise FedModelError(f"inner_rule must be one of {RULES}, got {inner_rule!r}")
        if solver not in SOLVERS:
            raise FedModelError(f"solver must be one of {SOLVERS}, got {solver!r}")
        if coordination not in ("full", "partial"):
            raise FedModelError(f"coordination must be 'full' or 'partial', got {coordination!r}")
        if mode not in ("auto", "cc", "dc"):
            raise FedModelError(f"mode must be 'auto', 'cc' or 'dc', got {mode!r}")
        if int(v_max) < 1 or int(max_iterations) < 1 or not 0 < participation <= 1:
            raise FedModelError("DALD needs v_max ≥ 1, max_iterations ≥ 1 and 0 < participation ≤ 1")
        if eps_primal < 0 or eps_dual < 0 or (solver in ("gd", "prox-grad") and (step <= 0 or local_steps < 1)):
            raise FedModelError("DALD needs eps ≥ 0, and step > 0, local_steps ≥ 1 for gd / prox-grad")
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
        self.dual_updates = True          # False: distributed PA / FedProx (μ ≡ 0), see special_cases
        self.require_consensus = True     # outer stop also needs ‖C‖∞ ≤ ε_pri

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
        if rho.size not in (1, d) or np.any(rho < 0) or not np.all(np.isfinite(rho)):
            raise FedModelError(f"rho must be nonnegative, a scalar or a vector of the model size "
                                f"{d}; got {rho.size} values")
        return np.broadcast_to(rho.ravel() if rho.size == d else rho.reshape(()), (d,)).copy()

    def _beta(self) -> float:
        if self.beta is not None:
            return float(self.beta)
        if isinstance(self.rho, dict):
            return 2.0
        return max(2.0 * float(np.mean(np.square(np.asarray(self.rho, float)))), 1e-12)

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
        self._rng = np.random.default_rng(self.seed)
        start = time.perf_counter()
        try:
            loop = self._cc if mode == "cc" else self._dc
            out = loop(problem, G, U, ex, x0, d, server_used, callback, verbose, start, checkpointer)
        finally:
            ex.close()
        out["info"]["mode"] = mode
        return out

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
        clients, beta = ex.clients, self._beta()
        rho2 = {c: self._rho(c, d) ** 2 for c in clients}
        ex.map("dald_cc_init", {c: {"x0": xhat, "beta": beta, "rho": np.sqrt(rho2[c])} for c in clients})
        ex.call("server", "configure", beta=beta, prox_weight=0.0, center=xhat)
        total_rho2 = sum(rho2.values())
        if self.dual_updates and np.any(total_rho2 <= 0):
            raise FedModelError("Fed-DALD-CC needs Σ_i ρ_i∘ρ_i > 0 in every coordinate")
        x = {c: xhat.copy() for c in clients}
        mu_sum = np.zeros(d)           # server's mirror of Σ_i μ_i (each term is known to it)
        history, total, status, k = [], 0, "max_iterations", 0
        bar = progress(self.max_iterations, verbose, "DALD-CC")
        opts = self._opts()
        saved = ckpt.restore(ex)   # resume: docs/checkpoints.md
        if saved:
            k, total, xhat, x, mu_sum = saved["k"], saved["total"], saved["xhat"], saved["x"], saved["mu_sum"]
            history, self._rng.bit_generator.state = saved["history"], saved["rng"]
        while total < self.max_iterations:
            k += 1
            v, dual, active = 0, np.inf, set()
            while True:                                                  # inner loop (Step 1)
                v += 1
                total += 1
                part = self._participants(clients, total)
                active.update(part)
                replies = ex.map("dald_cc_solve", {c: {"xhat": xhat, **opts} for c in part})   # (13)
                for c, r in replies.items():
                    x[c] = r["x"]
                new = self._server_step(ex, x, rho2, total_rho2, mu_sum, xhat, server_used)  # (14)/(29)
                finite = bool(np.all(np.isfinite(new)))
                if not finite:
                    break
                dual = float(np.max(np.abs(new - xhat), initial=0.0))       # D = x̂^{k,v} − x̂^{k,v−1}
                xhat = new
                if self._inner_done(k, v, dual) or total >= self.max_iterations:
                    break
            if not finite:          # keep the last finite iterate; the caller sees "diverged"
                status = "diverged"
                break
            primal = max(float(np.max(np.abs(xhat - x[c]), initial=0.0)) for c in clients)   # C_i
            # Step 2: multiplier step (15) on the clients, mirrored by the server
            replies = ex.map("dald_cc_dual", {c: {"xhat": xhat, "consensus": float(self.dual_updates)}
                                              for c in active})
            if self.dual_updates:
                for c in active:
                    mu_sum += 2.0 * rho2[c] * (xhat - x[c])
            dmu = max([r["dmu"] for r in replies.values()] + [0.0])
            if problem.server.constraints:
                dmu = max(dmu, ex.call("server", "update_multipliers", x=xhat)["dmu"])
            mus = ex.map("dald_state", {c: {} for c in clients})
            sum_mu = float(np.max(np.abs(sum(m["mu"] for m in mus.values())), initial=0.0))
            record = self._record(ex, {n: xhat for n in ex.nodes}, k, v, total, primal, dual,
                                  dmu / self._beta(), start)
            record["sum_mu"] = sum_mu
            history.append(record)
            if callback:
                callback(record)
            if self.monitor:
                self.monitor(total, x)
            bar.update(record)
            if self._converged(primal, dual, dmu):
                status = "converged"
                break
            ckpt.save(ex, k, {"k": k, "total": total, "xhat": xhat, "x": x, "mu_sum": mu_sum,
                                    "history": history, "rng": self._rng.bit_generator.state})
        bar.close()
        values, multipliers = gather_values(ex, problem, xhat)
        ex.ledger.rounds = total
        consensus = {c: m["mu"] for c, m in ex.map("dald_state", {c: {} for c in clients}).items()}
        return {"status": status, "values": values, "multipliers": multipliers, "history": history,
                "iterations": {"outer": k, "inner": total}, "ledger": ex.ledger,
                "info": {"consensus_multipliers": consensus, "client_values": x}}

    def _server_step(self, ex, x, rho2, total_rho2, mu_sum, xhat, server_used):
        clients = list(x)
        if not self.dual_updates:                                   # distributed PA (53), p_i = 1/n
            return sum(x.values()) / len(clients)
        weighted = sum(rho2[c] * x[c] for c in clients)
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
        H, order, batches = self._dc_graph(problem, G, U, server_used)
        beta = self._beta()
        position = {n: i for i, n in enumerate(order)}
        ex.map("dald_dc_init", {n: {"x0": x0, "beta": beta} for n in order})
        for n in order:
            for j in H.neighbors(n):
                edge = (n, j) if position[n] < position[j] else (j, n)
                ex.call(n, "dald_dc_link", neighbor=j, rho=self._rho(edge, d),
                        after=float(position[j] > position[n]), x=x0)
        bottom = {n for n in order if all(position[j] > position[n] for j in H.neighbors(n))}
        x = {n: x0.copy() for n in order}
        history, total, status, k = [], 0, "max_iterations", 0
        bar = progress(self.max_iterations, verbose, "DALD-DC")
        opts = self._opts()
        saved = ckpt.restore(ex)   # resume: docs/checkpoints.md
        if saved:
            k, total, x, history = saved["k"], saved["total"], saved["x"], saved["history"]
            self._rng.bit_generator.state = saved["rng"]
        while total < self.max_iterations:
            k += 1
            v = 0
            while True:                                                  # inner loop (Step 1)
                v += 1
                total += 1
                previous = dict(x)
                part = set(self._participants(order, total))
                for batch in batches:                                    # Gauss–Seidel over S (20)
                    replies = ex.map("dald_dc_solve", {n: dict(opts) for n in batch if n in part})
                    for n, r in replies.items():
                        x[n] = r["x"]
                        ex.map("dald_dc_receive", {j: {"neighbor": n, "x": x[n]} for j in H.neighbors(n)})
                dual = max([float(np.max(np.abs(x[n] - previous[n]), initial=0.0))   # (80)
                            for n in order if n not in bottom] + [0.0])
                finite = all(np.all(np.isfinite(x[n])) for n in order)
                if not finite or self._inner_done(k, v, dual) or total >= self.max_iterations:
                    break
            if not finite:          # keep the last finite sweep; the caller sees "diverged"
                status, x = "diverged", previous
                break
            replies = ex.map("dald_dc_dual", {n: {"consensus": float(self.dual_updates)} for n in order})  # (21)
            primal = max(r["primal"] for r in replies.values())
            dmu = max(r["dmu"] for r in replies.values())
            record = self._record(ex, x, k, v, total, primal, dual, dmu / beta, start)
            history.append(record)
            if callback:
                callback(record)
            if self.monitor:
                self.monitor(total, x)
            bar.update(record)
            if self._converged(primal, dual, dmu):
                status = "converged"
                break
            ckpt.save(ex, k, {"k": k, "total": total, "x": x, "history": history,
                                    "rng": self._rng.bit_generator.state})
        bar.close()
        clients = [n for n in order if n != "server"]
        shared = x["server"] if "server" in x and server_used else sum(x[c] for c in clients) / len(clients)
        values, multipliers = gather_values(ex, problem, shared)
        ex.ledger.rounds = total
        consensus = {}
        for n, m in ex.map("dald_state", {n: {} for n in order}).items():
            for j, mu in (m["mu"] or {}).items():
                if position[n] < position[j]:
                    consensus[(n, j)] = mu
        return {"status": status, "values": values, "multipliers": multipliers, "history": history,
                "iterations": {"outer": k, "inner": total}, "ledger": ex.ledger,
                "info": {"consensus_multipliers": consensus, "order": order, "client_values": x}}

    # -- bookkeeping ---------------------------------------------------------------------------
    def _record(self, ex, points, k, v, total, primal, dual, constraint, start) -> dict:
        reports = ex.map("report", {n: {"x": points[n]} for n in points if n in ex.programs})
        return {"iteration": k, "inner": v, "inner_total": total,
                "objective": sum(r["objective"] for r in reports.values()),
                "violation": max(r["violation"] for r in reports.values()),
                "primal_residual": primal, "dual_residual": dual,
                "constraint_residual": constraint, "time": time.perf_counter() - start}
