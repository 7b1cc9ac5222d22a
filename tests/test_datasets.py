"""fedmodel.datasets: loaders (shapes and class counts of ../shared/data/README.md), checksums,
errors, partitioners."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel import datasets as ds, partitioners
from conftest import missing_data


@pytest.fixture(scope="module")
def shared():
    root = ds.data_dir()
    if not (root / "SHA256SUMS").is_file():
        missing_data(f"reference datasets not found in {root} (set FEDMODEL_DATA)")
    return root


def test_uci121_loaders_match_the_data_readme(shared):
    bcw = ds.load_breast_cancer_wisc()
    assert bcw.X.shape == (699, 9) and np.bincount(bcw.y).tolist() == [458, 241]
    monks = ds.load_monks(1, "train")
    assert monks.X.shape == (124, 6)
    assert ds.load_monks(1, "test").X.shape == (432, 6)
    adult = ds.load_adult_uci121("train")
    assert adult.X.shape == (32561, 14) and np.bincount(adult.y).tolist() == [24720, 7841]
    assert abs(float(np.mean(adult.X[:, 0]))) < 0.05          # z-scored


@pytest.mark.integration     # every reference loader at full size: CI runs it after the fast suite
def test_other_loaders(shared):
    a9a = ds.load_a9a()
    assert a9a.X.shape == (32561, 123) and set(np.unique(a9a.y)) == {0, 1}
    assert int(a9a.y.sum()) == 7841                               # >50K
    m37 = ds.load_mnist37()
    assert m37.X.shape == (12396, 784) and np.bincount(m37.y).tolist() == [6131, 6265]
    assert 0.0 <= m37.X.min() and m37.X.max() <= 1.0
    test = ds.load_mnist("test")
    assert test.X.shape == (10000, 784) and set(np.unique(test.y)) == set(range(10))
    raw = ds.load_adult_raw("train")
    assert raw.X.shape[0] == 30162 and raw.X.shape[1] == len(raw.info["features"])
    assert int(raw.y.sum()) == 7508 and set(np.unique(raw.info["sex"])) == {0, 1}
    assert ds.load_regression("cal_housing").X.shape == (20640, 8)
    assert ds.load_regression("winequality").X.shape == (1599 + 4898, 11)
    assert ds.load_regression("abalone").X.shape == (4177, 10)
    assert ds.load_regression("power-plant").X.shape == (9568, 4)


def test_bundled_sklearn_sets():
    wdbc = ds.load_sklearn_breast_cancer()
    assert wdbc.X.shape == (569, 30) and np.bincount(wdbc.y).tolist() == [357, 212]   # 1 = malignant
    assert ds.load_diabetes().X.shape == (442, 10)


def test_wdbc_read_from_sklearns_file_equals_its_loader():
    """The built-in model's data are read from scikit-learn's CSV without importing it (1-3 s
    of CPU): the same numbers, labels (flipped: 1 = malignant) and names as its loader."""
    from sklearn.datasets import load_breast_cancer
    bunch, wdbc = load_breast_cancer(), ds.load_sklearn_breast_cancer()
    assert np.array_equal(wdbc.X, bunch.data) and np.array_equal(wdbc.y, 1 - bunch.target)
    assert wdbc.info["features"] == list(bunch.feature_names)


def test_missing_file_names_the_file_and_directory(tmp_path):
    with pytest.raises(fm.DataError, match="breast-cancer-wisc_R.dat") as info:
        ds.load_breast_cancer_wisc(root=tmp_path)
    assert str(tmp_path) in str(info.value) and "FEDMODEL_DATA" in str(info.value)


def test_checksum_mismatch_is_detected(tmp_path, monkeypatch):
    folder = tmp_path / "uci121" / "toy"
    folder.mkdir(parents=True)
    (folder / "toy_R.dat").write_text("\tf1\tclase\n1\t0.5\t0\n2\t-0.5\t1\n")
    import hashlib
    good = hashlib.sha256((folder / "toy_R.dat").read_bytes()).hexdigest()
    (tmp_path / "SHA256SUMS").write_text(f"{good}  ./uci121/toy/toy_R.dat\n")
    monkeypatch.setenv("FEDMODEL_DATA", str(tmp_path))
    data = ds.load_uci121("toy")
    assert data.X.shape == (2, 1) and data.y.tolist() == [0, 1]
    (tmp_path / "SHA256SUMS").write_text(f"{'0' * 64}  ./uci121/toy/toy_R.dat\n")
    ds._VERIFIED.clear()
    with pytest.raises(fm.DataError, match="checksum"):
        ds.load_uci121("toy")


def test_per_class_equal_split_is_balanced_seeded_and_drops_leftovers():
    y = np.array([0] * 23 + [1] * 11)
    parts = partitioners.per_class_equal_split(y, 5, seed=10)
    assert [np.bincount(y[p], minlength=2).tolist() for p in parts] == [[4, 2]] * 5
    everything = np.concatenate(parts)
    assert len(set(everything)) == len(everything) == 30                       # 3 + 1 dropped
    again = partitioners.per_class_equal_split(y, 5, seed=10)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partitioners.per_class_equal_split(y, 5, seed=11)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_iid_label_skew_dirichlet_and_strided_splits():
    iid = partitioners.iid_split(103, 10, seed=1)
    assert [len(p) for p in iid] == [10] * 10 and len(set(np.concatenate(iid))) == 100
    assert sum(len(p) for p in partitioners.iid_split(103, 10, drop_leftover=False)) == 103
    y = np.repeat(np.arange(10), 100)
    shards = partitioners.label_skew_split(y, 20, classes_per_client=2, seed=0)
    assert all(len(p) == 50 and len(np.unique(y[p])) <= 2 for p in shards)
    assert len(set(np.concatenate(shards))) == 1000
    y2 = np.repeat([0, 1, 2], 300)
    skewed = partitioners.dirichlet_split(y2, 5, alpha=0.1, seed=0)
    flat = partitioners.dirichlet_split(y2, 5, alpha=100.0, seed=0)
    spread = lambda parts: np.mean([np.bincount(y2[p], minlength=3).max() / len(p) for p in parts])  # noqa: E731
    assert spread(skewed) > 0.6 > 0.45 > spread(flat)
    assert sum(len(p) for p in skewed) == 900
    y3 = np.array([0] * 80 + [1] * 80)
    strided = partitioners.strided_split(y3, 4)
    counts = [np.bincount(y3[p], minlength=2).tolist() for p in strided]
    assert counts == [[20, 5], [5, 20], [20, 5], [5, 20]]
    assert len(set(np.concatenate(strided))) == 100


@pytest.mark.parametrize("call", [lambda: partitioners.per_class_equal_split([0, 1, 1], 2),
                                  lambda: partitioners.iid_split(5, 0),
                                  lambda: partitioners.iid_split(3, 4),
                                  lambda: partitioners.dirichlet_split([0, 1], 2, alpha=0.0),
                                  lambda: ds.load_regression("nope")])
def test_bad_arguments_raise_data_error(call):
    with pytest.raises(fm.DataError):
        call()
