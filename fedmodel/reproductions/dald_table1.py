"""Table I of Guo, Qu, Pan, Huang, "Distributed optimization: designed for federated learning"
(Experiment 1, Sec. VI-A; ../shared/spec/dald.md §4.1): IID linear regression on five real
datasets, all-in-one least squares (AIO) vs Fed-DALD-DC on a 3-node chain.

    min_x Σ_{i=1..3} Σ_j (a_ijᵀ x_i − b_ij)²   s.t.  x_1 = x_2,  x_2 = x_3

Data: diabetes (scikit-learn, its default scaled features), California housing, wine quality
(red + white combined, and each colour alone), abalone (sex one-hot) and the combined cycle power
plant from ../shared/data/regression, features as loaded (no further scaling) plus an intercept
column (without one the AIO column cannot be matched: diabetes R² would be 0.49, not 0.5177).
AIO = in-sample OLS (numpy lstsq). Metrics on the training data itself (the paper has no test
split). DALD settings as the paper: chain 1 → 2 → 3 from the hierarchical matrix
S = [[1,1,0],[0,1,1],[0,0,0]], ρ = 1, μ¹ = 0, x⁰ = 0, inner rule B4 with v_max = 1, 1000 inner
iterations in total (ε = 0 so the cap ends the run). Choices the paper leaves open (spec §5.4):
the split is a seeded random equal split (the paper calls the experiment IID; `seed`), the
local solver is the exact linear solve of the quadratic subproblem (the paper: scipy BFGS, whose
result differs by its tolerance), and the reported DALD model is the root node x_3 (solved last
in S); the spread over the three node models is printed beside it.
"""
from __future__ import annotations

import time

import numpy as np

from .report import finish, print_header, print_subset

# dataset key → (row label, paper row key)
DATASETS = {
    "diabetes": "Diabetes",
    "cal_housing": "California Housing",
    "winequality": "Wine Quality",
    "winequality-white": "Wine Quality",
    "winequality-red": "Wine Quality",
    "abalone": "Abalone",
    "power-plant": "Combined Cycle Power Plant",
}
FAST = ("diabetes", "abalone", "power-plant")
HIERARCHY = [[1, 1, 0], [0, 1, 1], [0, 0, 0]]        # Exp. 1: 1 → 2 → 3 (Definition 3)

# Paper, Table I: instances, features, MSE AIO, MSE DALD, R² AIO, R² DALD
PAPER = {
    "Diabetes": (442, 10, 2859.6963, 2859.6964, 0.5177, 0.5177),
    "California Housing": (20640, 8, 0.5243, 0.5310, 0.6062, 0.6012),
    "Wine Quality": (4898, 11, 0.5398, 0.5407, 0.2921, 0.2909),
    "Abalone": (4177, 8, 4.8027, 4.8033, 0.5379, 0.5378),
    "Combined Cycle Power Plant": (9568, 4, 20.7674, 20.7823, 0.9287, 0.9286),
}


def design(name: str, root=None) -> tuple[np.ndarray, np.ndarray]:
    """Features with an intercept column appended, and targets."""
    from fedmodel.datasets import load_regression
    data = load_regression(name, root=root)
    return np.column_stack([data.X, np.ones(len(data.y))]), np.asarray(data.y, float)


def metrics(X: np.ndarray, y: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """In-sample MSE and R² of the linear model x."""
    mse = float(np.mean((y - X @ x) ** 2))
    return mse, 1.0 - mse / float(np.var(y))


def aio(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """All-in-one least squares (the closed form, via lstsq)."""
    return np.linalg.lstsq(X, y, rcond=None)[0]


def build_problem(X: np.ndarray, y: np.ndarray, nodes: int = 3, seed: int = 0):
    """The chain model of Exp. 1: node i minimizes its sum of squared errors (no 1/N)."""
    import fedmodel as fm
    from fedmodel.partitioners import iid_split
    w = fm.Variable(X.shape[1], name="x")
    prob = fm.Problem(name="dald-table1")
    for i, rows in enumerate(iid_split(len(y), nodes, seed=seed, drop_leftover=False)):
        node = prob.add_client(f"c{i}")
        node.minimize(fm.sum_squares(node.data(X[rows], name="A") @ w - node.data(y[rows], name="b")))
    return prob, w


def dald(X: np.ndarray, y: np.ndarray, iterations: int = 1000, seed: int = 0,
         executor="serial") -> dict[str, np.ndarray]:
    """Fed-DALD-DC on the chain with the paper's settings; the node models by name (c0..c2)."""
    from fedmodel import topologies
    from fedmodel.backends.dald import DALD
    prob, _ = build_problem(X, y, seed=seed)
    algo = DALD.paper(eps_primal=0.0, eps_dual=0.0, max_iterations=iterations, solver="exact")
    res = prob.solve(algo, topology=topologies.hierarchy(HIERARCHY, prob), executor=executor,
                     scaling=False)   # the paper's model as written (docs/scaling.md)
    assert res.info["order"] == ["c0", "c1", "c2"]
    return res.info["client_values"]


def evaluate(name: str, iterations: int = 1000, seed: int = 0, executor="serial", root=None) -> dict:
    """AIO and DALD metrics of one dataset."""
    X, y = design(name, root)
    start = time.perf_counter()
    models = dald(X, y, iterations, seed, executor)
    seconds = time.perf_counter() - start
    nodes = {node: metrics(X, y, x) for node, x in models.items()}
    return {"name": name, "shape": (X.shape[0], X.shape[1] - 1), "aio": metrics(X, y, aio(X, y)),
            "dald": nodes["c2"], "nodes": nodes, "seconds": seconds}


def run(full: bool = False, iterations: int = 1000, seed: int = 0) -> int:
    names = list(DATASETS) if full else list(FAST)
    print("DALD paper, Table I: AIO least squares vs Fed-DALD-DC on the 3-node chain "
          f"(ρ = 1, B4 v_max = 1, {iterations} inner iterations, exact local solves, "
          f"random equal split seed {seed}; DALD = root node x_3; metrics in-sample)")
    if not full:
        print_subset("tableI", f"{len(names)} of the {len(DATASETS)} datasets ({', '.join(names)})",
                     "every dataset")
    print_header("dataset<18 N×d>9 | MSE AIO>10 paper>10 | MSE DALD>10 paper>10 nodes min–max>21 | "
                 "R² AIO>6 paper>6 | R² DALD>7 paper>6 | s>4")
    ok = True
    for name in names:
        out = evaluate(name, iterations, seed)
        paper = PAPER[DATASETS[name]]
        (mse_a, r2_a), (mse_d, r2_d) = out["aio"], out["dald"]
        node_mse = [m for m, _ in out["nodes"].values()]
        print(f"{name:<18} {out['shape'][0]:>5}×{out['shape'][1]:<3} | {mse_a:>10.4f} {paper[2]:>10.4f} | "
              f"{mse_d:>10.4f} {paper[3]:>10.4f} {min(node_mse):>10.4f}–{max(node_mse):<10.4f} | "
              f"{r2_a:>6.4f} {paper[4]:>6.4f} | {r2_d:>7.4f} {paper[5]:>6.4f} | {out['seconds']:>4.1f}")
        # checks: the paper's claim that DALD performs like AIO (its largest MSE gap is 1.3 %,
        # California), and the AIO column itself where the dataset is the paper's
        ok &= abs(mse_d - mse_a) <= 0.02 * mse_a
        if name in ("diabetes", "cal_housing", "abalone", "power-plant"):
            ok &= round(mse_a, 4) == paper[2] and round(r2_a, 4) == paper[4]
    print("\nNotes: the AIO column matches the paper to 4 decimals for diabetes, California, "
          "abalone and the power plant. Wine: the paper's row (4898 instances = white only) fits "
          "red + white combined (6497 rows: MSE 0.53972 vs 0.5398, R² 0.2921 = 0.2921); white alone "
          "gives 0.5632 / 0.2819. DALD after 1000 iterations sits slightly above AIO; how far depends "
          "on the split and on each node's data (California: an outlier-heavy node converges slowest), "
          "so the paper's DALD digits (its split and BFGS tolerance are unstated) are not expected "
          "exactly. See docs/REPRODUCTION.md.")
    return finish(ok)
