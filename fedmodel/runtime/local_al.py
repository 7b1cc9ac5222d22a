"""A client's smooth convex inequalities held in its local solves (a backend's consensus
ADMM over the intersection of the clients' sets): the method of multipliers of the local solver
"local-al" (`solve`), the constraints' values and Jacobian rows (`LocalPlans`), and the
gradients a client reads with them held (`lagrangian_gradient`, `local_remainder`)."""
from __future__ import annotations

from copy import copy
from typing import Any, Callable

import numpy as np

from ..compiler.merit import LOCAL_PENALTY
from ..compiler.sets import ACTIVE

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
    or prox solver `local_solvers.choose` picks without the held constraints). σ is back at its
    resting value afterwards (the node's state alone fixes P_i between requests). One client:
    `solve_rows`, the rules written once, with a row of one."""
    one = copy(lp)        # (the start set per round: `dataclasses.replace` was ~5 µs of it)

    def rest(Z: np.ndarray, idx: np.ndarray) -> tuple:
        one.z0 = Z[0]
        z, steps, residual = solve_rest(one)
        return z[None, :], np.array([steps]), np.array([residual])
    Z, steps, residual = solve_rows([program], lp.z0[None, :], lp.tol, rest)
    return Z[0], int(steps[0]), float(residual[0])


# solve_rest(Z, idx): the rest (the local problem without the held constraints) of the rows
# idx solved from Z[idx] at the programs' current σ and ν: (Z_idx, steps, residual) per row
RowsSolve = Callable[[np.ndarray, np.ndarray], tuple]


def solve_rows(programs: list, Z0: np.ndarray, tol, solve_rest: RowsSolve,
               values: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`solve`'s method of multipliers for k clients of one structure at once, each with its
    own σ, ν, rounds and verdict (the same rules and arithmetic per row as one client's):
    every round solves the rest of the rows still running in one `solve_rest(Z, idx)` call
    (the batched executor: one stacked Newton solve, `Group.solve_local`). Z0 (k, N) = (x, y)
    rows; tol a number or (k,); `values(Z, idx)` → g of the rows idx (k_idx, m) (default: each
    program's `LocalPlans.values`). Returns (Z, steps, the rest's last residual) per row."""
    k, n_x = len(programs), programs[0].n_shared
    plans = [local_plans(p) for p in programs]
    if values is None:
        def values(Z: np.ndarray, idx: np.ndarray) -> np.ndarray:
            return np.array([plans[j].values(programs[j], Z[j, :n_x], Z[j, n_x:]) for j in idx])
    mu = np.array([np.concatenate([np.ravel(p.node_state.mu[n]) for n in p.local_names]) for p in programs])
    # σ starts where the last solve ended (kept in the state: a resumed node solves alike)
    sigma = [p.state.get("local_penalty", LOCAL_PENALTY) for p in programs]
    for p in programs:
        p.state.pop("local_failed", None)
    tols = np.asarray(tol, float)
    tols = np.full(k, tols) if tols.ndim == 0 else np.broadcast_to(tols, (k,))
    Z, total, residual = np.array(Z0, dtype=float), np.zeros(k, dtype=int), np.zeros(k)
    last, violation = [np.inf] * k, np.zeros(k)
    violations: list[list[float]] = [[] for _ in range(k)]
    running, met = np.ones(k, dtype=bool), np.zeros(k, dtype=bool)
    synced: list[float | None] = [None] * k         # σ last written into each program
    sigmas = np.array(sigma, dtype=float)           # σ per row as an array (the same numbers)
    try:
        for _ in range(LOCAL_ROUNDS):
            idx = np.flatnonzero(running)
            if not idx.size:
                break
            rows = idx.tolist()
            for j in rows:
                if sigma[j] != synced[j]:       # (σ rises rarely: not re-read every round)
                    programs[j]._sync_penalties(sigma[j])
                    synced[j] = sigma[j]
            Z[idx], steps, residual[idx] = solve_rest(Z, idx)
            total[idx] += steps
            g = values(Z, idx)
            new_mu = np.maximum(mu[idx] + sigmas[idx, None] * g, 0.0)
            # (the ufuncs' reductions: np.max's wrapper was a visible share of a round)
            violation[idx] = np.maximum.reduce(g, axis=1, initial=0.0)
            # the KKT residual of the held constraints: violation and complementarity
            kkt = np.maximum(violation[idx], np.maximum.reduce(np.abs(np.minimum(-g, new_mu)), axis=1, initial=0.0))
            mu[idx] = new_mu
            checked = not np.isfinite(new_mu).all()     # (a NaN: the setter's error)
            for j, row in zip(rows, new_mu):
                programs[j].set_multipliers(plans[j].unflatten(row), checked=checked)
            for j, r in zip(rows, kkt.tolist()):
                if r <= tols[j]:
                    running[j], met[j] = False, True
                    continue
                seen = violations[j]
                seen.append(float(violation[j]))
                if len(seen) > STUCK_ROUNDS and all(b > 0.99 * a > 0 for a, b in
                                                    zip(seen[-STUCK_ROUNDS - 1:], seen[-STUCK_ROUNDS:])):
                    running[j] = False      # σ up PENALTY_GROWTH^STUCK_ROUNDS and g₊ still there: unmet
                    continue
                if r > 0.25 * last[j]:      # the multipliers converge slowly: a larger σ (dual step)
                    sigma[j] = sigmas[j] = min(PENALTY_GROWTH * sigma[j], PENALTY_MAX)
                last[j] = r
        for j in np.flatnonzero(~met & (violation > tols)):     # (complementarity alone unmet:
            programs[j].state["local_failed"] = float(violation[j])     # not a failure)
        return Z, total, residual
    finally:
        for p, s, written in zip(programs, sigma, synced):
            p.state["local_penalty"] = s
            if written != LOCAL_PENALTY:        # (else σ is at its resting value already)
                p._sync_penalties()


class LocalPlans:
    """Values and Jacobian of the constraints a client's local solves hold (compiled once per
    program: `local_plans`): g(x, y) flat, and the rows ∇ₓg_j by a plan of ∇ₓ(θᵀg) with a
    Parameter θ set to each unit vector (one evaluation per scalar row: few, by design; a
    single row's θ = 1 is set once, and θ is written only when the row read changes)."""

    def __init__(self, program: NodeProgram):
        from ..atoms import add, multiply, sum as sum_
        from ..compiler.codegen import Plan
        from ..compiler.differentiate import grad
        from ..expression import Parameter
        names = program.local_names or list(program.merit_ir.local_penalties)
        self.constraints = [c for c in program.constraints if c.name in names]
        self.sizes = [int(np.prod(c.shape, dtype=int)) for c in self.constraints]
        self.rows = sum(self.sizes)
        self.weights = [Parameter(c.shape, name=f"theta[{c.name}]", value=np.zeros(c.shape))
                        for c in self.constraints]
        parts = [sum_(multiply(t, c.expr)) for t, c in zip(self.weights, self.constraints)]
        total = parts[0] if len(parts) == 1 else add(*parts)
        self.value_plan = Plan([c.expr for c in self.constraints], program.variables)
        self.gradient_plan = Plan([grad(total, v) for v in program.shared.variables], program.variables)
        self._row: int | None = None        # the row θ selects now (None: not set)
        self.select(0)
        # the sets the client projects on (prox terms of constraints), with their entries' place
        # among the shared ones: their normals join the held rows' in `remainder_rows`
        shared = [id(v) for v in program.shared.variables]     # (by identity: == builds a constraint)
        self.sets = [(t, program.shared.offsets[shared.index(id(t.variable))])
                     for t in program.merit_ir.prox_terms
                     if t.constraint is not None and t.pieces and id(t.variable) in shared]

    def select(self, row: int) -> None:
        """θ = the unit vector of flat row `row` of g: `gradient_plan` then gives ∇ₓg_row. Only
        this object writes θ, so a row already selected is not written again."""
        if row == self._row:
            return
        for weight in self.weights:
            weight.value = np.zeros(weight.shape)
        start = 0
        for weight, size in zip(self.weights, self.sizes):
            if row < start + size:
                unit = np.zeros(size)
                unit[row - start] = 1.0
                weight.value = unit.reshape(weight.shape)
                break
            start += size
        self._row = row

    def values(self, program: NodeProgram, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """g at (x, y), flat."""
        out = self.value_plan(*program.compiled.values(np.asarray(x, float), np.asarray(y, float)))
        return np.concatenate([np.ravel(v) for v in out])

    def jacobian(self, program: NodeProgram, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """∇ₓg at (x, y): (rows of g, n_shared)."""
        inputs = program.compiled.values(np.asarray(x, float), np.asarray(y, float))
        out = np.empty((self.rows, program.n_shared))
        for row in range(self.rows):
            self.select(row)
            out[row] = program.shared.pack(list(self.gradient_plan(*inputs)))
        return out

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """{name: value} from a flat vector over the constraints' rows."""
        out, start = {}, 0
        for c, size in zip(self.constraints, self.sizes):
            out[c.name] = flat[start:start + size].reshape(c.shape)
            start += size
        return out

    def penalty_weights(self, program: NodeProgram) -> tuple[np.ndarray, np.ndarray]:
        """(ν, σ) per row of g, as the merit's Parameters hold them now (the Parameters looked
        up once per program: a group's certificate reads every member's each step)."""
        params = self.__dict__.get("_penalty_params")
        if params is None:
            m = program.merit_ir
            params = self._penalty_params = [(m.multipliers[c.name], m.local_penalties[c.name], size)
                                             for c, size in zip(self.constraints, self.sizes)]
        if len(params) == 1:
            mu, sigma, size = params[0]
            return np.ravel(mu.value), np.full(size, float(sigma.value))
        return (np.concatenate([np.ravel(mu.value) for mu, _, _ in params]),
                np.concatenate([np.full(size, float(sigma.value)) for _, sigma, size in params]))


def local_plans(program: NodeProgram) -> LocalPlans:
    """The program's `LocalPlans`, built on first use and kept on the program."""
    plans = program.__dict__.get("_local_plans")
    if plans is None:
        plans = program.__dict__["_local_plans"] = LocalPlans(program)
    return plans


def lagrangian_gradient(program: NodeProgram, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """g (∇ₓP_i at x) with the held constraints' AL gradient replaced by ∇gᵀν, ν their
    multipliers from the last local solve: the gradient of the local problem's Lagrangian
    (ADMM's λ⁰ = −this: the AL gradient at an infeasible start, σg(x)∇g with σ = 300, put
    λ⁰ hundreds of times off)."""
    x = np.asarray(x, float)
    plans = local_plans(program)
    values, jacobian = plans.values(program, x, program.y), plans.jacobian(program, x, program.y)
    mu, sigma = plans.penalty_weights(program)
    return np.asarray(g, float) - jacobian.T @ np.maximum(mu + sigma * values, 0.0) + jacobian.T @ mu


def local_remainder(program: NodeProgram, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """g (∇ₓP_i at x, current y, plus any linear terms) with the local constraints' AL
    gradient ∇gᵀ[ν + σg]₊ taken out and the element Σ_j ν_j ∇g_j (ν ≥ 0, rows g_j near
    active: g_j ≥ −ACTIVE·scale, as a set's normal cone reads a point near its boundary) of
    their normal cone closest to −g added: an upper bound on dist(−(∇F_i + …), N(x)) whatever
    ν it picks (bounded least squares, as the sets' normal cones are read). One client:
    `remainder_rows` with a row of one."""
    x = np.asarray(x, float)
    plans = local_plans(program)
    values, jacobian = plans.values(program, x, program.y), plans.jacobian(program, x, program.y)
    return remainder_rows([program], x[None, :], np.asarray(g, float)[None, :], values[None, :],
                          jacobian[None])[0]


def remainder_rows(programs: list, X: np.ndarray, G: np.ndarray, values: np.ndarray,
                   jacobians: np.ndarray) -> np.ndarray:
    """`local_remainder` of k clients from their points X (k, n_x), gradients G (k, n_x), the
    held constraints' values (k, m) and Jacobians (k, m, n_x) there (the batched executor
    evaluates those for a group at once: `Group.constraint_remainder`). A client with one
    near-active row takes its ν in closed form, max(0, −aᵀr / aᵀa) (the bounded least squares
    of one column: exact, where the iterative solver stops at its tolerance); with more, the
    bounded least squares (scipy's `lsq_linear`). A client that also projects on sets takes
    their active normals (`set_normals`) into the same least squares: the normal cone of the
    intersection is the sum of the cones, and one cone read after the other leaves what only
    their sum absorbs (a client holding a·w ≤ b beside w ≥ l, both active: ProxAL's certificate
    stood at 0.19 and every ADMM run went to its stall limit)."""
    weights = [local_plans(p).penalty_weights(p) for p in programs]
    mu, sigma = np.array([w[0] for w in weights]), np.array([w[1] for w in weights])
    out = G - np.einsum("kmn,km->kn", jacobians, np.maximum(mu + sigma * values, 0.0))
    # (the ufuncs' own reductions: np.max's and np.sum's wrappers cost more than the sums here)
    reach = np.maximum(1.0, np.maximum.reduce(np.abs(X), axis=1, initial=0.0))
    scale = np.maximum(1.0, np.add.reduce(np.abs(jacobians), axis=2) * reach[:, None])
    active = values >= -ACTIVE * scale
    count = np.count_nonzero(active, axis=1)
    sets = {j: set_normals(p, X[j]) for j, p in enumerate(programs) if local_plans(p).sets}
    sets = {j: normals for j, normals in sets.items() if len(normals)}
    joint = np.zeros(len(programs), dtype=bool)
    joint[list(sets)] = True
    one = np.flatnonzero((count == 1) & ~joint)
    if one.size:
        a = jacobians[one, np.argmax(active[one], axis=1)]         # each one's active row
        aa = np.einsum("kn,kn->k", a, a)
        ar = np.einsum("kn,kn->k", a, out[one])
        nu = np.maximum(0.0, np.divide(-ar, aa, out=np.zeros_like(ar), where=aa > 0))
        out[one] += nu[:, None] * a
    many = np.flatnonzero((count > 1) | joint)
    if many.size:
        from scipy.optimize import lsq_linear
        for j in many:
            A = jacobians[j][active[j]].T
            if j in sets:
                A = np.hstack([A, sets[j].T])
            out[j] = out[j] + A @ lsq_linear(A, -out[j], bounds=(0.0, np.inf)).x
    return out


def set_normals(program: NodeProgram, x: np.ndarray) -> np.ndarray:
    """The outward normals (rows, in the shared variables) of the client's projected sets'
    constraints active at x (`projection.Piece.normals`; a piece without that form, an ℓ1 ball,
    is left to its own remainder after)."""
    rows = []
    for term, start in local_plans(program).sets:
        flat = np.asarray(x[start:start + term.variable.size], float)
        for piece in term.pieces:
            found = piece.normals(flat, ACTIVE)
            if found is not None and len(found):
                block = np.zeros((len(found), x.size))
                block[:, start:start + flat.size] = found
                rows.append(block)
    return np.vstack(rows) if rows else np.zeros((0, x.size))
