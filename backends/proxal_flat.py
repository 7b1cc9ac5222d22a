"""ProxAL's distance test (`proxal_outer._near`) on a model whose minimizers are not a point
(He, Peng, Sun, "Federated learning with convex global and local constraints": the stop (11)
and its distance companion; equation numbers: that paper).

NP monks-1 one-hot (17 columns of rank 12; the class-0 rows' rank 11): along the null space N of
the objective's linear maps every f_i is constant, the proximal step (12) has no component there,
but an inexact ADMM run leaves one of up to ~β_k τ_k (the subproblem's gradient along N is only
(w − w_k)/β_k). At β_max = 1e6 those drifts are 0.01–1 an outer step, they do not shrink, and
the distance test read them as zero curvature: 100 outer iterations, 3,696 round trips, at a
point fm.verify finds 5e-8 from a minimizer modulo N (docs/BENCHMARKS.md, branch monks).

So where (11) and the KKT tests hold but the distance test does not, the server asks the nodes
once ("proxal_flat", read only) for a basis of the directions their objective cannot see (the
null space of their maps' Jacobian in the shared variables, `fedmodel.solution_set`; a prox term
sees its whole variable), intersects them, and reads the distance test again on the steps with
their part along N removed — what fm.verify measures: the distance to a minimizer modulo N.
A node's null space is what the gradients it sends already show (they lie in its maps' row
space); a node with more than FLAT_SIZE shared entries answers nothing.

Where that test still fails (the step ratios at β_k ≥ 1e5 read ADMM's inexactness, not the
model's curvature: monks-1's μ 9e-6 → 0 against the 0.03 of its Hessian modulo N), `curved`
asks each node for one number, the least curvature of its objective at w_k off its own flat
directions ("proxal_curvature", d ≤ CURVED_SIZE, read only), and bounds the distance with the
curvature of their sum modulo N those numbers guarantee."""
from __future__ import annotations

import weakref

import numpy as np

from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram
from fedmodel.solution_set import FLAT_SIZE, jacobian, maps, null_space

KEPT = 9      # the last iterates kept: `curvature`'s window of 6 step pairs needs 8 steps


@procedure("proxal_flat", {}, {"basis": f"<={FLAT_SIZE ** 2}"}, read_only=True)    # (its floats booked)
def _flat(program: NodeProgram) -> dict:
    """An orthonormal basis (n_shared × k) of the shared directions along which this node's
    objective is constant (None above FLAT_SIZE entries: not computed). With private variables
    y the node's constraints' maps count too: its objective may read x only through a y its
    constraints tie to x (an epigraph slack s ≥ |Xw − b|: the objective Σ s sees no x at all)."""
    n = program.n_shared
    if not 0 < n <= FLAT_SIZE:
        return {"basis": None}
    tied = [c.expr for c in program.all_constraints] if program.n_private else []
    objective = [m for e in [program.merit_ir.objective] + tied for m in maps(e)]
    rows = [jacobian(objective, program.variables)[:, :n]] if objective else []
    for term in program.merit_ir.prox_terms:       # a prox term sees every entry of its variable
        i = program.shared.variables.index(term.variable)
        rows.append(np.eye(n)[program.shared.offsets[i]:program.shared.offsets[i + 1]])
    basis = null_space(np.vstack(rows), n) if rows else np.eye(n)
    return {"basis": basis.tolist()}     # (plain lists: every executor's wire carries them)


def common(bases: list) -> np.ndarray | None:
    """The intersection of the nodes' flat subspaces (an orthonormal basis; None when a node
    gave none): v = N c stays flat for node i when (I − N_i N_iᵀ) N c = 0."""
    if not bases or any(b is None for b in bases):
        return None
    found = np.asarray(bases[0], dtype=float).reshape(len(bases[0]), -1)
    for basis in bases[1:]:
        if found.shape[1] == 0:
            break
        basis = np.asarray(basis, dtype=float).reshape(len(basis), -1)
        outside = found - basis @ (basis.T @ found)
        found = found @ null_space(outside, found.shape[1], scale=1.0)   # (unit columns)
    return found


_RUNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # executor -> its run's memo


def track(ex, history: list[dict], x: np.ndarray) -> None:
    """Keep the last KEPT outer iterates of the run on `ex` (history's last records'; none
    without an executor: records read on their own)."""
    if ex is None or x is None:
        return
    memo = _RUNS.get(ex)
    if memo is None or memo["run"] != id(history) or memo["length"] != len(history) - 1:
        memo = _RUNS[ex] = {"run": id(history), "points": [], "basis": False, "length": 0}
    memo["points"] = (memo["points"] + [np.array(x, dtype=float)])[-KEPT:]
    memo["length"] = len(history)


def memo(ex) -> dict | None:
    """The run's memo on `ex` (`track`'s iterates, the bases and readings asked so far) for a
    checkpoint: a resumed run asks and reads as the uninterrupted one would."""
    found = _RUNS.get(ex) if ex is not None else None
    return None if found is None else {key: value for key, value in found.items() if key != "run"}


def resume(ex, history: list[dict], saved: dict | None) -> None:
    """Put a checkpoint's memo (`memo`) back on `ex` for the resumed `history`."""
    if saved is not None and ex is not None:
        _RUNS[ex] = dict(saved, run=id(history))


def across(ex, history: list[dict], info: dict, curvature: float) -> list[dict] | None:
    """`history` with its last records' steps and sizes measured modulo the model's flat
    directions (info["solution_set"] says how many), or None when it has none (or too few
    steps are kept). The nodes are asked once per run, and only once the steps read no
    curvature (`proxal_outer.curvature` 0: a step that grew, what drift along them looks like):
    a model whose distance test fails for a step or two while its steps contract pays no
    round trip for it (bench_rounds' logistic-ball: 31 → 32 round trips if it did)."""
    memo = _RUNS.get(ex) if ex is not None else None
    if memo is None or memo["run"] != id(history) or len(memo["points"]) < 3:
        return None
    if memo["basis"] is False and curvature > 0:
        return None
    if memo["basis"] is False:   # the server first: it runs where the loop does (no round trip),
        # and a server term that sees every direction (a ridge: bench_verdicts' ls-ball) settles it
        nodes = [[node for node in ex.nodes if node not in ex.clients], list(ex.clients)]
        memo["basis"] = np.eye(ex.model_size)
        for group in nodes:
            if group and memo["basis"] is not None and memo["basis"].shape[1]:
                replies = ex.map("proxal_flat", {node: {} for node in group})
                memo["basis"] = common([memo["basis"].tolist()] + [replies[n]["basis"] for n in group])
    basis = memo["basis"]
    if basis is None or basis.shape[1] == 0:
        return None
    _say(info, basis)
    seen = [p - basis @ (basis.T @ p) for p in memo["points"]]
    tail = [dict(r, step=float(np.linalg.norm(b - a)), size=float(np.linalg.norm(b)), across=True)
            for r, a, b in zip(history[-(len(seen) - 1):], seen, seen[1:])]
    return history[:-len(tail)] + tail


def _say(info: dict, basis: np.ndarray) -> None:
    info["solution_set"] = (f"the objective is constant along a {basis.shape[1]}-dimensional subspace "
                            "of the shared variables (its data's maps have deficient rank): the "
                            "minimizers are not a point; the distance test reads the steps modulo it")


def near(backend, ex, history: list[dict], info: dict, near_test, curvature) -> bool:
    """`proxal_outer._near` (`near_test`) on `across`'s view of the history: the distance test
    modulo the flat directions (False without any), else `curved`'s."""
    view = across(ex, history, info, curvature(history))
    return (view is not None and near_test(backend, view)) or curved(backend, ex, history, info)


CURVED_SIZE = 200     # shared entries above which no node reads its Hessian (`curved`)
SMOOTH = 1e-2         # the two differences' relative disagreement above which a Hessian is refused
NOISE = 1e-8          # an eigenvalue below NOISE × the largest is the differences' error: 0
_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # program → (∇f_i plan, N_i's complement)


@procedure("proxal_curvature", {"x": "x"}, {"least": "1", "flat": "1"}, read_only=True)
def _curvature(program: NodeProgram, x) -> dict:
    """λ_i, the least eigenvalue of ∇²f_i(x) on the complement of this node's flat directions N_i
    (`_flat`; ∇²f_i vanishes on N_i), the Hessian by central differences of the node's objective
    gradient: one number, not the matrix, and N_i's dimension ("flat"). None: private variables (the objective may see x only
    through them), more than CURVED_SIZE entries, or differences at two widths that disagree (a
    kink or a jump in the curvature near x: a reading there would not hold beside x)."""
    n, x = program.n_shared, np.asarray(x, dtype=float)
    if program.n_private or not 0 < n <= CURVED_SIZE:
        return {"least": None, "flat": None}
    if program not in _PLANS:
        basis = np.asarray(_flat(program)["basis"], dtype=float).reshape(n, -1)
        _PLANS[program] = (program.compiled.objective_gradient_plan, _complement(basis))
    (plan, seen), y = _PLANS[program], program.y

    def gradient(z):
        return np.concatenate([np.ravel(g) for g in plan(*program._values(z, y))])

    def differences(h):
        return np.array([(gradient(x + h * e) - gradient(x - h * e)) / (2 * h) for e in np.eye(n)])
    width = 1e-4 * max(1.0, float(np.max(np.abs(x))))
    with np.errstate(all="ignore"):
        wide, narrow = differences(width), differences(width / 4)
    if not np.all(np.isfinite(wide)) or np.linalg.norm(wide - narrow) > SMOOTH * max(np.linalg.norm(wide), 1e-300):
        return {"least": None, "flat": None}
    hessian = (wide + wide.T) / 2
    values = np.linalg.eigvalsh(seen.T @ hessian @ seen) if seen.shape[1] else np.zeros(1)
    least = float(values[0]) if values[0] > NOISE * np.abs(np.linalg.eigvalsh(hessian)).max() else 0.0
    return {"least": least, "flat": n - seen.shape[1]}


def _complement(basis: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the orthogonal complement of `basis`'s columns."""
    n = basis.shape[0]
    return null_space(basis.T, n) if basis.shape[1] else np.eye(n)


def curved(backend, ex, history: list[dict], info: dict) -> bool:
    """`reading`'s verdict: True only where the nodes' curvature bounds the distance within dist_tol."""
    return reading(backend, ex, history, info) is True


def reading(backend, ex, history: list[dict], info: dict) -> bool | None:
    """The distance test with the objective's own curvature: (‖Δw_k‖₂/β_k + √d τ_k)/μ ≤
    dist_tol‖w‖₂ (`proxal_outer.distance_left`'s bound), steps and sizes modulo the flat
    directions N, and μ half the least eigenvalue on N's complement of Σ_i λ_i P_i, λ_i the
    nodes' `_curvature` and P_i the projection off node i's N_i: vᵀ∇²f_i v ≥ λ_i‖P_i v‖², so μ
    bounds Σ∇²f_i's curvature there from below (Weyl) from one number a node. The constraints'
    terms of the augmented Lagrangian are convex, so its curvature is at least f's; half: the
    bound needs it on a ball about w_k of the bound's radius (≤ dist_tol‖w‖₂), where a smooth
    f's Hessian barely moves. The step ratios `curvature` reads are, at β_k ≥ 1e5, ADMM's
    inexactness (NP monks-1 n = 5: μ 9e-6 → 0 while fm.verify found the iterate 4e-8 from a
    minimizer modulo N; docs/BENCHMARKS.md, branch cold). Asked (a round trip a test) only once
    (11) and the KKT tests hold; the nodes' N_i (one more) once a run, where a node has one.
    None where no reading can be had (no executor, too few iterates kept, d > CURVED_SIZE, a
    node that reads none); asked once an outer iteration (`proxal_outer._near` may ask first)."""
    memo = _RUNS.get(ex) if ex is not None else None
    if memo is None or memo["run"] != id(history) or len(memo["points"]) < 2 or "dimension" not in history[-1] \
            or memo.get("curved") is False or not 0 < ex.model_size <= CURVED_SIZE \
            or _curvature not in getattr(backend, "procedures", ()):     # (cProx-AL: not installed)
        return None
    if memo.get("read", (None,))[0] == len(history):      # (asked this outer iteration already)
        return memo["read"][1]
    memo["read"] = (len(history), _read(backend, ex, history, info, memo))
    return memo["read"][1]


def _read(backend, ex, history: list[dict], info: dict, memo: dict) -> bool | None:
    """`reading`'s round trips and bound."""
    replies = ex.map("proxal_curvature", {node: {"x": memo["points"][-1]} for node in ex.nodes})
    if any(r["least"] is None for r in replies.values()):
        memo["curved"] = False       # (no more round trips for it this run: the old test alone)
        return None
    if "bases" not in memo and not any(r["flat"] for r in replies.values()):
        memo["bases"] = {node: np.zeros((ex.model_size, 0)) for node in replies}     # (no N_i: no round trip)
        memo["basis"] = np.zeros((ex.model_size, 0))
    if "bases" not in memo:
        bases = ex.map("proxal_flat", {node: {} for node in ex.nodes})
        memo["bases"] = {node: np.asarray(r["basis"], dtype=float).reshape(ex.model_size, -1)
                         for node, r in bases.items()}
        if memo["basis"] is False:
            memo["basis"] = common([b.tolist() for b in memo["bases"].values()])
    basis = memo["basis"]
    if basis is None:
        return None
    if basis.shape[1]:
        _say(info, basis)
    bound = sum(replies[node]["least"] * (np.eye(ex.model_size) - b @ b.T) for node, b in memo["bases"].items())
    outside = _complement(basis)
    mu = 0.5 * float(np.linalg.eigvalsh(outside.T @ bound @ outside)[0]) if outside.shape[1] else 0.0
    seen = [p - basis @ (basis.T @ p) for p in memo["points"][-2:]]
    last = history[-1]
    # the multipliers' error moves the AL's minimizer by ‖Jᵀδμ‖/μ: with unit rows (equilibrated)
    # and at most d independent active ones, ≤ d‖δμ‖∞, δμ taken as their last step (remaining
    # error ≤ it at a contraction ≤ 1/2). Without it examples/centralized_form.py stopped
    # "converged" 1.2e-3 from CVXPY's w with its multipliers still moving by 0.05.
    last["nodes_curvature"] = mu     # (`proxal_outer.next_tau`'s μ where the steps read none)
    gradient = float(np.linalg.norm(seen[1] - seen[0])) / last["beta"] + np.sqrt(last["dimension"]) * last["tau"] \
        + last["dimension"] * last["multiplier_change"]
    return bool(mu > 0 and gradient / mu <= getattr(backend, "dist_tol", np.inf) * float(np.linalg.norm(seen[1])) \
        * last.get("metric", 1.0))


PROCEDURES = (_flat, _curvature)     # (`ProxAL.procedures`)
