"""FedADMM's node-local bookkeeping (Song, Wang, Zuazua, arXiv 2402.13989; equation numbers:
that paper): requests served on the node and never part of the algorithm's traffic — the
client's β_i and η_i, the multipliers of its projected affine sets, and why FedADMM cannot run
with it (`client` has the client steps)."""
from __future__ import annotations

from fedmodel.runtime.messages import procedure
from fedmodel.runtime.program import NodeProgram
from ..projecting import has_affine_sets, projected_multipliers


@procedure("fedadmm_beta", {}, {"beta": "1", "lr": "1"}, local=True, read_only=True)
def _penalty(program: NodeProgram):
    """The client's current β_i and step η_i (None before its first round): reporting, and
    ProxAL's composition carrying β_i from one subproblem to the next."""
    s = program.state.get("fedadmm", {})
    return {"beta": s.get("beta"), "lr": s.get("lr")}


@procedure("fedadmm_set_multipliers", {}, {"multipliers": "opaque"}, local=True, read_only=True)
def _set_multipliers(program: NodeProgram) -> dict:
    """The multipliers of the client's projected affine constraints at its last local point u_i:
    the local step's optimality 0 ∈ ∇f̃_i(u) − λ_i + N_C(u) (λ_i after (2.8b)) gives the normal
    element α_i λ_i − ∇f_i(u) in the model's units (f_i = α_i f̃_i). Driver bookkeeping (the
    result's multipliers), served locally."""
    s = program.state.get("fedadmm")
    if not s or not has_affine_sets(program):
        return {"multipliers": {}}
    gradient = program.value_grad(s["u"], program.y)[1][:program.n_shared]
    return {"multipliers": projected_multipliers(program, s["u"], s["alpha"] * s["lam"] - gradient)}


@procedure("fedadmm_refusal", {}, {"refusal": "str"}, local=True, read_only=True)
def _refusal(program: NodeProgram) -> dict:
    """Why FedADMM cannot run with this node as it is (None: it can). Its constraints must be
    simple sets on the shared variables — balls, bounds, halfspaces, affine subspaces with
    constant coefficients, and intersections of them (`backends.projecting`) —, projected in
    the clients' local solves and the server's z-step; what the compiler could not make a
    projection is refused. Node-local bookkeeping, asked before the first round."""
    if not program.constraints:
        return {"refusal": None}
    names = [c.name for c in program.constraints]
    supported = ("norm balls, bounds, halfspaces a @ w <= b and hyperplanes a @ w == b (a, b, "
                 "radii, bounds: constants or Parameters), on shared variables")
    if program.role == "server":
        return {"refusal": (
            f"FedADMM's server step handles only constraints it can project on ({supported}); "
            f"the server has {names}. Use backends.ProxAL(inner=backends.FedADMM(...)) or "
            "backends.ProxAL")}
    return {"refusal": (
        f"FedADMM handles client constraints only as projections ({supported}); client "
        f"{program.name!r} has {names}. Use backends.ProxAL(inner=backends.FedADMM(...)) "
        "(constraints by a proximal AL, FedADMM on its subproblems) or backends.ProxAL / DALD")}
