"""`CompiledMerit`: the compiled merit P_i of one node — its value, gradient, Hessian and
Hessian-vector product plans, and the plans of its objective and constraint residuals.

It is what `NodeProgram` evaluates; it holds no optimizer state. The merit's Parameters (β, ω,
the centers, the multipliers) are the plans' inputs: they are written only by `set_parameters`,
from the node's state (`node_state.NodeState`, which holds their values), never read back.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..atoms import add, multiply, sum as sum_
from ..compiler import shared_structure
from ..compiler.classify import polynomial_degree
from ..compiler.codegen import Plan
from ..compiler.differentiate import grad
from ..compiler.directions import Unbatchable
from ..compiler.merit import build_merit
from ..constraints import Constraint
from ..errors import FedModelError, SmoothnessError
from ..expression import Parameter, Variable
from . import gram_hessian, solvers

# floats per direction-carrying intermediate of `CompiledMerit.hessian` (32 MB): its columns go
# in blocks of directions that keep each intermediate (e.g. X V for data X) within it
HESSIAN_BLOCK_FLOATS = 4_000_000


class Variables(list):
    """A list of variables searched by identity: `u == v` between variables builds a constraint
    (as in CVXPY), so list's own `index` / `in` raise for any variable after the first."""

    def index(self, variable, *_):
        for i, v in enumerate(self):
            if v is variable:
                return i
        raise ValueError(f"{variable!r} is not in the list")

    def __contains__(self, variable) -> bool:
        return any(v is variable for v in self)


class Layout:
    """Packs a list of variables into one flat vector and back."""

    def __init__(self, variables: list[Variable]):
        self.variables = Variables(variables)
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


class CompiledMerit:
    """P_i of node `name` over z = (x, y) (shared `x`, private `y`), compiled once."""

    def __init__(self, name: str, terms: list, constraints: list[Constraint],
                 shared: Layout, private: Layout, project: bool = False, local: bool = False):
        self.name = name
        self.shared, self.private = shared, private
        self.n_shared = shared.size
        self.variables = shared.variables + private.variables
        self.ir = m = build_merit(terms, constraints, self.variables, name, project=project, local=local)
        self.constraints = m.constraints   # handled by the AL (canonical: rewritten if nonsmooth)
        self.all_constraints = constraints
        if m.unsupported or not m.expression.is_smooth():
            reasons = m.unsupported or ["the merit function is not smooth"]
            raise SmoothnessError(
                f"node {name!r} has a nonsmooth term or constraint without a prox: "
                + "; ".join(reasons))
        # the compiled plans of P_i with ∇P_i per variable, and of f_i: public (read them, do not
        # replace them) because the batched executor stacks the plans of a group's clients.
        # Derived and compiled once per structure (`_share`), re-bound to this node's data
        self._gradients = self._share.derive("gradients", lambda cm: [
            grad(cm.ir.expression, v) for v in cm.variables])
        self.value_grad_plan = self._share.plan("value_grad", lambda cm: Plan(
            [cm.ir.expression] + cm._gradients, cm.variables))
        self.objective_plan = self._share.plan("objective", lambda cm: Plan([cm.ir.objective], cm.variables))
        self.quadratic = _is_quadratic(self.value_grad_plan)
        self._hvp_directions = None   # see _direction_plan
        self._gradient_plan = self._value_plan = None   # see gradient_plan, value_plan
        self._recent = _Recent()   # see value_grad
        # one vector variable and nothing private (a model's usual client): z = x is the plans'
        # one input as it is (`values`: unpacking, a list of reshaped views, was ~2 µs of each
        # of a serial ADMM step's ~5 evaluations)
        self._one_vector = not private.size and len(shared.variables) == 1 and \
            shared.variables[0].shape == (shared.size,)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_gram", None)            # derived (`gram_hessian.structure`): analysed again there
        state.pop("_share", None)           # another node's graphs (its data): never shipped
        return state

    @functools.cached_property
    def _share(self) -> shared_structure.Binding:
        """This node's place among the nodes of its structure (`compiler.shared_structure`):
        what it derives and compiles is done once per structure and re-bound to its data."""
        m = self.ir
        sources = [m.expression, m.objective] + [c.expr for c in self.constraints] + \
            [c.expr for c in self.all_constraints]
        return shared_structure.Binding(self, sources, self.variables)

    # ---- the Parameters: written from the node's state, never read back ------------------------
    def set_parameters(self, beta: float | None = None, prox_weight: float | None = None,
                       centers: dict[int, np.ndarray] | None = None,
                       multipliers: dict[str, np.ndarray] | None = None) -> None:
        """Write the given values into the merit's Parameters (ω_y = 1/β for private variables)
        and forget the memoized evaluations, which read the old ones."""
        m = self.ir
        if beta is not None:
            m.beta.value = beta
            m.private_weight.value = (1.0 / beta) if self.private.size else 0.0
        if prox_weight is not None:
            m.prox_weight.value = prox_weight
        for uid, value in (centers or {}).items():
            m.centers[uid].value = value
        for name, value in (multipliers or {}).items():
            m.multipliers[name].value = value
        self._recent.clear()

    def forget(self) -> None:
        """Forget the memoized evaluations (`value_grad`)."""
        self._recent.clear()

    # ---- evaluation --------------------------------------------------------------------------
    def values(self, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
        """The plans' inputs, one array per variable, of z = (x, y)."""
        if self._one_vector and x.shape == (self.n_shared,):
            return [x]
        return self.shared.unpack(x) + self.private.unpack(y)

    def value_grad(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """P_i and its gradient with respect to z = (x, y). The last two evaluations are kept
        (until a parameter of the merit changes): ADMM-type steps evaluate the merit at a point
        and then start a local solve there, or restart from where the last solve ended."""
        hit = self._recent.get(x, y)
        if hit is not None:
            return hit[0], hit[1].copy()
        out = self.value_grad_plan(*self.values(x, y))
        g = self.flatten(out[1:])
        self._recent.put(x, y, float(out[0]), g.copy())
        return float(out[0]), g

    def gradient(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """∇ₓP_i at (x, y) without P_i's value: bitwise `value_grad`'s, from a plan that skips
        the loss itself (the logistic values: ~15 % of an evaluation)."""
        return self.gradient_z(x, y)[:self.n_shared]

    def gradient_z(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """∇P_i with respect to z = (x, y) without P_i's value (`gradient`, private part
        included): a new array, bitwise `value_grad`'s; a memoized evaluation is reused, and
        this one is not memoized (it is taken where no local solve starts)."""
        hit = self._recent.get(x, y)
        if hit is not None:
            return hit[1].copy()
        return self.flatten(self.gradient_plan(*self.values(x, y)))

    @property
    def value_plan(self) -> Plan:
        """The plan of P_i alone (no gradient), compiled on first use: trial points of a line
        search need only values (its output is `value_grad_plan`'s first, the same numbers)."""
        if self._value_plan is None:
            self._value_plan = self._share.plan("value", lambda cm: Plan(
                cm.value_grad_plan.outputs[:1], cm.variables))
        return self._value_plan

    @property
    def gradient_plan(self) -> Plan:
        """The plan of ∇P_i per variable without P_i itself, compiled on first use (its
        gradients are the merit plan's outputs, so its numbers are `value_grad_plan`'s)."""
        if self._gradient_plan is None:
            self._gradient_plan = self._share.plan("gradient", lambda cm: Plan(
                cm.value_grad_plan.outputs[1:], cm.variables))
        return self._gradient_plan

    # the constraint residual plans are compiled on first use (only a node with constraints
    # uses them): the empty plans of an unconstrained client were 14 of the ~150 objects its
    # program kept (memory, and what the cyclic collector scans at 10⁵ clients). A constrained
    # node so compiles them in its run's first report, outside the set-up's collector pause
    @functools.cached_property
    def residuals(self) -> Plan:
        """The residuals of the constraints the augmented Lagrangian handles (`constraints`)."""
        return self._share.plan("residuals", lambda cm: Plan([c.expr for c in cm.constraints], cm.variables))

    @functools.cached_property
    def all_residuals(self) -> Plan:
        """The residuals of the node's constraints as the user wrote them (`all_constraints`)."""
        return self._share.plan("all_residuals", lambda cm: Plan(
            [c.expr for c in cm.all_constraints], cm.variables))

    def flatten(self, parts: list) -> np.ndarray:
        """The per-variable gradients as one new flat vector (broadcast to each variable's shape)."""
        if len(self.variables) == 1 and np.shape(parts[0]) == self.variables[0].shape:
            return np.array(parts[0], dtype=float).ravel()   # the common case, without broadcast_to
        return np.concatenate([np.ravel(np.broadcast_to(gi, v.shape))
                               for gi, v in zip(parts, self.variables)]) if self.variables else np.zeros(0)

    # ---- second order ------------------------------------------------------------------------
    def hessian(self, z: np.ndarray) -> np.ndarray:
        """∇²P_i(z) from the derived Hessian-vector product ∇(∇P_i · v), compiled once as a plan
        that carries many directions v at once (`codegen.Plan(batched=...)`): called with the
        unit vectors it returns the matrix, e.g. Xᵀ (s ⊙ X) for a loss of X w in one matrix
        product. Columns go in blocks of at most `HESSIAN_BLOCK_FLOATS` floats per
        intermediate; a merit whose product has a step without a rule over directions takes
        the single-direction plan column by column. A matrix beyond
        `solvers.DENSE_NEWTON_FLOATS` is refused (FedModelError), never allocated: such sizes
        take the Hessian-free solves (`hvp`, `local_solvers.choose`)."""
        layout = self._layout
        values, n = layout.unpack(z), layout.size
        if not solvers.dense_fits(n):
            raise FedModelError(
                f"node {self.name!r}: its {n} × {n} Hessian would take {8 * n * n / 1e9:.1f} GB, "
                f"beyond the dense Newton budget (fedmodel.runtime.solvers.DENSE_NEWTON_FLOATS = "
                f"{solvers.DENSE_NEWTON_FLOATS:.3g} floats); use a Hessian-free local solver "
                "(method 'auto', 'newton-cg' or 'lbfgs')")
        gram = gram_hessian.hessian(self, z, values) if n else None
        if gram is not None:                # a loss of data products: Gram products (syrk)
            return gram
        plan = self._hessian_plan
        if plan is None:                    # no rule over directions: one product per column
            H = np.column_stack([self.hvp(z, e) for e in np.eye(n)]) if n else np.zeros((0, 0))
            return 0.5 * (H + H.T)
        H = self.dense_hessian(plan, values)
        return 0.5 * (H + H.T)

    def dense_hessian(self, plan: Plan, values: list[np.ndarray], blocks: list | None = None) -> np.ndarray:
        """The matrix of a plan linear in the directions (`_hessian_plan`, or a part of the
        Hessian-vector product) from the unit directions `blocks` (`unit_blocks`; default
        `_hessian_plan`'s), not symmetrized."""
        n = self._layout.size
        H = np.empty((n, n))
        for start, k, directions in self._unit_directions if blocks is None else blocks:
            out = plan(*values, *directions)
            if len(out) == 1 and plan.batched_outputs[0] and out[0].shape == (n, k):
                H[:, start:start + k] = out[0]            # one vector variable: its columns
                continue
            H[:, start:start + k] = np.concatenate([     # (an output not carrying them is 0)
                np.reshape(np.broadcast_to(o if carried else np.reshape(o, np.shape(o) + (1,)),
                                           v.shape + (k,)), (v.size, k))
                for o, carried, v in zip(out, plan.batched_outputs, self.variables)])
        return H

    @functools.cached_property
    def _layout(self) -> Layout:
        """The layout of z = (x, y): all the node's variables."""
        return Layout(self.variables)

    @functools.cached_property
    def _unit_directions(self) -> list[tuple[int, int, list[np.ndarray]]]:
        """The unit vectors e_j in blocks for `_hessian_plan` (`unit_blocks`)."""
        return self.unit_blocks(self._hessian_plan.batched_size)

    def unit_blocks(self, batched_size: int) -> list[tuple[int, int, list[np.ndarray]]]:
        """The unit vectors e_j in blocks for a plan over directions whose largest
        direction-carrying intermediate holds `batched_size` floats a direction: (first column,
        k, the block's directions per variable, each of shape var.shape + (k,)); at most
        `HESSIAN_BLOCK_FLOATS` floats per such intermediate of a block."""
        layout = self._layout
        n = layout.size
        block = max(1, min(n, HESSIAN_BLOCK_FLOATS // max(batched_size, 1)))
        identity = _identity(n)
        return [(start, min(block, n - start),
                 [np.reshape(E, v.shape + (E.shape[1],)) for E, v in
                  zip(np.split(identity[:, start:start + block], layout.offsets[1:-1]), self.variables)])
                for start in range(0, n, block)]

    @functools.cached_property
    def _hvp_expressions(self) -> tuple[list, list[Parameter]]:
        """∇(∇P_i · v) per variable as expressions, with the direction v as Parameters (one per
        variable), derived once from the merit plan's own gradients (`value_grad_plan`), once
        per structure (`_share`)."""
        n = len(self.variables)
        derived = self._share.derive("hvp", _derive_hvp)
        return derived[:n], derived[n:]

    @functools.cached_property
    def _objective_gradients(self) -> list:
        return self._share.derive("objective_gradients", lambda cm: [grad(cm.ir.objective, v) for v in cm.shared.variables])

    @functools.cached_property
    def objective_gradient_plan(self) -> Plan | None:
        """∇f_i per shared variable (the objective alone) over z, once per structure; None without."""
        if not self.shared.variables:
            return None
        self._objective_gradients    # (first: the shared plan is re-bound onto this node's own)
        return self._share.plan("objective_gradient_plan", lambda cm: Plan(cm._objective_gradients, cm.variables))

    @functools.cached_property
    def _hessian_plan(self) -> Plan | None:
        """The Hessian-vector product's plan over many directions (the directions are inputs
        after the variables), or None when one of its steps has no rule over directions."""
        self._hvp_expressions        # (first: the shared plan is re-bound onto this node's own)
        return self._share.plan("hessian", _compile_hessian)

    def _direction_plan(self) -> tuple[Plan, list[Parameter]]:
        """The compiled Hessian-vector product ∇(∇P_i · v) with the direction v as Parameters
        (one per variable), built on first use: O(N) memory per product, whatever N."""
        if self._hvp_directions is None:
            directions = self._hvp_expressions[1]     # (first: as for `_hessian_plan`)
            plan = self._share.plan("direction", lambda cm: Plan(cm._hvp_expressions[0], cm.variables))
            self._hvp_directions = (plan, directions)
        return self._hvp_directions

    def hvp(self, z: np.ndarray, v: np.ndarray) -> np.ndarray:
        """∇²P_i(z)·v without forming ∇²P_i (compiled: for sparse data two sparse products)."""
        plan, directions = self._direction_plan()
        layout = self._layout
        for d, dv in zip(directions, layout.unpack(np.asarray(v, float))):
            d.value = dv
        return layout.pack(plan(*layout.unpack(z)))


def _derive_hvp(merit: CompiledMerit) -> list:
    """∇(∇P_i · v) per variable, then the directions v (Parameters), of `merit`."""
    directions = [Parameter(v.shape, name=f"dir[{v.name}]") for v in merit.variables]
    gv = add(*[sum_(multiply(gi, di)) for gi, di in zip(merit.value_grad_plan.outputs[1:], directions)])
    return [grad(gv, v) for v in merit.variables] + directions


def _compile_hessian(merit: CompiledMerit) -> Plan | None:
    """The plan of `CompiledMerit._hessian_plan` (None when a step has no rule over directions)."""
    products, directions = merit._hvp_expressions
    try:
        return Plan(products, merit.variables + directions, batched=directions)
    except Unbatchable:
        return None


# polynomial degree ≤ 2 of a merit, by its value-gradient plan's structure (`Plan.structure_key`):
# the degree reads only the atoms, their parameters and which leaves are variables, all in the
# key, and computing it was ~15 % of a client's set-up (it walks the merit as a tree)
_QUADRATIC: dict[tuple, bool] = {}


@functools.lru_cache(maxsize=4)
def _identity(n: int) -> np.ndarray:
    """The n × n identity, read-only and shared: every program's `_unit_directions` are views of
    it (one per program held n × n each: 0.98 GB for 200 clients at d = 784)."""
    identity = np.eye(n)
    identity.flags.writeable = False
    return identity


def _is_quadratic(plan: Plan) -> bool:
    """Whether the plan's first output (a merit P_i) is a polynomial of degree ≤ 2."""
    found = _QUADRATIC.get(plan.structure_key)
    if found is None:
        if len(_QUADRATIC) >= 4096:
            _QUADRATIC.clear()
        found = _QUADRATIC[plan.structure_key] = polynomial_degree(plan.outputs[0]) <= 2
    return found


class _Recent:
    """The last two evaluations, (x, y) → (value, gradient), matched bit for bit (the bytes
    keys they replace were: -0.0 is not 0.0) by comparing the arrays' bits, O(n) without a
    copy or a hash: hashing x's bytes was ~0.4 ms of a ~1.6 ms evaluation at n = 10⁵."""

    __slots__ = ("entries",)

    def __init__(self):
        self.entries: list[tuple[np.ndarray, np.ndarray, float, np.ndarray]] = []

    def clear(self) -> None:
        self.entries.clear()

    def get(self, x: np.ndarray, y: np.ndarray) -> "tuple[float, np.ndarray] | None":
        for seen_x, seen_y, value, g in self.entries:
            if _same_bits(seen_x, x) and _same_bits(seen_y, y):
                return value, g
        return None

    def put(self, x: np.ndarray, y: np.ndarray, value: float, g: np.ndarray) -> None:
        if len(self.entries) >= 2:
            del self.entries[0]
        self.entries.append((np.array(x, dtype=float), np.array(y, dtype=float), value, g))


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    b = np.ascontiguousarray(b, dtype=float)
    if a.shape != b.shape:
        return False
    # small arrays: their bytes compared are ~8× cheaper than array_equal's ufunc (0.3 against
    # 2.4 µs at d = 12: 1.2 million checks were 13 % of a 500-client ProxAL run); large ones
    # without the copy
    return a.tobytes() == b.tobytes() if a.size <= 256 else \
        np.array_equal(a.view(np.uint64), b.view(np.uint64))
