"""The multipliers of the sets `ProxAL(inner=NewtonInner())`'s server projects on: the clients'
data-free balls and bounds moved to it (`proxal_newton.server_sets`) and its own.

Algorithm 2 reports a client's set multipliers from its own last local solve
(`proxal_nodes._set_multipliers`); under Newton no client solves, the server's model step
projects. At the last Newton point z (the run's answer) the step's stationarity gives the
normal-cone element: 0 ∈ G + ∂(Σ_j l1_j|z_j|) + N_C(z), G the clients' summed merit gradient
plus the server's (with the multiplier update after it, ∇f + Σ μ_j ∇c_j + the proximal term's
ω(z − w_k), which vanishes with the step), so −(G + the ℓ1 subgradient closest to −G) is
written as Σ_j ν_j ∇g_j(z) over the active rows of the sets' constraints, ν ≥ 0
(`proxal_nodes._normal_multipliers`, bounded least squares). Clients that hold the same set
(n copies of one ball) share its ν equally: the dual's centre, as an interior-point solver
(CVXPY's) reports it; any split with the same sum satisfies KKT.
"""
from __future__ import annotations

import numpy as np

from fedmodel.compiler.sets import ZERO
from fedmodel.runtime.active_set import l1_residual
from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram
from .proxal_nodes import _normal_multipliers

PROBE_SCALE = 1e3       # probes this far (× max(1, ‖z‖∞)) from z: every side of a set's boundary


def l1_weights(program: NodeProgram) -> np.ndarray:
    """Per-entry λ of the node's λ‖w‖₁ terms on the shared variables (0 elsewhere)."""
    parts = [np.zeros(v.size) for v in program.shared.variables]
    for term in program.merit_ir.prox_terms:
        if term.kind == "norm1" and term.kinked is None and term.constraint is None:
            parts[program.shared.variables.index(term.variable)] += term.weight()
    return np.concatenate(parts) if parts else np.zeros(0)


def l1_remainder(z: np.ndarray, g: np.ndarray, l1: np.ndarray) -> np.ndarray:
    """g plus the element of ∂(Σ_j l1_j|z_j|) closest to −g (`active_set.l1_residual`), entries
    within ZERO of 0 read as 0."""
    zero = np.abs(z) <= ZERO * max(1.0, float(np.max(np.abs(z), initial=0.0)))
    return l1_residual(np.where(zero, 0.0, z), g, l1)


def set_multipliers(program: NodeProgram, z: np.ndarray, normal: np.ndarray) -> dict[str, np.ndarray]:
    """ν by constraint name of the sets the node `program` projects on, at its shared point z,
    from `normal` ≈ an element of their normal cone at z (flat, the node's layout); each group
    of equal sets (`_same_set`) gets one ν, split equally among its members."""
    terms = [m for t in program.merit_ir.prox_terms for m in (t.members or (t,)) if m.constraint is not None]
    values, normals = program.shared.unpack(np.asarray(z, float)), program.shared.unpack(np.asarray(normal, float))
    out: dict[str, np.ndarray] = {}
    for variable in {id(m.variable): m.variable for m in terms}.values():
        i = program.shared.variables.index(variable)
        groups: dict[bytes, list] = {}
        for m in terms:
            if m.variable is variable:
                groups.setdefault(_same_set(m, values[i]), []).append(m.constraint)
        found = _normal_multipliers([g[0] for g in groups.values()], variable, values[i], normals[i])
        for members in groups.values():
            share = np.asarray(found[members[0].name], float) / len(members)
            out.update({c.name: share.copy() for c in members})
    return out


def _same_set(term, x: np.ndarray) -> bytes:
    """A key equal for terms projecting on the same set: their projections of x and of two
    points far out on either side (fixed probes; sets that differ anywhere near x part there)."""
    x = np.asarray(x, float)
    far = PROBE_SCALE * max(1.0, float(np.max(np.abs(x), initial=0.0)))
    probe = np.random.default_rng(0).standard_normal(x.shape) * far
    return b"".join(np.round(term.prox(p, 1.0), 12).tobytes() for p in (x, x + probe, x - probe))


@procedure("proxal_newton_set_multipliers", {"x": "x", "grad": "x", "l1": "x"}, {"multipliers": "opaque"},
           local=True, read_only=True)
def newton_set_multipliers(program: NodeProgram, x, grad, l1) -> dict:
    """The multipliers of the server's sets at the last Newton point z = x, given the clients'
    summed gradient and ℓ1 weights there (`set_multipliers`). Driver bookkeeping."""
    z = np.asarray(x, float)
    G = np.asarray(grad, float) + program.value_grad(z, program.y)[1][:program.n_shared]
    normal = -l1_remainder(z, G, np.asarray(l1, float) + l1_weights(program))
    return {"multipliers": set_multipliers(program, z, normal)}
