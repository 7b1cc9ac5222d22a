"""Datasets the papers use, and the partitioners that split them over clients.

Files are read from a data directory — `root=` when given, else `$FEDMODEL_DATA`, else
`../shared/data` beside the repository — and are never copied into the project. Each file is
checked against the directory's `SHA256SUMS` on first use. A missing or corrupted file raises
`DataError` naming the file and the directory it was looked for in.

    >>> data = load_uci121("breast-cancer-wisc")            # doctest: +SKIP
    >>> parts = per_class_equal_split(data.y, 5, seed=10)   # doctest: +SKIP
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


# ---- partitioners --------------------------------------------------------------------------
def _positive_int(value, name: str) -> None:
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise DataError(f"{name} must be a positive integer, got {value!r}")


def _check_clients(n_clients: int, available: int, what: str) -> None:
    _positive_int(n_clients, "n_clients")
    if n_clients > available:
        raise DataError(f"cannot give each of {n_clients} clients at least one sample: only "
                        f"{available} {what}")


def per_class_equal_split(y, n_clients: int, seed: int = 10) -> list[np.ndarray]:
    """The constrained-FL paper's split (spec §4.1, authors' code): for each class, shuffle its
    samples with `seed` and give every client floor(N_class / n) of them; leftovers are dropped.
    Every client gets the same number of samples of each class. Rows sorted per client."""
    y = np.asarray(y)
    classes = np.unique(y)
    smallest = min(int(np.sum(y == c)) for c in classes) if len(classes) else 0
    _check_clients(n_clients, smallest, "samples in the smallest class")
    rng = np.random.RandomState(seed)
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    for c in classes:
        rows = np.flatnonzero(y == c)
        rng.shuffle(rows)
        share = len(rows) // n_clients
        for i in range(n_clients):
            parts[i].extend(rows[i * share:(i + 1) * share])
    return [np.sort(np.array(p, dtype=int)) for p in parts]


def iid_split(n_samples: int, n_clients: int, seed: int = 0, drop_leftover: bool = True) -> list[np.ndarray]:
    """Uniformly random equal parts (the leftover rows dropped, or spread with `drop_leftover=False`)."""
    _check_clients(n_clients, n_samples, "samples")
    rows = np.random.default_rng(seed).permutation(n_samples)
    if drop_leftover:
        share = n_samples // n_clients
        return [np.sort(rows[i * share:(i + 1) * share]) for i in range(n_clients)]
    return [np.sort(part) for part in np.array_split(rows, n_clients)]


def label_skew_split(y, n_clients: int, classes_per_client: int = 2, seed: int = 0) -> list[np.ndarray]:
    """Label-sorted shards (McMahan et al.; FedADMM's MNIST split, spec §4): sort by label, cut
    into n·k equal shards, give each client k shards drawn without replacement. With MNIST's
    20,000 → 200 shards of 50 images for 100 clients, each client sees at most 2 labels."""
    y = np.asarray(y)
    _positive_int(n_clients, "n_clients")
    _positive_int(classes_per_client, "classes_per_client")
    shards = n_clients * classes_per_client
    if shards > len(y):
        raise DataError(f"cannot cut {shards} shards ({n_clients} clients × {classes_per_client}) "
                        f"of at least one sample from {len(y)} samples; use fewer clients or "
                        "classes_per_client")
    order = np.argsort(y, kind="stable")
    size = len(y) // shards
    pieces = [order[s * size:(s + 1) * size] for s in range(shards)]
    assignment = np.random.default_rng(seed).permutation(shards).reshape(n_clients, classes_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in assignment]


def dirichlet_split(y, n_clients: int, alpha: float = 0.5, seed: int = 0, min_size: int = 1,
                    max_tries: int = 100) -> list[np.ndarray]:
    """Per class, proportions over clients ~ Dirichlet(alpha) (small alpha: strong skew);
    redrawn until every client has at least `min_size` samples."""
    if alpha <= 0:
        raise DataError(f"alpha must be positive, got {alpha}")
    y = np.asarray(y)
    _check_clients(n_clients, len(y) // max(min_size, 1), f"samples for min_size={min_size}")
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(n_clients)]
        for c in np.unique(y):
            rows = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(alpha * np.ones(n_clients)))[:-1] * len(rows)).astype(int)
            for i, piece in enumerate(np.split(rows, cuts)):
                parts[i].extend(piece)
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.array(p, dtype=int)) for p in parts]
    raise DataError(f"no Dirichlet(alpha={alpha}) split gave every one of {n_clients} clients "
                    f"{min_size} samples in {max_tries} draws; use a larger alpha or fewer clients")


def strided_split(y, n_clients: int, ratio: int = 4) -> list[np.ndarray]:
    """DALD Table II's non-IID partition, the literal reading R1 (spec dald.md): with X0, X1 the
    rows of class 0 (digit 3) and 1 (digit 7) in order, even clients i get X0[i::n] ∪ X1[i::4n]
    (4:1) and odd clients X0[i::4n] ∪ X1[i::n] (1:4). Disjoint; uses about 5/8 of the data."""
    y = np.asarray(y)
    _positive_int(ratio, "ratio")
    _check_clients(n_clients, int(min(np.sum(y == 0), np.sum(y == 1))), "samples in a class")
    zeros, ones = np.flatnonzero(y == 0), np.flatnonzero(y == 1)
    parts = []
    for i in range(n_clients):
        many, few = (zeros, ones) if i % 2 == 0 else (ones, zeros)
        parts.append(np.sort(np.concatenate([many[i::n_clients], few[i::ratio * n_clients]])))
    return parts
