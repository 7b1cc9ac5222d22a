"""ProxAL's and cProx-AL's stop test on the clients' private variables (one of
`proxal_outer.outer_stop`'s).

The distance test beside (11) (`proxal_outer._near`) reads the shared variables' outer steps
only. A private variable fixed by the shared ones through a client equality — the quantile
LP's v = pos(Xw − y), the epigraph slacks of `fedmodel.compiler.epigraph` — can be 30× smaller
than the terms it is the difference of, so a relative error 4e-5 in w is one of 3.8e-3 in v:
the quantile LP of tests/test_epigraph.py ended "converged" there (docs/BENCHMARKS.md, branch
epigraph).
"""
from __future__ import annotations

import numpy as np

from fedmodel.runtime.ledger import procedure
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
