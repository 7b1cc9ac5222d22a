"""Partitioners: split a dataset's rows over clients (IID, per class, label skew, Dirichlet,
the strided split of the DALD paper). Each returns one index array per client.

    >>> from fedmodel.datasets import load_uci121                  # doctest: +SKIP
    >>> parts = per_class_equal_split(load_uci121("breast-cancer-wisc").y, 5, seed=10)  # doctest: +SKIP
"""
from __future__ import annotations

import numpy as np

from .errors import DataError


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
