"""A client's smooth convex inequalities held in its local solves (a backend's consensus
ADMM over the intersection of the clients' sets): the method of multipliers of the local solver
"local-al" (`solve`), the constraints' values and Jacobian rows (`LocalPlans`), and the
gradients a client reads with them held (`lagrangian_gradient`, `local_remainder`)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from ..compiler.merit import LOCAL_PENALTY

# a `program.NodeProgram` (which imports this module through local_solvers: no cycle)
NodeProgram = Any


# The method of multipliers of "local-al": at most LOCAL_ROUNDS solves a local solve, σ ×
# PENALTY_GROWTH (up to PENALTY_MAX) after a round whose violation fell by less than 4×
# rounds; STUCK_ROUNDS rounds in a row whose violation fell by < 1 % (σ rising ×10 each) end it
# as unmet: a feasible constraint's violation falls ~σ-fold when σ rises
LOCAL_ROUNDS = 40
STUCK_ROUNDS = 3
PENALTY_GROWTH = 10.0
PENALTY_MAX = 1e12


def solve(program: NodeProgram, lp: Any, solve_rest: Callable[[Any], tuple]):
    """The local solve with the client's smooth convex inequalities g(x) ≤ 0 held exactly
    (`NodeProgram.local_names`): min φ(z) s.t. g ≤ 0, φ the local problem without them, by the
    method of multipliers on their own AL term (1/2σ)(‖[ν + σg]₊‖² − ‖ν‖²) in P_i —
    each round the smooth (or prox) solver of the rest to `lp.tol`, then ν ← [ν + σg]₊ —,
    warm-started from the last solve's ν (the node's μ of those constraints, what the run
    reports as their multipliers). Stops when g₊ and the complementarity min(−g, ν) are both
    ≤ `lp.tol` (then ∇φ + ∇gᵀν ≤ tol too: the last round's stationarity). A constraint this
    client cannot meet (ν growing, g₊ not falling after LOCAL_ROUNDS rounds) is not an error:
    the solve returns its least violating point and leaves `state["local_failed"]` = the
    violation for the backend to read. `solve_rest(local problem)` solves the rest (the smooth
    or prox solver `local_solvers.choose` picks without the held constraints). σ is back at its resting value afterwards (the node's
    state alone fixes P_i between requests)."""
    names, plans = program.local_names, local_plans(program)
    mu = np.concatenate([np.ravel(program.node_state.mu[n]) for n in names])
    # σ starts where the last solve ended (kept in the state: a resumed node solves alike)
    sigma, z, total, last = program.state.get("local_penalty", LOCAL_PENALTY), lp.z0, 0, np.inf
    program.state.pop("local_failed", None)
    violations: list[float] = []
    try:
        for _ in range(LOCAL_ROUNDS):
            program._sync_penalties(sigma)
            z, steps, residual = solve_rest(replace(lp, z0=z))
            total += steps
            g = plans.values(program, z[:program.n_shared], z[program.n_shared:])
            mu = np.maximum(mu + sigma * g, 0.0)
            program.set_multipliers(plans.unflatten(mu))
            violation = float(np.max(g, initial=0.0))
            # the KKT residual of the held constraints: violation and complementarity
            kkt = max(violation, float(np.max(np.abs(np.minimum(-g, mu)), initial=0.0)))
            if kkt <= lp.tol:
                return z, total, residual
            violations.append(violation)
            if len(violations) > STUCK_ROUNDS and all(b > 0.99 * a > 0 for a, b in
                                                      zip(violations[-STUCK_ROUNDS - 1:], violations[-STUCK_ROUNDS:])):
                break                   # σ up PENALTY_GROWTH^STUCK_ROUNDS and g₊ still there: unmet
            if kkt > 0.25 * last:       # the multipliers converge slowly: a larger σ (dual step)
                sigma = min(PENALTY_GROWTH * sigma, PENALTY_MAX)
            last = kkt
        if violation > lp.tol:         # (complementarity alone unmet: not a failure)
            program.state["local_failed"] = violation
        return z, total, residual
    finally:
        program.state["local_penalty"] = sigma
        program._sync_penalties()


class LocalPlans:
    """Values and Jacobian of the constraints a client's local solves hold (compiled once per
    program: `local_plans`): g(x, y) flat, and the rows ∇ₓg_j by a plan of ∇ₓ(θᵀg) with a
    Parameter θ set to each unit vector (one evaluation per scalar row: few, by design)."""

    def __init__(self, program: NodeProgram):
        from ..atoms import add, multiply, sum as sum_
        from ..compiler.codegen import Plan
        from ..compiler.differentiate import grad
        from ..expression import Parameter
        names = program.local_names or list(program.merit_ir.local_penalties)
        self.constraints = [c for c in program.constraints if c.name in names]
        self.sizes = [int(np.prod(c.shape, dtype=int)) for c in self.constraints]
        self.weights = [Parameter(c.shape, name=f"theta[{c.name}]", value=np.zeros(c.shape))
                        for c in self.constraints]
        parts = [sum_(multiply(t, c.expr)) for t, c in zip(self.weights, self.constraints)]
        total = parts[0] if len(parts) == 1 else add(*parts)
        self.value_plan = Plan([c.expr for c in self.constraints], program.variables)
        self.gradient_plan = Plan([grad(total, v) for v in program.shared.variables], program.variables)

    def values(self, program: NodeProgram, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """g at (x, y), flat."""
        out = self.value_plan(*program.compiled.values(np.asarray(x, float), np.asarray(y, float)))
        return np.concatenate([np.ravel(v) for v in out])

    def jacobian(self, program: NodeProgram, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """∇ₓg at (x, y): (rows of g, n_shared)."""
        inputs = program.compiled.values(np.asarray(x, float), np.asarray(y, float))
        rows = []
        for k, (weight, size) in enumerate(zip(self.weights, self.sizes)):
            for j in range(size):
                unit = np.zeros(size)
                unit[j] = 1.0
                for other in self.weights:
                    other.value = np.zeros(other.shape)
                weight.value = unit.reshape(weight.shape)
                out = self.gradient_plan(*inputs)
                rows.append(program.shared.pack(list(out)))
        return np.array(rows).reshape(sum(self.sizes), program.n_shared)

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """{name: value} from a flat vector over the constraints' rows."""
        out, start = {}, 0
        for c, size in zip(self.constraints, self.sizes):
            out[c.name] = flat[start:start + size].reshape(c.shape)
            start += size
        return out


def local_plans(program: NodeProgram) -> LocalPlans:
    """The program's `LocalPlans`, built on first use and kept on the program."""
    plans = program.__dict__.get("_local_plans")
    if plans is None:
        plans = program.__dict__["_local_plans"] = LocalPlans(program)
    return plans


def _without_penalty(program: NodeProgram, x: np.ndarray, g: np.ndarray):
    """(g − ∇gᵀ[ν + σg]₊: g without the held constraints' AL gradient, g(x), ∇g(x), ν)."""
    plans = local_plans(program)
    values, jacobian = plans.values(program, x, program.y), plans.jacobian(program, x, program.y)
    m = program.merit_ir
    mu = np.concatenate([np.ravel(m.multipliers[c.name].value) for c in plans.constraints])
    sigma = np.concatenate([np.full(size, float(m.local_penalties[c.name].value))
                            for c, size in zip(plans.constraints, plans.sizes)])
    return np.asarray(g, float) - jacobian.T @ np.maximum(mu + sigma * values, 0.0), values, jacobian, mu


def lagrangian_gradient(program: NodeProgram, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """g (∇ₓP_i at x) with the held constraints' AL gradient replaced by ∇gᵀν, ν their
    multipliers from the last local solve: the gradient of the local problem's Lagrangian
    (ADMM's λ⁰ = −this: the AL gradient at an infeasible start, σg(x)∇g with σ = 300, put
    λ⁰ hundreds of times off)."""
    x = np.asarray(x, float)
    out, _, jacobian, mu = _without_penalty(program, x, g)
    return out + jacobian.T @ mu


def local_remainder(program: NodeProgram, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """g (∇ₓP_i at x, current y, plus any linear terms) with the local constraints' AL
    gradient ∇gᵀ[ν + σg]₊ taken out and the element Σ_j ν_j ∇g_j (ν ≥ 0, rows g_j near
    active: g_j ≥ −ACTIVE·scale, as a set's normal cone reads a point near its boundary) of
    their normal cone closest to −g added: an upper bound on dist(−(∇F_i + …), N(x)) whatever
    ν it picks (bounded least squares, as the sets' normal cones are read)."""
    from scipy.optimize import lsq_linear
    from ..compiler.sets import ACTIVE
    x = np.asarray(x, float)
    out, values, jacobian, _ = _without_penalty(program, x, g)
    scale = np.maximum(1.0, np.abs(jacobian).sum(axis=1) * max(1.0, float(np.max(np.abs(x), initial=0.0))))
    active = values >= -ACTIVE * scale
    if np.any(active):
        nu = lsq_linear(jacobian[active].T, -out, bounds=(0.0, np.inf)).x
        out = out + jacobian[active].T @ nu
    return out
