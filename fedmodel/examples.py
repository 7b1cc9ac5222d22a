"""Built-in example models for `fedmodel run` (each returns the problem and its main variable)."""
from __future__ import annotations

from typing import Callable


def neyman_pearson(n_clients: int = 5, threshold: float = 0.2, seed: int = 0,
                   radius: float | None = 10.0, ridge: float = 1e-2):
    """Neyman-Pearson classification (paper 1, eq. 30) on scikit-learn's bundled breast-cancer
    data (WDBC; benign = class 0, malignant = class 1), split per class equally over clients:
    minimize the mean class-0 logistic loss s.t. each client's class-1 loss ≤ `threshold`.

    The 30 standardized WDBC features separate the classes almost perfectly, so without a bound
    the minimizer runs off to ‖w‖ ≈ 800 (objective ≈ 5e-4) and every solver, CVXPY's included,
    is ill-conditioned there. The server's global constraint ‖w‖₂ ≤ `radius` (None: none) keeps
    the model well posed, as in API.md's example. Even inside the ball the objective is so flat
    that an (ε, ε)-KKT point with ε = 1e-3 can sit far from the minimizer; the server's small
    ridge term (`ridge`/2)‖w‖² (0: none) makes the minimizer unique and well conditioned, so a
    verified answer is also a close one. The paper's experiment (Table 1) has neither term."""
    import fedmodel as fm
    from fedmodel.datasets import load_sklearn_breast_cancer, per_class_equal_split
    data = load_sklearn_breast_cancer()
    X = (data.X - data.X.mean(axis=0)) / data.X.std(axis=0)
    parts = per_class_equal_split(data.y, n_clients, seed=seed)
    w = fm.Variable(X.shape[1], name="w")
    prob = fm.Problem(name="neyman-pearson")
    for i, rows in enumerate(parts):
        client = prob.add_client(f"c{i}")
        X0 = client.data(X[rows][data.y[rows] == 0], name=f"X0_{i}")
        X1 = client.data(X[rows][data.y[rows] == 1], name=f"X1_{i}")
        client.minimize(fm.mean(fm.logistic(X0 @ w)) / n_clients)
        client.subject_to((fm.mean(fm.logistic(-(X1 @ w))) <= threshold).named(f"np[{client.name}]"))
    if radius is not None:
        prob.server.subject_to((fm.norm2(w) <= radius).named("ball"))
    if ridge:
        prob.server.minimize(0.5 * ridge * fm.sum_squares(w))
    return prob, w


EXAMPLES: dict[str, Callable] = {"neyman-pearson": neyman_pearson}

# Backend options `fedmodel run` uses for an example (by example, then backend); any other
# example or backend gets `DEFAULT_OPTIONS`.
#
# ProxAL presets. `PAPER_PROXAL` is Algorithm 1 exactly as the paper runs its NP experiment
# (β = 300, fixed ρ_i = 0.01, q = 0.9, s̄ = 1e-3, ε = (1e-3, 1e-3)); it needs 10³–10⁴ ADMM
# iterations per outer step. `FAST_PROXAL` keeps the algorithm, the certificate (22)–(23) and the
# stopping rule (11) and changes only parameters (docs/BENCHMARKS.md, ProxAL section):
# - q = 0.3: the certificate ε_{t+1} + Σ ε̃_i ≤ τ_k contains the local tolerance ε_{t+1} = q^t
#   itself, so every ADMM run needs at least log τ_k / log q iterations (65–110 for q = 0.9,
#   10–12 for q = 0.3); Newton local solves make the tighter tolerance almost free;
# - residual-balanced ρ_i from 0.1 (the certificate uses the ρ_i the server used, see
#   backends/proxal.py);
# - ε2 = 1e-4: a violation of ε2 moves the objective by about |μ|·ε2; with the multipliers of
#   the NP models (|μ| ≈ 10 on adult) ε2 = 1e-3 leaves gaps of ~1e-2, so answers do not verify
#   at rtol 1e-3;
# - beta_growth = 4 (β_max = 1e4): β rises between outer iterations only when the violation
#   stalls (falls by less than 4×), the standard AL penalty update; iteration k uses its β_k in
#   the multiplier step, the proximal weight and (11). On near-degenerate models (adult at
#   n = 5: 36 → 6 outer iterations) it is what makes ProxAL fast; elsewhere β stays 300. On an
#   infeasible model the violation then stalls at β_max and ProxAL stops after 3 such outer
#   iterations (status "infeasible", info["infeasible"] and info["violated"]);
# - anderson = 5: Anderson acceleration of the ADMM (backends/anderson.py; ρ changes restart
#   it). The certificate (22) holds for any client state, so (23) stays sound; on the NP models
#   it cuts the ADMM iterations 2–6× (docs/BENCHMARKS.md).
# `backends.ProxAL()` defaults equal FAST_PROXAL; `backends.ProxAL.paper()` is PAPER_PROXAL (its
# fixed-ρ, fixed-β, no-Anderson options are spelled out so that changing defaults cannot touch it).
PAPER_PROXAL = dict(beta=300.0, rho=0.01, s_bar=1e-3, q=0.9, tol=(1e-3, 1e-3), adaptive_rho=False,
                    beta_growth=1.0, anderson=0)
PAPER_CPROXAL = dict(beta=300.0, s_bar=1e-3, tol=(1e-3, 1e-3), beta_growth=1.0)
FAST_PROXAL = dict(beta=300.0, rho=0.1, s_bar=1e-3, q=0.3, adaptive_rho=True, tol=(1e-3, 1e-4),
                   beta_growth=4.0, beta_max=1e4, anderson=5)
DEFAULT_OPTIONS: dict[str, dict] = {"proxal": FAST_PROXAL}
BACKEND_OPTIONS: dict[str, dict[str, dict]] = {
    "neyman-pearson": {"proxal": FAST_PROXAL},
}


def backend_options(example: str, backend: str) -> dict:
    """The options `fedmodel run` passes to `backend` for `example`."""
    return dict(BACKEND_OPTIONS.get(example, {}).get(backend, DEFAULT_OPTIONS.get(backend, {})))
