"""DALD's compiled kernels (backends/dald/kernels.py) against plain numpy / Python-loop
implementations of the formulas in their docstrings, on random inputs.

The kernels do the serial procedures' operations in the same order, so every comparison is
exact (`assert_array_equal`), the Gauss–Seidel sweep included (its reference computes each
node's consensus terms in the kernel's CSR order, then the node's own proximal-gradient step, as
`dald_dc_solve` does on one node)."""
import networkx as nx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedmodel.backends.dald import kernels
from fedmodel.runtime.kernels import exact_shape
from test_kernels import FEW, _frozen, _per_row, _shrink, _unchanged


# ---- multiplier steps and residuals ----------------------------------------------------------
@FEW
@given(n=st.integers(1, 6), d=st.integers(1, 6), xhat=st.sampled_from(["row", "full"]),
       weight=st.sampled_from(["scalar", "column", "full"]), seed=st.integers(0, 2**32 - 1))
def test_consensus_dual_equals_its_formula(n, d, xhat, weight, seed):
    """μ_i + w_i∘(x̂_i − x_i) row by row; inputs untouched."""
    rng = np.random.default_rng(seed)
    MU, X = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    h, w = _per_row(xhat, rng, n, d), _per_row(weight, rng, n, d)
    before = _frozen(MU, X, h, w)
    got = kernels.consensus_dual(MU, X, h, w)
    np.testing.assert_array_equal(got, MU + np.asarray(w) * (np.asarray(h) - X))
    _unchanged(before, (MU, X, h, w))


@FEW
@given(n=st.integers(2, 7), d=st.integers(1, 5), m=st.integers(1, 10),
       move=st.sampled_from(["none", "mixed", "all"]), weight=st.sampled_from(["column", "full"]),
       seed=st.integers(0, 2**32 - 1))
def test_edge_dual_equals_its_formula(n, d, m, move, weight, seed):
    """Per edge: size = ‖x_tail − x_head‖∞, μ + w∘(x_tail − x_head) where `move`, else μ."""
    rng = np.random.default_rng(seed)
    X, MU = rng.normal(size=(n, d)), rng.normal(size=(m, d))
    tail = rng.integers(0, n, size=m)
    head = (tail + rng.integers(1, n, size=m)) % n          # another node
    w = _per_row(weight, rng, m, d)
    moves = {"none": np.zeros(m, bool), "all": np.ones(m, bool), "mixed": rng.random(m) < 0.5}[move]
    before = _frozen(X, MU, tail, head, w, moves)
    out, size = kernels.edge_dual(X, MU, tail, head, w, moves)
    C = X[tail] - X[head]
    np.testing.assert_array_equal(size, np.max(np.abs(C), axis=1))
    np.testing.assert_array_equal(out, np.where(moves[:, None], MU + w * C, MU))
    _unchanged(before, (X, MU, tail, head, w, moves))


@FEW
@given(n=st.integers(1, 7), d=st.integers(1, 6), weight=st.sampled_from(["scalar", "column", "full"]),
       seed=st.integers(0, 2**32 - 1))
def test_consensus_gap_equals_its_formula(n, d, weight, seed):
    """Σ over member rows (in row order) of w_i∘(x̂ − x_i); the residual over ALL rows."""
    rng = np.random.default_rng(seed)
    X, xhat = rng.normal(size=(n, d)), rng.normal(size=d)
    w = _per_row(weight, rng, n, d)
    member = rng.random(n) < 0.5
    X[~member] *= 10.0                           # the largest gap is usually on a non-member row
    before = _frozen(X, xhat, w, member)
    total, largest = kernels.consensus_gap(X, xhat, w, member)
    want = np.zeros(d)
    W = np.broadcast_to(np.asarray(w, float), (n, d))
    for i in range(n):
        if member[i]:
            want += W[i] * (xhat - X[i])
    np.testing.assert_array_equal(total, want)
    assert largest == np.max(np.abs(xhat - X))
    _unchanged(before, (X, xhat, w, member))


def test_consensus_gap_without_members_still_measures_every_row():
    total, largest = kernels.consensus_gap(np.array([[1.0, 5.0], [2.0, 2.0]]), np.array([2.0, 2.0]),
                                           1.0, np.zeros(2, bool))
    np.testing.assert_array_equal(total, [0.0, 0.0])
    assert largest == 3.0


@FEW
@given(n=st.integers(1, 7), d=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_largest_change_equals_its_formula(n, d, seed):
    """max over the listed rows of ‖x_i − previous_i‖∞ (0 for no rows); X finite."""
    rng = np.random.default_rng(seed)
    X, previous = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    member = rng.random(n) < 0.6
    largest, finite = kernels.largest_change(X, previous, member)
    assert largest == np.max(np.abs(X[member] - previous[member]), initial=0.0)
    assert finite is True


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_largest_change_flags_a_non_finite_entry_in_any_row(bad):
    """The finite flag covers all of X, also rows the change is not measured on."""
    rng = np.random.default_rng(3)
    X, previous = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    rows = np.array([0, 2])
    member = np.isin(np.arange(5), rows)
    want = float(np.max(np.abs(X[rows] - previous[rows])))
    for r, c in [(1, 0), (4, 3), (0, 1)]:       # unlisted rows, then a listed one
        Y = X.copy()
        Y[r, c] = bad
        largest, finite = kernels.largest_change(Y, previous, member)
        assert finite is False
        if r not in rows:
            assert largest == want
        else:                                   # as np.max: NaN wins, else inf
            np.testing.assert_array_equal(largest, np.max(np.abs(Y[rows] - previous[rows])))
    assert kernels.largest_change(X, np.full_like(X, np.nan), member)[1] is True   # only X is checked


# ---- Gauss–Seidel sweep -----------------------------------------------------------------------
def _csr(graph: nx.Graph, n: int):
    """(ptr, edge, nbr, sign) of `graph`; edge e = (i, j), i < j, in sorted order: "+" at i, "−" at j."""
    edges = sorted(tuple(sorted(e)) for e in graph.edges)
    ends = [[] for _ in range(n)]
    for e, (i, j) in enumerate(edges):
        ends[i].append((e, j, 1.0))
        ends[j].append((e, i, -1.0))
    ptr = np.cumsum([0] + [len(x) for x in ends])
    flat = [end for x in ends for end in x]
    edge, nbr, sign = (np.array([f[k] for f in flat]) for k in range(3))
    return (ptr, edge.astype(np.intp), nbr.astype(np.intp), sign.astype(float)), len(edges)


def _sweep_reference(X, G, MU, order, adjacency, weight, step, threshold, cols, project=None):
    """Node by node in `order`, as `dald_dc_solve` computes one node's (20): its consensus terms
    linear = Σ_e sign·μ_e, total = Σ_e w_e, anchor = Σ_e w_e∘x_j / total (x_j the newest model:
    this sweep's if j came earlier), then z = x_i − α(∇P_i + linear + total∘(x_i − anchor)), then
    soft-thresholding (or `project`)."""
    ptr, edge, nbr, sign = adjacency
    W = np.broadcast_to(weight, MU.shape)
    B, done = X.copy(), set()
    for i in order:
        linear, total, anchor = _terms_reference(i, X, B, done, MU, ptr, edge, nbr, sign, W)
        g = G[i] + (linear + total * (X[i] - anchor))
        z = X[i] - step * g
        if project is not None:
            project(z, i)
        elif threshold[i] >= 0:
            z[cols] = _shrink(z[cols], threshold[i])
        B[i], done = z, done | {i}
    return B


def _terms_reference(i, X, B, done, MU, ptr, edge, nbr, sign, W):
    """Node i's consensus terms of (20) in its CSR order, as Python sums (no edge: 0, 0, x_i)."""
    if ptr[i] == ptr[i + 1]:
        return np.zeros(X.shape[1]), np.zeros(X.shape[1]), X[i].copy()
    ks = range(ptr[i], ptr[i + 1])
    others = [B[nbr[k]] if nbr[k] in done else X[nbr[k]] for k in ks]
    linear = sum(sign[k] * MU[edge[k]] for k in ks)
    total = sum(W[edge[k]] * np.ones(X.shape[1]) for k in ks)
    anchor = sum(W[edge[k]] * other for k, other in zip(ks, others)) / total
    return linear, total, anchor


@pytest.mark.parametrize("kind", ["path", "ring", "erdos_renyi", "tree"])
@pytest.mark.parametrize("wide", [False, True])
def test_edge_terms_equal_their_formula(kind, wide):
    """Σ_e sign·μ_e, Σ_e w_e and the weighted mean of the neighbour models, per node of `rows`
    (a random subset, any order), bitwise as Python sums in CSR order; a node without edges
    gets 0, 0 and its own model; inputs untouched."""
    for seed in range(5):
        X, _, MU, order, adjacency, weight, _, _ = _sweep_case(kind, 7, 4, wide, True, seed)
        ptr, edge, nbr, sign = adjacency
        before = _frozen(X, MU, order, weight, *adjacency)
        got = kernels.edge_terms(X, MU, order, adjacency, weight)
        W = np.broadcast_to(weight, MU.shape)
        for k, i in enumerate(order):
            for a, b in zip(got, _terms_reference(i, X, X, set(), MU, ptr, edge, nbr, sign, W)):
                np.testing.assert_array_equal(a[k], b)
        _unchanged(before, (X, MU, order, weight, *adjacency))
    lonely = kernels.edge_terms(np.array([[2.0, 3.0]]), np.zeros((0, 2)), np.array([0]),
                                (np.array([0, 0]), np.zeros(0, int), np.zeros(0, int), np.zeros(0)), 1.0)
    assert [a.tolist() for a in lonely] == [[[0.0, 0.0]], [[0.0, 0.0]], [[2.0, 3.0]]]


def _graph(kind, n, seed):
    if kind == "path":
        return nx.path_graph(n)
    if kind == "ring":
        return nx.cycle_graph(n)
    if kind == "tree":
        return nx.random_labeled_tree(n, seed=seed)
    for s in range(seed, seed + 1000):           # the first connected G(n, 0.4) from `seed` on
        graph = nx.erdos_renyi_graph(n, 0.4, seed=s)
        if nx.is_connected(graph):
            return graph


def _sweep_case(kind, n, d, wide, partial, seed):
    rng = np.random.default_rng(seed)
    graph = _graph(kind, n, seed)
    assert nx.is_connected(graph)
    adjacency, m = _csr(graph, n)
    X, G, MU = rng.normal(size=(n, d)), rng.normal(size=(n, d)), rng.normal(size=(m, d))
    weight = rng.uniform(0.2, 2.0, size=(m, d if wide else 1))
    order = rng.permutation(n)
    if partial:
        order = order[:max(1, n // 2)]
    threshold = rng.uniform(0.0, 0.3, size=n)
    threshold[rng.random(n) < 0.3] = -1.0
    return X, G, MU, order, adjacency, weight, float(rng.uniform(0.05, 0.5)), threshold


@pytest.mark.parametrize("kind", ["path", "ring", "erdos_renyi", "tree"])
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("partial", [False, True])
def test_gauss_seidel_sweep_equals_the_node_by_node_loop(kind, wide, partial):
    """Any order (a random permutation, or a subset: the others keep X), ρ per edge or per
    coordinate, soft-thresholding on a column slice; inputs untouched."""
    for seed in range(5):
        X, G, MU, order, adjacency, weight, step, threshold = _sweep_case(kind, 7, 4, wide, partial, seed)
        cols = slice(1, 3)
        before = _frozen(X, G, MU, order, weight, threshold, *adjacency)
        got = kernels.gauss_seidel_sweep(X, G, MU, order, adjacency, weight, step, threshold, cols)
        want = _sweep_reference(X, G, MU, order, adjacency, weight, step, threshold, cols)
        np.testing.assert_array_equal(got, want)
        left_out = np.setdiff1d(np.arange(len(X)), order)
        np.testing.assert_array_equal(got[left_out], X[left_out])
        _unchanged(before, (X, G, MU, order, weight, threshold, *adjacency))


@pytest.mark.parametrize("kind", ["path", "ring", "erdos_renyi", "tree"])
@pytest.mark.parametrize("partial", [False, True])
def test_gauss_seidel_sweep_with_a_prox_callback(kind, partial):
    """`prox_row(z, i)` runs on node i's new row right after its step (later nodes see the
    projected row); the thresholds are not applied on this path, even with a column slice."""
    calls = []

    def box(z, i):                                # a per-node box: the index must be right
        calls.append(i)
        np.clip(z, -0.1 * (i + 1), 0.05 * (i + 1), out=z)

    for seed in range(5):
        X, G, MU, order, adjacency, weight, step, threshold = _sweep_case(kind, 7, 4, True, partial, seed)
        threshold = np.abs(threshold)             # would shrink every row if applied
        calls.clear()
        got = kernels.gauss_seidel_sweep(X, G, MU, order, adjacency, weight, step, threshold,
                                         slice(0, 4), prox_row=box)
        assert calls == list(order)
        calls.clear()
        want = _sweep_reference(X, G, MU, order, adjacency, weight, step, None, None, project=box)
        np.testing.assert_array_equal(got, want)


def test_gauss_seidel_sweep_docstring_chain():
    """The 3-node chain of the docstring, computed by hand: 0.5, 1.25, 1.625."""
    adjacency, _ = _csr(nx.path_graph(3), 3)
    X = np.array([[0.0], [1.0], [2.0]])
    B = kernels.gauss_seidel_sweep(X, np.zeros((3, 1)), np.zeros((2, 1)), np.arange(3), adjacency,
                                   np.ones((2, 1)), 0.5, -np.ones(3))
    np.testing.assert_array_equal(B.ravel(), [0.5, 1.25, 1.625])
    B = kernels.gauss_seidel_sweep(X, np.zeros((3, 1)), np.zeros((2, 1)), np.array([2, 1, 0]), adjacency,
                                   np.ones((2, 1)), 0.5, -np.ones(3))
    np.testing.assert_array_equal(B.ravel(), [0.375, 0.75, 1.5])   # reversed: 1.5, then 0.75, 0.375


def test_a_read_only_view_of_a_stack_is_read_without_a_copy():
    """Group replies are read-only views of the executor's stacks: the kernels read them in
    place (one signature, no copy) and give the same numbers."""
    X = np.random.default_rng(0).normal(size=(4, 3))
    view = X.view()
    view.flags.writeable = False
    passed = exact_shape(view, X.shape)
    assert np.shares_memory(passed, X) and passed.flags.writeable
    assert kernels.largest_change(view, np.zeros_like(X), np.ones(4, bool)) == \
        kernels.largest_change(X, np.zeros_like(X), np.ones(4, bool))
