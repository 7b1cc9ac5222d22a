"""ProxAL's presets (backends/proxal.py): `PAPER_PROXAL`, the paper's NP setting, and
`FAST_PROXAL`, the defaults of Algorithm 2 (`ProxAL()`'s options; its inner solver is
"auto": backends/proxal_inner.py). Why each value, measured, below."""

# `PAPER_PROXAL` is Algorithm 1 exactly as the paper runs its NP experiment
# (β = 300, fixed ρ_i = 0.01, q = 0.9, s̄ = 1e-3, ε = (1e-3, 1e-3)); it needs 10³–10⁴ ADMM
# iterations per outer step. `FAST_PROXAL` keeps the algorithm, the certificate (22)–(23) and the
# stopping rule (11) and changes only parameters (docs/BENCHMARKS.md, ProxAL section):
# - q = 0.3: the certificate ε_{t+1} + Σ ε̃_i ≤ τ_k contains the local tolerance ε_{t+1} = q^t
#   itself, so every ADMM run needs at least log τ_k / log q iterations (65–110 for q = 0.9,
#   10–12 for q = 0.3); Newton local solves make the tighter tolerance almost free;
# - residual-balanced ρ_i from 0.1 (the certificate uses the ρ_i the server used, see
#   backends/proxal_nodes.py);
# - ε1 = 1e-5 (on the equilibrated model, docs/scaling.md): with ε1 = 1e-3 the built-in NP model
#   stopped 3-6 % from CVXPY's minimizer (an objective flat along the ridge); 1e-5 lands within
#   6e-4 there for ~3x the ADMM iterations (97 -> 294), and within 1e-5 on the canonical tests;
# - ε2 = 1e-4: a violation of ε2 moves the objective by about |μ|·ε2; with the multipliers of
#   the NP models (|μ| ≈ 10 on adult) ε2 = 1e-3 leaves gaps of ~1e-2, so answers do not verify
#   at rtol 1e-3;
# - beta_growth = 4 (β_max = 1e6): β rises between outer iterations only when the violation
#   stalls (falls by less than 4×), the standard AL penalty update; iteration k uses its β_k in
#   the multiplier step, the proximal weight and (11). On near-degenerate models (adult at
#   n = 5: 36 → 6 outer iterations) it is what makes ProxAL fast; elsewhere β stays 300. On an
#   infeasible model the violation then stalls at β_max and ProxAL stops after 3 such outer
#   iterations (status "infeasible", info["infeasible"] and info["violated"]). β_max = 1e6, not
#   1e4: on an active constraint of a flat objective the outer steps contract by 1/(1 + β_max μ)
#   once β is capped (NP adult n = 5, μ ≈ 8e-6 equilibrated: 0.927 a step, 89 outer / 1,771
#   round trips at 1e4; 16 / 390 at 1e6), and a barely feasible NP model ended "stalled" at 1e4
#   (tests/test_proxal_flat.py). The cost: an infeasible verdict needs 2 more raises (adult
#   n = 10: 6 outer / 135 round trips → 8 / 314); bench_rounds' synthetic rows never reach 1e4;
# - anderson = 5 (module docstring): on the NP models it cuts the ADMM iterations 2–6×
#   (docs/BENCHMARKS.md); ρ rebalances every RHO_PERIOD-th step, so the memory fills between.
# - tau_rule = "progress", local_tol_cap = 0.1, client_sets = True (module docstring): the round
#   trips to a verified point fall from 124–629 to 20–84 on bench_rounds' synthetic models at
#   n = 5 and 40 (docs/BENCHMARKS.md, "ProxAL in ≤ 100 round trips"); client_constraints = "local":
#   the NP models' from 211–374 to 56–133 (docs/BENCHMARKS.md, "Client constraints held locally").
# - dist_tol = 1e-4 (module docstring): (11) alone, an absolute stationarity test, stopped
#   "converged" 1-6 % away on a flat objective (a 10⁻³ ridge over many features).
# `backends.ProxAL()`'s Algorithm 2 defaults equal FAST_PROXAL; `backends.ProxAL.paper()` is PAPER_PROXAL (its
# fixed-ρ, fixed-β, no-Anderson options are spelled out so that changing defaults cannot touch it).
PAPER_PROXAL = dict(beta=300.0, rho=0.01, s_bar=1e-3, q=0.9, tol=(1e-3, 1e-3), adaptive_rho=False,
                    beta_growth=1.0, anderson=0)
FAST_PROXAL = dict(beta=300.0, rho=0.1, s_bar=1e-3, q=0.3, adaptive_rho=True, tol=(1e-5, 1e-4),
                   beta_growth=4.0, beta_max=1e6, anderson=5, tau_rule="progress", local_tol_cap=0.1,
                   client_sets=True, dist_tol=1e-4, client_constraints="local")
# the paper's outer schedule, local tolerances and client constraints, spelled out for
# `ProxAL.paper()` (like its fixed ρ and β) so that changing the defaults cannot touch it
PAPER_RULES = dict(tau_rule="paper", local_tol_cap=float("inf"), client_sets=False, dist_tol=float("inf"),
                    client_constraints="al")
