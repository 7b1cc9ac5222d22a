"""Round 4 of "fedmodel as a new user" (issue 25): the shipped datasets as a user finds them,
the examples, the executors, numbers at the edges.

Each test failed on main before its fix (docs/BENCHMARKS.md, "Issue 25 — fedmodel as a new
user, round 4 (branch `newuser4`)"); data loaders are checked against pandas reading the file.
"""
import numpy as np
import pandas as pd
import pytest

import fedmodel as fm
from fedmodel import datasets as ds
from conftest import load_data


@pytest.mark.integration          # reads both Adult files (~45k lines): about 1 s
def test_adult_raw_test_split_has_the_training_columns():
    """adult.test lacks native-country=Holand-Netherlands: one-hot over its own levels gave it
    103 columns against the training split's 104, every later column shifted."""
    train = load_data(ds.load_adult_raw, "train")
    test = ds.load_adult_raw("test")
    assert test.info["features"] == train.info["features"] and test.X.shape == (15060, 104)
    names = test.info["features"]
    assert test.X[:, names.index("native-country=Holand-Netherlands")].sum() == 0
    # independent: pandas reading adult.test, the levels of one column one-hot by hand
    cols = ds.ADULT_COLUMNS + ["income"]
    df = pd.read_csv(ds.data_file("uci121/adult/adult.test"), sep=r"\s+", header=None,
                     names=cols, comment="|")
    df = df[~(df == "?").any(axis=1)]
    for level in ("Mexico", "United-States", "Yugoslavia"):
        column = test.X[:, names.index(f"native-country={level}")]
        np.testing.assert_array_equal(column, (df["native-country"] == level).to_numpy(float))
    np.testing.assert_array_equal(test.X[:, names.index("hours-per-week")], df["hours-per-week"])


def _frame():
    return pd.DataFrame({"age": [31.0, 45.0, 52.0], "rooms": [3.0, np.nan, 4.0],
                         "sex": ["M", "F", "M"]})


def test_a_dataframe_nan_names_its_column():
    prob = fm.Problem()
    c = prob.add_client("hospital-A")
    with pytest.raises(fm.DataError, match=r"hospital-A.*row 1, column 'rooms'"):
        c.data(_frame()[["age", "rooms"]], name="X")


def test_a_dataframe_string_column_is_named():
    prob = fm.Problem()
    c = prob.add_client("c0")
    with pytest.raises(fm.DataError, match=r"not numeric.*column\(s\) \['sex'\].*get_dummies"):
        c.data(_frame().fillna(0.0), name="X")
    # the user's fix: one-hot, then it is data (the values as pandas has them)
    X = c.data(pd.get_dummies(_frame().fillna(0.0), dtype=float), name="X")
    np.testing.assert_array_equal(X.value[:, 1], [3.0, 0.0, 4.0])


_MODEL_FILE = '''
import numpy as np
import fedmodel as fm

def make_problem(n_clients):
    rng = np.random.default_rng(4)
    w = fm.Variable(3, name="w")
    prob = fm.Problem(name="ridge-file")
    for i in range(n_clients):
        c = prob.add_client(f"c{i}")
        X, y = c.data(rng.normal(size=(10, 3)), name="X"), c.data(rng.normal(size=10), name="y")
        c.minimize(fm.sum_squares(X @ w - y))
    prob.server.minimize(0.5 * fm.sum_squares(w))
    return prob

backend = "proxal"
solve_options = {"max_outer": 1}
'''


@pytest.mark.integration          # imports Flower (fedmodel.deploy's loader) and CVXPY: ~3-7 s
def test_fedmodel_run_takes_a_model_file(tmp_path, capsys):
    """`fedmodel run examples/X.py` (the model files `fedmodel deploy` takes) was "unknown
    example"; the file's solve_options go with the backend it names."""
    from fedmodel.cli import main
    path = tmp_path / "ridge_file.py"
    path.write_text(_MODEL_FILE)
    assert main(["run", str(path), "--backend", "cvxpy", "--clients", "3"]) == 0
    out = capsys.readouterr().out
    rng = np.random.default_rng(4)
    parts = [(rng.normal(size=(10, 3)), rng.normal(size=10)) for _ in range(3)]
    X, y = np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    w = np.linalg.solve(X.T @ X + 0.5 * np.eye(3), X.T @ y)
    f = np.sum((X @ w - y) ** 2) + 0.5 * w @ w
    assert "ridge-file: 3 clients, 3 shared parameters" in out
    reported = float(out.split("objective")[1].split()[0])
    assert abs(reported - f) <= 1e-6 * f
    assert main(["run", str(path), "--backend", "proxal", "--clients", "3"]) == 1   # max_outer 1
    assert "max_iterations" in capsys.readouterr().out
    # a star-only backend on a ring: the command line's advice, not the Python API's
    assert main(["run", str(path), "--backend", "fedprox", "--topology", "ring"]) == 2
    err = capsys.readouterr().err
    assert "not on --topology ring; use --topology star" in err and "prob.solve" not in err


def _least_squares(target):
    X = np.random.default_rng(2).normal(size=(10, 3))
    prob = fm.Problem()
    c = prob.add_client("c0")
    w = fm.Variable(3, name="w")
    c.minimize(fm.sum_squares(c.data(X, name="X") @ w - c.data(np.full(10, target), name="y")))
    return prob, w, X


def test_targets_whose_square_overflows_are_a_data_error():
    """y ~ 1e200 (other units): the start-point check said "set w.value to a point where it is
    finite (a warm start)" — no start helps; the data need rescaling."""
    prob, w, X = _least_squares(1e200)
    with pytest.raises(fm.DataError, match=r"client 'c0'.*'c0\.y' reach 1e\+200.*rescale"):
        prob.solve("proxal")
    # rescaled as the message says, the answer is the least-squares one (closed form)
    prob, w, X = _least_squares(1.0)
    w_star = np.linalg.lstsq(X, np.ones(10), rcond=None)[0]
    np.testing.assert_allclose(prob.solve("proxal").value(w), w_star, rtol=1e-4, atol=1e-6)
