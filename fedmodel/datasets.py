"""Datasets the papers use (the partitioners that split them over clients: `fedmodel.partitioners`).

Files are read from a data directory — `root=` when given, else `$FEDMODEL_DATA`, else
`../shared/data` beside the repository — and are never copied into the project. Each file is
checked against the directory's `SHA256SUMS` on first use. A missing or corrupted file raises
`DataError` naming the file and the directory it was looked for in.

    >>> data = load_uci121("breast-cancer-wisc")            # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import DataError


@dataclass(frozen=True)
class Dataset:
    """Features `X` (float64, samples × features), labels or targets `y`, and a description."""

    X: np.ndarray
    y: np.ndarray
    name: str
    info: dict = field(default_factory=dict)


# ---- files ---------------------------------------------------------------------------------
def data_dir(root: str | os.PathLike | None = None) -> Path:
    """The data directory: `root`, else `$FEDMODEL_DATA`, else `../shared/data`."""
    if root is not None:
        return Path(root)
    if os.environ.get("FEDMODEL_DATA"):
        return Path(os.environ["FEDMODEL_DATA"])
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


_VERIFIED: set[Path] = set()


def data_file(relative: str, root: str | os.PathLike | None = None, verify: bool = True) -> Path:
    """Path of a data file, checked to exist and (with `verify`) to match `SHA256SUMS`."""
    directory = data_dir(root)
    path = directory / relative
    if not path.is_file():
        raise DataError(f"dataset file {relative!r} not found in {directory} (set FEDMODEL_DATA "
                        "to the directory holding the reference datasets, or pass root=...)")
    if verify:
        verify_checksum(relative, root)
    return path


def verify_checksum(relative: str, root: str | os.PathLike | None = None) -> None:
    """Compare a file's SHA-256 with its line in `SHA256SUMS` (no-op if that file is absent or
    does not list it); raise `DataError` on a mismatch."""
    directory = data_dir(root)
    path = (directory / relative).resolve()
    if path in _VERIFIED:
        return
    sums = directory / "SHA256SUMS"
    if not sums.is_file():
        return
    expected = None
    for line in sums.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and os.path.normpath(parts[1].lstrip("*")) == os.path.normpath(relative):
            expected = parts[0].lower()
    if expected is None:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise DataError(f"dataset file {relative!r} in {directory} does not match its SHA256SUMS "
                        "checksum; the copy is corrupted or a different version")
    _VERIFIED.add(path)


# ---- loaders -------------------------------------------------------------------------------
def load_uci121(name: str, split: str | None = None, root=None, verify: bool = True) -> Dataset:
    """A dataset of the 121-UCI collection (z-scored features, integer classes).

    `split` is None for single-file sets (`<name>_R.dat`), or "train" / "test" for sets that
    come split (`<name>_train_R.dat`), e.g. adult and the monks problems."""
    suffix = "_R.dat" if split is None else f"_{split}_R.dat"
    relative = f"uci121/{name}/{name}{suffix}"
    path = data_file(relative, root, verify)
    table = np.loadtxt(path, skiprows=1, dtype=float)     # header, then: index f1..fd class
    X, y = table[:, 1:-1], table[:, -1].astype(int)
    return Dataset(X, y, name, {"file": relative, "classes": np.bincount(y).tolist()})


def load_breast_cancer_wisc(root=None) -> Dataset:
    """UCI Wisconsin breast cancer (original, 699×9; 458 benign = 0 / 241 malignant = 1)."""
    return load_uci121("breast-cancer-wisc", root=root)


def load_monks(k: int = 1, split: str = "train", root=None) -> Dataset:
    """MONK's problem k (121-UCI encoding; train 124 rows for monks-1, test 432)."""
    return load_uci121(f"monks-{k}", split=split, root=root)


def load_monks_onehot(k: int = 1, splits: tuple[str, ...] = ("train", "test"), root=None) -> Dataset:
    """MONK's problem k from the original files (`monks-k.train` / `.test`, concatenated in
    `splits` order), the six attributes one-hot encoded (3+3+2+3+4+2 = 17 columns) — the
    encoding under which MONK-1's rule (a1 = a2 or a5 = 1) is nearly linear."""
    rows = []
    for split in splits:
        for line in data_file(f"uci121/monks-{k}/monks-{k}.{split}", root).read_text().splitlines():
            if line.strip():
                rows.append([int(v) for v in line.split()[:7]])
    table = np.array(rows)
    levels = (3, 3, 2, 3, 4, 2)
    X = np.hstack([(table[:, j + 1:j + 2] == np.arange(1, m + 1)).astype(float)
                   for j, m in enumerate(levels)])
    return Dataset(X, table[:, 0], f"monks-{k}", {"splits": splits})


def load_adult_uci121(split: str = "train", root=None) -> Dataset:
    """Adult in the 121-UCI encoding (train 32561×14; 24720 ≤50K = 0 / 7841 >50K = 1)."""
    return load_uci121("adult", split=split, root=root)


def load_a9a(split: str = "train", root=None, sparse: bool = False) -> Dataset:
    """LIBSVM a9a (123 binary features), labels +1 → 1, −1 → 0; `sparse`: X as scipy CSR."""
    from sklearn.datasets import load_svmlight_file
    relative = "libsvm/a9a" if split == "train" else "libsvm/a9a.t"
    X, y = load_svmlight_file(str(data_file(relative, root)), n_features=123)
    X = X.tocsr() if sparse else np.asarray(X.todense())
    return Dataset(X, (y > 0).astype(int), "a9a", {"file": relative})


def hashed_pairs(X, buckets: int):
    """X (scipy.sparse or array, n × p) with hashed pairwise interactions appended: for each
    pair i < j of a row's nonzero features, the product X_i·X_j added into column
    p + hash(i, j) mod `buckets` (a fixed multiplicative hash) — n × (p + buckets), CSR. a9a
    with 16,384 buckets: d = 16,507, ~100 nonzeros a row (the large sparse model of issue 25)."""
    import scipy.sparse as sp
    X = sp.csr_array(X, dtype=float)
    X.sum_duplicates()
    n, p = X.shape
    counts = np.diff(X.indptr)
    rows, cols, vals = [np.repeat(np.arange(n), counts)], [X.indices.astype(np.int64)], [X.data]
    for k in np.unique(counts[counts > 1]):       # rows with k nonzeros at once (a9a: k ≤ 14)
        which = np.flatnonzero(counts == k)
        at = X.indptr[which][:, None] + np.arange(k)         # (rows, k) positions in X.data
        i, j = np.triu_indices(k, 1)
        a = X.indices[at[:, i]].astype(np.uint64)
        b = X.indices[at[:, j]].astype(np.uint64)
        h = ((a * np.uint64(1_000_003) + b) * np.uint64(2_654_435_761)) % np.uint64(2**32)
        rows.append(np.repeat(which, len(i)))
        cols.append(p + (h % np.uint64(buckets)).astype(np.int64).ravel())
        vals.append((X.data[at[:, i]] * X.data[at[:, j]]).ravel())
    out = sp.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                       shape=(n, p + buckets))
    out.sum_duplicates()
    return out


ADULT_COLUMNS = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
                 "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
                 "hours-per-week", "native-country"]
_ADULT_NUMERIC = {"age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"}


def _adult_rows(relative: str, root) -> np.ndarray:
    rows = []
    for line in data_file(relative, root).read_text().splitlines():
        fields = [f.strip() for f in line.replace(",", " ").split()]
        if len(fields) != 15 or "?" in fields or line.startswith("|"):
            continue
        rows.append(fields)
    if not rows:
        raise DataError(f"no rows could be read from {relative!r}")
    return np.array(rows, dtype=object)


def load_adult_raw(split: str = "train", root=None) -> Dataset:
    """Raw UCI Adult (`adult.data` / `adult.test`): rows with '?' dropped, numeric columns
    as is, categorical columns one-hot (columns named in info["features"]); y = 1 for >50K.
    info["sex"] (1 = Male) and info["race"] keep the sensitive attributes. Both splits are
    one-hot over the training file's levels, so a model fitted on one applies to the other (the
    test file lacks native-country=Holand-Netherlands: its own levels shifted every later column)."""
    if split not in ("train", "test"):
        raise DataError(f"Adult has the splits 'train' and 'test', not {split!r}")
    train = _adult_rows("uci121/adult/adult.data", root)
    relative = "uci121/adult/adult.data" if split == "train" else "uci121/adult/adult.test"
    table = train if split == "train" else _adult_rows(relative, root)
    columns, names = [], []
    for j, column in enumerate(ADULT_COLUMNS):
        values = table[:, j]
        if column in _ADULT_NUMERIC:
            columns.append(values.astype(float)[:, None])
            names.append(column)
        else:
            levels = sorted(set(train[:, j]) | set(values))
            columns.append((values[:, None] == np.array(levels)[None, :]).astype(float))
            names.extend(f"{column}={level}" for level in levels)
    y = np.array([label.rstrip(".") == ">50K" for label in table[:, 14]], dtype=int)
    info = {"file": relative, "features": names, "sex": (table[:, 9] == "Male").astype(int),
            "race": table[:, 8].astype(str)}
    return Dataset(np.hstack(columns), y, "adult-raw", info)


# "adult-b" groupings (spec fl_constraints.md §4.4, the ml-bias-fairness notebook recipe)
_WORKCLASS_GROUPS = {"govt": ("Federal-gov", "Local-gov", "State-gov"), "private": ("Private",),
                     "self_employed": ("Self-emp-inc", "Self-emp-not-inc"),
                     "without_pay": ("Without-pay", "Never-worked")}
_COUPLE = ("Married-civ-spouse", "Married-AF-spouse")   # living with a spouse; all others single
_ADULT_B_ZSCORED = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")


def load_adult_b(server_fraction: float = 0.2, seed: int = 10, root=None) -> tuple[Dataset, Dataset]:
    """The fairness experiment's "adult-b" rebuilt from raw `adult.data` (no public copy exists):
    (clients' pool, server's data). 30,162 rows without '?' → 38 features: 6 z-scored numerics
    (age, fnlwgt, education-num, capital-gain, capital-loss, hours-per-week), marital-status
    single (1) / couple (0), native-country non-US (1) / US (0), workclass in 4 groups,
    occupation (14), relationship (6) and race (5) one-hot, education dropped (education-num
    keeps it), and sex (1 = Male) LAST, as the authors' code orders it. A seeded shuffle
    (`seed`) puts round(server_fraction · N) rows on the server (6,032) and the rest (24,130)
    in the clients' pool. y = 1 for >50K. Names in info["features"]."""
    raw = load_adult_raw("train", root)
    names = raw.info["features"]

    def column(name: str) -> np.ndarray:
        return raw.X[:, names.index(name)]

    def any_of(prefix: str, levels) -> np.ndarray:
        found = [column(f"{prefix}={v}") for v in levels if f"{prefix}={v}" in names]
        return np.sum(found, axis=0) if found else np.zeros(len(raw.y))

    def one_hot(prefix: str) -> list[tuple[str, np.ndarray]]:
        return [(n, column(n)) for n in names if n.startswith(prefix + "=")]

    numeric = [(n, (column(n) - column(n).mean()) / column(n).std()) for n in _ADULT_B_ZSCORED]
    parts = numeric + [("single", 1.0 - any_of("marital-status", _COUPLE)),
                       ("non-US", 1.0 - any_of("native-country", ("United-States",)))]
    parts += [(f"workclass={g}", any_of("workclass", levels)) for g, levels in _WORKCLASS_GROUPS.items()]
    for prefix in ("occupation", "relationship", "race"):
        parts += one_hot(prefix)
    parts.append(("sex", raw.info["sex"].astype(float)))
    X = np.column_stack([values for _, values in parts])
    features = [name for name, _ in parts]
    order = np.random.RandomState(seed).permutation(len(raw.y))
    cut = int(round(server_fraction * len(order)))
    server_rows, client_rows = np.sort(order[:cut]), np.sort(order[cut:])
    info = {"features": features, "sex_column": len(features) - 1, "source": raw.info["file"]}
    return (Dataset(X[client_rows], raw.y[client_rows], "adult-b-clients", {**info, "rows": client_rows}),
            Dataset(X[server_rows], raw.y[server_rows], "adult-b-server", {**info, "rows": server_rows}))


def load_mnist(split: str = "train", scale: bool = True, root=None) -> Dataset:
    """MNIST (official order): X 60000×784 (train) or 10000×784 (test), in [0, 1] with `scale`."""
    if split not in ("train", "test"):   # anything else read the test set under the name asked
        raise DataError(f"MNIST has the splits 'train' and 'test', not {split!r}")
    relative = "mnist_train.npz" if split == "train" else "mnist_test.npz"
    with np.load(data_file(relative, root)) as archive:
        X, y = archive["X"], archive["y"].astype(int)
    return Dataset(X / 255.0 if scale else X.astype(float), y, f"mnist-{split}", {"file": relative})


def load_mnist37(scale: bool = True, root=None) -> Dataset:
    """MNIST training digits 3 (y = 0) and 7 (y = 1) in original order; info["idx"] = rows in
    the 60k training set."""
    with np.load(data_file("mnist37_train.npz", root)) as archive:
        X, digits, idx = archive["X"], archive["y"].astype(int), archive["idx"]
    y = (digits == 7).astype(int)
    return Dataset(X / 255.0 if scale else X.astype(float), y, "mnist37", {"idx": idx})


def load_regression(name: str, root=None) -> Dataset:
    """Regression sets of the DALD paper's Table I: "cal_housing", "winequality-red",
    "winequality-white", "winequality" (red + white), "abalone" (sex one-hot), "power-plant",
    "diabetes" (bundled with scikit-learn)."""
    if name == "diabetes":
        return load_diabetes()
    if name == "cal_housing":
        table = np.loadtxt(data_file("regression/cal_housing.data", root), delimiter=",")
        lon, lat, age, rooms, bedrooms, population, households, income, value = table.T
        X = np.column_stack([income, age, rooms / households, bedrooms / households, population,
                             population / households, lat, lon])     # scikit-learn's layout
        return Dataset(X, value / 1e5, name)
    if name in ("winequality-red", "winequality-white"):
        table = np.loadtxt(data_file(f"regression/{name}.csv", root), delimiter=";", skiprows=1)
        return Dataset(table[:, :-1], table[:, -1], name)
    if name == "winequality":
        red, white = load_regression("winequality-red", root), load_regression("winequality-white", root)
        return Dataset(np.vstack([red.X, white.X]), np.concatenate([red.y, white.y]), name)
    if name == "abalone":
        raw = np.loadtxt(data_file("regression/abalone.data", root), dtype=str)
        sex = raw[:, 0]
        onehot = (sex[:, None] == np.array(["F", "I", "M"])[None, :]).astype(float)
        numeric = raw[:, 1:].astype(float)
        return Dataset(np.hstack([onehot, numeric[:, :-1]]), numeric[:, -1], name)
    if name == "power-plant":
        table = np.loadtxt(data_file("regression/gal_uci/power-plant/data.txt", root))
        return Dataset(table[:, :-1], table[:, -1], name)
    raise DataError(f"unknown regression dataset {name!r}; choose cal_housing, winequality-red, "
                    "winequality-white, winequality, abalone, power-plant or diabetes")


_WDBC_MEASURES = ("radius", "texture", "perimeter", "area", "smoothness", "compactness",
                  "concavity", "concave points", "symmetry", "fractal dimension")
# scikit-learn's feature names, in its column order: 10 means, 10 standard errors, 10 worst values
WDBC_FEATURES = ([f"mean {m}" for m in _WDBC_MEASURES] + [f"{m} error" for m in _WDBC_MEASURES]
                 + [f"worst {m}" for m in _WDBC_MEASURES])


def load_sklearn_breast_cancer() -> Dataset:
    """scikit-learn's bundled WDBC (569×30): benign = class 0 (357), malignant = class 1 (212).
    (scikit-learn's own target is the reverse: 0 = malignant.)

    Read from the CSV scikit-learn ships (`sklearn/datasets/data/breast_cancer.csv`, found with
    `importlib.util.find_spec`, which does not import the package): importing `sklearn.datasets`
    costs ~1-3 s of CPU, more than `fedmodel run`'s whole solve of the built-in model. Falls back
    to `sklearn.datasets.load_breast_cancer` where the file is not where scikit-learn keeps it."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "breast_cancer.csv" if spec and spec.origin else None
    if path is not None and path.is_file():
        table = np.loadtxt(path, delimiter=",", skiprows=1)
        X, target = table[:, :-1], table[:, -1].astype(int)
    else:
        from sklearn.datasets import load_breast_cancer
        bunch = load_breast_cancer()
        X, target = np.asarray(bunch.data, float), np.asarray(bunch.target)
    return Dataset(X, 1 - target, "wdbc", {"features": list(WDBC_FEATURES)})


def load_diabetes() -> Dataset:
    """scikit-learn's bundled diabetes regression set (442×10)."""
    from sklearn.datasets import load_diabetes as sklearn_diabetes
    bunch = sklearn_diabetes()
    return Dataset(np.asarray(bunch.data, float), np.asarray(bunch.target, float), "diabetes")


_MOVED = frozenset(("per_class_equal_split", "iid_split", "label_skew_split", "dirichlet_split",
                    "strided_split"))


def __getattr__(name: str):
    """The partitioners, which lived here, are `fedmodel.partitioners`'s; still importable from
    this module (`from fedmodel.datasets import iid_split`)."""
    if name in _MOVED:
        from . import partitioners
        return getattr(partitioners, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
