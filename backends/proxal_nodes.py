"""ProxAL's client side (Algorithm 2 of He, Peng, Sun, "Federated learning with convex global and
local constraints"; equation numbers: that paper): the client steps, each written once over rows
of clients (`fedmodel.runtime.client_step`: a group of one on the serial, Ray and Flower
executors, a whole group on the batched and JAX ones), keeping each client's state (u_i, λ_i,
ρ_i, Anderson history) in `program.state["admm"]`, the client's sample count m_i for
ρ_i = a·m_i (Remark 4.2), and the multipliers of the sets a client projects in (19)
(`ProxAL(client_sets=True)`), read from its last local point.

`proxal_admm_step` does, for the rows at once: the local solve (19) by `Group.solve_local`
(Newton and exact solves of a stack that fits: one batched solve, `batched_newton`; L-BFGS,
prox, GD and Newton-CG: each client's own solver), the certificate (22) from one ∇P_i
evaluation, the multiplier step (20), ũ_i (21) and adaptive ρ_i; Anderson's per-client
histories (mix, push) client by client. Members sent different options or server iterates are
served one by one (the same step on each).
"""
from __future__ import annotations

import weakref

import numpy as np

from fedmodel.expression import Data
from fedmodel.runtime.batched_group import Group, broadcast_rows, private_stack
from fedmodel.runtime.batched_procedures import common_value, same_options
from fedmodel.runtime import ball_newton, local_al
from fedmodel.runtime.client_step import client_step
from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram
from .anderson import MAX_MEMORY, ClientHistory
from .proxal_private import _private_step, private_step


@procedure("proxal_samples", {}, {"samples": "1"}, local=True, read_only=True)
def _sample_count(program: NodeProgram) -> dict:
    """m_i of Remark 4.2: the most rows of any data the node's terms and constraints read (1
    when it reads no array). Node-local bookkeeping for the server's ρ_i = a·m_i."""
    exprs = [program.merit_ir.objective] + [c.expr for c in program.all_constraints]
    rows = [leaf.shape[0] for e in exprs for leaf in e.leaves() if isinstance(leaf, Data) and leaf.ndim >= 1]
    return {"samples": float(max(rows or [1]))}


@client_step("proxal_admm_init", {"w": "x", "rho": "1", "anderson": "1", "beta": "1", "prox_weight": "1",
                                  "local": "1"},
             {"u_tilde": "x"})
def _admm_init(group: Group, members: list[str], payloads: dict) -> dict[str, dict]:
    """Step 1 of Algorithm 2: u⁰ = w̃⁰, λ⁰ = −∇P_i(w̃⁰), ũ⁰ = w̃⁰ − ∇P_i(w̃⁰)/ρ_i. Each client's
    gradient from its own plan (once per ADMM run): the request does not say which local solver
    follows, and an L-BFGS-B run started from a gradient that differs in the last bits can take
    other steps. With `beta` and `prox_weight` the client first configures P_{i,k} (13) with
    center w̃⁰ = w_k, as "configure" would: the outer step's two requests in one message.
    `local` (0 or 1, with `ProxAL(client_constraints="local")`): whether the client's local
    solves hold its smooth convex constraints (`NodeProgram.hold_locally`; 0: the fallback to
    the augmented Lagrangian)."""
    replies = {}
    for m in members:
        program, request = group.programs[group.index[m]], payloads[m]
        w, rho, anderson = np.asarray(request["w"], float), float(request["rho"]), int(request.get("anderson", 0.0))
        if request.get("local") is not None:
            program.hold_locally(bool(request["local"]))
        if request.get("beta") is not None:
            program.configure(beta=request["beta"], prox_weight=request["prox_weight"], center=w)
        grad = program.merit(w)["grad"]
        if program.local_names:         # ∇F_i + ∇gᵀν of the held constraints, not their AL term
            grad = local_al.lagrangian_gradient(program, w, grad)
        program.state["admm"] = {"u": w.copy(), "lam": -grad, "rho": rho, "w": w.copy(),
                                 "history": ClientHistory(anderson) if anderson else None}
        replies[m] = {"u_tilde": w - grad / rho}
    group.forget()          # new state dicts
    return replies


@client_step("proxal_admm_step", {"w": "x", "eps": "1", "adaptive": "1", "solver": "str",
                                  "mix": f"<={MAX_MEMORY}", "restart": "1"},
             {"u_tilde": "x", "eps_tilde": "1", "rho": "1", "steps": "1", "products": f"<={MAX_MEMORY + 1}",
              "local_failed": "1", "primal": "1"})
def _admm_step(group: Group, members: list[str], payloads: dict) -> dict[str, dict] | None:
    """One client step of Algorithm 2 at the server's w^{t+1} for the rows `members`:
    certificate (22), local solve (19), multiplier step (20), ũ_i (21); with Anderson, first
    the mix the server sent. None (served one by one) when the members were sent different
    options or iterates."""
    opts = same_options(payloads, members, ("eps", "adaptive", "solver", "restart"))
    w = common_value(payloads, members)
    mix = None if opts is None else opts.get("mix")
    if opts is None or w is None or (mix is not None and any(
            payloads[m] is not opts and not np.array_equal(payloads[m].get("mix"), mix) for m in members)):
        return None
    rows = np.array([group.index[m] for m in members])
    states = [group.programs[i].state["admm"] for i in rows]
    k, n_x = len(members), group.n_x
    U = np.array([s["u"] for s in states], dtype=float).reshape(k, n_x)
    Lam = np.array([s["lam"] for s in states], dtype=float).reshape(k, n_x)
    rho = np.array([float(s["rho"]) for s in states])
    histories = [s["history"] for s in states]
    for j, history in enumerate(histories):   # Anderson acceleration (backends/anderson.py)
        if history is None:
            continue
        if opts.get("restart", 0.0):
            history.clear()
        if mix is not None and len(mix):       # the state x_i = (u_i, λ_i/ρ_i) the server mixed ũ_i of
            x = history.mix(np.asarray(mix, float))
            U[j], Lam[j] = x[:n_x], rho[j] * x[n_x:]
    # (19): u ≈ argmin P_i(u) + <λ, u − w> + (ρ/2)‖u − w‖², to ‖∇φ_i‖∞ ≤ ε_{t+1}, warm-started
    # at (u_i, y_i); its residual is not read (a quadratic client: one step, `exact_step`)
    private = private_stack(group)
    Z, steps, _ = group.solve_local(np.concatenate([U, private[rows]], axis=1), rows, Lam, rho, w,
                                    float(opts["eps"]), opts.get("solver", "auto"), residual=False)
    U_new, Y_new = Z[:, :n_x], Z[:, n_x:]
    # (22) with the OLD λ_i^t, u_i^t and the ρ_i^t the server used in (18), and the private
    # values y_i this step leaves (those the run reports): ∇_w ℓ_k(w, y) = ∇P_0(w) +
    # Σ_i ∇_w P_i(w, y_i) for any y_i, and (18) gives ∇P_0(w) ≈ −Σ_i (λ_i − ρ_i (w − u_i))
    # whatever they are. Read before the solve (at y_i^t), it bounded ∇_w ℓ_k at a point the
    # run does not return (equilibrated private slack: true 6.2e-4 against 2.9e-4).
    private = private.copy()
    private[rows] = Y_new
    remainder = group.grad(broadcast_rows(w, group.n, n_x), private)[rows, :n_x] + Lam - rho[:, None] * (w - U)
    if group.prox or group.programs[rows[0]].local_names:   # a client's λ‖w‖₁, set or held constraint: its ∂ counts
        remainder = group.constraint_remainder(rows, w, remainder)
    eps_tilde = np.abs(remainder).max(axis=1, initial=0.0)
    Lam_new = Lam + rho[:, None] * (U_new - w)                                   # (20)
    new_rho = rho
    # the consensus residual ‖u_i − w‖∞ (reported by a client that holds constraints:
    # `proxal_admm.no_consensus`)
    primal = np.abs(U_new - w).max(axis=1, initial=0.0)
    # A set's normal cone (or a held constraint's) read at a w outside it is no subdifferential
    # of ℓ_k (∂ of an indicator is empty there), so (22) alone "solved" runs whose w stood
    # outside X_i (issue 25: w ≥ 1 from w = 0, certificate 0 at t = 0). ρ_i dist∞(w, X_i) is
    # the gradient of X_i's Moreau envelope with weight ρ_i: added, (23) asks dist ≤ τ_k/ρ_i.
    radii = ball_newton.radii(group, rows)
    if radii is not None:       # one ball a client: `_outside`'s distance, stacked
        far = np.abs(w - ball_newton.project(np.broadcast_to(w, (k, n_x)), radii)).max(axis=1, initial=0.0)
        outside = np.minimum(far, primal)
    else:
        outside = np.array([_outside(group.programs[i], w, Y_new[j], primal[j]) for j, i in enumerate(rows)])
    eps_tilde = eps_tilde + rho * outside
    if opts.get("adaptive", 0.0):
        previous = np.array([s["w"] for s in states], dtype=float).reshape(k, n_x)
        dual = rho * np.abs(w - previous).max(axis=1, initial=0.0)
        new_rho = np.array([_balance(r, p, d) for r, p, d in zip(rho.tolist(), primal.tolist(), dual.tolist())])
    U_tilde = U_new + Lam_new / new_rho[:, None]                                 # (21), new ρ
    w_kept, replies = w.copy(), {}
    for j, m in enumerate(members):     # each client's state and reply (row views of fresh stacks)
        program, history = group.programs[rows[j]], histories[j]
        program.y = Y_new[j]
        reply = {"eps_tilde": float(eps_tilde[j]), "steps": int(steps[j]), "u_tilde": U_tilde[j],
                 "rho": float(new_rho[j]), "primal": float(primal[j]) if program.local_names else 0.0}
        failed = program.state.pop("local_failed", None)
        if failed is not None:          # its held constraints could not be met (`local_al.solve`)
            reply["local_failed"] = float(failed)
        if history is not None:         # the iterate in the ρ it was computed with
            reply["products"] = history.push(np.concatenate([U_new[j], Lam_new[j] / rho[j]]),
                                             np.concatenate([U[j], Lam[j] / rho[j]]))
        program.state["admm"] = {"u": U_new[j], "lam": Lam_new[j], "rho": float(new_rho[j]), "w": w_kept,
                                 "history": history}
        replies[m] = reply
    return replies


def _outside(program: NodeProgram, w: np.ndarray, y: np.ndarray, primal: float) -> float:
    """An upper bound on dist∞(w, X_i), X_i the sets client i projects on and the constraints
    its solves hold (0 inside, and for a client with neither): a set's own projection; for a
    violated held constraint the consensus residual ‖u_i − w‖∞ (`primal`; u_i ∈ X_i)."""
    if program.local_names and np.max(local_al.local_plans(program).values(program, w, y), initial=0.0) > 0:
        return primal
    far, values = 0.0, None
    for term in program.merit_ir.prox_terms:
        if term.constraint is not None:
            values = program.shared.unpack(np.asarray(w, float)) if values is None else values
            v = values[program.shared.variables.index(term.variable)]
            far = max(far, float(np.max(np.abs(v - term.prox(v, 1.0)), initial=0.0)))
    return min(far, primal)


def _balance(rho: float, primal: float, dual: float, ratio: float = 10.0, factor: float = 2.0) -> float:
    """Residual balancing (Boyd et al. §3.4.1): keep primal and dual residuals within `ratio`."""
    if primal > ratio * dual:
        return rho * factor
    if dual > ratio * primal:
        return rho / factor
    return rho


@procedure("proxal_set_multipliers", {}, {"multipliers": "opaque"}, local=True, read_only=True)
def _set_multipliers(program: NodeProgram) -> dict:
    """The multipliers, by constraint name, of the sets this client projected in (19)
    (`ProxAL(client_sets=True)`), at its last local point u_i: (19) and (20) give
    0 ∈ ∇P_i(u_i) + λ_i + N_C(u_i), so −(∇P_i(u_i) + λ_i) is the normal-cone element; it is
    written as Σ_j ν_j ∇g_j(u_i) over the active rows g_j of the sets' constraints, ν ≥ 0
    (bounded least squares on the constraints' Jacobian, `_jacobian`: a set's constraint reads
    only the shared variable). Driver bookkeeping (the result's multipliers:
    the KKT certificate reads sets through their normal cones), served locally."""
    state = program.state.get("admm")
    terms = [m for t in program.merit_ir.prox_terms for m in (t.members or (t,)) if m.constraint is not None]
    if not state or not terms:
        return {"multipliers": {}}
    u = np.asarray(state["u"], float)
    normal = -(program.value_grad(u, program.y)[1][:program.n_shared] + state["lam"])
    values, normals = program.shared.unpack(u), program.shared.unpack(normal)
    out: dict = {}
    for variable in {id(m.variable): m.variable for m in terms}.values():
        i = program.shared.variables.index(variable)
        members = [m.constraint for m in terms if m.variable is variable]
        out.update(_normal_multipliers(members, variable, values[i], normals[i]))
    return {"multipliers": out}


def _normal_multipliers(constraints, variable, x, normal) -> dict[str, np.ndarray]:
    """ν ≥ 0 (one per row of each constraint g ≤ 0; 0 on inactive rows) with Σ ν_j ∇g_j(x)
    closest to `normal`."""
    from scipy.optimize import lsq_linear
    from fedmodel.compiler.codegen import Plan
    plan = Plan([c.expr for c in constraints], [variable])
    x = np.asarray(x, float)
    flat = x.ravel()
    value = np.concatenate([np.ravel(v) for v in plan(x)])
    jacobian = _jacobian(constraints, variable, x, plan, value.size)
    slack = 1e-6 * np.maximum(1.0, np.abs(jacobian).sum(axis=1) * max(1.0, float(np.max(np.abs(flat), initial=0.0))))
    active = value >= -slack
    nu = np.zeros(value.size)
    if np.any(active):
        nu[active] = lsq_linear(jacobian[active].T, np.ravel(normal), bounds=(0.0, np.inf)).x
    out, start = {}, 0
    for c in constraints:
        size = int(np.prod(c.shape, dtype=int))
        out[c.name] = nu[start:start + size].reshape(c.shape)
        start += size
    return out


def _jacobian(constraints, variable, x: np.ndarray, plan, rows: int) -> np.ndarray:
    """The constraints' Jacobian in `variable` at x, whichever way takes fewer plan calls: a row
    at a time by the compiled transposed-Jacobian product (one call a row: a ball at d = 10⁵ is
    one call, where central differences took 2·10⁵ — 101 of the 174 s a9a-100k solve), or a
    column at a time by central differences (two calls a column: many rows on few unknowns).
    The rows stand only where central differences along one random direction agree: at a kink
    (an ℓ∞ ball's tied corner, a Euclidean ball's centre) a derivative rule picks one piece or
    gives nan, where central differences average the pieces the multipliers are fitted to."""
    from fedmodel.compiler.codegen import Plan
    from fedmodel.compiler.differentiate import vjp
    from fedmodel.expression import Variable
    flat, shape = x.ravel(), x.shape
    step = 1e-6 * max(1.0, float(np.max(np.abs(flat), initial=0.0)))

    def along(direction: np.ndarray) -> np.ndarray:
        up, down = (flat + step * direction).reshape(shape), (flat - step * direction).reshape(shape)
        return (np.concatenate([np.ravel(v) for v in plan(up)])
                - np.concatenate([np.ravel(v) for v in plan(down)])) / (2 * step)

    jacobian = np.empty((rows, flat.size))
    if rows <= 2 * flat.size:
        start = 0
        for c in constraints:
            weight = Variable(c.shape, name="row")
            transposed = Plan([vjp(c.expr, variable, weight)], [variable, weight])
            one_hot = np.zeros(int(np.prod(c.shape, dtype=int)))
            for j in range(one_hot.size):
                one_hot[j] = 1.0
                with np.errstate(all="ignore"):
                    jacobian[start + j] = np.ravel(transposed(x, one_hot.reshape(c.shape))[0])
                one_hot[j] = 0.0
            start += one_hot.size
        direction = np.random.default_rng(0).uniform(-1.0, 1.0, flat.size)
        differenced = along(direction)
        size = max(float(np.max(np.abs(jacobian) @ np.abs(direction), initial=0.0)),
                   float(np.max(np.abs(differenced), initial=0.0)))
        if np.all(np.isfinite(jacobian)) and np.allclose(jacobian @ direction, differenced,
                                                         rtol=1e-5, atol=1e-5 * size):
            return jacobian
    unit = np.zeros(flat.size)
    for j in range(flat.size):
        unit[j] = 1.0
        jacobian[:, j] = along(unit)
        unit[j] = 0.0
    return jacobian


@procedure("proxal_report", {"x": "x"}, {"objective": "1", "violation": "1", "complementarity": "1",
                                         "gradient_scale": "1", "private_step": "1"}, local=True, read_only=True)
def _report(program: NodeProgram, x) -> dict:
    """"report" (objective and largest violation at x), Σ_j |μ_j c_j(x)| over the constraints
    in the augmented Lagrangian (not those the solves hold), with the μ the outer step's
    multiplier update (5) just left: the complementarity that bounds f(x) − f* at a point
    stationary for the Lagrangian at μ (`proxal_outer.settled`), and the size of this node's
    objective gradient at x (`gradient_scale`: what the stop's stationarity is relative to,
    `proxal_outer.relative`). It rides on that update, after it (two scalars more than
    "report"; harness bookkeeping, served locally)."""
    reply = program.report(x)
    gap = 0.0
    if program.constraints:
        residuals = program.compiled.residuals(*program._values(np.asarray(x, float), program.y))
        for constraint, c in zip(program.constraints, residuals):
            if constraint.name not in program.local_names:
                gap += float(np.sum(np.abs(program.node_state.mu[constraint.name] * np.asarray(c))))
    return {**reply, "complementarity": gap, "gradient_scale": gradient_scale(program, np.asarray(x, float)),
            "private_step": private_step(program)}     # (`proxal_private.private_settled`)


BEND = 1e-4                       # the relative step of the difference along x (`gradient_scale`)
_AT_ZERO: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # program → ‖∇f_i(0)‖∞


def gradient_scale(program: NodeProgram, x: np.ndarray) -> float:
    """The size of this node's objective gradient at x in the shared variables, as
    `fm.verify`'s relative stationarity measures it (fedmodel/certificate.py): max(‖∇f_i(x)‖∞,
    min(‖∇f_i(0)‖∞, ‖∇²f_i(x)·x‖∞)) — the gradients at 0 standing for gradients that vanish at a
    perfect fit unless x's own curvature along x is less (a saturated loss) — plus λ of a λ‖w‖₁.
    The equilibration (fedmodel/compiler/scaling.py) sizes the objective at the origin; where
    the loss saturates (logistic on separable data in large units) the gradients near the
    answer are ~10⁶ times smaller, and an absolute ε1 there certifies nothing."""
    plan = program.compiled.objective_gradient_plan      # (compiled once per structure)
    extra = sum(t.weight() for t in program.merit_ir.prox_terms if t.weight is not None)
    if plan is None:
        return float(extra)

    def size(z: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.concatenate([np.ravel(g) for g in plan(*program._values(z, program.y))])
    if program not in _AT_ZERO:
        _AT_ZERO[program] = float(np.max(np.abs(size(np.zeros_like(x))), initial=0.0))
    at_zero = _AT_ZERO[program]
    here = float(np.max(np.abs(size(x)), initial=0.0))
    bend = float(np.max(np.abs(size(x * (1 + BEND)) - size(x * (1 - BEND))), initial=0.0)) / (2 * BEND)
    floor = min(at_zero, bend) if np.isfinite(at_zero) else bend
    return float(max(here, floor if np.isfinite(floor) else 0.0) + extra)


# ProxAL's client steps (`ProxAL.procedures`)
PROCEDURES = (_sample_count, _admm_init, _admm_step, _set_multipliers, _report, _private_step)
