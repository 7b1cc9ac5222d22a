"""Table 2 (fairness, nonconvex disparity constraints): the adult-b rebuild and the fast subset
(n = 1 on a stratified fifth of adult-b, trial 1) against cProx-AL and an independent SLSQP solve."""
import warnings

import numpy as np
import pytest

from fedmodel import datasets
from conftest import missing_data

pytestmark = pytest.mark.integration     # paper reproduction on adult-b: CI runs it after the fast suite

@pytest.fixture(autouse=True, scope="module")
def _reference_data():
    if not (datasets.data_dir() / "SHA256SUMS").is_file():
        missing_data(f"reference datasets not found in {datasets.data_dir()}")


def test_adult_b_rebuild_has_the_documented_rows_features_and_is_deterministic():
    import pandas as pd
    clients, server = datasets.load_adult_b()
    assert clients.X.shape == (24130, 38) and server.X.shape == (6032, 38)
    assert np.bincount(clients.y).tolist() == [18146, 5984]
    assert np.bincount(server.y).tolist() == [4508, 1524]
    features = clients.info["features"]
    assert features[-1] == "sex" and clients.info["sex_column"] == 37
    assert "education-num" in features and not any(f.startswith("education=") for f in features)
    # independent reading of the raw file: rows without '?', sex and label counts
    raw = pd.read_csv(datasets.data_file("uci121/adult/adult.data"), header=None,
                      sep=r"\s+", na_values="?").dropna()
    assert len(raw) == 30162
    X = np.vstack([clients.X, server.X])
    assert X[:, -1].sum() == (raw[9] == "Male").sum() == 20380
    assert np.sum(np.concatenate([clients.y, server.y])) == (raw[14] == ">50K").sum()
    # six z-scored numerics over all 30,162 rows; one-hot groups sum to one per row
    np.testing.assert_allclose(X[:, :6].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(X[:, :6].std(axis=0), 1.0, rtol=1e-12)
    for prefix in ("workclass=", "occupation=", "relationship=", "race="):
        cols = [j for j, f in enumerate(features) if f.startswith(prefix)]
        np.testing.assert_array_equal(X[:, cols].sum(axis=1), 1.0)
    assert X[:, features.index("single")].sum() == (~raw[5].isin(["Married-civ-spouse", "Married-AF-spouse"])).sum()
    again, _ = datasets.load_adult_b()
    np.testing.assert_array_equal(again.X, clients.X)
    np.testing.assert_array_equal(again.info["rows"], clients.info["rows"])


@pytest.fixture(scope="module")
def fast_case():
    from fedmodel.reproductions import proxal_table2 as table2
    data = table2.load(table2.FAST["fraction"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = table2.solve_case(1, table2.FAST["trials"], data)
    return table2, data, row


def test_fast_subset_meets_the_disparity_bound_and_matches_cprox(fast_case):
    table2, data, row = fast_case
    assert row["convex"] is False                       # differences of convex functions
    assert row["samples"] == 4825 and row["server_samples"] == 1205
    assert row["alg1"]["status"] == ["converged"] and row["cprox"]["status"] == ["converged"]
    assert row["alg1"]["admm_ok"] == [True]             # every inner stop met (23), no cap hit
    assert row["worst_feas_alg1"] <= table2.THRESHOLD + 1e-3     # clients AND server
    assert row["worst_feas_cprox"] <= table2.THRESHOLD + 1e-3
    assert row["feas_max_alg1"] == pytest.approx(0.1, abs=1e-3)  # the constraint is active
    assert row["rel_diff"][0] <= 1e-3                   # paper at n = 1: 1.97e-3
    assert row["obj_alg1"][0] == pytest.approx(row["obj_cprox"][0], rel=1e-3)
    # KKT certificate of Definition 1 at the (1e-3, 1e-3) target (Theorem 3.1's bound)
    assert max(row["alg1"]["stationarity"]) <= 1e-3 + 1e-6
    assert max(row["alg1"]["kkt_feasibility"]) <= 1e-3


def _slsqp_reference(data, w0, r=0.1):
    """The centralized problem (32) for n = 1 by scipy's SLSQP with hand-written numpy gradients."""
    from scipy.optimize import minimize
    from scipy.special import expit
    (X, y), (X0, y0) = data
    Z = X * (1 - 2 * y)[:, None]

    def loss(Zb):
        return lambda w: (np.mean(np.logaddexp(0, Zb @ w)), Zb.T @ expit(Zb @ w) / len(Zb))

    def gap(Xb, yb):
        Zb = Xb * (1 - 2 * yb)[:, None]
        female, male = loss(Zb[Xb[:, -1] == 0]), loss(Zb[Xb[:, -1] == 1])
        return lambda w: tuple(a - b for a, b in zip(female(w), male(w)))

    constraints = []
    for g in (gap(X, y), gap(X0, y0)):
        constraints.append({"type": "ineq", "fun": lambda w, g=g: r - g(w)[0], "jac": lambda w, g=g: -g(w)[1]})
        constraints.append({"type": "ineq", "fun": lambda w, g=g: r + g(w)[0], "jac": lambda w, g=g: g(w)[1]})
    objective = loss(Z)
    out = minimize(lambda w: objective(w)[0], w0, jac=lambda w: objective(w)[1], method="SLSQP",
                   constraints=constraints, options={"ftol": 1e-12, "maxiter": 300})
    return out


def test_fast_subset_objective_is_near_an_independent_slsqp_solve(fast_case):
    # The (1e-3, 1e-3) KKT stop of the proximal AL is not a 1e-3 objective gap: this objective is
    # flat along the collinear one-hot directions, and SLSQP (300 iterations, at its cap) reaches
    # a feasible point 4.5e-3 lower from the same w⁰ (docs/REPRODUCTION.md, Table 2).
    table2, data, row = fast_case
    reference = _slsqp_reference(data, table2.start_point(38, 1))
    _, disparity = table2.block_metrics(reference.x, data, [np.arange(len(data[0][1]))])
    assert np.all(disparity <= table2.THRESHOLD + 1e-6)
    assert row["obj_alg1"][0] == pytest.approx(reference.fun, rel=1e-2)
    assert row["obj_alg1"][0] >= reference.fun - 1e-4


def test_metrics_agree_with_the_model_and_the_language_rejects_cvxpy_for_it():
    import fedmodel as fm
    from fedmodel.reproductions import proxal_table2 as table2
    data = table2.load(25)
    prob, w, parts = table2.build(data, 2)
    w_value = table2.start_point(38, 3)
    objective, disparity = table2.block_metrics(w_value, data, parts)
    w.value = w_value
    assert prob.objective.value == pytest.approx(objective.mean(), rel=1e-12)
    # each block's "disparity+" constraint value is D_i − r
    by_name = {c.name: c for c in prob.constraints}
    for i, name in enumerate(["c0", "c1", "server"]):
        gap = float(np.asarray(by_name[f"disparity+[{name}]"].expr.value)) + table2.THRESHOLD
        assert abs(gap) == pytest.approx(disparity[i], rel=1e-10)
    with pytest.raises(fm.CurvatureError):
        prob.solve("cvxpy")


@pytest.mark.slow
def test_n5_on_a_fifth_of_adult_b_meets_the_bound_and_matches_cprox():
    from fedmodel.reproductions import proxal_table2 as table2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = table2.solve_case(5, range(1, 2), table2.load(5))
    assert row["alg1"]["status"] == ["converged"]
    assert row["worst_feas_alg1"] <= table2.THRESHOLD + 1e-3
    assert row["rel_diff"][0] <= 5e-3                   # paper at n = 5: 1.86e-3
