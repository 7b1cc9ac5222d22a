"""The DALD backend (`DALD`): its options and the steps Fed-DALD-CC (`cc`) and Fed-DALD-DC
(`dc`) share — penalties ρ and β, the inner and outer stop rules, participation, divergence and
stall detection, history records.
"""
from __future__ import annotations

import inspect
import time
from typing import Any, Callable, Sequence

import numpy as np

from fedmodel import topologies
from fedmodel.compiler.feasibility import feasible_by_its_sets
from fedmodel.errors import FedModelError, TopologyError
from fedmodel.runtime.checkpoint import Checkpointer
from fedmodel.runtime.program import moved_to_server
from ..base import Backend, Run, paper_preset
from ..outcome import Outcome, Status
from ..watch import DivergenceWatch
from . import cc_nodes, dc_nodes, local
from .cc import FedDALDCC
from .dc import FedDALDDC, without_self_loops
from .options import PAPER_DALD, ClientModels, check_options
from .reports import Reports
from .stall import StallRule


class DALD(Reports, StallRule, FedDALDCC, FedDALDDC, Backend):
    """Fed-DALD-CC on a star (Algorithm 2), Fed-DALD-DC on any other connected graph (Algorithm 3).

    Defaults: ρ = 1 (all ones), μ¹ = 0, x⁰ = 0, inner rule B4 with v_max = 1, step α = 1e-4 for
    the GD / prox-grad solver layer with W = 1, as in the paper; and, not in the paper,
    ε_pri = ε_dual = 1e-6 (paper 1e-5), `adaptive_rho` (Fed-DALD-CC: ρ rescaled by the spectral
    penalty rule of Xu et al. 2017 (`spectral`: curvature estimates from the iterates the
    coordinator already has, no extra message) for the first ADAPT_UNTIL outer steps, with exact local solves only (a larger ρ
    would make the fixed gd / prox-grad step unstable); a given ρ is the initial value; Fed-DALD-DC:
    each edge's ρ from its ends' curvatures, at most the given ρ, `dc.edge_rho`) and
    `stall_window` (constrained models: "infeasible" / "stalled"), `one_message` (Fed-DALD-CC:
    Step 2 sent with the next solve request, one round trip per iteration, the same iterates)
    and `dist_tol` (Fed-DALD-CC: "converged" also needs the contraction of the last outer steps
    to put x̂ within dist_tol·‖x̂‖₂ of the answer); with the default β, the penalty of the server's
    own constraints ×10 while their violation fails to halve, on a model whose constraints are sets
    that meet (Fed-DALD-CC: `penalty.ServerPenalty`). `DALD.paper()` is the paper's exact setting.

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
    for DC (default: a hierarchy DiGraph's solve order, else the problem's client order;
    "colour": ordered by the colour classes of a greedy colouring, so each class is one
    parallel batch, `dc.colour_order`).
    """

    name = "dald"
    checkpointing = True
    # the node steps of Fed-DALD-CC and -DC and the node's multiplier report
    procedures = (*cc_nodes.PROCEDURES, *dc_nodes.PROCEDURES, local._state)

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
                 stall_window: int | None = 20, adaptive_rho: bool = True, one_message: bool = True,
                 dist_tol: float | None = 1e-4, raise_beta: bool = False):
        check_options(locals())
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
        # spectral penalty selection of ρ (CC, while k ≤ ADAPT_UNTIL) / ρ per edge from the nodes'
        # curvatures (DC); not in the paper
        self.adaptive_rho = bool(adaptive_rho)
        # Fed-DALD-CC: the clients' β ×10 while their violation fails to halve (`penalty.penalty_slow`)
        self.raise_beta = bool(raise_beta)
        # Fed-DALD-CC with every client in every step: Step 2 (15) of outer iteration k sent
        # with the solve request (13) of k + 1 (same x̂, same iterates): one round trip per
        # iteration instead of two (the paper's box sends them apart; DALD.paper() does)
        self.one_message = bool(one_message)
        # Fed-DALD-CC's stop also needs x̂ within dist_tol·‖x̂‖₂ of the answer, estimated from the
        # contraction of the last outer steps (`distance.distance_left`); None: the paper's test alone
        self.dist_tol = None if dist_tol is None else float(dist_tol)
        self.dual_updates = True          # False: distributed PA / FedProx (μ ≡ 0), see special_cases
        self.require_consensus = True     # outer stop also needs ‖C‖∞ ≤ ε_pri

    @classmethod
    def paper(cls, **overrides) -> "DALD":
        """The paper's setting (Guo et al., §VI): ρ = 1, inner rule B4 with v_max = 1,
        ε_pri = ε_dual = 1e-5, step α = 1e-4 for gd / prox-grad, 1000 iterations, and no stall
        detection (not in the paper). `overrides` change any option, e.g. solver="prox-grad"."""
        return paper_preset(cls(**{**PAPER_DALD, **overrides}))

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
        rho = np.asarray(rho, float)           # its entries were checked when the backend was built
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
        if topology is None and self.mode != "dc":
            # the default star: Fed-DALD-CC reads no graph (networkx's import was 0.08 CPU s of a
            # d = 784 run's 3.7); the star builder's check of the clients, without the graph
            topologies.require_clients(problem, "star")
            return None, None, "cc"
        G = topologies.star(problem) if topology is None else topology
        topologies.validate(G, problem)             # TopologyError: disconnected, unknown nodes …
        G = without_self_loops(G, self.name)
        server = topologies.server_node(G)
        if server is not None and server != "server":
            import networkx as nx
            G = nx.relabel_nodes(G, {server: "server"})
        U = G.to_undirected() if G.is_directed() else G
        star = server is not None and all("server" in e for e in U.edges) and \
            U.degree("server") == len(problem.clients)
        mode = self.mode if self.mode != "auto" else ("cc" if star else "dc")
        if mode == "cc" and not star:     # FedProx, FedAvg, DGD, PA: Fed-DALD-CC, no `mode` option
            other = "mode='dc'" if "mode" in inspect.signature(type(self).__init__).parameters else \
                "prob.solve('dald', topology=G), which runs on any connected graph"
            raise TopologyError(f"{self.name} (Fed-DALD-CC) needs a star: a 'server' node joined to "
                                f"every client and no client–client edges; use topologies.star(problem) or {other}")
        return G, U, mode

    def prepare(self, problem, topology):
        """(G, its undirected view, "cc" or "dc"): the topology checked before the run opens."""
        return self._topology(problem, topology)

    def loop(self, problem, ex, run: Run) -> Outcome:
        G, U, mode = run.topology
        # the server's block also holds clients' sets moved there (`moved_to_server`): without
        # it a client's ‖·‖₁ ball was ignored and DALD "stalled" at the unconstrained optimum
        server_used = bool(problem.server.terms or problem.server.constraints or moved_to_server(problem))
        d = ex.model_size
        x0 = self._start_point(d)
        self._prepare(ex, x0)
        self._rng = np.random.default_rng(self.seed)
        self._last_seen, self._away = {}, {}
        # the stall rule's "infeasible" needs a model that may be one (`_stall`)
        self._has_point = feasible_by_its_sets(problem)
        start = time.perf_counter()
        loop = self._cc if mode == "cc" else self._dc
        out = loop(problem, G, U, ex, x0, d, server_used, run.callback, run.verbose, start, run.checkpointer)
        out.info["mode"] = mode
        return out

    def conclude(self, problem, ex, run: Run, outcome: Outcome) -> None:
        """An infeasible / stalled run names the constraints violated at the gathered values."""
        self._stall_report(problem, outcome.status, outcome.values, outcome.info,
                           outcome.iterations.get("outer", 0))
        if outcome.status == Status.MAX_ITERATIONS:
            self._cap_report(outcome.history, outcome.info)
        self._absent_report(problem, outcome)

    def _start_point(self, d: int) -> np.ndarray:
        """x⁰ for every node: zeros, or `x0` (a scalar or the d flattened shared variables)."""
        if self.x0 is None:
            return np.zeros(d)
        x0 = np.asarray(self.x0, float).ravel()
        if x0.size not in (1, d):
            raise FedModelError(f"x0 must be a scalar or the {d} shared variables, flattened "
                                f"(got {x0.size} numbers)")
        return np.broadcast_to(x0, (d,)).copy()

    # -- checkpoints (docs/checkpoints.md) ------------------------------------------------------
    def _resume(self, ckpt: Checkpointer, ex) -> tuple[DivergenceWatch, dict[str, Any] | None]:
        """The divergence watch and a resumed run's loop state (None for a fresh run). What both
        loops keep alike — the participation generator and the watch's memory — is restored here."""
        watch = self._watch()
        saved = ckpt.restore(ex)
        if saved:
            self._rng.bit_generator.state = saved["rng"]
            watch.smallest = dict(saved["watch"])
        return watch, saved

    def _save(self, ckpt: Checkpointer, ex, iteration: int, watch: DivergenceWatch, **loop: Any) -> None:
        """Checkpoint after outer iteration `iteration`: the loop's own state `loop`, and what
        `_resume` restores."""
        ckpt.save(ex, iteration, {**loop, "rng": self._rng.bit_generator.state, "watch": dict(watch.smallest)})

    def _prepare(self, ex, x0: np.ndarray) -> None:
        """Settings the nodes must be asked for before the first iteration (none for DALD)."""

    def _participants(self, nodes: Sequence[str], total: int = 0) -> Sequence[str]:
        """The nodes taking part in step `total`: `nodes` itself (not a copy: callers only read
        it) when every node does."""
        if self.coordination == "full":
            return nodes
        if self.availability is not None:
            up = set(self.availability(total))
            nodes = [n for n in nodes if n in up or n == "server"] or nodes
        if self.participation < 1.0:
            keep = [n for n in nodes if self._rng.random() < self.participation]
            nodes = keep or [nodes[int(self._rng.integers(len(nodes)))]]
        seen, away = getattr(self, "_last_seen", {}), getattr(self, "_away", {})
        for n in nodes:         # each node's last step and its longest absence (`_absent_report`)
            gap = (seen.get(n, 0) + 1, total - 1)
            if gap[1] - gap[0] > away.get(n, (0, -1))[1] - away.get(n, (0, -1))[0]:
                away[n] = gap
            seen[n] = total
        return nodes

    def _converged(self, primal, dual, dmu, beta: float | None = None) -> bool:
        ok_primal = primal <= self.eps_primal or not self.require_consensus
        return ok_primal and dual <= self.eps_dual and dmu / (beta or self._beta()) <= self.eps_primal

    def _outer_step_done(self, record: dict, history: list, callback, bar, nodes: list[str], X: np.ndarray,
                         constrained: bool, primal: float, dual: float, dmu: float,
                         beta: float | None = None) -> str | None:
        """Hand the outer step's record on (history, callback, progress bar) and the models X
        (rows: `nodes`) to the `monitor`; the status to stop with ("converged", or a stall
        verdict), or None. `beta`: the constraints' penalty dmu is read in (None: `_beta()`)."""
        history.append(record)
        if callback:
            callback(record)
        if self.monitor:
            self.monitor(record["inner_total"], ClientModels(nodes, X))
        bar.update(record)
        if self._converged(primal, dual, dmu, beta):
            return Status.CONVERGED
        if constrained:
            return self._stall(history)
        return None

    @staticmethod
    def _record(k, v, total, primal, dual, constraint, start, objective=float("nan"),
                violation=float("nan")) -> dict:
        """One history record (objective and violation NaN on records that are not reported)."""
        return {"iteration": k, "inner": v, "inner_total": total, "objective": objective,
                "violation": violation, "primal_residual": primal, "dual_residual": dual,
                "constraint_residual": constraint, "time": time.perf_counter() - start}
