"""DP-IADMM: differentially private inexact ADMM (Ryu & Kim, "Differentially private federated
learning via inexact ADMM"), Algorithms 1 (ObjP) and 2 (ObjT), and the output-perturbation
baseline OutP of Huang et al. Equation numbers refer to ../shared/seeds/dp_inexact_admm.txt;
readings and discrepancies: ../shared/spec/dp_iadmm.md.

One round t (all clients, star topology), ρ = ρ̂^t from (21):
  ObjP / ObjT  (4a) server w^{t+1} = argmin_w Σ_p <λ_p, w> + ρ/2‖w − z_p‖²  = mean_p(z_p − λ_p/ρ)
               (8)/(9) client z_p^{t+1} = IADMM step at w^{t+1} with f'_p(z_p^t) + ξ̃_p^t
               (4c) server λ_p += ρ(w^{t+1} − z_p^{t+1})
  OutP         client z_p^{t+1} = IADMM-Prox step (5a) at the OLD w^t, proximity η̂^t, plus
               Gaussian noise on the output; then (4a) with z^{t+1}, then (4c)   [spec 2.6]

Structure — DP is a layer over the ADMM step, not a copy of it: `iadmm_step` is the non-private
closed-form z-step of (5)/(6); a mechanism perturbs its input or its output. Objective
perturbation adds <ξ̃, z> to H^t (5b), which is G^t (10) up to a constant (App. A.1), i.e. it
replaces f'_p by f'_p + ξ̃; output perturbation adds Gaussian noise to the step's result.
With ε̄ = ∞ the mechanism is the identity, so the run is exactly IADMM (Remark 1(ii)). Noise is
drawn on each client from its own generator (numpy Generator kept in `program.state`), spawned
from `seed` (SeedSequence(seed, spawn_key=(client index,))) or from the client's OS entropy.
Δ̄ is computed on the client from its own objective (`RecordGradients`); only z_p leaves it.
(`RecordGradients` would belong in the runtime as a per-record-gradient request of NodeProgram;
it lives here, node side, until the runtime offers one — hence this module's length.)

Readings (the issue: default to the paper, expose the code's):
  ObjT radius   trust_radius="paper": δ^t = a/t² (A.11; default); "code": δ^t = a (precedence bug)
  ObjT norm     trust_norm="inf" (Sec. 4, default) or "2" (6b as written)
  Δ̄ (11b)/(20)  sensitivity="paper": max over the client's own records of the L1 norm of the
                record's gradient term (no factor 2, data-dependent, as (20) and the code);
                "replace": twice that; a number (or {client: number}): a data-independent bound,
                see `glm_sensitivity_bound`. Loss scaling (1/I vs 1/I_p) is the model's.
  OutP noise    outp_std="sigma": N(0, σ²) (Huang et al., default); "sigma2": std σ² (the code)
  W             the clients' z are unconstrained as in the code; simple server constraints
                (bounds, norm ball) and server terms h(w) enter (4a), solved by the server.
  CV            history has both Σ_p‖w − z_p‖₁ (paper) and that divided by P (code).

Privacy accounting (per client; each round releases one z_p, ε̄-DP for ObjP/ObjT — Theorems 1, 3
— and (ε̄, δ̄)-DP for OutP), over the rounds actually run, for a schedule ε_1..ε_T:
  basic      ε = Σ_t ε_t,  δ = Σ_t δ_t
  advanced   ε = √(2 ln(1/δ') Σ_t ε_t²) + Σ_t ε_t (e^{ε_t} − 1),  δ = Σ_t δ_t + δ'
             (Dwork, Rothblum & Vadhan 2010; Dwork & Roth, Thm 3.20 for equal ε_t), δ' =
             `composition_delta` (default: `delta` = 1e-6).
The guarantee is formal only when Δ̄ bounds (11b) over every neighbouring data set, i.e. with a
data-independent `sensitivity` bound (and for OutP with outp_std="sigma" and correct constants);
the paper's data-dependent Δ̄ (20) is reported as nominal (`info["privacy"]["formal"]`).
"""
from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fedmodel.atoms import (Add, BroadcastTo, LogSumExp, MatMul, Maximum, Multiply, Neg, Norm1,
                            Reshape, Sum, SumSquares)
from fedmodel.atoms.elementwise import Elementwise
from fedmodel.compiler.codegen import Plan
from fedmodel.compiler.differentiate import grad as derive
from fedmodel.compiler.sets import simple_set
from fedmodel.errors import FedModelError
from fedmodel.expression import Data, Leaf, Variable
from fedmodel.runtime import make_executor
from fedmodel.runtime.checkpoint import NO_CHECKPOINT, Checkpointer
from fedmodel.runtime.ledger import MessageKind, procedure, register
from fedmodel.runtime.program import compile_programs
from .base import Backend
from .watch import DivergenceWatch
from .common import check_count, check_number as _number, gather_values, progress, require_star

VARIANTS = ("objT", "objP", "outP")


# ---- schedules (public: computed by the server) ------------------------------------------------
@dataclass(frozen=True)
class RhoSchedule:
    """ρ̂^t = scale · min{cap, c1·growth^{⌊t/T_c⌋} + c2/ε̄}  (21); ε̄ = ∞ drops c2/ε̄ (the code's
    non-private ρ). `scale` = 0.01 gives OutP+ (A.10)."""

    c1: float = 2.0
    c2: float = 5.0
    T_c: float = 1e4
    cap: float = 1e9
    growth: float = 1.2
    scale: float = 1.0

    def __call__(self, t: int, epsilon: float) -> float:
        extra = 0.0 if math.isinf(epsilon) else self.c2 / epsilon
        return self.scale * min(self.cap, self.c1 * self.growth ** (t // self.T_c) + extra)


RHO_PRESETS = {"mnist": RhoSchedule(2.0, 5.0, 1e4), "femnist": RhoSchedule(0.005, 0.05, 2e3)}
# `DPADMM.paper()`. The constructor's defaults are the fast non-private configuration instead:
# ε̄ = ∞, ObjP with a = 10, ρ floored at the clients' curvature ("auto"), stop at tol — ObjT with δ^t = a/t² freezes the clients (Σδ^t = aπ²/6)
# and never reaches the optimum without noise. Measured (tests/test_dp_admm.py models, tol 1e-8):
# ridge 121 rounds (paper setting: not converged in 6000, 0.34 away), logistic 757 rounds (0.36 away).
PAPER_DPADMM = dict(variant="objT", rho_schedule="mnist", a=1.0, max_rounds=20000,
                    trust_radius="paper", trust_norm="inf", tol=0.0)


def composition(epsilons, deltas=0.0, delta_prime: float = 1e-6) -> dict[str, tuple[float, float]]:
    """Cumulative privacy loss of mechanisms that are (ε_t, δ_t)-DP: basic (Σε_t, Σδ_t) and
    advanced (√(2 ln(1/δ')Σε_t²) + Σε_t(e^{ε_t} − 1), Σδ_t + δ'); `best` is the smaller ε."""
    eps = np.asarray(epsilons, float).ravel()
    dlt = np.broadcast_to(np.asarray(deltas, float), eps.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        return _composed(float(eps.sum()), float(np.sum(eps ** 2)), float(np.sum(eps * np.expm1(eps))),
                         float(dlt.sum()), delta_prime)


def _composed(s1: float, s2: float, s3: float, sd: float, delta_prime: float) -> dict:
    """`composition` from the running sums Σε, Σε², Σε(e^ε − 1), Σδ."""
    basic = (s1, sd)
    advanced = (math.sqrt(2.0 * math.log(1.0 / delta_prime) * s2) + s3 if math.isfinite(s1)
                else math.inf, sd + delta_prime)
    return {"basic": basic, "advanced": advanced, "best": min(basic, advanced)}


def glm_sensitivity_bound(feature_l1: float, slope_l1: float, weight: float,
                          replace: bool = True) -> float:
    """A data-independent Δ̄ for models whose records enter only through a_iᵀw (linear,
    logistic, softmax regression) with loss weight `weight` per record (1/I or 1/I_p).
    Assumes every possible record has ‖a‖₁ ≤ feature_l1 (pixels in [0, 1]: J) and a loss whose
    derivative in the predictor has ‖∂ℓ/∂(aᵀw)‖₁ ≤ slope_l1 everywhere (logistic: 1, softmax
    cross-entropy: 2; squared loss only with bounded residuals). The record's gradient term
    a ⊗ ∂ℓ then has ‖·‖₁ ≤ feature_l1·slope_l1·weight; replacing one record moves ∇f_p by at
    most twice that (`replace=False`: adding/removing one with the weight fixed)."""
    if min(feature_l1, slope_l1, weight) <= 0:
        raise FedModelError("glm_sensitivity_bound needs positive feature_l1, slope_l1 and weight")
    return (2.0 if replace else 1.0) * feature_l1 * slope_l1 * weight


# ---- per-record gradients (node side, for Δ̄ (11b)) ---------------------------------------------
_ROWS, _TOTAL, _FREE, _CONST = "rows", "total", "free", "const"
_LINEAR = (Add, Neg, Sum, BroadcastTo, Reshape)


class RecordGradients:
    """‖∇f_p(z; D) − ∇f_p(z; D without record i)‖₁ for every record i, for client objectives
    whose records are rows of data matrices entering through products `A @ w` (w shared) and
    combined row by row (elementwise atoms, row-wise sums / log_sum_exp, then sums or means over
    the rows). Each product becomes S = A @ w; with u = ∂f/∂S the record's term is a_i ⊗ u_i and
    its L1 norm ‖a_i‖₁‖u_i‖₁ (20). Records of several matrices with the same row count are
    treated as the same records (their norms add: an upper bound)."""

    def __init__(self, objective, shared: list[Variable], where: str):
        ids = {v.uid for v in shared}
        products: dict[tuple, tuple] = {}
        memo: dict[int, Any] = {}

        def substitute(node):
            if id(node) not in memo:
                a = getattr(node, "args", ())
                if (isinstance(node, MatMul) and isinstance(a[0], Data) and a[0].ndim == 2
                        and isinstance(a[1], Variable) and a[1].uid in ids):
                    key = (a[0].uid, a[1].uid)
                    if key not in products:
                        products[key] = (node, a[0], Variable(node.shape, name=f"rows[{a[0].name}]"))
                    memo[id(node)] = products[key][2]
                elif isinstance(node, Leaf):
                    memo[id(node)] = node
                else:
                    new = [substitute(x) for x in a]
                    memo[id(node)] = node if all(x is y for x, y in zip(new, a)) else node.with_args(*new)
            return memo[id(node)]

        reduced = substitute(objective)
        records = {p[2].uid: p[2].shape[0] for p in products.values()}
        kind = _separable(reduced, records, {})
        direct = [v.name for v in shared
                  if any(isinstance(leaf, Data) for leaf in derive(reduced, v).leaves())]
        if kind not in (_TOTAL, _FREE, _CONST) or direct:
            raise FedModelError(
                f"sensitivity='paper' needs per-record gradients of client {where!r}: its objective "
                "must read its records only as rows of `data @ w` products combined row by row "
                "(elementwise atoms, row-wise sums or log_sum_exp, then sum/mean over rows)"
                + (f"; data also enters the gradient of {direct} directly" if direct else "")
                + ". Pass a data-independent bound instead, e.g. "
                "DPADMM(sensitivity=glm_sensitivity_bound(...)) or a number")
        self.products = list(products.values())
        self._forward = Plan([p[0] for p in self.products], shared) if products else None
        self._adjoint = Plan([derive(reduced, p[2]) for p in self.products],
                             shared + [p[2] for p in self.products]) if products else None
        self._row_l1 = [np.sum(np.abs(p[1].value), axis=1) for p in self.products]

    def max_l1(self, parts: list[np.ndarray]) -> float:
        """max_i ‖record i's gradient term‖₁ at the point `parts` (shared variables' values)."""
        if not self.products:
            return 0.0
        rows = self._forward(*parts)
        adjoints = self._adjoint(*parts, *rows)
        totals: dict[int, np.ndarray] = {}
        for (node, _, S), row_l1, u in zip(self.products, self._row_l1, adjoints):
            u = np.abs(np.broadcast_to(u, S.shape))
            per_row = row_l1 * (u.reshape(S.shape[0], -1).sum(axis=1))
            totals[S.shape[0]] = totals.get(S.shape[0], 0.0) + per_row
        return float(max(np.max(t) for t in totals.values()))


def _separable(node, records: dict[int, int], memo: dict) -> str | None:
    """Kind of a node after the substitution: const (no variable), free (shared variables, no
    record), rows (row i depends on record i only), total (a sum of per-record terms), or None."""
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, Leaf):
        out = _ROWS if node.uid in records else _FREE if isinstance(node, Variable) else _CONST
    else:
        kinds = [_separable(a, records, memo) for a in node.args]
        out = _combine(node, kinds, records)
    memo[id(node)] = out
    return out


def _combine(node, kinds: list, records: dict) -> str | None:
    if None in kinds:
        return None
    if all(k == _CONST for k in kinds):
        return _CONST
    if _ROWS not in kinds and _TOTAL not in kinds:
        return _FREE
    if _TOTAL in kinds:                  # only linear maps of a sum over records stay separable
        if isinstance(node, Add) and _ROWS not in kinds:
            return _TOTAL
        linear = isinstance(node, _LINEAR) or (isinstance(node, (Multiply, MatMul))
                                              and kinds.count(_CONST) == len(kinds) - 1)
        return _TOTAL if linear and set(kinds) <= {_TOTAL, _CONST} else None
    if _FREE in kinds:                   # a record mixed with the model outside `A @ w`
        return None
    m = {a.shape[0] for a, k in zip(node.args, kinds) if k == _ROWS}
    if len(m) != 1:
        return None
    m = m.pop()
    if isinstance(node, Sum):
        return _TOTAL if node.axis in (None, 0) else _ROWS
    if isinstance(node, (SumSquares, Norm1)):
        return _TOTAL
    if isinstance(node, LogSumExp):
        return _ROWS if node.axis not in (None, 0) else None
    if isinstance(node, MatMul):
        return _ROWS if kinds == [_ROWS, _CONST] and node.args[0].ndim == 2 else None
    if isinstance(node, (Elementwise, Add, Neg, Multiply, Maximum, BroadcastTo, Reshape)):
        return _ROWS if node.shape[:1] == (m,) else None
    return None


_RECORD_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def record_sensitivity(program, z: np.ndarray) -> float:
    """Δ̄_p^t of (11b) as the paper computes it in (20), at the client's z_p^t (node side)."""
    records = _RECORD_CACHE.get(program)
    if records is None:
        records = _RECORD_CACHE[program] = RecordGradients(
            program.merit_ir.objective, program.shared.variables, program.name)
    return records.max_l1(program.shared.unpack(z))


def _record_count(program) -> int:
    sizes = [leaf.shape[0] for leaf in program.merit_ir.objective.leaves()
             if isinstance(leaf, Data) and leaf.ndim >= 1]
    return max(sizes, default=1)


# ---- the non-private step and the DP layers (node side) ----------------------------------------
def iadmm_step(z, grad, w, lam, rho, prox=0.0, radius=None, norm="inf") -> np.ndarray:
    """The IADMM z-step: argmin of H^t (5b) = <grad, z> + ρ/2‖w − z + λ/ρ‖² with the proximal
    term (1/2η)‖z − z^t‖² (5a), prox = 1/η, or (radius given) within ‖z − z^t‖ ≤ δ (6).
    Closed forms: H^t is an isotropic quadratic, so the trust region is a clip (∞-norm) or a
    radial projection (2-norm) of its minimizer."""
    if radius is None:
        return (-grad + rho * w + lam + prox * z) / (rho + prox)
    u = w + (lam - grad) / rho
    if norm == "inf":
        return np.clip(u, z - radius, z + radius)
    length = float(np.linalg.norm(u - z))
    return u if length <= radius else z + (radius / length) * (u - z)


class Identity:
    """No perturbation: the step is exactly IADMM (ε̄ = ∞)."""

    def objective(self, program, state, z, grad):
        return grad

    def output(self, state, z, sigma):
        return z


@dataclass
class LaplaceObjective(Identity):
    """Objective perturbation (10)–(11): ξ̃ with i.i.d. Laplace(0, Δ̄_p^t/ε̄) entries is added
    to the linear term, so the step solves (8)/(9)."""

    epsilon: float
    sensitivity: Any = "paper"           # "paper" | "replace" | a fixed bound Δ̄

    def objective(self, program, state, z, grad):
        if isinstance(self.sensitivity, str):            # (11b) as in (20), at z_p^t
            bound = record_sensitivity(program, z) * (2.0 if self.sensitivity == "replace" else 1.0)
        else:
            bound = float(self.sensitivity)
        xi = state["rng"].laplace(0.0, bound / self.epsilon, size=grad.shape)   # (11a)
        _log(state, bound, xi)
        return grad + xi


@dataclass
class GaussianOutput(Identity):
    """Output perturbation (Huang et al.): z^{t+1} + N(0, s²I) with s = σ ("sigma") or σ²
    ("sigma2", the authors' code)."""

    std: str = "sigma"

    def output(self, state, z, sigma):
        scale = sigma if self.std == "sigma" else sigma ** 2
        noise = state["rng"].normal(0.0, scale, size=z.shape)
        _log(state, scale, noise)
        return z + noise


def _log(state, scale: float, noise: np.ndarray) -> None:
    state["log"]["scale"].append(scale)
    state["log"]["noise_abs"].append(float(np.mean(np.abs(noise))))
    if state["noise"] is not None:
        state["noise"].append(noise.copy())


@procedure("dp_admm_init", {"z0": "x", "mechanism": "str", "epsilon": "1", "sensitivity": "str",
                            "bound": "1", "std": "str", "norm": "str", "seed": "1", "index": "1",
                            "record": "1"}, {"records": "1"})
def _client_init(program, z0, mechanism, epsilon, sensitivity="paper", bound=None, std="sigma",
                 norm="inf", seed=None, index=0, record=0.0):
    """z_p^1 (the client keeps its z_p; the server keeps λ_p), the DP layer, and the client's
    own generator: spawned from `seed` for reproducible simulations, or (seed=None) seeded from
    OS entropy on the client, so that no one else can replay — and subtract — its noise."""
    entropy = None if seed is None else np.random.SeedSequence(int(seed), spawn_key=(int(index),))
    if mechanism == "laplace":
        layer = LaplaceObjective(float(epsilon), sensitivity if bound is None else float(bound))
        if bound is None:
            record_sensitivity(program, np.asarray(z0, float))   # refuse unsupported models early
    else:
        layer = GaussianOutput(std) if mechanism == "gaussian" else Identity()
    program.state["dp_admm"] = {"z": np.array(z0, float), "rng": np.random.default_rng(entropy),
                                "layer": layer, "norm": norm, "log": {"scale": [], "noise_abs": []},
                                "noise": [] if record else None}
    return {"records": float(_record_count(program))}


@procedure("dp_admm_step", {"w": "x", "lam": "x", "rho": "1", "prox": "1", "radius": "1",
                            "sigma": "1"}, {"z": "x"})
def _client_step(program, w, lam, rho, prox=0.0, radius=None, sigma=0.0):
    """Line 5 of Algorithms 1–2: (8) or (9); for OutP (5a) plus output noise."""
    s = program.state["dp_admm"]
    z, layer = s["z"], s["layer"]
    g = program.merit(z)["grad"]                                   # f'_p(z_p^t; D_p), (37)
    g = layer.objective(program, s, z, g)                          # f'_p + ξ̃_p^t: G^t (10)
    z_new = iadmm_step(z, g, w, lam, rho, prox, radius, s["norm"])  # (8)/(9) ≡ (5)/(6) at ξ̃
    s["z"] = layer.output(s, z_new, sigma)                         # OutP only
    return {"z": s["z"]}


def _client_log(program):
    s = program.state.get("dp_admm", {})
    return {"log": {"scale": list(s.get("log", {}).get("scale", [])),
                    "noise_abs": list(s.get("log", {}).get("noise_abs", [])),
                    "noise": None if s.get("noise") is None else np.array(s["noise"])}}


# served locally: the harness's metrics and debugging, never part of the algorithm's traffic
register(MessageKind("dp_admm_log", {}, {"log": "opaque"}, local=True), _client_log)


# ---- the backend --------------------------------------------------------------------------------
class DPADMM(Backend):
    """DP-IADMM: ObjT (Algorithm 2), ObjP (Algorithm 1, default) and the OutP baseline.

    Defaults: the fastest robust non-private configuration (ε̄ = ∞, ObjP, a = 10, stop at tol);
    the paper's exact setting is `DPADMM.paper(epsilon=...)` (ObjT, a = 1, δ^t = a/t², T = 2e4).
    epsilon: ε̄ per round and client (∞: non-private IADMM). delta: OutP's δ̄ (1e-6).
    rho_schedule: "auto" (default: "mnist", floored at 2.2·max_p L̂_p, the clients' measured
    curvature, when ε̄ = ∞; a private run never releases L̂_p, so there it is "mnist") |
    "mnist" (c1=2, c2=5, T_c=1e4; the paper) | "femnist" | a RhoSchedule | a number
    (static ρ) | a callable (t, ε̄) -> ρ. a: scales η^t = a/√t (ObjP; default 10, paper 1), δ^t (ObjT)
    and η̂^t (OutP).
    max_rounds: T (paper: 2e4). seed: per-client generators spawned from it (None: each client
    seeds itself). trust_radius: "paper" (a/t²) | "code" (a) | callable t -> δ^t.
    trust_norm: "inf" | "2". sensitivity: "paper" | "replace" | number | {client: number}.
    ObjT's step has no proximal term: as an iteration it is stable only when ρ^t > 2·L_p
    (L_p: Lipschitz constant of ∇f_p); the paper's ρ̂^t meets this at its 1/I loss scaling.
    outp_std: "sigma" | "sigma2". outp_constants: (c1, c3) of η̂ and σ (default (I_p, I_p/4) as
    the code). composition_delta: δ' of advanced composition. tol: stop when the primal
    ‖w − z_p‖∞ and dual ρ‖Δw‖∞ residuals are ≤ tol (0: run all rounds). log_every: history
    stride. record_noise: keep every noise draw on the clients (info["noise"], for tests).
    """

    name = "dp-admm"
    checkpointing = True

    def __init__(self, epsilon: float = float("inf"), variant: str = "objP", delta: float = 1e-6,
                 rho_schedule: Any = "auto", a: float = 10.0, max_rounds: int = 20000,
                 seed: int | None = None, trust_radius: Any = "paper", trust_norm: str = "inf",
                 sensitivity: Any = "paper", outp_std: str = "sigma",
                 outp_constants: tuple[float, float] | None = None,
                 composition_delta: float | None = None, tol: float = 1e-8, log_every: int = 1,
                 record_noise: bool = False, w0: Any = None):
        names = {v.lower(): v for v in VARIANTS}
        if not isinstance(variant, str) or variant.lower() not in names:
            raise FedModelError(f"variant must be one of {VARIANTS}, got {variant!r}")
        epsilon = _number("epsilon (ε̄ per round; float('inf') for non-private IADMM)", epsilon,
                          0.0, math.inf, closed=True)
        delta = _number("delta", delta, 0.0, 1.0)
        if composition_delta is not None:
            composition_delta = _number("composition_delta", composition_delta, 0.0, 1.0)
        a, tol = _number("a", a, 0.0, math.inf), _number("tol", tol, 0.0, math.inf, low_closed=True)
        max_rounds, log_every = check_count("max_rounds", max_rounds), check_count("log_every", log_every)
        if trust_radius not in ("paper", "code") and not callable(trust_radius):
            raise FedModelError("trust_radius must be 'paper' (δ^t = a/t²), 'code' (δ^t = a) or a "
                                f"callable t -> δ^t, got {trust_radius!r}")
        if trust_norm not in ("inf", "2") or outp_std not in ("sigma", "sigma2"):
            raise FedModelError(f"trust_norm must be 'inf' or '2' and outp_std 'sigma' or 'sigma2' "
                                f"(got {trust_norm!r}, {outp_std!r})")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                                 or seed < 0):
            raise FedModelError(f"seed must be a nonnegative integer or None, got {seed!r}")
        if outp_constants is not None:
            if not isinstance(outp_constants, (tuple, list)) or len(outp_constants) != 2:
                raise FedModelError(f"outp_constants must be a pair (c1, c3), got {outp_constants!r}")
            outp_constants = tuple(_number("outp_constants", c, 0.0, math.inf) for c in outp_constants)
        self.epsilon, self.variant, self.delta = epsilon, names[variant.lower()], delta
        # "auto": the "mnist" schedule (21), floored (ε̄ = ∞ only) at 2.2·max_p L̂_p, measured by
        # the clients at w⁰, where the linearized z-step is stable for every variant
        self.auto_rho = isinstance(rho_schedule, str) and rho_schedule.lower() == "auto"
        self.rho_schedule = _rho_schedule("mnist" if self.auto_rho else rho_schedule)
        self.a, self.max_rounds, self.seed = a, max_rounds, seed
        self.trust_radius, self.trust_norm = trust_radius, trust_norm
        self.sensitivity = _check_sensitivity(sensitivity)
        self.outp_std, self.outp_constants = outp_std, outp_constants
        self.composition_delta = composition_delta if composition_delta is not None else delta
        self.tol, self.log_every = tol, log_every
        self.record_noise, self.w0 = bool(record_noise), w0
        if w0 is not None:
            try:
                finite = bool(np.all(np.isfinite(np.asarray(w0, dtype=float))))
            except (TypeError, ValueError):
                finite = False
            if not finite:
                raise FedModelError(f"w0 must be finite numbers (a scalar or the shared variables, "
                                    f"flattened), got {w0!r}")

    @classmethod
    def paper(cls, **overrides) -> "DPADMM":
        """The paper's setting (Ryu & Kim, MNIST experiments): ObjT (Algorithm 2), ρ̂^t of (21)
        with the MNIST constants, a = 1, trust radius δ^t = a/t², T = 20,000 rounds run in full
        (tol = 0). ε̄ is the experiment's variable: pass `epsilon=` (default ∞, IADMM)."""
        return cls(**{**PAPER_DPADMM, **overrides})

    # -- public schedules ---------------------------------------------------------------------
    def rho(self, t: int, floor: float = 0.0) -> float:
        """ρ^t of the schedule, at least `floor` (rho_schedule="auto": 2.2·max_p L̂_p of the run)."""
        rho = self.rho_schedule(t, self.epsilon)
        rho = max(rho, floor) if isinstance(rho, (int, float)) else rho
        if not isinstance(rho, (int, float)) or not 0 < rho < math.inf:
            raise FedModelError(f"rho_schedule gave ρ^{t} = {rho}; it must be positive and finite")
        return float(rho)

    def radius(self, t: int) -> float:
        """ObjT's trust radius δ^t."""
        if not callable(self.trust_radius):
            return self.a / t ** 2 if self.trust_radius == "paper" else self.a
        radius = self.trust_radius(t)
        if not isinstance(radius, (int, float)) or not 0 <= radius < math.inf:
            raise FedModelError(f"trust_radius gave δ^{t} = {radius!r}; it must be finite and ≥ 0")
        return float(radius)

    def outp_parameters(self, t: int, rho: float, records: float) -> tuple[float, float]:
        """OutP's 1/η̂^t and σ^t (spec 2.6, the code's Theorem-4 calibration of Huang et al.):
        1/η̂ = (c3 + 2(c1/I_p)√(t ln(1.25/δ̄))/ε̄)/a, σ = 2(c1/I_p)√(2 ln(1.25/δ̄))/(ε̄(ρ + 1/η̂));
        non-private: 1/η̂ = c3/a, σ = 0."""
        c1, c3 = self.outp_constants or (records, records / 4.0)
        if math.isinf(self.epsilon):
            return c3 / self.a, 0.0
        log_term = math.log(1.25 / self.delta)
        inv_eta = (c3 + 2.0 * (c1 / records) * math.sqrt(t * log_term) / self.epsilon) / self.a
        return inv_eta, 2.0 * (c1 / records) * math.sqrt(2.0 * log_term) / (self.epsilon * (rho + inv_eta))

    def privacy(self, rounds: int) -> dict:
        """`composition` of `rounds` rounds at (ε̄, 0) (ObjP/ObjT) or (ε̄, δ̄) (OutP), per client."""
        eps, dlt = self.epsilon, self._round_delta()
        if rounds == 0:
            return _composed(0.0, 0.0, 0.0, 0.0, self.composition_delta)
        return _composed(rounds * eps, rounds * eps * eps, rounds * eps * math.expm1(eps),
                         rounds * dlt, self.composition_delta)

    def _round_delta(self) -> float:
        return self.delta if self.variant == "outP" and math.isfinite(self.epsilon) else 0.0

    # -- run ------------------------------------------------------------------------------------
    def run(self, problem, topology=None, executor="serial", callback=None, verbose=False,
            checkpointer: Checkpointer = NO_CHECKPOINT, **_):
        require_star(problem, topology, self.name)
        self._check_model(problem)
        programs = compile_programs(problem)
        d = programs["server"].n_shared
        ex = make_executor(executor).start(programs)
        try:
            return self._loop(problem, ex, d, callback, verbose, checkpointer)
        finally:
            ex.close()

    def _check_model(self, problem) -> None:
        if not problem.clients:
            raise FedModelError("DPADMM needs at least one client")
        for c in problem.clients:
            what = ("local constraints" if c.constraints else "private variables" if c.private_variables
                    else "a nonsmooth term" if any(not t.is_smooth() for t in c.terms) else None)
            if what:
                raise FedModelError(
                    f"client {c.name!r} has {what}: DP-IADMM's client step is the closed-form "
                    "linearized step (8)/(9) of a smooth objective of the shared variables only. "
                    "Move constraints and nonsmooth regularizers to the server, or use ProxAL")
        hard = [c.name for c in problem.server.constraints if simple_set(c) is None]
        if hard:
            raise FedModelError(f"server constraints {hard} are not simple sets: DPADMM's server "
                                "step (4a) handles bounds and norm balls on a shared variable "
                                "(by projection) only; use ProxAL for general global constraints")
        if isinstance(self.sensitivity, dict):
            missing = sorted({c.name for c in problem.clients} - set(self.sensitivity))
            if missing:
                raise FedModelError(f"sensitivity has no bound for clients {missing}")

    def _init_clients(self, ex, w):
        private = not math.isinf(self.epsilon)
        mechanism = "none" if not private else "gaussian" if self.variant == "outP" else "laplace"
        payloads = {}
        for i, c in enumerate(ex.clients):
            bound = self.sensitivity.get(c) if isinstance(self.sensitivity, dict) else \
                None if isinstance(self.sensitivity, str) else self.sensitivity
            payloads[c] = {"z0": w, "mechanism": mechanism, "epsilon": self.epsilon,
                           "sensitivity": self.sensitivity if isinstance(self.sensitivity, str) else "bound",
                           "bound": bound, "std": self.outp_std, "norm": self.trust_norm,
                           "seed": self.seed, "index": i, "record": float(self.record_noise)}
        return {c: r["records"] for c, r in ex.map("dp_admm_init", payloads).items()}

    def _server_step(self, ex, z, lam, rho, w, server_used):
        """(4a): w = mean_p(z_p − λ_p/ρ); with server terms/sets, argmin h(w) + Pρ/2‖w − that‖²."""
        anchor = sum(z[c] - lam[c] / rho for c in z) / len(z)
        if not server_used:
            return anchor
        return ex.call("server", "solve_local", linear=None, weight=len(z) * rho, anchor=anchor,
                       x0=w, tol=1e-12, method="auto")["x"]

    def _loop(self, problem, ex, d, callback, verbose, checkpointer):
        clients = ex.clients
        w = np.zeros(d)
        if self.w0 is not None:
            w0 = np.asarray(self.w0, float).ravel()
            if w0.size not in (1, d) or not np.all(np.isfinite(w0)):
                raise FedModelError(f"w0 must be finite, a scalar or {d} numbers (the shared "
                                    f"variables, flattened); got {w0.size}")
            w[:] = w0
        records = self._init_clients(ex, w)
        rho_floor = 0.0
        if self.auto_rho and math.isinf(self.epsilon):     # data-dependent: never in private runs
            curvature = ex.map("local_curvature", {c: {"z": w, "iterations": 20} for c in clients})
            rho_floor = 2.2 * max(r["L"] for r in curvature.values())
        z = {c: w.copy() for c in clients}                              # z_p^1
        lam = {c: np.zeros(d) for c in clients}                         # λ_p^1 = 0
        server_used = bool(problem.server.terms or problem.server.constraints)
        per_round = (self.epsilon, self._round_delta())
        history, status, t, rho, diverged = [], "max_iterations", 0, math.nan, {}
        bar = progress(self.max_rounds, verbose, "DP-ADMM")
        start = time.perf_counter()
        watch = DivergenceWatch("DP-ADMM", hint=self._hint())
        saved = checkpointer.restore(ex)    # client RNGs and noise logs come back with the nodes
        if saved:
            t, w, z, lam, rho, history = (saved[key] for key in ("t", "w", "z", "lam", "rho", "history"))
            watch.smallest = dict(saved.get("watch", {}))
        for t in range(t + 1, self.max_rounds + 1):
            rho = self.rho(t, rho_floor)                                       # (21)
            step = {"rho": rho, "prox": 0.0, "radius": None, "sigma": 0.0}
            if self.variant == "objP":
                step["prox"] = math.sqrt(t) / self.a                           # 1/η^t, η^t = a/√t
            elif self.variant == "objT":
                step["radius"] = self.radius(t)                                # δ^t
            if self.variant == "outP":      # z(w^t) → w → λ
                payloads = {}
                for c in clients:
                    step["prox"], step["sigma"] = self.outp_parameters(t, rho, records[c])
                    payloads[c] = {"w": w, "lam": lam[c], **step}
                z_new = {c: r["z"] for c, r in ex.map("dp_admm_step", payloads).items()}
                w_new = self._server_step(ex, z_new, lam, rho, w, server_used)  # (4a)
            else:                           # w → z → λ (Algorithms 1–2, lines 3–7)
                w_new = self._server_step(ex, z, lam, rho, w, server_used)      # (4a)
                replies = ex.map("dp_admm_step", {c: {"w": w_new, "lam": lam[c], **step}
                                                  for c in clients})            # (8) / (9)
                z_new = {c: r["z"] for c, r in replies.items()}
            if watch.check(t, **{"w (server model)": w_new,
                                 "z_p (client models)": np.array(list(z_new.values()))}):
                status = watch.report(diverged)
                break
            for c in clients:
                lam[c] = lam[c] + rho * (w_new - z_new[c])                      # (4c)
            ord_ = np.inf if self.trust_norm == "inf" or self.variant != "objT" else 2
            moved = max(float(np.linalg.norm(z_new[c] - z[c], ord_)) for c in clients)
            primal = max(float(np.max(np.abs(w_new - z_new[c]), initial=0.0)) for c in clients)
            dual = rho * float(np.max(np.abs(w_new - w), initial=0.0))
            cv = sum(float(np.sum(np.abs(w_new - z_new[c]))) for c in clients)
            w, z = w_new, z_new
            done = self.tol > 0 and primal <= self.tol and dual <= self.tol
            if t % self.log_every == 0 or done or t == self.max_rounds:
                privacy = self.privacy(t)
                record = {"round": t, "rho": rho, "radius": step["radius"],
                          "prox": step["prox"] if self.variant == "objP" else None,
                          "step": moved, "primal_residual": primal, "dual_residual": dual,
                          "consensus_violation": cv, "consensus_violation_mean": cv / len(clients),
                          "epsilon": self.epsilon, "epsilon_basic": privacy["basic"][0],
                          "epsilon_advanced": privacy["advanced"][0],
                          "time": time.perf_counter() - start, **self._report(ex, w)}
                history.append(record)
                if callback:
                    callback(record)
                bar.update(record)
            if done:
                status = "converged"
                break
            checkpointer.save(ex, t, {"t": t, "w": w, "z": z, "lam": lam, "rho": rho, "history": history,
                                      "watch": dict(watch.smallest)})
        bar.close()
        rounds = t if status != "diverged" else t - 1
        info = self._info(ex, z, lam, rho, records, per_round, t, history) | diverged   # t rounds released z
        info["rho_floor"] = rho_floor        # ρ^t = max(schedule, floor): `self.rho(t, floor)`
        values, multipliers = gather_values(ex, problem, w)
        ex.ledger.rounds = rounds
        return {"status": status, "values": values, "multipliers": multipliers, "history": history,
                "iterations": {"rounds": rounds}, "ledger": ex.ledger, "info": info}

    def _hint(self) -> str:
        """What to change when a run diverges: the z-step is stable when ρ^t (plus ObjP's √t/a)
        dominates the clients' gradient Lipschitz constants."""
        if self.variant == "objT":
            return ("raise rho_schedule so that ρ^t > 2·L_p (L_p: Lipschitz constant of the "
                    "clients' gradients) or lower a (the trust radius)")
        return (f"raise rho_schedule above the clients' gradient Lipschitz constants, or lower a "
                f"(now {self.a:g}) so the proximal weight √t/a dominates them sooner")

    def _report(self, ex, w) -> dict:
        reports = ex.map("report", {n: {"x": w} for n in ex.nodes})
        return {"objective": sum(r["objective"] for r in reports.values()),
                "violation": max(r["violation"] for r in reports.values())}

    def _info(self, ex, z, lam, rho, records, per_round, rounds, history) -> dict:
        logs = {c: r["log"] for c, r in ex.map("dp_admm_log", {c: {} for c in ex.clients}).items()}
        for record in history:          # the paper's average noise magnitude (1/PJK)Σ|ξ|
            i = record["round"] - 1
            drawn = [lg["noise_abs"][i] for lg in logs.values() if i < len(lg["noise_abs"])]
            record["noise_magnitude"] = float(np.mean(drawn)) if drawn else 0.0
        privacy = self.privacy(rounds)
        formal = math.isfinite(self.epsilon) and rounds > 0 and (
            self.outp_std == "sigma" if self.variant == "outP" else not isinstance(self.sensitivity, str))
        privacy.update({"per_round": per_round, "rounds": rounds, "formal": formal,
                        "composition_delta": self.composition_delta,
                        "note": "per client; formal only with a data-independent sensitivity bound "
                                "(ObjP/ObjT) or outp_std='sigma' with valid constants (OutP)"})
        scales = {c: np.asarray(lg["scale"]) for c, lg in logs.items()}
        info = {"variant": self.variant, "privacy": privacy, "client_values": dict(z),
                "dual_variables": dict(lam), "rho": rho, "records": records,
                "sensitivity" if self.variant != "outP" else "noise_std": scales,
                "readings": {"trust_radius": self.trust_radius if isinstance(self.trust_radius, str)
                             else "callable", "trust_norm": self.trust_norm,
                             "sensitivity": self.sensitivity if isinstance(self.sensitivity, str)
                             else "bound", "outp_std": self.outp_std}}
        if self.record_noise:
            info["noise"] = {c: lg["noise"] for c, lg in logs.items()}
        return info


def _rho_schedule(value) -> Callable[[int, float], float]:
    if isinstance(value, str):
        if value.lower() not in RHO_PRESETS:
            raise FedModelError(f"unknown rho_schedule {value!r}; use one of {sorted(RHO_PRESETS)}, "
                                "a RhoSchedule(c1, c2, T_c), a number or a callable (t, ε̄) -> ρ")
        return RHO_PRESETS[value.lower()]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value < math.inf:
            raise FedModelError(f"a static rho_schedule must be positive and finite, got {value!r}")
        return lambda t, epsilon: float(value)
    if callable(value):
        return value
    raise FedModelError(f"rho_schedule must be a preset name, RhoSchedule, number or callable, "
                        f"got {value!r}")


def _check_sensitivity(value):
    if isinstance(value, str):
        if value not in ("paper", "replace"):
            raise FedModelError(f"sensitivity must be 'paper', 'replace', a positive number or "
                                f"{{client: number}}, got {value!r}")
        return value
    bounds = value.values() if isinstance(value, dict) else [value]
    if not all(isinstance(b, (int, float)) and 0 <= b < math.inf for b in bounds):
        raise FedModelError(f"a sensitivity bound must be a finite nonnegative number, got {value!r}")
    return dict(value) if isinstance(value, dict) else float(value)
