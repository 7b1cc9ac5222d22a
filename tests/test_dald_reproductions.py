"""Fast subsets of the DALD reproductions (Table I, Table II, Fig. 5) with numeric assertions.
Data from ../shared/data (tests skip when a file is absent); diabetes ships with scikit-learn."""
import numpy as np
import pytest

from fedmodel.reproductions import dald_table1 as t1
from fedmodel.reproductions import dald_table2 as t2
from conftest import load_data

pytestmark = pytest.mark.integration     # paper reproductions: CI runs it after the fast suite


def _design(name):
    return load_data(t1.design, name)


@pytest.mark.parametrize("name", ["diabetes", "cal_housing", "abalone", "power-plant", "winequality"])
def test_table1_aio_is_closed_form_least_squares_and_the_papers_column(name):
    X, y = _design(name)
    normal = np.linalg.solve(X.T @ X, X.T @ y)                # normal equations, independent of lstsq
    mse, r2 = t1.metrics(X, y, t1.aio(X, y))
    assert mse == pytest.approx(t1.metrics(X, y, normal)[0], rel=1e-10)
    paper = t1.PAPER[t1.DATASETS[name]]
    if name == "winequality":            # red + white: R² to 4 decimals, MSE 0.53972 vs 0.5398
        assert round(r2, 4) == paper[4] and abs(mse - paper[2]) <= 1e-4
    else:
        assert round(mse, 4) == paper[2] and round(r2, 4) == paper[4]


def test_table1_wine_white_only_does_not_fit_the_papers_row():
    X, y = _design("winequality-white")
    mse, r2 = t1.metrics(X, y, t1.aio(X, y))
    assert abs(r2 - 0.2921) > 0.005 and abs(mse - 0.5398) > 0.01


@pytest.mark.parametrize("name, tol", [("diabetes", 1e-5), ("power-plant", 2e-3)])
def test_table1_dald_chain_reaches_the_aio_mse(name, tol):
    """1000 inner iterations on the chain (paper settings): every node's model within `tol`
    (relative MSE) of the closed form; diabetes converges to 1.5e-6, the power plant's
    unscaled features (values ~10³) to 7e-4."""
    X, y = _design(name)
    mse_aio = t1.metrics(X, y, t1.aio(X, y))[0]
    models = t1.dald(X, y, iterations=1000)
    assert sorted(models) == ["c0", "c1", "c2"]
    for x in models.values():
        mse = t1.metrics(X, y, x)[0]
        assert mse_aio <= mse <= mse_aio * (1 + tol)


@pytest.fixture(scope="module")
def mnist10():
    return load_data(t2.experiment, 10)


def test_table2_partition_and_evaluation_set(mnist10):
    assert len(mnist10.parts) == 10 and mnist10.X_test.shape == (2038, 784)
    assert int(np.sum(mnist10.b_test > 0)) == 1028             # MNIST test 7s (3s: 1010)
    assert 7700 <= mnist10.N <= 7800                            # R1 uses ≈ 5/8 of 12,396


@pytest.mark.parametrize("method", t2.METHODS)
@pytest.mark.parametrize("lam", [0.0, 1e-2])
def test_table2_backend_equals_the_numpy_reference(mnist10, method, lam):
    """The fedmodel backend (serial executor) and the independent vectorized reference give the
    same client models iterate by iterate: the reference's grid numbers are the backend's."""
    a = t2.run_backend(method, mnist10, lam, 4, (1, 4))
    b = t2.run_reference(method, mnist10, lam, 4, (1, 4))
    for k in (1, 4):
        assert np.max(np.abs(a[k] - b[k])) <= 1e-12 * np.max(np.abs(b[k]))
    assert np.max(np.abs(b[4] - b[1])) > 0


def test_table2_subset_accuracy(mnist10):
    """n = 10, λ = 1e-3, 300 iterations. Bound: the centralized no-intercept logistic regression
    on the same training rows (scikit-learn, C = 1e4) scores 97.74 % on the test 3s/7s; DALD's
    client models must be within 0.75 points of it already, FedProx (no multipliers, so the
    non-IID clients stay apart) below both DALD variants with a larger spread — Table II's
    ordering."""
    result = {m: t2.summary(t2.accuracies(mnist10, t2.run_reference(m, mnist10, 1e-3, 300, (300,))[300]))
              for m in t2.METHODS}
    for method in ("dald-cc", "dald-dc"):
        assert result[method][0] >= 97.74 - 0.75, result
        assert result[method][0] > result["fedprox"][0] + 0.5, result
        assert result[method][1] < result["fedprox"][1], result
    assert result["fedprox"][0] >= 95.0                          # it still learns (paper: 97.4)


def test_paper_table_is_parsed():
    assert len(t2.PAPER) == 24
    assert t2.PAPER[(1000, 1e-3)]["fedprox"][2] == 88.21        # the text says 87.21
    assert t2.PAPER[(10, 0.0)]["dald-dc"] == (98.80, 2.14, 99.04, 1.50)


def test_fig5_curves_and_png(mnist10, tmp_path):
    """Curves are recorded at iteration 1 and every `every`-th, equal the Table II models at
    the same iteration, and the PNG is written."""
    from fedmodel.reproductions import dald_fig5
    data = dald_fig5.curves(10, iterations=20, every=10, exp=mnist10)
    k, mean, std = data["dald-dc"]
    assert list(k) == [1, 10, 20] and np.all(std >= 0)
    models = t2.run_reference("dald-dc", mnist10, dald_fig5.LAMBDA, 20, (20,))[20]
    assert mean[-1] == pytest.approx(100 * np.mean(t2.accuracies(mnist10, models)), abs=1e-12)
    path = dald_fig5.plot({10: data}, tmp_path / "fig5.png")
    assert path.stat().st_size > 10_000
