"""`NodeProgram`: the compiled unit of one node (a client or the server).

It holds the node's data (inside its compiled merit), its private variables and multipliers
(its state), and answers the requests declared in `messages.MESSAGES`. Backends never hold a
NodeProgram's data: they send requests through an executor and get model-sized replies.

A NodeProgram is a façade over three parts, one job each:
- `compiled_merit.CompiledMerit` (`program.compiled`): the plans of P_i — value, gradient,
  Hessian, Hessian-vector product — and of the objective and constraint residuals;
- `node_state.NodeState` (`program.node_state`): everything a later request depends on, as
  plain data, which `save_state` / `load_state` copy whole;
- `local_solvers.SOLVERS`: the table of local solvers `solve_local` picks from.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..compiler.canonical import needs_projection
from ..compiler.merit import LOCAL_PENALTY
from ..collector import collection_paused, freeze_setup
from ..constraints import Constraint, Equality
from ..expression import Data, Variable
from . import local_al, local_solvers, low_rank, solve_cache
from .compiled_merit import CompiledMerit, Layout
from .node_state import NodeState


class NodeProgram:
    """Compiled merit P_i, its gradient, constraints and objective of one node, and its state."""

    def __init__(self, name: str, role: str, terms: list, constraints: list[Constraint],
                 shared: list[Variable], private: list[Variable], project: bool = False,
                 local: bool = False):
        self.name, self.role = name, role
        self.shared, self.private = Layout(shared), Layout(private)
        self.n_shared, self.n_private = self.shared.size, self.private.size
        self.variables = shared + private
        self.compiled = CompiledMerit(name, terms, constraints, self.shared, self.private, project, local)
        m = self.compiled.ir
        self.node_state = NodeState(
            y=np.zeros(self.n_private), y_center=np.zeros(self.n_private),
            # the Parameters' initial arrays themselves (no copy per client): neither side
            # changes an array in place, both replace it (and save_state copies)
            mu={name: p.value for name, p in m.multipliers.items()},
            centers={uid: p.value for uid, p in m.centers.items()})
        self._factor_cache: tuple | None = None    # (weights, Inverse of ∇²P_i + diag, spectrum): derived
        self._hessian_key: tuple | None = None     # the settings the kept Hessian is exact for
        self.holder = None   # the executor holding its state (`Executor.take_over`), or None: free

    def __getstate__(self) -> dict:
        if self.holder is not None:         # a copy (Ray, checkpoints) gets the newest state
            self.holder.sync()
        state = dict(self.__dict__, holder=None)
        state.pop("_low_rank", None)        # derived (`low_rank.structure`): analysed again there
        return state

    # ---- the parts, as the executors and backends read them -----------------------------------
    merit_ir = property(lambda self: self.compiled.ir, doc="The merit's IR (`compiler.merit.Merit`).")
    value_grad_plan = property(lambda self: self.compiled.value_grad_plan)
    objective_plan = property(lambda self: self.compiled.objective_plan)
    gradient_plan = property(lambda self: self.compiled.gradient_plan)
    quadratic = property(lambda self: self.compiled.quadratic)
    constraints = property(lambda self: self.compiled.constraints)
    all_constraints = property(lambda self: self.compiled.all_constraints)

    @property
    def y(self) -> np.ndarray:
        """The private variables' current value (flat)."""
        return self.node_state.y

    @y.setter
    def y(self, value: np.ndarray) -> None:
        self.node_state.y = value

    @property
    def state(self) -> dict[str, Any]:
        """Node-side state of backend procedures (e.g. ADMM's u, λ)."""
        return self.node_state.procedures

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        self.node_state.procedures = value

    @property
    def _hessian_cache(self) -> np.ndarray | None:
        """The chord Hessian ∇²P_i the Newton solves keep (`local_solvers.newton_matrix`)."""
        return self.node_state.hessian

    @_hessian_cache.setter
    def _hessian_cache(self, value: np.ndarray | None) -> None:
        self.node_state.hessian = value

    # ---- evaluation --------------------------------------------------------------------------
    def _values(self, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
        return self.compiled.values(x, y)

    def value_grad(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """P_i and its gradient with respect to z = (x, y) (`CompiledMerit.value_grad`)."""
        return self.compiled.value_grad(x, y)

    def gradient(self, x: np.ndarray) -> np.ndarray:
        """∇ₓP_i at (x, current y) without P_i's value: bitwise `merit(x)["grad"]`, for callers
        that need only the gradient (ProxAL's test (22), once per ADMM step and client)."""
        return self.compiled.gradient(np.asarray(x, float), self.y)

    def hessian(self, z: np.ndarray) -> np.ndarray:
        """∇²P_i(z) (`CompiledMerit.hessian`; refused beyond the dense Newton budget)."""
        return self.compiled.hessian(z)

    def hvp(self, z: np.ndarray, v: np.ndarray) -> np.ndarray:
        """∇²P_i(z)·v without forming ∇²P_i."""
        return self.compiled.hvp(z, v)

    # ---- requests (see messages.MESSAGES) ------------------------------------------------------
    def configure(self, beta: float, prox_weight: float, center: np.ndarray) -> dict:
        """Set β, the proximal weight ω on the shared variables and the center x̄; the private
        variables' center is their current value, with weight 1/β (they live in one block).
        The node's state keeps them (β once: `NodeState.beta`), the merit's Parameters get them."""
        s = self.node_state
        s.beta, s.prox_weight = float(beta), float(prox_weight)
        s.y_center = self.y.copy()
        for var, value in zip(self.variables, self._values(np.asarray(center, float), s.y_center)):
            s.centers[var.uid] = np.array(value, dtype=float)
        self.compiled.set_parameters(beta=beta, prox_weight=prox_weight, centers=s.centers)
        self._sync_penalties()
        self._forget_hessian()
        return {}

    # ---- constraints its local solves hold (`compile_programs(client_constraints=True)`) -----
    @property
    def local_names(self) -> list[str]:
        """The constraints this client's local solves hold exactly (local solver "local-al";
        their μ are the multipliers of its last local solve, which "update_multipliers" leaves
        alone); [] when it has none or was told to keep them in the AL (`hold_locally(False)`)."""
        penalties = self.compiled.ir.local_penalties      # (not the properties: read ~5× a step)
        return list(penalties) if penalties and self.node_state.procedures.get("local_constraints", True) else []

    def hold_locally(self, local: bool) -> None:
        """Hold the local constraints in the local solves (True) or put them back in the
        augmented Lagrangian with the node's β (False: a backend's fallback), kept in the state."""
        if self.merit_ir.local_penalties and bool(local) != bool(self.local_names):
            self.state["local_constraints"] = bool(local)
            self._sync_penalties()

    def _sync_penalties(self, value: float | None = None) -> None:
        """Write σ of the local constraints' AL terms: `value` (a local solve's), else the
        state's — β when they are in the AL, `merit.LOCAL_PENALTY` when held locally."""
        penalties = self.merit_ir.local_penalties
        if not penalties:
            return
        if value is None:
            value = self._settings_key()[0] if not self.local_names else LOCAL_PENALTY
        value = float(value)
        if all(p.value is not None and float(p.value) == value for p in penalties.values()):
            return      # σ as it is (a local solve's rounds: twice per client and round)
        for parameter in penalties.values():
            parameter.value = value
        self.compiled.forget()

    def constraint_remainder(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """`prox_remainder` after the local constraints' share: g (∇P_i at x plus the ADMM's
        terms) without their AL gradient, plus the element of their normal cone closest to −g
        (`local_al.local_remainder`) — the optimality residual when the local solves hold them."""
        if self.local_names:
            g = local_al.local_remainder(self, x, g)
        return self.prox_remainder(x, g)

    def merit(self, x: np.ndarray) -> dict:
        value, g = self.value_grad(np.asarray(x, float), self.y)
        return {"value": value, "grad": g[:self.n_shared]}

    def solve_local(self, linear, weight, anchor, x0, tol, method="auto", max_steps=1000, lr=None) -> dict:
        """argmin_{x,y} P_i(x, y) + linearᵀx + ½ Σ_j weight_j (x_j − anchor_j)² (+ h on the
        server) to ‖∇‖∞ ≤ tol, warm-started at (x0, current y), by the local solver `method`
        (a name of `local_solvers.SOLVERS`, or "auto": `local_solvers.choose`)."""
        linear = np.zeros(self.n_shared) if linear is None else np.asarray(linear, float)
        anchor = np.zeros(self.n_shared) if anchor is None else np.asarray(anchor, float)
        weight = np.asarray(weight, float)     # (np.full: broadcast_to sets up an nditer, ~3 µs)
        weight_x = np.full(self.n_shared, weight) if weight.ndim == 0 else \
            np.broadcast_to(weight, (self.n_shared,))
        n_x = self.n_shared

        def fun_grad(z):
            x, y = z[:n_x], z[n_x:]
            value, g = self.compiled.value_grad(x, y)     # (`value_grad`, one call less)
            diff = x - anchor
            scaled = weight_x * diff
            value += float(linear @ x + 0.5 * (diff @ scaled))
            g[:n_x] += linear + scaled        # g is ours: value_grad returns a fresh array
            return value, g

        z0 = np.concatenate([np.asarray(x0, float), self.y])
        problem = local_solvers.LocalProblem(fun_grad, z0, tol, weight_x, max_steps, lr)
        z, steps, residual = local_solvers.solve(self, method, problem)
        self.y = z[n_x:].copy()
        return {"x": z[:n_x], "steps": steps, "grad_norm": residual}

    def _choose(self, method: str) -> str:
        """The table entry `solve_local` takes for `method` (`local_solvers.choose`)."""
        return local_solvers.choose(self, method)

    def _settings_key(self) -> tuple[float, float, float]:
        """(β, ω, ω_y) as the merit's Parameters hold them (β = 1, ω_y = 0 before "configure")."""
        beta, weight = self.node_state.beta, self.node_state.prox_weight
        if beta is None:
            return 1.0, float(weight), 0.0
        return float(beta), float(weight), (1.0 / beta) if self.n_private else 0.0

    def _forget_hessian(self) -> None:
        """After the merit's parameters change: forget recent evaluations, and a quadratic merit's
        Hessian if β or ω changed ("exact" needs it exact; no inequality terms, no active set; a
        packed one is refreshed, `low_rank.refreshed`). Other merits keep theirs (chord matrix)."""
        self.compiled.forget()
        if self.quadratic and self._settings_key() != self._hessian_key:     # (the key: only then)
            self._hessian_cache, self._factor_cache, self._hessian_key = \
                low_rank.refreshed(self), None, self._settings_key()

    def apply_prox(self, z: np.ndarray, t: float) -> np.ndarray:
        """prox_{t·g} of the node's prox terms g on the shared part of z = (x, y) (a copy; y is
        left as is); for set terms, the projection. Terms on the same variable are applied in
        sequence: exact for λ‖x‖₁ and for a single set, for bounds and ‖·‖∞ balls together
        (intervals per coordinate), and for λ‖x‖₁ with a ball or bounds (the prox factors)."""
        n_x = self.n_shared
        out = np.array(z, dtype=float)
        parts = self.shared.unpack(out[:n_x])
        for term in self.merit_ir.prox_terms:
            i = self.shared.variables.index(term.variable)
            parts[i] = term.prox(parts[i], t)
        out[:n_x] = self.shared.pack(parts)
        return out

    def prox_remainder(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """g (a gradient in the shared variables at x) plus the element of the prox terms'
        subdifferentials (λ∂‖w‖₁, normal cones) closest to −g, term by term: the optimality
        residual of a node with prox terms (g itself when it has none)."""
        if not self.merit_ir.prox_terms:
            return np.array(g, dtype=float)
        parts = self.shared.unpack(np.asarray(g, float).copy())
        values = self.shared.unpack(np.asarray(x, float))
        for term in self.merit_ir.prox_terms:
            i = self.shared.variables.index(term.variable)
            parts[i] = term.residual(values[i], parts[i])
        return self.shared.pack(parts)

    def update_multipliers(self, x: np.ndarray) -> dict:
        """μ_I ← [μ_I + β c_I]₊, μ_E ← μ_E + β c_E at (x, y); reply ‖Δμ‖∞ and ‖Δy‖∞."""
        s = self.node_state
        beta = self._settings_key()[0]
        residuals = self.compiled.residuals(*self._values(np.asarray(x, float), self.y)) \
            if self.constraints else []
        change, new_mu, local = 0.0, {}, self.local_names
        for constraint, c_value in zip(self.constraints, residuals):
            if constraint.name in local:      # its μ is the local solves' (`local_al.solve`)
                continue
            mu = s.mu[constraint.name]
            new = mu + beta * np.asarray(c_value)
            if not isinstance(constraint, Equality):
                new = np.maximum(new, 0.0)
            change = max(change, float(np.max(np.abs(new - mu), initial=0.0)))
            new_mu[constraint.name] = new
        self.set_multipliers(new_mu)
        dy = float(np.max(np.abs(self.y - s.y_center), initial=0.0))
        return {"dmu": change, "dy": dy}

    def report(self, x: np.ndarray) -> dict:
        """Objective f_i (with prox-able terms) and the largest violation of this node's constraints."""
        values = self._values(np.asarray(x, float), self.y)
        objective = float(self.objective_plan(*values)[0])
        for term in self.merit_ir.prox_terms:
            objective += term.value(values[self.shared.variables.index(term.variable)])
        residuals = self.compiled.all_residuals(*values) if self.all_constraints else []
        violation = max([0.0] + [c.violation(r) for c, r in zip(self.all_constraints, residuals)])
        return {"objective": objective, "violation": violation}

    def violations(self, x: np.ndarray, tol: float = 0.0) -> dict[str, float]:
        """{"name: constraint": violation} of this node's constraints (as the user wrote them)
        violated by more than `tol` at (x, current y): what an infeasible run names."""
        if not self.all_constraints:
            return {}
        residuals = self.compiled.all_residuals(*self._values(np.asarray(x, float), self.y))
        return {repr(c): c.violation(r) for c, r in zip(self.all_constraints, residuals)
                if c.violation(r) > tol}

    def multipliers(self) -> dict:
        return {"multipliers": {name: mu.copy() for name, mu in self.node_state.mu.items()}}

    def private_values(self) -> dict:
        return {"values": {v.uid: val.copy() for v, val in zip(self.private.variables, self.private.unpack(self.y))}}

    def set_multipliers(self, multipliers: dict[str, np.ndarray], checked: bool = True) -> None:
        """Set the multipliers of the named constraints (the node's state and its merit).
        `checked=False`: the caller's values are finite float arrays of the constraints' shapes,
        ≥ 0 (a local solve's rounds, `local_al.solve_rows`), written without the setter's checks."""
        mu = self.node_state.mu
        for name, value in multipliers.items():
            mu[name] = np.asarray(value, float)
        if checked:
            self.compiled.set_parameters(multipliers={name: mu[name] for name in multipliers})
        else:
            params = self.compiled.ir.multipliers
            for name in multipliers:
                params[name]._assign(mu[name])
        self._forget_hessian()      # (forgets the memoized evaluations too)

    def save_state(self) -> dict:
        """The node's state (`NodeState`, every field, copied): everything a later request
        depends on (checkpoints, Ray recovery, a Flower node's `Context`)."""
        return {"state": self.node_state.to_plain()}

    def load_state(self, state: dict) -> dict:
        """Take `state` (a `save_state`'s, or a checkpoint's without the settings: those kept)
        and write it into the merit's Parameters."""
        s = self.node_state = self.node_state.updated(state)
        self.compiled.set_parameters(beta=s.beta if "beta" in state else None,
                                     prox_weight=s.prox_weight if "prox_weight" in state else None,
                                     centers=s.centers, multipliers=s.mu)
        self._sync_penalties()
        # the kept Hessian is exact for the settings it was saved with, which are the node's
        # now (a state is saved after `_forget_hessian` has matched them); its factor is derived
        self._factor_cache = None
        self._hessian_key = self._settings_key() if self.quadratic else None
        return {}


class ProgramSpec:
    """The source of one node's program — its block's terms and constraints — to be compiled
    where the node runs. A block whose data comes from a loader (`client.data(loader=...)`) stays
    a spec on the driver; executors `build()` it (the serial one in-process, Ray on the actor).
    It carries the layout, so backends can read `n_shared` and `shared` from it."""

    def __init__(self, name: str, role: str, terms: list, constraints: list[Constraint],
                 shared: list[Variable], private: list[Variable], project: bool = False,
                 local: bool = False):
        self.name, self.role, self.project, self.local = name, role, project, local
        self.terms, self.constraints = list(terms), list(constraints)
        self.shared, self.private = Layout(shared), Layout(private)
        self.n_shared, self.n_private = self.shared.size, self.private.size

    @functools.cached_property
    def loader_data(self) -> list:
        """Data leaves with a loader read by this block (loaded or not); found once (a walk over
        the block's expressions, which `compile_programs` needs twice per client)."""
        exprs = self.terms + [c.expr for c in self.constraints]
        found = {leaf.uid: leaf for e in exprs for leaf in e.leaves()
                 if isinstance(leaf, Data) and leaf.loader is not None}
        return list(found.values())

    @property
    def remote(self) -> bool:
        return any(d.remote for d in self.loader_data)

    def build(self) -> NodeProgram:
        """Run the block's loaders here (DataError naming the block on failure), then compile."""
        for item in self.loader_data:
            item.load()
        program = NodeProgram(self.name, self.role, self.terms, self.constraints,
                              self.shared.variables, self.private.variables, project=self.project,
                              local=self.local)
        program.spec = self
        return program


@solve_cache.reused      # (a warm re-solve of an unchanged model: its last programs, restarted)
def compile_programs(problem, project: bool = True, client_sets: bool = False,
                     client_constraints: bool = False, to_server: list = ()) -> dict[str, "NodeProgram | ProgramSpec"]:
    """One NodeProgram per block (server first, then clients in order). With `project`, simple
    constraints on the shared variables held by the server are handled by projection; with
    `client_sets` also those held by clients, on the client (for backends whose client solves
    project, e.g. FedADMM); with `client_constraints` a client's smooth convex inequalities on
    the shared variables get their own penalty (`compiler.merit.is_local`), for backends whose
    local solves hold them (local solver "local-al": `local_al.solve`); `to_server`: clients'
    sets the server holds instead (FedAvg's server step projects on them). A block whose
    data is produced on its worker stays a `ProgramSpec` (the executor builds it there)."""
    shared = problem.shared_variables()
    moved = [] if client_sets else moved_to_server(problem)
    moved += [c for c in to_server if not any(c is m for m in moved)]
    programs: dict = {}
    with collection_paused():
        for block in problem.blocks:
            private = list(getattr(block, "private_variables", []))
            role = "server" if block is problem.server else "client"
            constraints = block.constraints + moved if role == "server" else \
                [c for c in block.constraints if not any(c is m for m in moved)]
            spec = ProgramSpec(block.name, role, block.terms, constraints, shared, private,
                               project=project and (role == "server" or client_sets),
                               local=client_constraints and role == "client")
            programs[block.name] = spec if spec.remote else spec.build()
        freeze_setup()       # (in the pause: see there)
    return programs


def moved_to_server(problem) -> list[Constraint]:
    """Clients' constraints on the shared variables alone with no smooth form (a ‖·‖₁ ball, a
    ball whose radius is a Parameter): the same constraint on the server, where it is projected
    (`compile_programs` puts them there unless clients' solves project)."""
    return [c for b in problem.clients for c in b.constraints if needs_projection(c)]
