"""`NodeProgram`: the compiled unit of one node (a client or the server).

It holds the node's data (inside its compiled plans), its private variables, and its
multipliers, and answers the requests declared in `ledger.MESSAGES`. Backends never hold a
NodeProgram's data: they send requests through an executor and get model-sized replies.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..atoms import add, multiply, sum as sum_
from ..compiler.canonical import needs_projection
from ..compiler.classify import polynomial_degree
from ..collector import collection_paused, freeze_setup
from ..compiler.codegen import Plan
from ..compiler.differentiate import grad
from ..compiler.directions import Unbatchable
from ..compiler.merit import build_merit
from ..constraints import Constraint, Equality
from ..errors import FedModelError, SmoothnessError
from ..expression import Data, Parameter, Variable
from . import solvers
from .active_set import feature_sign, l1_residual


# floats per direction-carrying intermediate of `NodeProgram.hessian` (32 MB): its columns go in
# blocks of directions that keep each intermediate (e.g. X V for data X) within it
HESSIAN_BLOCK_FLOATS = 4_000_000
ACTIVE_SET_MAX = 500    # unknowns up to which a quadratic + λ‖w‖₁ subproblem is solved exactly


class Layout:
    """Packs a list of variables into one flat vector and back."""

    def __init__(self, variables: list[Variable]):
        self.variables = variables
        self.offsets = np.cumsum([0] + [v.size for v in variables])
        self.size = int(self.offsets[-1])

    def unpack(self, flat: np.ndarray) -> list[np.ndarray]:
        return [flat[self.offsets[i]:self.offsets[i + 1]].reshape(v.shape)
                for i, v in enumerate(self.variables)]

    def pack(self, values: list[Any]) -> np.ndarray:
        if not values:
            return np.zeros(0)
        return np.concatenate([np.ravel(np.broadcast_to(np.asarray(v, dtype=float), var.shape))
                               for v, var in zip(values, self.variables)])


class NodeProgram:
    """Compiled merit P_i, its gradient, constraints and objective of one node."""

    def __init__(self, name: str, role: str, terms: list, constraints: list[Constraint],
                 shared: list[Variable], private: list[Variable], project: bool = False):
        self.name, self.role = name, role
        self.shared, self.private = Layout(shared), Layout(private)
        self.n_shared, self.n_private = self.shared.size, self.private.size
        self.variables = shared + private
        self.merit_ir = build_merit(terms, constraints, self.variables, name, project=project)
        m = self.merit_ir
        self.constraints = m.constraints   # handled by the AL (canonical: rewritten if nonsmooth)
        self.all_constraints = constraints
        if m.unsupported or not m.expression.is_smooth():
            reasons = m.unsupported or ["the merit function is not smooth"]
            raise SmoothnessError(
                f"node {name!r} has a nonsmooth term or constraint without a prox: "
                + "; ".join(reasons))
        # the compiled plans of P_i with ∇P_i per variable, and of f_i: public (read them, do not
        # replace them) because the batched executor stacks the plans of a group's clients
        self.value_grad_plan = Plan([m.expression] + [grad(m.expression, v) for v in self.variables],
                                    self.variables)
        self.objective_plan = Plan([m.objective], self.variables)
        self.quadratic = _is_quadratic(self.value_grad_plan)
        self._hvp_directions = None   # see _direction_plan
        self._gradient_plan = None   # see gradient
        self._hessian_cache: np.ndarray | None = None
        self._factor_cache: tuple | None = None
        self._hessian_key: tuple | None = None
        self._recent: dict[bytes, tuple[float, np.ndarray]] = {}   # see value_grad
        self.y = np.zeros(self.n_private)
        self._y_center = np.zeros(self.n_private)
        self.state: dict[str, Any] = {}   # node-side state of backend procedures (e.g. ADMM's u, λ)
        self.holder = None   # the executor holding its state (`Executor.take_over`), or None: free

    def __getstate__(self) -> dict:
        if self.holder is not None:         # a copy (Ray, checkpoints) gets the newest state
            self.holder.sync()
        return dict(self.__dict__, holder=None)

    # ---- evaluation helpers -----------------------------------------------------------------
    def _values(self, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
        return self.shared.unpack(x) + self.private.unpack(y)

    def value_grad(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """P_i and its gradient with respect to z = (x, y). The last two evaluations are kept
        (until a parameter of the merit changes): ADMM-type steps evaluate the merit at a point
        and then start a local solve there, or restart from where the last solve ended."""
        key = x.tobytes() + y.tobytes()
        hit = self._recent.get(key)
        if hit is not None:
            return hit[0], hit[1].copy()
        out = self.value_grad_plan(*self._values(x, y))
        g = self._flatten(out[1:])
        if len(self._recent) >= 2:
            del self._recent[next(iter(self._recent))]
        self._recent[key] = (float(out[0]), g.copy())
        return float(out[0]), g

    def gradient(self, x: np.ndarray) -> np.ndarray:
        """∇ₓP_i at (x, current y) without P_i's value: bitwise `merit(x)["grad"]`, from a plan
        that skips the loss itself (the logistic values: ~15 % of an evaluation), for callers
        that need only the gradient (ProxAL's test (22), once per ADMM step and client)."""
        x = np.asarray(x, float)
        hit = self._recent.get(x.tobytes() + self.y.tobytes())
        if hit is not None:
            return hit[1][:self.n_shared].copy()
        return self._flatten(self.gradient_plan(*self._values(x, self.y)))[:self.n_shared]

    # the constraint residual plans are compiled on first use (only a node with constraints
    # uses them): the empty plans of an unconstrained client were 14 of the ~150 objects its
    # program kept (memory, and what the cyclic collector scans at 10⁵ clients). A constrained
    # node so compiles them in its run's first report, outside the set-up's collector pause
    @functools.cached_property
    def _residuals(self) -> Plan:
        """The residuals of the constraints the augmented Lagrangian handles (`constraints`)."""
        return Plan([c.expr for c in self.constraints], self.variables)

    @functools.cached_property
    def _all_residuals(self) -> Plan:
        """The residuals of the node's constraints as the user wrote them (`all_constraints`)."""
        return Plan([c.expr for c in self.all_constraints], self.variables)

    @property
    def gradient_plan(self) -> Plan:
        """The plan of ∇P_i per variable without P_i itself, compiled on first use (its
        gradients are the merit plan's outputs, so its numbers are `value_grad_plan`'s)."""
        if self._gradient_plan is None:
            self._gradient_plan = Plan(self.value_grad_plan.outputs[1:], self.variables)
        return self._gradient_plan

    def _flatten(self, parts: list) -> np.ndarray:
        """The per-variable gradients as one new flat vector (broadcast to each variable's shape)."""
        if len(self.variables) == 1 and np.shape(parts[0]) == self.variables[0].shape:
            return np.array(parts[0], dtype=float).ravel()   # the common case, without broadcast_to
        return np.concatenate([np.ravel(np.broadcast_to(gi, v.shape))
                               for gi, v in zip(parts, self.variables)]) if self.variables else np.zeros(0)

    def hessian(self, z: np.ndarray) -> np.ndarray:
        """∇²P_i(z) from the derived Hessian-vector product ∇(∇P_i · v), compiled once as a plan
        that carries many directions v at once (`codegen.Plan(batched=...)`): called with the
        unit vectors it returns the matrix, e.g. Xᵀ (s ⊙ X) for a loss of X w in one matrix
        product, where deriving and compiling one product per column (the earlier one-plan
        path) cost d differentiations at set-up and d matrix-vector products per call.
        Columns go in blocks of at most `HESSIAN_BLOCK_FLOATS` floats per intermediate; a
        merit whose product has a step without a rule over directions takes the single-
        direction plan column by column. A matrix beyond `solvers.DENSE_NEWTON_FLOATS` is
        refused (FedModelError), never allocated: such sizes take the Hessian-free solves
        (`hvp`, `_choose`)."""
        layout = self._layout
        values, n = layout.unpack(z), layout.size
        if not solvers.dense_fits(n):
            raise FedModelError(
                f"node {self.name!r}: its {n} × {n} Hessian would take {8 * n * n / 1e9:.1f} GB, "
                f"beyond the dense Newton budget (fedmodel.runtime.solvers.DENSE_NEWTON_FLOATS = "
                f"{solvers.DENSE_NEWTON_FLOATS:.3g} floats); use a Hessian-free local solver "
                "(method 'auto', 'newton-cg' or 'lbfgs')")
        plan = self._hessian_plan
        if plan is None:                    # no rule over directions: one product per column
            H = np.column_stack([self.hvp(z, e) for e in np.eye(n)]) if n else np.zeros((0, 0))
            return 0.5 * (H + H.T)
        H = np.empty((n, n))
        for start, k, directions in self._unit_directions:
            out = plan(*values, *directions)
            if len(out) == 1 and plan.batched_outputs[0] and out[0].shape == (n, k):
                H[:, start:start + k] = out[0]            # one vector variable: its columns
                continue
            H[:, start:start + k] = np.concatenate([     # (an output not carrying them is 0)
                np.reshape(np.broadcast_to(o if carried else np.reshape(o, np.shape(o) + (1,)),
                                           v.shape + (k,)), (v.size, k))
                for o, carried, v in zip(out, plan.batched_outputs, self.variables)])
        return 0.5 * (H + H.T)

    @functools.cached_property
    def _layout(self) -> Layout:
        """The layout of z = (x, y): all the node's variables."""
        return Layout(self.variables)

    @functools.cached_property
    def _unit_directions(self) -> list[tuple[int, int, list[np.ndarray]]]:
        """The unit vectors e_j in blocks for `_hessian_plan`: (first column, k, the block's
        directions per variable, each of shape var.shape + (k,)); at most
        `HESSIAN_BLOCK_FLOATS` floats per direction-carrying intermediate of a block."""
        layout, plan = self._layout, self._hessian_plan
        n = layout.size
        block = max(1, min(n, HESSIAN_BLOCK_FLOATS // max(plan.batched_size, 1)))
        identity = np.eye(n)
        return [(start, min(block, n - start),
                 [np.reshape(E, v.shape + (E.shape[1],)) for E, v in
                  zip(np.split(identity[:, start:start + block], layout.offsets[1:-1]), self.variables)])
                for start in range(0, n, block)]

    @functools.cached_property
    def _hvp_expressions(self) -> tuple[list, list[Parameter]]:
        """∇(∇P_i · v) per variable as expressions, with the direction v as Parameters (one per
        variable), derived once from the merit plan's own gradients (`value_grad_plan`)."""
        directions = [Parameter(v.shape, name=f"dir[{v.name}]") for v in self.variables]
        gv = add(*[sum_(multiply(gi, di)) for gi, di in zip(self.value_grad_plan.outputs[1:], directions)])
        return [grad(gv, v) for v in self.variables], directions

    @functools.cached_property
    def _hessian_plan(self) -> Plan | None:
        """The Hessian-vector product's plan over many directions (the directions are inputs
        after the variables), or None when one of its steps has no rule over directions."""
        products, directions = self._hvp_expressions
        try:
            return Plan(products, self.variables + directions, batched=directions)
        except Unbatchable:
            return None

    def _direction_plan(self) -> tuple[Plan, list[Parameter]]:
        """The compiled Hessian-vector product ∇(∇P_i · v) with the direction v as Parameters
        (one per variable), built on first use: O(N) memory per product, whatever N."""
        if getattr(self, "_hvp_directions", None) is None:   # (absent in older pickles)
            products, directions = self._hvp_expressions
            self._hvp_directions = (Plan(products, self.variables), directions)
        return self._hvp_directions

    def hvp(self, z: np.ndarray, v: np.ndarray) -> np.ndarray:
        """∇²P_i(z)·v without forming ∇²P_i (compiled: for sparse data two sparse products)."""
        plan, directions = self._direction_plan()
        layout = Layout(self.variables)
        for d, dv in zip(directions, layout.unpack(np.asarray(v, float))):
            d.value = dv
        return layout.pack(plan(*layout.unpack(z)))

    # ---- requests (see ledger.MESSAGES) ------------------------------------------------------
    def configure(self, beta: float, prox_weight: float, center: np.ndarray) -> dict:
        """Set β, the proximal weight ω on the shared variables and the center x̄; the private
        variables' center is their current value, with weight 1/β (they live in one block)."""
        m = self.merit_ir
        m.beta.value = beta
        m.prox_weight.value = prox_weight
        m.private_weight.value = (1.0 / beta) if self.n_private else 0.0
        self._y_center = self.y.copy()
        for var, value in zip(self.variables, self._values(np.asarray(center, float), self._y_center)):
            m.centers[var.uid].value = value
        self._forget_hessian()
        return {}

    def merit(self, x: np.ndarray) -> dict:
        value, g = self.value_grad(np.asarray(x, float), self.y)
        return {"value": value, "grad": g[:self.n_shared]}

    def solve_local(self, linear, weight, anchor, x0, tol, method="auto", max_steps=1000, lr=None) -> dict:
        """argmin_{x,y} P_i(x, y) + linearᵀx + ½ Σ_j weight_j (x_j − anchor_j)² (+ h on the
        server) to ‖∇‖∞ ≤ tol, warm-started at (x0, current y)."""
        linear = np.zeros(self.n_shared) if linear is None else np.asarray(linear, float)
        anchor = np.zeros(self.n_shared) if anchor is None else np.asarray(anchor, float)
        weight = np.asarray(weight, float)     # (np.full: broadcast_to sets up an nditer, ~3 µs)
        weight_x = np.full(self.n_shared, weight) if weight.ndim == 0 else \
            np.broadcast_to(weight, (self.n_shared,))
        n_x = self.n_shared

        def fun_grad(z):
            x, y = z[:n_x], z[n_x:]
            value, g = self.value_grad(x, y)
            diff = x - anchor
            scaled = weight_x * diff
            value += float(linear @ x + 0.5 * (diff @ scaled))
            g[:n_x] += linear + scaled        # g is ours: value_grad returns a fresh array
            return value, g

        z0 = np.concatenate([np.asarray(x0, float), self.y])
        method = self._choose(method)
        if method == "prox":
            z, steps, residual = self._solve_prox(fun_grad, z0, tol, weight_x)
        elif method in ("exact", "newton"):
            def hess(z, fresh):
                return self._newton_matrix(z, weight_x, fresh and method == "newton")
            if method == "exact":   # a quadratic: solve it exactly (one step and one refinement),
                tol, max_steps = 0.0, 2   # whatever tolerance was allowed — it costs the same
            z, steps, residual = solvers.newton(fun_grad, hess, z0, tol, max_steps)
        elif method == "gd":
            z, steps, residual = solvers.gradient_descent(fun_grad, z0, lr, int(max_steps))
        elif method in ("newton-cg", "exact-cg"):
            def hvp(z, v):
                out = self.hvp(z, v)
                out[:n_x] += weight_x * v[:n_x]
                return out
            z, steps, residual = solvers.newton_cg(fun_grad, hvp, z0, tol, max_steps,
                                                   exact=method == "exact-cg")
        elif method == "lbfgs":
            z, steps, residual = solvers.lbfgs(fun_grad, z0, tol, max_steps)
        else:
            raise FedModelError(f"unknown local solver {method!r}")
        self.y = z[n_x:].copy()
        return {"x": z[:n_x], "steps": steps, "grad_norm": residual}

    def _choose(self, method: str) -> str:
        """The local method for `method` ("auto" or a name) by the size rule: a dense Newton
        matrix ("exact", "newton") only while it fits `solvers.DENSE_NEWTON_FLOATS`; beyond,
        Newton-CG on Hessian-vector products ("exact-cg": CG to 1e-12 for a quadratic).
        "auto" keeps today's choices within the budget (Newton up to 200 unknowns, L-BFGS-B
        above) and takes Newton-CG beyond it."""
        n = self.n_shared + self.n_private
        if method == "auto":
            if self.merit_ir.prox_terms:
                return "prox"
            if self.quadratic:
                method = "exact"
            elif n <= 200 and solvers.dense_fits(n):
                return "newton"
            else:   # beyond the budget Newton-CG: 3-6× faster than L-BFGS-B on a9a's hashed
                # logistic clients (d = 16,507, β = 10 and 300, tol 1e-6 and 1e-9)
                return "lbfgs" if solvers.dense_fits(n) else "newton-cg"
        if method in ("exact", "newton") and not solvers.dense_fits(n):
            return "exact-cg" if method == "exact" else "newton-cg"
        return method

    def _newton_matrix(self, z: np.ndarray, weight_x: np.ndarray, fresh: bool) -> solvers.Inverse:
        """The inverse (`solvers.Inverse`) of ∇²P_i + diag(weight). ∇²P_i is cached until a
        Newton step asks for a fresh one (the chord rule in `solvers.newton`), also across
        parameter changes: an earlier Hessian is only a chord matrix, and the first step that
        makes too little progress replaces it. A quadratic merit's Hessian is constant until β
        or a proximal weight changes, so "exact" costs one inversion per change and one
        matrix-vector product per solve."""
        if fresh or self._hessian_cache is None:
            self._hessian_cache, self._factor_cache = self.hessian(z), None
        key = weight_x.tobytes()
        cached = self._factor_cache
        # (a checkpoint written before the inverse held a Cholesky factor: recomputed)
        if cached is None or cached[0] != key or not isinstance(cached[1], solvers.Inverse):
            H = self._hessian_cache.copy()
            H[np.diag_indices(self.n_shared)] += weight_x
            self._factor_cache = (key, solvers.Inverse(H))
        return self._factor_cache[1]

    def _forget_hessian(self) -> None:
        """After the merit's parameters change: forget recent evaluations, and the Hessian of a
        quadratic merit if β or a proximal weight changed ("exact" needs the exact matrix; it
        has no inequality terms, whose active set would matter). Other merits keep theirs as a
        chord matrix (see `_newton_matrix`)."""
        m = self.merit_ir
        self._recent.clear()
        key = (float(m.beta.value), float(m.prox_weight.value), float(m.private_weight.value))
        if self.quadratic and key != self._hessian_key:
            self._hessian_cache, self._factor_cache, self._hessian_key = None, None, key

    def _solve_prox(self, fun_grad, z0, tol, weight_x):
        """Prox terms all λ‖w‖₁ (and not too many unknowns): exact feature-sign search for a
        quadratic merit, proximal Newton otherwise; FISTA for other terms or when those fail."""
        terms = self.merit_ir.prox_terms
        if terms and all(t.kind == "norm1" for t in terms) and z0.size <= ACTIVE_SET_MAX and \
                solvers.dense_fits(z0.size):
            solve = self._solve_quadratic_l1 if self.quadratic else self._solve_prox_newton
            exact = solve(fun_grad, z0, tol, weight_x)
            if exact is not None:
                return exact
        lipschitz = float(np.max(weight_x, initial=1.0))
        return solvers.prox_gradient(fun_grad, self.apply_prox, z0, tol, lipschitz, max_steps=100_000)

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

    def _solve_quadratic_l1(self, fun_grad, z0, tol, weight_x):
        """A quadratic merit whose prox terms are all λ‖w‖₁: solved exactly by feature-sign
        search on the cached Hessian (`active_set`), or None if that fails (then FISTA)."""
        if self._hessian_cache is None:
            self._hessian_cache, self._factor_cache = self.hessian(z0), None
        H = self._hessian_cache.copy()
        H[np.diag_indices(self.n_shared)] += weight_x
        c = fun_grad(z0)[1] - H @ z0
        return feature_sign(H, c, self._l1_weights(z0.size), z0, tol)

    def _solve_prox_newton(self, fun_grad, z0, tol, weight_x, max_steps=100):
        """A smooth non-quadratic merit whose prox terms are all λ‖w‖₁ (a logistic or
        constrained client with an ℓ1 term): proximal Newton — each step minimizes the quadratic
        model plus λ‖w‖₁ exactly (feature-sign search) and backtracks on f + λ‖w‖₁ — else None
        (then FISTA, whose step count grows with the AL penalty's curvature: ~10⁴ steps at β = 300)."""
        lam = self._l1_weights(z0.size)
        z = z0.copy()
        f, g = fun_grad(z)
        residual, refined = solvers.norm_inf(l1_residual(z, g, lam)), False
        for step in range(max_steps):
            # at tol, one more (quadratically convergent) step: a gradient residual of tol leaves
            # the point tol/curvature away, which consensus methods at eps = tol would not reach
            if residual <= tol and (refined or residual <= 1e-3 * tol):
                return z, step, residual
            refined = residual <= tol
            H = self.hessian(z)
            H[np.diag_indices(self.n_shared)] += weight_x
            model = feature_sign(H, g - H @ z, lam, z, 0.1 * min(residual, tol))
            if model is None:
                return (z, step, residual) if refined else None
            direction = model[0] - z
            decrease = g @ direction + lam @ (np.abs(model[0]) - np.abs(z))   # < 0 unless optimal
            total, t = f + lam @ np.abs(z), 1.0
            while True:
                candidate = z + t * direction
                new_f, new_g = fun_grad(candidate)
                new_residual = solvers.norm_inf(l1_residual(candidate, new_g, lam))
                if solvers.accepted(new_f + lam @ np.abs(candidate), total, t, decrease,
                                    new_residual, residual):
                    break
                t *= 0.5
                if t < 1e-10:
                    return (z, step, residual) if refined else None
            z, f, g, residual = candidate, new_f, new_g, new_residual
        return None

    def _l1_weights(self, size: int) -> np.ndarray:
        """λ per unknown of (x, y): the node's λ‖w‖₁ weights on the shared entries, 0 elsewhere."""
        lam = np.zeros(size)
        for term in self.merit_ir.prox_terms:
            i = self.shared.variables.index(term.variable)
            lam[self.shared.offsets[i]:self.shared.offsets[i + 1]] += term.weight()
        return lam

    def update_multipliers(self, x: np.ndarray) -> dict:
        """μ_I ← [μ_I + β c_I]₊, μ_E ← μ_E + β c_E at (x, y); reply ‖Δμ‖∞ and ‖Δy‖∞."""
        m = self.merit_ir
        beta = float(m.beta.value)
        residuals = self._residuals(*self._values(np.asarray(x, float), self.y)) if self.constraints else []
        change = 0.0
        for constraint, c_value in zip(self.constraints, residuals):
            mu = m.multipliers[constraint.name]
            new = mu.value + beta * np.asarray(c_value)
            if not isinstance(constraint, Equality):
                new = np.maximum(new, 0.0)
            change = max(change, float(np.max(np.abs(new - mu.value), initial=0.0)))
            mu.value = new
        self._forget_hessian()
        dy = float(np.max(np.abs(self.y - self._y_center), initial=0.0))
        return {"dmu": change, "dy": dy}

    def report(self, x: np.ndarray) -> dict:
        """Objective f_i (with prox-able terms) and the largest violation of this node's constraints."""
        values = self._values(np.asarray(x, float), self.y)
        objective = float(self.objective_plan(*values)[0])
        for term in self.merit_ir.prox_terms:
            objective += term.value(values[self.variables.index(term.variable)])
        residuals = self._all_residuals(*values) if self.all_constraints else []
        violation = max([0.0] + [c.violation(r) for c, r in zip(self.all_constraints, residuals)])
        return {"objective": objective, "violation": violation}

    def violations(self, x: np.ndarray, tol: float = 0.0) -> dict[str, float]:
        """{"name: constraint": violation} of this node's constraints (as the user wrote them)
        violated by more than `tol` at (x, current y): what an infeasible run names."""
        if not self.all_constraints:
            return {}
        residuals = self._all_residuals(*self._values(np.asarray(x, float), self.y))
        return {repr(c): c.violation(r) for c, r in zip(self.all_constraints, residuals)
                if c.violation(r) > tol}

    def multipliers(self) -> dict:
        return {"multipliers": {name: p.value.copy() for name, p in self.merit_ir.multipliers.items()}}

    def private_values(self) -> dict:
        return {"values": {v.uid: val.copy() for v, val in zip(self.private.variables, self.private.unpack(self.y))}}

    def set_multipliers(self, multipliers: dict[str, np.ndarray]) -> None:
        for name, value in multipliers.items():
            self.merit_ir.multipliers[name].value = np.asarray(value, float)
        self._forget_hessian()

    def save_state(self) -> dict:
        """Everything a later request depends on (checkpoints, Ray recovery), the chord Hessian
        caches included: a resumed Newton solve must start from the same (stale) matrix as the
        uninterrupted one to reproduce it bitwise. `_recent` and the plans are left out: they
        only memoize deterministic evaluations."""
        m = self.merit_ir
        return {"state": {"y": self.y.copy(), "y_center": self._y_center.copy(),
                          "mu": self.multipliers()["multipliers"], "beta": m.beta.value,
                          "procedures": _copy_state(self.state),
                          "prox_weight": m.prox_weight.value,
                          "centers": {uid: p.value.copy() for uid, p in m.centers.items()},
                          # the factor (an `Inverse` of the chord Hessian + weight) is not
                          # kept: it is a deterministic function of the kept Hessian, recomputed
                          # bit for bit on first use, and only plain data travels (Flower)
                          "hessian": _copy_state((self._hessian_cache, None, self._hessian_key))}}

    def load_state(self, state: dict) -> dict:
        m = self.merit_ir
        self.y, self._y_center = state["y"].copy(), state["y_center"].copy()
        self.state = _copy_state(state.get("procedures", {}))
        for name, value in state["mu"].items():
            m.multipliers[name].value = value
        m.beta.value, m.prox_weight.value = state["beta"], state["prox_weight"]
        m.private_weight.value = (1.0 / float(state["beta"])) if self.n_private else 0.0
        for uid, value in state["centers"].items():
            m.centers[uid].value = value
        self._forget_hessian()
        if "hessian" in state:     # absent in checkpoints written before it was saved
            self._hessian_cache, self._factor_cache, self._hessian_key = _copy_state(state["hessian"])
        return {}


# polynomial degree ≤ 2 of a merit, by its value-gradient plan's structure (`Plan.structure_key`):
# the degree reads only the atoms, their parameters and which leaves are variables, all in the
# key, and computing it was ~15 % of a client's set-up (it walks the merit as a tree)
_QUADRATIC: dict[tuple, bool] = {}


def _is_quadratic(plan: Plan) -> bool:
    """Whether the plan's first output (a merit P_i) is a polynomial of degree ≤ 2."""
    found = _QUADRATIC.get(plan.structure_key)
    if found is None:
        if len(_QUADRATIC) >= 4096:
            _QUADRATIC.clear()
        found = _QUADRATIC[plan.structure_key] = polynomial_degree(plan.outputs[0]) <= 2
    return found


def _copy_state(state: dict) -> dict:
    import copy
    return copy.deepcopy(state)


class ProgramSpec:
    """The source of one node's program — its block's terms and constraints — to be compiled
    where the node runs. A block whose data comes from a loader (`client.data(loader=...)`) stays
    a spec on the driver; executors `build()` it (the serial one in-process, Ray on the actor).
    It carries the layout, so backends can read `n_shared` and `shared` from it."""

    def __init__(self, name: str, role: str, terms: list, constraints: list[Constraint],
                 shared: list[Variable], private: list[Variable], project: bool = False):
        self.name, self.role, self.project = name, role, project
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
                              self.shared.variables, self.private.variables, project=self.project)
        program.spec = self
        return program


def compile_programs(problem, project: bool = True,
                     client_sets: bool = False) -> dict[str, "NodeProgram | ProgramSpec"]:
    """One NodeProgram per block (server first, then clients in order). With `project`, simple
    constraints on the shared variables held by the server are handled by projection; with
    `client_sets` also those held by clients, on the client (for backends whose client solves
    project, e.g. FedADMM). A block whose data is produced on its worker stays a `ProgramSpec`
    (the executor builds it there)."""
    shared = problem.shared_variables()
    # a client's constraint on the shared variables alone with no smooth form (a ‖·‖₁ ball) is
    # the same constraint on the server, where it is projected (unless clients' solves project)
    moved = [] if client_sets else \
        [c for b in problem.clients for c in b.constraints if needs_projection(c)]
    programs: dict = {}
    with collection_paused():
        for block in problem.blocks:
            private = list(getattr(block, "private_variables", []))
            role = "server" if block is problem.server else "client"
            constraints = block.constraints + moved if role == "server" else \
                [c for c in block.constraints if not any(c is m for m in moved)]
            spec = ProgramSpec(block.name, role, block.terms, constraints, shared, private,
                               project=project and (role == "server" or client_sets))
            programs[block.name] = spec if spec.remote else spec.build()
        freeze_setup()       # (in the pause: see there)
    return programs
