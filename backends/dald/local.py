"""The node side shared by Fed-DALD-CC and Fed-DALD-DC: the solver layer a node runs for its
local problem ((13) / (20)) — written once, for rows of clients (`local_argmin`) — its state
(`program.state["dald"]`), and `dald_state` (what the coordinator reads back at the end: μ_i,
or the edge multipliers μ_e).

A step runs on a group of clients (`fedmodel.runtime.client_step`): a `NodeRows` (one node: the
serial, Ray and Flower executors), a numpy `Group` (the batched executor) or a `JaxGroup` (vmap).
"""
from __future__ import annotations

import numpy as np

from fedmodel.constraints import Equality
from fedmodel.runtime.batched_group import Group, in_group_order, private_stack, read_only
from fedmodel.runtime.batched_procedures import local_steps
from fedmodel.runtime.client_step import NodeRows, client_step
from fedmodel.runtime.solvers import MIN_STEP, descent, norm_inf

# the solver layer's options, in the requests of (13) and (20)
SOLVE_OPTIONS = {"tol": "1", "solver": "str", "step": "1", "local_steps": "1", "warm": "1", "residual": "1"}
# inexact solves (the spec's (28): a local gradient error g_i^k → 0 keeps DALD convergent): a
# solve by `lbfgs_kept` stops at ‖∇‖∞ ≤ INEXACT·w·r, w the smallest weight 2ρ∘ρ (the local
# problem's curvature is at least w, so x_i is within INEXACT·r of its argmin) and r the
# coordinator's smallest residual of the last outer step (`residual`, in x's units)
INEXACT = 0.1


# ---- solver layer (runs on the node) ----------------------------------------------------------
def local_argmin(group: Group, rows: np.ndarray, X0: np.ndarray, linear, weight, anchor,
                 tol: float | None, solver: str, step: float, steps: float,
                 subtract_linear: bool = False, residual: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """x_i ≈ argmin P_i(x) + linear_iᵀx + ½Σ_j weight_ij(x_j − anchor_ij)² for the clients `rows`
    of `group`, warm-started at X0 (n, n_x) (every client's row; only `rows` are solved):
    (new (n, n_x) stack — the other rows are X0's —, steps per row). `linear`, `weight`,
    `anchor`: a scalar, a (n_x,) row, or one row per client of the group ((n, 1) or (n, n_x));
    `subtract_linear`: `linear` holds −linear. The solved clients' private values y_i are written.

    Solver layers: "prox-grad", and "gd" on a node with a prox-able term (λ‖w‖₁: GD would ignore
    it), are W proximal-gradient steps (63)/(64) z ← prox_{αΠ}(z − α∇Ψ(z)) (Ψ: smooth part + AL),
    "gd" otherwise W gradient steps — for all rows at once (`batched_procedures.local_steps`, one
    compiled pass per step; under JAX one fused loop). "auto", "exact" and "newton" ("prox" on a
    node with a prox-able term) are `Group.solve_local`: one batched Newton solve of the rows on
    a group (each client's own solver where it does not fit), the node's own solver on one node."""
    rows = np.asarray(rows, dtype=np.intp)
    n, n_x = group.n, group.n_x
    first = group.programs[rows[0]]
    given = tol is not None and tol >= 0
    if not given:  # default: 1e-10 for quadratic nodes (one linear solve); 1e-8
        # otherwise — Newton's Armijo test cannot see decreases below rounding (|f|·1e-16)
        tol = 1e-10 if first.quadratic else 1e-8
    if solver in ("prox-grad", "gd") and len(rows) < n and len(rows) <= Group.STRAGGLERS * n:
        # a few clients of a large group (a dropout round, a Gauss–Seidel batch): each on its
        # own plans, not n rows of work for each
        return _each_row(group, rows, X0, linear, weight, anchor, tol, solver, step, steps, subtract_linear)
    for i in rows if group.n_y else ():    # re-center the private variables' proximal term (1/β)
        p = group.programs[i]
        p.configure(p.node_state.beta, 0.0, X0[i])     # (β as `init_state` set it)
    has_prox = bool(group.prox)
    if solver in ("prox-grad", "gd"):
        Z = np.concatenate([X0, private_stack(group)], axis=1) if group.n_y else X0
        Z = local_steps(group, Z, linear, weight, anchor, float(step), int(steps),
                        solver == "prox-grad" or has_prox, subtract_linear)
        out = np.ascontiguousarray(Z[:, :n_x]) if len(rows) == n else np.array(X0, dtype=float)
        if len(rows) < n:           # clients that did not take part keep their x_i
            out[rows] = Z[rows, :n_x]
        for i in rows if group.n_y else ():
            group.programs[i].y = Z[i, n_x:].copy()
        return out, np.full(len(rows), int(steps))
    method = {"auto": "auto", "exact": "auto", "newton": "prox" if has_prox else "newton"}[solver]
    sign = -1.0 if subtract_linear else 1.0
    lowest = float(np.min(weight))
    if method == "auto" and residual is not None and lowest > 0.0 and group.local_method("auto") == "lbfgs":
        tol = tol if given else INEXACT * lowest * float(residual)
        return _kept_lbfgs(group, rows, X0, sign, linear, weight, anchor, float(tol))
    if not given and residual is not None and lowest > 0.0:
        # Newton to a relative test w·r (L-BFGS's above: INEXACT·w·r), never looser than the
        # default: the fixed 1e-8 put x_i up to 1e-8/w from its argmin, a floor of the
        # consensus residual once adaptive ρ made w small (NP logistic, loss ≈ 7e-4: ‖x̂ − x_i‖∞
        # stuck at 3e-5 > ε_pri, 1,000 iterations to max_iterations; at w·r it converges,
        # verified; INEXACT·w·r doubled `fedmodel run --backend dald`'s round trips, 244 → 507)
        tol = min(tol, lowest * float(residual))
    Z0 = np.concatenate([X0[rows], private_stack(group)[rows]], axis=1)
    Z, taken, _ = group.solve_local(Z0, rows, sign * _rows_of(linear, rows, n), _rows_of(weight, rows, n),
                                    _rows_of(anchor, rows, n), float(tol), method, 1000, float(step))
    out = np.array(X0, dtype=float)
    out[rows] = Z[:, :n_x]
    for j, i in enumerate(rows if group.n_y else ()):
        group.programs[i].y = Z[j, n_x:].copy()
    return out, taken


# ---- L-BFGS whose memory outlives the solve ---------------------------------------------------
FTOL = 1e-14            # relative change of a value below which `lbfgs_kept` reads the gradient
MEMORY = 20             # curvature pairs a node keeps (scipy's L-BFGS-B's maxcor here; 10: 1.2× the evaluations)


def _kept_lbfgs(group: Group, rows: np.ndarray, X0: np.ndarray, sign: float, linear, weight, anchor,
                tol: float, max_steps: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """`local_argmin`'s "auto" where the node's own choice is L-BFGS (smooth, not quadratic, too
    many unknowns for Newton) and the request brings the coordinator's `residual`: L-BFGS whose
    curvature pairs are kept in the node's state across outer steps. Successive problems (13)
    differ only in the linear term, the anchor and the weight 2ρ∘ρ; the pairs store ∇P_i's
    differences without the weight's share, which is added back exactly at the weight of the
    day, so they stay valid when adaptive ρ moves it. On MNIST 3v7 (d = 784) scipy's L-BFGS-B,
    each solve without memory to 1e-8, took 9.1 evaluations a solve; this, at the `INEXACT`
    tolerance, 3.6 (docs/BENCHMARKS.md, branch daldlocal). Each client by its own program's
    plans; the stop test is ‖∇‖∞ ≤ tol, as before."""
    n, n_x = group.n, group.n_x
    lin, wts, anc = (np.broadcast_to(np.asarray(_rows_of(a, rows, n), float).reshape(len(rows), -1),
                                     (len(rows), n_x)) for a in (linear, weight, anchor))
    out, taken = np.array(X0, dtype=float), np.zeros(len(rows), dtype=int)
    for j, i in enumerate(rows):
        p = group.programs[i]
        c, w, a = sign * lin[j], wts[j], anc[j]
        state = p.state.setdefault("dald", {})
        # P_i where the last solve ended, if its parameters (own multipliers, β, centers) are
        # still those: the next solve starts there (warm), one evaluation a solve saved
        key, end, last = _merit_key(p), state.get("end"), []

        def fun_grad(z, p=p, c=c, w=w, a=a, key=key, end=end, last=last):
            if end is not None and end[0] == key and np.array_equal(end[1], z):
                value, g = end[2], end[3].copy()
            else:
                value, g = p.value_grad(z[:n_x], z[n_x:])
            last[:] = [z, value, g.copy()]
            diff = z[:n_x] - a
            g[:n_x] += c + w * diff
            return value + float(c @ z[:n_x] + 0.5 * (diff @ (w * diff))), g
        z, taken[j] = lbfgs_kept(fun_grad, np.concatenate([X0[i], p.y]), np.concatenate([w, np.zeros(group.n_y)]),
                                 state, tol, max_steps)
        state["end"] = (key, *last) if last and np.array_equal(last[0], z) else None
        out[i] = z[:n_x]
        if group.n_y:
            p.y = z[n_x:].copy()
    return out, taken


def _merit_key(program) -> bytes:
    """The parameters of P_i (β, ω, the AL multipliers, the proximal centers) as bytes."""
    st = program.node_state
    arrays = [np.array([st.beta or 0.0, st.prox_weight]), *st.mu.values(), *st.centers.values()]
    return b"".join(np.ascontiguousarray(x, dtype=float).tobytes() for x in arrays)


def lbfgs_kept(fun_grad, z0: np.ndarray, weight: np.ndarray, state: dict, tol: float,
               max_steps: int = 1000) -> tuple[np.ndarray, int]:
    """argmin of fun_grad (P(z) + ½Σ weight_j z_j² + a linear part) to ‖∇‖∞ ≤ tol from z0 by
    L-BFGS with backtracking (`_line_search`), starting from the pairs in
    state["pairs"] = (S, Y − weight∘S) and leaving the newest `MEMORY` there: (z, steps)."""
    z = np.array(z0, dtype=float)
    value, g = fun_grad(z)
    residual = norm_inf(g)
    S, Yf = state.get("pairs", (np.zeros((0, z.size)), np.zeros((0, z.size))))
    if S.shape[1] != z.size:
        S, Yf = np.zeros((0, z.size)), np.zeros((0, z.size))
    steps = 0
    while residual > tol and steps < max_steps:
        found = None
        for memory in ((S, Yf), None) if len(S) else (None,):
            direction, slope = descent(g, _two_loop(g, memory, weight))
            found = _line_search(fun_grad, z, value, direction, slope)
            if found is not None:
                break
        if found is None:          # no descent left at this precision, even along −∇
            break
        new, value, new_g = found
        s, y = new - z, new_g - g
        if not s.any():            # a step below rounding: nothing left to gain at this precision
            break
        if float(s @ y) > 1e-10 * float(np.linalg.norm(s) * np.linalg.norm(y)):   # curvature
            S, Yf = np.vstack([S, s])[-MEMORY:], np.vstack([Yf, y - weight * s])[-MEMORY:]
        z, g, residual = new, new_g, norm_inf(new_g)
        steps += 1
    state["pairs"] = (S, Yf)
    return z, steps


def _line_search(fun_grad, z: np.ndarray, value: float, direction: np.ndarray, slope: float):
    """The first of t = 1, ½, ¼, … with Armijo's decrease, or — where the values no longer
    resolve it (within FTOL·|P|: near the answer at tight tolerances) — Hager & Zhang's
    approximate Wolfe conditions (SIAM J. Optim. 2005), read from the gradient, which still
    resolves: (point, value, gradient), or None below `solvers.MIN_STEP`."""
    t, level = 1.0, FTOL * max(abs(value), 1.0)
    while t >= MIN_STEP:
        candidate = z + t * direction
        new_value, g = fun_grad(candidate)
        if new_value <= value + 1e-4 * t * slope:
            return candidate, new_value, g
        if new_value <= value + level and 0.9 * slope <= float(g @ direction) <= -0.9998 * slope:
            return candidate, new_value, g
        t *= 0.5
    return None


def _two_loop(g: np.ndarray, memory, weight: np.ndarray) -> np.ndarray:
    """−H·g, H the L-BFGS inverse Hessian of the pairs (S, Yf + weight∘S) with H₀ = γI, γ =
    sᵀy/yᵀy of the newest pair; −g·min(1, 1/‖g‖₂) without pairs. The compact form (Byrd,
    Nocedal & Schnabel 1994; Nocedal & Wright (7.24)) — the two-loop recursion's product (Alg.
    7.4) as a few matrix products: its 2m Python-level steps were 0.44 of DALD's 5.6 profiled s
    on MNIST 3v7 (d = 784, m = 20)."""
    if memory is None:
        return -g * min(1.0, 1.0 / max(float(np.linalg.norm(g)), 1e-300))
    S, Yf = memory
    Y = Yf + weight * S
    SY = S @ Y.T                   # s_iᵀy_j
    sy = np.diag(SY).copy()
    if not np.all(sy > 0.0):       # a pair kept under a larger weight, on a nonconvex P: dropped
        keep = sy > 0.0
        if not keep.any():
            return _two_loop(g, None, weight)
        S, Y, SY, sy = S[keep], Y[keep], SY[np.ix_(keep, keep)], sy[keep]
    gamma = sy[-1] / float(Y[-1] @ Y[-1])
    R = np.triu(SY)
    u = np.linalg.solve(R, S @ g)                                   # R⁻¹Sᵀg
    p = np.linalg.solve(R.T, sy * u + gamma * (Y @ (Y.T @ u)) - gamma * (Y @ g))
    return -(gamma * g + S.T @ p - gamma * (Y.T @ u))


def _rows_of(a, rows: np.ndarray, n: int):
    """An operand of `local_argmin` for the rows `rows`, as `Group.solve_local` takes it: a
    per-client stack's rows ((n, 1): one number per row), a (d,) row repeated, a scalar as is."""
    a = np.asarray(a, dtype=float)
    if a.ndim == 2 and a.shape[0] == n:
        a = a[rows]
        return a[:, 0] if a.shape[1] == 1 else a
    return np.broadcast_to(a, (len(rows), a.shape[-1])) if a.ndim >= 1 else a


def _each_row(group: Group, rows, X0, linear, weight, anchor, tol, solver, step, steps, subtract_linear):
    """`local_argmin` client by client, each as a group of one (its own plans)."""
    out, taken, n = np.array(X0, dtype=float), np.zeros(len(rows), dtype=int), group.n
    for j, i in enumerate(rows):
        one = NodeRows(group.programs[i])
        x, k = local_argmin(one, np.zeros(1, dtype=np.intp), X0[i:i + 1], _one(linear, i, n),
                            _one(weight, i, n), _one(anchor, i, n), tol, solver, step, steps, subtract_linear)
        out[i], taken[j] = x[0], k[0]
    return out, taken


def _one(a, i: int, n: int):
    """Row i of a per-client operand, as a one-row operand; anything else as is."""
    a = np.asarray(a, dtype=float)
    return a[i:i + 1] if a.ndim == 2 and a.shape[0] == n else a


def init_state(program, x0: np.ndarray, beta: float, rho2: np.ndarray | None) -> None:
    """A node's DALD state at x⁰: penalty β for its own constraints; ρ_i∘ρ_i (CC) or None (DC)."""
    program.configure(float(beta), 0.0, x0)
    program.state["dald"] = {"x": np.array(x0, float), "rho2": rho2, "edges": {}, "mu": np.zeros_like(x0)}


def unwinding(program, before: dict[str, np.ndarray]) -> float:
    """The largest step, in units of the node's β, by which one of its inequality multipliers
    fell in its last update and stayed positive (`before`: the multipliers before it), else 0.
    Such a multiplier belongs to a constraint that holds strictly at x_i yet still acts on the
    local solve: it falls by β·|c| every step until it reaches 0 and lets go — a plateau of the
    residuals that ends (the stall rule, `DALD._stall`). An infeasible run's multipliers do not
    fall steadily."""
    after, largest = program.node_state.mu, 0.0
    for constraint in program.constraints:
        if isinstance(constraint, Equality):      # free sign: a falling one lets nothing go
            continue
        old, new = before[constraint.name], after[constraint.name]
        falling = (new > 0.0) & (new < old)
        largest = max(largest, float(np.max(old[falling] - new[falling], initial=0.0)))
    return largest / float(program.node_state.beta or 1.0)


def own_multipliers(group: Group, rows: np.ndarray, xs) -> tuple[np.ndarray, np.ndarray]:
    """Step 2's update of the nodes' own constraint multipliers at their models `xs` (one per
    row of `rows`), node by node: (dmu, unwind) per row — the largest multiplier change and
    `unwinding` (Fed-DALD-CC and -DC report both; the stall rule reads the second)."""
    dmu, unwind = np.zeros(len(rows)), np.zeros(len(rows))
    if group.constrained:
        for k, (i, x) in enumerate(zip(rows, xs)):
            p = group.programs[i]
            if p.constraints:
                before = {name: mu.copy() for name, mu in p.node_state.mu.items()}
                dmu[k] = p.update_multipliers(x)["dmu"]
                unwind[k] = unwinding(p, before)
    return dmu, unwind


# ---- the clients' states ----------------------------------------------------------------------
def cc_states(group: Group) -> list[dict] | None:
    """The clients' Fed-DALD-CC states (None unless every client ran `dald_cc_init`), checked
    once until a client is next served node by node (or handed to another executor)."""
    def validate():
        states = [p.state.get("dald") for p in group.programs]
        return None if any(s is None or s.get("rho2") is None for s in states) else states
    return group.checked("cc", validate)


def star_states(group: Group) -> list[dict] | None:
    """`cc_states` when no client holds DC edge multipliers (μ_i is then one row per client),
    else None; checked once until a client is next served node by node (not per report)."""
    def validate():
        states = cc_states(group)
        return None if states is None or any(s.get("edges") for s in states) else states
    return group.checked("cc_star", validate)


def _state_stacked(group: Group, rows: np.ndarray, blocks: dict, common: dict) -> dict | None:
    """μ_i of Fed-DALD-CC clients as the group's (n, d) stack (rows of the request)."""
    if blocks or common or star_states(group) is None:
        return None
    MU = group.gather("mu", cc_states(group), group.n_x)
    return {"mu": read_only(MU) if in_group_order(rows, group.n) else MU[rows]}


@client_step("dald_state", {}, {"mu": "opaque"}, local=True, read_only=True, stacked=_state_stacked)
def _state(group: Group, members: list[str], payloads: dict) -> dict[str, dict]:
    """μ_i (CC: the array the client holds), or {neighbour: μ_e} (DC), of each member."""
    replies = {}
    for m in members:
        s = group.programs[group.index[m]].state.get("dald", {})
        mu = {k: e["mu"].copy() for k, e in s.get("edges", {}).items()} if s.get("edges") else s.get("mu")
        replies[m] = {"mu": mu}
    return replies
