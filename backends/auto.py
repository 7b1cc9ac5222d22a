"""`backend="auto"` (the default of `Problem.solve`): pick the backend and its settings from the
model and from what a round trip costs on the executor, run it, and say what was picked and why
in `res.info["auto"]` (docs/api.md, "Choosing a backend: auto").

The rules, in order (each measured on benchmarks/bench_rounds.py's suite; docs/BENCHMARKS.md,
the section on backend="auto"):

1. A nonsmooth term with neither a gradient nor a prox (`compiler.canonical.classify_objective`)
   is refused: no federated backend can take it (CVXPY, centralized, can); so is a model
   without clients.
2. A graph that is no star (ring, path, grid, a server with client–client edges) runs DALD
   (Fed-DALD-DC, the server block hosted on a client): only the DALD/DGD family runs on such
   graphs. Its Gauss-Seidel sweep goes in colour classes (`order="colour"`, one parallel batch
   each: 2 instead of n on a path). DP options there are refused (DP-ADMM needs a star).
3. DP options (`epsilon_total`, `epsilon`, `delta`) run DP-ADMM with them.
3b. A star where federated Newton steps fit (`proxal_inner.newton_reading`, the rule ProxAL's
   default inner solver reads: the step's dense d × d matrices within the dense Newton budget —
   14, n more on an executor that gathers the replies before summing —, a convex model with no
   private variables and no client prox term but λ‖w‖₁, no secure aggregation): ProxAL with its
   defaults, whose subproblems then take Newton steps (backends/proxal_inner.py;
   `res.info["inner"]`): bench_rounds' suite 9–16 round trips against Algorithm 2's 24–49
   at n = 5, 40, 200, NP monks-1 67 against 382, mnist-ball n = 5, 40, 200 24 / 24 / 27 against
   194 / 328 / 819, all verified, less CPU (docs/BENCHMARKS.md, branches newtoninner and
   newtonbig; lead, 2026-12-01). A refusal at its first subproblem (a node's reply the model did
   not show) runs Algorithm 2 (ProxAL's own fall-back). Where round trips are dear too: a Flower deployment on loopback
   (n = 5) reached CVXPY's ridge in 13 round trips, 41 s wall (FedADMM: 57 round trips, 56 s),
   NP adult in 65 round trips, 82 s (docs/flower.md).
4. Otherwise, a star: ProxAL where some constraint is no simple set (it reads a client's data — Neyman-
   Pearson — or couples variables) or a client has private variables: its augmented
   Lagrangian is the one exact treatment. Otherwise (unconstrained, or norm balls, bounds,
   halfspaces only, ℓ1 by its prox) the measured cost decides — round trips × (seconds a round
   trip costs + the clients' CPU per round trip), docs/BENCHMARKS.md "… auto at many tiny
   clients (branch `newuser5`)". ProxAL takes fewer round trips at every n (bench_auto,
   n = 40 / 200: 28–42 / 28–49 against FedADMM's 53–66 / 61–93; 1,000 clients of 3 rows 45
   against 243), and where no client holds a set its round trip costs FedADMM's CPU
   (ridge n = 200: 50 ms against 46 ms) — so ProxAL at every n there. Where clients hold sets
   (balls, bounds) ProxAL's held-constraint steps cost ~4× FedADMM's per client per round
   trip (logistic-ball n = 200: 9.4 s / 37 against 3.9 s / 61), so from `MANY_CLIENTS` clients
   on FedADMM unless a round trip costs more than `HELD_CROSSOVER` × n seconds, where ProxAL's
   fewer round trips outweigh its extra CPU (crossing measured at 0.06 s for n = 40, 0.23 s for
   n = 200; below 40 clients FedADMM's round trips vary too much: 41–182 at n = 5). Where FedADMM
   refuses the model (a client's ℓ1 term and its set, say), or its run diverges (an exp loss),
   ProxAL runs.
   Where round trips are dear (≥ `DEAR_ROUND_TRIP` seconds: Flower, not the in-process
   executors; the executor's measurement where it has one, `Executor.measure_round_trip` —
   Ray measures when a run opens it —, else its fixed hint `round_trip_cost`) ProxAL solves
   its local subproblems tighter (`local_tol_cap=DEAR_LOCAL_TOL_CAP`): more local work per
   round (since the clients' ε/n tolerance this saves round trips only sometimes: logistic-ball
   30 → 32, 36 → 35, 59 → 33 at n = 5, 10, 20), more CPU per round trip; on cheap ones its
   default.

`Auto(overrides={"proxal": {...}})` adds options to whichever backend is picked (the command
line's tighter ProxAL tolerances, for instance); `Auto(epsilon_total=...)` asks for privacy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedmodel import registry, topologies
from fedmodel.compiler.canonical import classify_objective
from fedmodel.compiler.sets import simple_set
from fedmodel.errors import FedModelError, SmoothnessError, TopologyError
from fedmodel.problem import make_backend
from fedmodel.runtime.executor import round_trip_estimate
from . import proxal_inner
from .proxal_inner import few as _few

# Clients from which FedADMM replaces ProxAL on models whose clients hold simple sets (a star)
# where round trips are cheap: from there ProxAL's held-constraint steps take the more CPU
# (docs/BENCHMARKS.md, bench_auto). Without client sets ProxAL is the cheaper at every n.
MANY_CLIENTS = 40
# Seconds per client above which a round trip is dear enough for ProxAL where clients hold sets:
# (ProxAL's CPU − FedADMM's) / (FedADMM's round trips − ProxAL's), per client — logistic-ball
# n = 40: (1.81 − 0.78 s) / (55 − 38) / 40 = 1.5e-3; n = 200: (9.39 − 3.94) / (61 − 37) / 200 =
# 1.1e-3; 200 clients × 3 rows with client balls: (21.1 − 6.3) / (118 − 53) / 200 = 1.1e-3
HELD_CROSSOVER = 1.1e-3
# Seconds per round trip from which a round trip is "dear" (Flower's simulation: ~0.1 s,
# a deployment 6.6 s; Ray on loopback ~0.015 s, in process ~1e-4 s: docs/BENCHMARKS.md)
DEAR_ROUND_TRIP = 0.05
# ProxAL's local tolerance cap where round trips are dear (its default 0.1:
# ε_{t+1} = min(q^t, τ_k/10))
DEAR_LOCAL_TOL_CAP = 0.01
DP_OPTIONS = ("epsilon_total", "epsilon", "delta")


@dataclass
class Traits:
    """What in a model decides the backend (`describe`)."""
    clients: int
    general: list[str] = field(default_factory=list)      # constraints no projection takes
    sets: list[str] = field(default_factory=list)         # simple sets (balls, bounds, affine)
    held: list[str] = field(default_factory=list)         # clients holding a simple set
    prox: list[str] = field(default_factory=list)         # blocks with a λ‖w‖₁ term
    unsupported: list[str] = field(default_factory=list)  # nonsmooth terms without a prox
    private: list[str] = field(default_factory=list)      # clients with private variables


def describe(problem) -> Traits:
    """The model's constraints and where they live, its nonsmooth terms, private variables and
    server block: what `Auto.choose` decides from."""
    traits = Traits(clients=len(problem.clients))
    for block in problem.blocks:
        where = "server" if block.kind == "server" else f"client {block.name!r}"
        for constraint in block.constraints:
            simple = simple_set(constraint, affine=True) is not None
            (traits.sets if simple else traits.general).append(f"{where}: {constraint.name}")
            if simple and block.kind != "server" and where not in traits.held:
                traits.held.append(where)
        classified = classify_objective(block.terms)
        traits.unsupported += [f"{where}: {expr}" for expr in classified.unsupported]
        if classified.prox:
            traits.prox.append(where)
    traits.private = [c.name for c in problem.clients if c.private_variables]
    return traits


def round_trip_cost(executor: Any) -> float:
    """Seconds a round trip costs on `executor` beyond the nodes' own work (`round_trip_source`
    says where the number comes from)."""
    return round_trip_source(executor)[0]


def round_trip_source(executor: Any) -> tuple[float, str]:
    """(seconds a round trip costs on `executor`, where that comes from): its measurement
    (`Executor.measure_round_trip`: an instance's own, else the last one of its class in this
    process), else its class's fixed hint `round_trip_cost` — for a name, the registered
    class's, without starting it (`executor.round_trip_estimate`)."""
    if isinstance(executor, str) or executor is None:
        executor = registry.lookup("executor", executor or "serial")
    return round_trip_estimate(executor)


def is_star(problem, topology: Any) -> bool:
    """Whether a topology is a star (None is one): a server node joined to every client and no
    client–client edge — where backends with a server run (DALD's own test for Fed-DALD-CC)."""
    if topology is None:
        return True
    server = topologies.server_node(topology)
    graph = topology.to_undirected() if topology.is_directed() else topology
    return server is not None and all(server in edge for edge in graph.edges) \
        and graph.degree(server) == len(problem.clients)


@dataclass
class Choice:
    """What `Auto` picked: a registered backend name, its options, and why (one reason a rule);
    for ProxAL, its inner solver ("newton" or "admm": `proxal_inner`; after the run, the one that ran)."""
    backend: str
    settings: dict[str, Any]
    reasons: list[str]
    round_trip_cost: float = 0.0
    inner: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "settings": dict(self.settings), "reasons": list(self.reasons),
                "round_trip_cost": self.round_trip_cost, **({"inner": self.inner} if self.inner else {})}


class Auto:
    """`backend="auto"`: the backend and settings the model and the executor call for (module
    docstring). `overrides`: {backend name: options} added to the picked backend's; DP options
    (`epsilon_total`, `epsilon`, `delta`) ask for a private run (DP-ADMM)."""

    name = "auto"

    def __init__(self, overrides: dict[str, dict[str, Any]] | None = None, **privacy: Any):
        unknown = sorted(set(privacy) - set(DP_OPTIONS))
        if unknown:
            raise FedModelError(f"backend 'auto' takes {list(DP_OPTIONS)} (a private run) and "
                                f"overrides={{backend: options}}, not {unknown}; to set a "
                                "backend's options, name it: prob.solve('proxal', ...)")
        if overrides is not None and not (isinstance(overrides, dict) and
                                          all(isinstance(v, dict) for v in overrides.values())):
            raise FedModelError(f"overrides must be {{backend name: {{option: value}}}}, got "
                                f"{overrides!r}")
        self.overrides = dict(overrides or {})
        self.privacy = {k: v for k, v in privacy.items() if v is not None}

    @property
    def solves_epigraph(self) -> bool:
        """(`Backend.solves_epigraph`) ProxAL does, unless DP options pick DP-ADMM, whose
        client step takes no private variables."""
        return not self.privacy

    def choose(self, problem, topology: Any = None, executor: Any = None) -> Choice:
        """The backend, its settings and the reasons, from the model and the executor."""
        traits, (cost, source) = describe(problem), round_trip_source(executor)
        if traits.unsupported:
            raise SmoothnessError(
                f"no backend can run problem {problem.name!r}: the terms {traits.unsupported} are "
                "nonsmooth with no prox (only λ·norm1(w) of a shared variable has one); write "
                "them as constraints (e.g. t ≥ |a|) or solve centrally with backend='cvxpy'")
        dear = cost >= DEAR_ROUND_TRIP
        trip = (f"round trips {'dear' if dear else 'cheap'} on this executor "
                f"(~{cost:.3g} s each, {source}; dear from {DEAR_ROUND_TRIP:g} s)")
        if not traits.clients:
            raise FedModelError(f"no backend can run problem {problem.name!r} federated: it has no "
                                "clients (add them with prob.add_client) — or solve it centrally "
                                "with backend='cvxpy'")
        if not is_star(problem, topology):
            return self._graph(problem, topology, traits, cost, trip)
        if self.privacy:
            return self._pick("dp-admm", dict(self.privacy), cost, [
                f"differential privacy asked ({self.privacy}): DP-ADMM is the private backend",
                trip])
        newton, why = proxal_inner.newton_reading(problem, executor)     # (ProxAL's default reads it too)
        if newton:      # dear round trips too: fewer of them (Flower: lead, 2026-12-01)
            choice = self._pick("proxal", {}, cost, [
                f"{why}: ProxAL with its subproblems by federated Newton steps (its default "
                "inner='auto'; each client sends its merit's gradient and Hessian a round "
                "trip) takes the fewest round trips and the least CPU (bench_rounds: 7–13 round "
                "trips on the ridge, logistic, ball and lasso rows, 58 / 74 on NP monks-1 at n = "
                "5 / 40)", trip])
            choice.inner = "newton"
            return choice
        declined = [f"no Newton steps: {why}"]      # (said in the reasons)
        many = MANY_CLIENTS
        simple = f"only simple sets ({_few(traits.sets)})" if traits.sets else "no constraints"
        if traits.general or traits.private:
            why = (f"constraints that are no simple set ({_few(traits.general)})" if traits.general
                   else f"private variables on clients {_few(traits.private)}")
            reasons = [f"{why}: ProxAL's augmented Lagrangian treats them exactly", trip]
        elif traits.clients >= many and traits.held:
            crossing = HELD_CROSSOVER * traits.clients
            held = f"{traits.clients} clients ≥ {many} holding sets ({_few(traits.held)})"
            if cost < crossing:
                return self._pick("fedadmm", {}, cost, [
                    f"{held}, round trips under {crossing:.3g} s: FedADMM takes less time (ProxAL's "
                    "held-constraint steps cost more CPU than its fewer round trips save)", trip, *declined])
            reasons = [f"{held}, round trips over {crossing:.3g} s: ProxAL's fewer round trips "
                       "outweigh its extra CPU", trip]
        elif traits.clients >= many:
            reasons = [f"{traits.clients} clients, {simple}, none held by a client: ProxAL takes the "
                       "fewest round trips at the CPU per round trip of FedADMM's", trip]
        else:
            reasons = [f"{traits.clients} clients < {many}, {simple}: ProxAL's defaults take the "
                       "fewest round trips", trip]
        return self._proxal(reasons + declined, cost)

    def _proxal(self, reasons: list[str], cost: float) -> Choice:
        """ProxAL where Newton steps do not fit (its default inner then runs Algorithm 2, by the
        same rule), with more local work per round where round trips are dear."""
        if cost < DEAR_ROUND_TRIP:
            choice = self._pick("proxal", {}, cost, reasons)
        else:
            choice = self._pick("proxal", {"local_tol_cap": DEAR_LOCAL_TOL_CAP}, cost, reasons + [
                f"local subproblems solved tighter (local_tol_cap={DEAR_LOCAL_TOL_CAP:g}): more "
                "local work per round, fewer round trips"])
        choice.inner = "admm"
        return choice

    def _graph(self, problem, topology, traits: Traits, cost: float, trip: str) -> Choice:
        """A graph that is no star: DALD (Fed-DALD-DC, a server block hosted on a client) with its
        sweep in colour classes, unless privacy is asked."""
        nodes = topology.number_of_nodes()
        if self.privacy:
            raise TopologyError(
                f"no backend can run problem {problem.name!r} privately on a graph that is no star "
                f"({nodes} nodes): DP-ADMM needs a server joined to every client; pass a star "
                "topology (or none) or drop the DP options")
        return self._pick("dald", {"order": "colour"}, cost, [
            f"a graph that is no star ({nodes} nodes, {topology.number_of_edges()} edges): only "
            "DALD-style backends run on graphs (Fed-DALD-DC)",
            "its sweep in colour classes (order='colour'): each class one parallel batch, so "
            "fewer round trips per iteration", trip])

    def _pick(self, backend: str, settings: dict, cost: float, reasons: list[str]) -> Choice:
        settings = {**settings, **self.overrides.get(backend, {})}
        return Choice(backend, settings, reasons, cost)

    def solve(self, problem, topology: Any = None, executor: Any = None, **options: Any):
        """Choose (`choose`), run the choice with `Problem.solve`'s other arguments, and record
        the choice in `res.info["auto"]`."""
        choice = self.choose(problem, topology, executor)
        try:
            result = make_backend(choice.backend, **choice.settings).solve(
                problem, topology=topology, executor=executor, **options)
        except FedModelError as refusal:
            if choice.backend != "fedadmm":
                raise
            # (FedADMM checks its nodes before its first round: nothing ran) ProxAL takes any
            # constraint and prox term FedADMM's projections cannot combine
            why = f"FedADMM refused the model ({' '.join(str(refusal).split()[:12])} …)"
            choice = self._proxal([why + ": ProxAL runs it"], choice.round_trip_cost)
            result = make_backend(choice.backend, **choice.settings).solve(
                problem, topology=topology, executor=executor, **options)
        if choice.backend == "fedadmm" and result.status == "diverged":
            # FedADMM's gradient steps need a gradient Lipschitz on the whole path; an exp
            # (Poisson) loss blows up where ProxAL's Newton solves converge (newuser4's abalone)
            first = {"backend": "fedadmm", "status": "diverged",
                     "round_trips": getattr(result.ledger, "round_trips", None)}
            choice = self._proxal([f"FedADMM diverged after {first['round_trips']} round trips: "
                                   "ProxAL runs it"], choice.round_trip_cost)
            result = make_backend(choice.backend, **choice.settings).solve(
                problem, topology=topology, executor=executor, **options)
            result.info["auto_first_run"] = first
        ran = result.info.get("inner", {}) if choice.backend == "proxal" else {}
        if ran and ran["name"] != choice.inner:      # ProxAL's fall-back (a refusal at its first subproblem)
            choice.inner = ran["name"]
            choice.reasons.insert(0, ran["reason"])
        result.info["auto"] = choice.as_dict()
        return result

