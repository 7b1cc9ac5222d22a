"""New-user round 10 (the life of a run): what a run's result shows must not depend on the
data's units. Each test fails on main 2579f54."""
import numpy as np

from fedmodel import plotting
from fedmodel.result import History


def _history(scale: float) -> History:
    """A run's history in the user's units: the objective of data ×√scale is ×scale."""
    return History({"iteration": k + 1, "objective": scale * (2.0 + 10.0 ** -k), "violation": 0.0}
                   for k in range(6))


def _gap(history: History, reference: float) -> tuple[str, np.ndarray]:
    figure = plotting.convergence_figure(history, reference=reference)
    panel = figure.axes[-1]
    return panel.get_title(), np.asarray(panel.lines[0].get_ydata())


def test_objective_gap_panel_is_the_same_in_any_units():
    """Data ×1e-3 (objective ×1e-6, f* = 2e-6) showed |f − f*| itself (max(1, |f*|) = 1): a gap
    of 1e-11 where the run is 1e-5 off; data ×1e3 showed it relative. Now |f − f*| / |f*|."""
    expected = 10.0 ** -np.arange(6) / 2.0
    for scale in (1e-6, 1.0, 1e6):
        title, gap = _gap(_history(scale), 2.0 * scale)
        assert title == "relative objective gap |f − f*| / |f*|"
        np.testing.assert_allclose(gap, expected, rtol=1e-9)


def test_objective_gap_to_a_zero_optimum_is_relative_to_the_run():
    """f* = 0 has no size: the gap is taken over the run's largest |f|, in any units."""
    for scale in (1e-6, 1e6):
        history = History({"iteration": k + 1, "objective": scale * 10.0 ** -k} for k in range(4))
        title, gap = _gap(history, 0.0)
        assert title == "relative objective gap |f − f*| / max |f|"
        np.testing.assert_allclose(gap, 10.0 ** -np.arange(4), rtol=1e-12)


def _sparse_model(scale: float = 1.0, nudge: float = 0.0):
    """Least squares over 3 clients whose data are scipy sparse (as sklearn's svmlight reader
    gives them), in units ×scale."""
    import scipy.sparse as sp
    import fedmodel as fm
    rng = np.random.default_rng(3)
    w = fm.Variable(6, name="w")
    prob = fm.Problem()
    for i, rows in enumerate((1, 8, 30)):
        X = sp.random_array((rows, 6), density=0.5, random_state=rng, format="csr") * scale
        if i == 2 and nudge:
            X.data[0] += nudge
        y = rng.normal(size=rows) * scale
        c = prob.add_client()
        c.minimize(fm.sum_squares(c.data(X, name="X") @ w - c.data(y, name="y")) / 39)
    prob.server.minimize(1e-2 * scale ** 2 * fm.sum_squares(w))
    return prob, w


def test_checkpoint_of_a_model_with_sparse_data(tmp_path):
    """A checkpoint of a model with scipy sparse data raised a bare ValueError ("setting an array
    element with a sequence") from its fingerprint before the run; now it runs, resumes, and
    another sparse matrix is refused."""
    import pytest
    from fedmodel.runtime.checkpoint import CheckpointError
    path = tmp_path / "run.ckpt"
    prob, w = _sparse_model()
    plain = prob.solve("dald").value(w)
    first = prob.solve("dald", checkpoint=str(path), checkpoint_every=5)
    np.testing.assert_array_equal(first.value(w), plain)
    again, w2 = _sparse_model()          # the same data rebuilt: the finished run comes back
    np.testing.assert_array_equal(again.solve("dald", checkpoint=str(path), resume=True).value(w2), plain)
    other, _ = _sparse_model(nudge=1e-9)
    with pytest.raises(CheckpointError, match="another run"):
        other.solve("dald", checkpoint=str(path), resume=True)


def test_fingerprint_reads_sparse_data_whatever_its_format():
    """The same matrix as CSR, COO or CSC (and with its entries in another order) is the same
    data; a changed entry is not."""
    import scipy.sparse as sp
    from fedmodel.runtime.checkpoint_fingerprint import _update
    import hashlib

    def digest(value):
        h = hashlib.sha256()
        _update(h, value)
        return h.hexdigest()
    M = sp.random_array((7, 5), density=0.4, random_state=1, format="coo")
    shuffled = sp.coo_array((M.data[::-1], (M.row[::-1], M.col[::-1])), shape=M.shape)
    wide = M.tocsr()                     # the same matrix with int64 indices (scipy picks by size)
    wide.indices, wide.indptr = wide.indices.astype(np.int64), wide.indptr.astype(np.int64)
    assert len({digest(M), digest(M.tocsr()), digest(M.tocsc()), digest(shuffled), digest(wide)}) == 1
    changed = M.tocsr()
    changed.data[0] *= 1 + 1e-15
    assert digest(changed) != digest(M)


def test_cli_topology_needs_its_parameters(capsys):
    """`fedmodel run --topology grid` (the --help listed "star, path, ring, complete, …") died
    with a TypeError traceback (grid() missing rows and cols), `--topology validate` too; now a
    topology's parameters come after a colon and anything else is a clear error, rc 2."""
    import pytest
    from fedmodel import cli
    for text, says in [("grid", "needs its parameter: write grid:ROWSxCOLS"),
                       ("grid:axb", "write it as grid:ROWSxCOLS"),
                       ("grid:2x3", "grid 2x3 has 6 cells but the problem has 5 clients"),
                       ("erdos_renyi", "needs its parameter: write erdos_renyi:P"),
                       ("ring:3", "ring takes no parameter"),
                       ("star:", "star takes no parameter"),        # (it ran with a graph's options)
                       ("grid:-2x-3", "write it as grid:ROWSxCOLS"),  # (it said "6 cells but … 6 clients")
                       ("validate", "unknown topology 'validate'")]:
        assert cli.main(["run", "--topology", text]) == 2
        assert says in capsys.readouterr().err
    from fedmodel.builtin_models import MODELS
    prob, _ = MODELS["neyman-pearson"](n_clients=6)
    G = cli._topology("grid:2x3", prob)
    assert (G.graph["rows"], G.graph["cols"], G.number_of_edges()) == (2, 3, 7)
    assert cli._topology("random_regular:2", prob).graph["degree"] == 2
    with pytest.raises(Exception, match="edge probability"):
        cli._topology("erdos_renyi:2", prob)


def test_result_value_of_an_expression():
    """`res.value(fm.norm2(w))` raised "Result.value takes a Variable, got Norm2"; now an
    expression is evaluated at the result's point with the Parameters it was solved with — not
    at the variables' current values, which the next solve overwrites."""
    import pytest
    import fedmodel as fm
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(12, 3)), rng.normal(size=12)
    w, lam = fm.Variable(3, name="w"), fm.Parameter(nonneg=True, value=0.1)
    prob = fm.Problem()
    c = prob.add_client()
    A = c.data(X, name="X")
    c.minimize(fm.sum_squares(A @ w - c.data(y, name="y")))
    prob.server.minimize(lam * fm.sum_squares(w))
    first = prob.solve("dald")
    x1 = first.value(w).copy()
    lam.value = 10.0
    second = prob.solve("dald")
    assert np.abs(second.value(w) - x1).max() > 1e-2          # another point: w.value moved on
    assert first.value(fm.norm2(w)) == pytest.approx(np.linalg.norm(x1), rel=1e-12)
    np.testing.assert_allclose(first.value(A @ w - 1.0), X @ x1 - 1.0, rtol=1e-12)
    np.testing.assert_allclose(first.value(w[1:]), x1[1:], rtol=0)
    assert first.value(lam * fm.sum_squares(w)) == pytest.approx(0.1 * x1 @ x1, rel=1e-12)
    assert second.value(lam * fm.sum_squares(w)) == pytest.approx(10.0 * second.value(w) @ second.value(w), rel=1e-12)
    with pytest.raises(fm.FedModelError, match="not part of the problem"):
        first.value(fm.norm2(fm.Variable(3, name="v")))
    with pytest.raises(fm.FedModelError, match="takes a Variable or an expression"):
        first.value("w")
