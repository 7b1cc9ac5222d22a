"""Node programs for backends whose server and client steps project (FedADMM, DP-ADMM): every
simple set on the shared variables — balls however written, bounds, and also halfspaces
`a @ w <= b`, small polyhedra and affine subspaces `A @ w == b` with constant coefficients
(`compiler.canonical.PROJECT_ALL`; radii, bounds and offsets may be Parameters) — is compiled
as a projection, and several on one variable as their intersection (Dykstra's algorithm,
`compiler.projection`), on the server and on the clients.
Other backends (ProxAL, DALD) keep affine constraints in their augmented Lagrangian, and the KKT
certificate reads them through their multipliers: a projecting backend reports the multipliers
of the affine sets it projected on (`projected_multipliers`, the procedure
"server_set_multipliers" for a server's z-step)."""
from __future__ import annotations

import numpy as np

from fedmodel.compiler.canonical import PROJECT_ALL
from fedmodel.compiler.intersections import check_boxes_meet, prox_conflict
from fedmodel.compiler.sets import AFFINE, affine_multipliers, simple_set
from fedmodel.errors import FedModelError
from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import ProgramSpec, compile_programs


def compile_projecting(problem) -> dict:
    """`compile_programs(problem, client_sets=True)` with affine sets projected too. The
    clients get `PROJECT_ALL` through `client_sets`; `compile_programs` gives the server plain
    projection (`True`), so a server that holds an affine set is compiled again with it.
    FedModelError where a node's λ‖w‖₁ and sets would be applied in turn inexactly
    (`intersections.prox_conflict`)."""
    programs = project_server_sets(problem, compile_programs(problem, client_sets=PROJECT_ALL))
    for name, program in programs.items():     # (a program built on its worker is not checked)
        merit = getattr(program, "merit_ir", None)
        conflict = prox_conflict(merit.prox_terms) if merit is not None else None
        if conflict:
            raise FedModelError(f"node {name!r}: {conflict}")
    return programs


def project_server_sets(problem, programs: dict, to_server: list = ()) -> dict:
    """`programs` with the server's program compiled again to project its affine sets too
    (`compile_programs` gives the server plain projection: balls, bounds), where it holds one;
    `to_server`: clients' sets it holds too (`compile_programs`)."""
    server = problem.server
    if any(affine_only(c) for c in server.constraints):
        shared = problem.shared_variables()
        spec = ProgramSpec(server.name, "server", server.terms, [*server.constraints, *to_server], shared,
                           list(getattr(server, "private_variables", [])), project=PROJECT_ALL)
        programs[server.name] = spec if spec.remote else spec.build()
    return programs


def projectable(constraint) -> bool:
    """A constraint a server step can enforce by projection: a simple set (ball, bound) or an
    affine one (halfspace, polyhedron, subspace with constant coefficients)."""
    return simple_set(constraint, affine=True) is not None


def affine_only(constraint) -> bool:
    """A constraint that only `PROJECT_ALL` projects (a halfspace, polyhedron or subspace)."""
    return simple_set(constraint) is None and simple_set(constraint, affine=True) is not None


def projects_affine(problem) -> bool:
    """Whether some block of `problem` holds an affine set (whose multiplier a projecting
    backend then computes at the end of its run)."""
    return any(affine_only(c) for block in problem.blocks for c in block.constraints)


def projected_multipliers(program, x: np.ndarray, normal: np.ndarray) -> dict[str, np.ndarray]:
    """The multipliers of the affine constraints the node `program` projected on, at its shared
    point x, from `normal` ∈ N_C(x) (flat, the node's layout): `sets.affine_multipliers` per
    projected set."""
    out: dict[str, np.ndarray] = {}
    values, normals = program.shared.unpack(np.asarray(x, float)), program.shared.unpack(np.asarray(normal, float))
    for term in program.merit_ir.prox_terms:
        if term.constraint is not None:
            i = program.shared.variables.index(term.variable)
            out.update(affine_multipliers(term, values[i], normals[i]))
    return out


def has_affine_sets(program) -> bool:
    """Whether the node projects on an affine constraint (whose multiplier it then reports)."""
    return any(m.kind in AFFINE for t in program.merit_ir.prox_terms for m in (t.members or (t,)))


@procedure("server_set_multipliers", {"x": "x", "anchor": "x", "weight": "1"},
           {"multipliers": "opaque"}, local=True, read_only=True)
def _server_set_multipliers(program, x, anchor, weight) -> dict:
    """The multipliers of the server's projected affine constraints at its last z-step's result
    x = argmin h(x) + ι_C(x) + (weight/2)‖x − anchor‖²: its normal-cone element is
    weight·(anchor − x) − ∇h(x). Driver bookkeeping (the result's multipliers), served locally."""
    if not has_affine_sets(program):
        return {"multipliers": {}}
    x = np.asarray(x, float)
    normal = weight * (np.asarray(anchor, float) - x) - program.value_grad(x, program.y)[1][:program.n_shared]
    return {"multipliers": projected_multipliers(program, x, normal)}


def server_set_multipliers(ex, x: np.ndarray, step: tuple) -> dict:
    """The multipliers of the server's projected affine sets at x, the result of its last
    proximal step `step` = (anchor, weight) (the local request "server_set_multipliers")."""
    anchor, weight = step
    return ex.call("server", "server_set_multipliers", x=x, anchor=anchor, weight=float(weight))["multipliers"]


def data_free_client_sets(problem) -> list:
    """The clients' balls and bounds on the shared variables that read no client data (constant
    or Parameter radii and bounds: `sets.simple_set`), which the server's step (53) projects on
    exactly (their intersection). Held by a client, a ball's AL term has curvature λ_i/r, which
    outgrew the step 1/L̂: a 0.1 ball on 3 logistic clients diverged in 10/10 seeds."""
    moved = [c for block in problem.clients for c in block.constraints
             if simple_set(c) is not None and not c.expr.data_owners()]
    try:
        check_boxes_meet([simple_set(c) for c in moved])
    except FedModelError:     # clients' boxes that leave no point: each keeps its own, and the
        return []             # run ends "stalled" naming them (`base.finish_result`)
    return moved
