"""The built-in models behind `fedmodel run MODEL` and `fedmodel examples` (each builder returns
the problem and its main variable), and the backend options `fedmodel run` uses for them.

Scripts that show how to write a model of your own are in the repository's `examples/` folder."""
from __future__ import annotations

from typing import Callable

import numpy as np



def neyman_pearson(n_clients: int = 5, threshold: float = 0.2, seed: int = 0,
                   radius: float | None = 10.0, ridge: float = 1e-2):
    """Neyman-Pearson classification (paper 1, eq. 30) on scikit-learn's bundled breast-cancer
    data (WDBC; benign = class 0, malignant = class 1), split per class equally over clients:
    minimize the mean class-0 logistic loss s.t. each client's class-1 loss ≤ `threshold`.

    The 30 standardized WDBC features separate the classes almost perfectly, so without a bound
    the minimizer runs off to ‖w‖ ≈ 800 (objective ≈ 5e-4) and every solver, CVXPY's included,
    is ill-conditioned there. The server's global constraint ‖w‖₂ ≤ `radius` (None: none) keeps
    the model well posed, as in docs/api.md §1's example. Even inside the ball the objective is so flat
    that an (ε, ε)-KKT point with ε = 1e-3 can sit far from the minimizer; the server's small
    ridge term (`ridge`/2)‖w‖² (0: none) makes the minimizer unique and well conditioned, so a
    verified answer is also a close one. The paper's experiment (Table 1) has neither term."""
    import fedmodel as fm
    from fedmodel.datasets import load_sklearn_breast_cancer
    data = load_sklearn_breast_cancer()
    X = (data.X - data.X.mean(axis=0)) / data.X.std(axis=0)
    prob, w, _ = neyman_pearson_clients(X, data.y, n_clients, threshold, seed)
    if radius is not None:
        prob.server.subject_to((fm.norm2(w) <= radius).named("ball"))
    if ridge:
        prob.server.minimize(0.5 * ridge * fm.sum_squares(w))
    return prob, w


def neyman_pearson_clients(X: np.ndarray, y: np.ndarray, n_clients: int, threshold: float,
                           seed: int):
    """The Neyman-Pearson model (paper 1, eq. 30) of `(X, y)` split per class equally over
    `n_clients` clients (`seed`): minimize the mean class-0 logistic loss s.t. each client's
    class-1 loss ≤ `threshold`. Returns (problem, w, the clients' row sets)."""
    import fedmodel as fm
    from fedmodel.partitioners import per_class_equal_split
    parts = per_class_equal_split(y, n_clients, seed=seed)
    w = fm.Variable(X.shape[1], name="w")
    prob = fm.Problem(name="neyman-pearson")
    for i, rows in enumerate(parts):
        client = prob.add_client(f"c{i}")
        X0 = client.data(X[rows][y[rows] == 0], name=f"X0_{i}")
        X1 = client.data(X[rows][y[rows] == 1], name=f"X1_{i}")
        client.minimize(fm.mean(fm.logistic(X0 @ w)) / n_clients)
        client.subject_to((fm.mean(fm.logistic(-(X1 @ w))) <= threshold).named(f"np[{client.name}]"))
    return prob, w, parts


MODELS: dict[str, Callable] = {"neyman-pearson": neyman_pearson}

# Backend options `fedmodel run` uses, by backend (the same for every built-in model; any
# other backend gets none). The ProxAL presets live with ProxAL (backends/proxal.py). `run
# --verify` checks the answer against CVXPY to 1e-3 relative in every measure, the solution's
# distance included, so the options aim well inside it (measured on neyman-pearson, 5 clients,
# equilibrated model; distances relative, ∞-norm):
# - proxal: its defaults, passed as none (ProxAL(): Newton steps where they fit, else Algorithm 2
#   with FAST_PROXAL; an Algorithm 2 option given would pick Algorithm 2, backends/proxal_inner.py).
#   Algorithm 2 (ε = (1e-5, 1e-4), dist_tol = 1e-4): 4.7e-5, 92 round trips (5 outer, 82 ADMM
#   iterations); ε = (1e-6, 1e-7), chosen when (11) alone stopped (2.9e-5 then; 32 outer, 716
#   inner), landed 6.5e-6 away in 101 round trips (docs/BENCHMARKS.md, branch pxrounds);
# - cproxal: ε = (1e-5, 1e-6): 2.3e-6;
# - dald on a star: the defaults (adaptive ρ): 822 iterations, 1.1e-4;
# - dald on any other graph (Fed-DALD-DC): ρ = 0.1, 3000 iterations. With ρ = 1 a 6-ring was
#   0.28 away after 1000 iterations (the objective's curvature is far below ρ², so x̂ crawls);
#   ρ = 0.1 converges in 213 (2e-5 away). Each edge's ρ now follows its nodes' curvatures, at
#   most the given ρ (`dc.edge_rho`, branch dcrows), and ρ = 0.1 still matters: from ρ = 1 the
#   ring and the complete graph end at the 3000 cap (fedmodel run --verify: NOT OK). The
#   constraints' penalty is DALD-DC's default, max(2ρ², 1) = 1 (backends/dald/dc.py,
#   BETA_FLOOR): 2ρ² = 0.02 left a ring at its cap and a complete graph "stalled" once the
#   ball's variable was equilibrated too (compiler/set_scaling.py), and β = 2 was passed here;
#   with the default, ring 244, complete 396 iterations, verified (β = 2: 227, 391).
RUN_OPTIONS: dict[str, dict] = {"proxal": {},
                                "cproxal": {"tol": (1e-5, 1e-6)}}
GRAPH_OPTIONS: dict[str, dict] = {"dald": {"rho": 0.1, "max_iterations": 3000}}
# auto (the default): the options above for whichever backend it picks
RUN_OPTIONS["auto"], GRAPH_OPTIONS["auto"] = ({"overrides": dict(RUN_OPTIONS)},
                                              {"overrides": {**RUN_OPTIONS, **GRAPH_OPTIONS}})


def backend_options(backend: str, topology: str | None = None) -> dict:
    """The options `fedmodel run` passes to `backend` for every built-in model (a copy), on
    `topology` (a name from fm.topologies; None: a star)."""
    options = dict(RUN_OPTIONS.get(backend, {}))
    if topology not in (None, "star"):
        options.update(GRAPH_OPTIONS.get(backend, {}))
    return options
