"""ProxAL's and cProx-AL's stop test on the clients' private variables (one of
`proxal_outer.outer_stop`'s), and what their verdicts read at the nodes: the violated
constraints (`_violations`) and which of them a private slack meets alone (`slack_verdict`).

The distance test beside (11) (`proxal_outer._near`) reads the shared variables' outer steps
only. A private variable fixed by the shared ones through a client equality — the quantile
LP's v = pos(Xw − y), the epigraph slacks of `fedmodel.compiler.epigraph` — can be 30× smaller
than the terms it is the difference of, so a relative error 4e-5 in w is one of 3.8e-3 in v:
the quantile LP of tests/test_epigraph.py ended "converged" there (docs/BENCHMARKS.md, branch
epigraph).
"""
from __future__ import annotations

import numpy as np

from fedmodel.compiler.slack import met_by_slack
from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram


def private_step(program: NodeProgram) -> float:
    """This node's last outer step in its private variables relative to their size,
    ‖y − ȳ‖∞/max(‖y‖∞, ZERO) (ȳ: the proximal center, y where the outer iteration began); 0
    without private variables."""
    y = np.asarray(program.y, float)
    center = getattr(program.node_state, "y_center", None)
    if center is None or np.shape(center) != y.shape:
        return 0.0
    # at least ZERO: a slack whose answer is 0 (s ≥ 0 active) ends at 1e-13…1e-10, where steps
    # of rounding read as 10× its size and ProxAL went to its cap (tests/test_rewrites.py)
    return float(np.max(np.abs(y - center), initial=0.0)) / max(float(np.max(np.abs(y), initial=0.0)), ZERO)


ZERO = 1e-2    # (`private_step`) a private value below this, in the run's equilibrated units, counts as this size


@procedure("proxal_private_step", {}, {"private_step": "1"}, local=True, read_only=True)
def _private_step(program: NodeProgram) -> dict:
    """`private_step` (cProx-AL's records; ProxAL's ride on "proxal_report")."""
    return {"private_step": private_step(program)}


def private_settled(backend, history: list[dict], ex, still, distance_left) -> bool:
    """The private variables' distance test: the distance still to go in each node's private
    variables, its last relative outer step `private_step` times the tail the shared steps
    predict (`distance_left` over the last step: Σ of the remaining steps of a proximal point
    iteration contracting at one rate), ≤ dist_tol — or, where the shared iterates stand still
    (`still`: `proxal_outer._still`), that step ≤ dist_tol/100 as theirs. The nodes' reading rides on
    "proxal_report" (ProxAL) or is asked here once the other tests hold (cProx-AL). True
    without a finite dist_tol (the papers' presets: (11) alone)."""
    tol = getattr(backend, "dist_tol", np.inf)
    if tol == np.inf:
        return True
    last = history[-1]
    if "private_step" not in last:
        if ex is None:           # (records judged without nodes to ask: tests of the other rules)
            return True
        replies = ex.map("proxal_private_step", {node: {} for node in ex.nodes})
        last["private_step"] = max(r["private_step"] for r in replies.values())
    step = last["private_step"]
    if step == 0:
        return True
    if still(history, tol):
        return step <= 1e-2 * tol
    tail = distance_left(history, last["dimension"]) / last["step"] if last.get("step", 0) > 0 else np.inf
    return step * max(1.0, tail) <= tol


def met_by_slacks(program: NodeProgram, violated: dict[str, float]) -> list[str]:
    """The names in `violated` (this node's, `program.violations`) of constraints a private
    slack of the node meets alone by growing (`compiler.slack.met_by_slack`)."""
    met = met_by_slack(program.all_constraints, list(program.private.variables)) if violated else []
    return [name for name in map(repr, met) if name in violated]


FEASIBLE_STALL = ("the largest violation stayed at {v:.3g} while the multipliers grew, in constraints that "
                  "their private slacks meet alone by growing: the model is feasible, not "
                  "infeasible, and the run stalled (its scaling, or β_max; fm.verify with a CVXPY "
                  "reference tells how far the point is)")


def slack_verdict(found: str, slack_met: set[str], violated: dict) -> tuple[str, str | None]:
    """(status, message template): `found` as it is, or "stalled" with `FEASIBLE_STALL` where
    `found` is "infeasible" but every violated constraint is one a slack meets
    (`met_by_slacks`): raising those slacks gives a point that meets every constraint, so the
    model is feasible (the hinge SVM with features ×1e3 under ProxAL and cProx-AL, the pinball
    loss at unit scale under ProxAL: docs/BENCHMARKS.md, newuser5)."""
    if found == "infeasible" and violated and set(violated) <= slack_met:
        return "stalled", FEASIBLE_STALL
    return found, None


@procedure("proxal_violations", {"x": "x", "tol": "1"}, {"violated": "opaque", "slack_met": "opaque"},
           read_only=True)
def _violations(program: NodeProgram, x, tol=0.0):
    """This node's constraints violated by more than `tol` at `x` (rendered form → violation),
    and those of them its private slacks meet alone (`met_by_slacks`)."""
    violated = program.violations(x, tol)
    return {"violated": violated, "slack_met": met_by_slacks(program, violated)}
