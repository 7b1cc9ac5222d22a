"""Watching a run: fm.plot convergence figures, the progress bar's terminal switch and
Result.history as a DataFrame. The plotted data is checked against the history it came from."""
import io
import sys

import numpy as np
import pytest

import fedmodel as fm
from fedmodel import topologies
from fedmodel import backends, plotting
from fedmodel.result import History
from test_checkpoint import PROXAL, constrained_model, least_squares

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def proxal_run():
    prob, w = constrained_model()
    return prob, prob.solve(backends.ProxAL(**PROXAL))


def _titles(figure):
    return [ax.get_title() for ax in figure.axes]


def _line(ax, label):
    found = [line for line in ax.lines if line.get_label() == label]
    assert len(found) == 1, f"{label!r} in {[line.get_label() for line in ax.lines]}"
    return found[0]


@pytest.mark.integration   # (CI's integration run: the fast suite stays under 3 minutes)
def test_plot_writes_the_papers_figures(tmp_path, proxal_run):
    prob, res = proxal_run
    paths = fm.plot(res, tmp_path / "figs", topology=topologies.star(prob))
    assert [p.name for p in paths] == ["convergence.png", "clients.png", "topology.png"]
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000


def test_convergence_panels_show_the_history(proxal_run):
    prob, res = proxal_run
    figure = plotting.convergence_figure(res.history, threshold=1e-3, reference=5.0)
    assert _titles(figure) == ["objective", "constraint violation", "residuals",
                               "relative objective gap |f − f*| / |f*|"]
    objective, violation, residuals, gap = figure.axes
    line = _line(objective, "objective")
    np.testing.assert_array_equal(line.get_xdata(), [r["iteration"] for r in res.history])
    np.testing.assert_array_equal(line.get_ydata(), [r["objective"] for r in res.history])
    threshold = _line(violation, "threshold 0.001")
    assert list(threshold.get_ydata()) == [1e-3, 1e-3]
    assert violation.get_yscale() == "symlog" and violation.get_ylim()[1] >= 1e-3
    labels = {line.get_label() for line in residuals.lines}
    assert {"primal change ‖Δw‖∞", "multiplier change ‖Δμ‖∞", "ADMM certificate (22)"} <= labels
    assert residuals.get_yscale() == "log"
    expected = np.abs(np.array([r["objective"] for r in res.history]) - 5.0) / 5.0
    np.testing.assert_allclose(gap.lines[0].get_ydata(), expected)


def test_client_bands_are_mean_and_range_over_clients(proxal_run):
    prob, res = proxal_run
    figure = plotting.clients_figure(res.history, threshold=1e-3)
    assert _titles(figure) == ["local objectives", "local feasibility (constraint violation)"]
    values = np.array([[r["client_objective"][c] for c in ("c0", "c1", "c2")] for r in res.history])
    np.testing.assert_allclose(_line(figure.axes[0], "mean over clients").get_ydata(), values.mean(axis=1))
    band = figure.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(values.min()) and band.max() == pytest.approx(values.max())
    assert list(_line(figure.axes[1], "threshold 0.001").get_ydata()) == [1e-3, 1e-3]


def test_other_backends_histories(tmp_path):
    prob, w = least_squares()               # unconstrained: no violation panel, rounds on x
    res = prob.solve(backends.DPADMM(epsilon=1.0, max_rounds=20, seed=0, sensitivity=1.0))
    figure = plotting.convergence_figure(res.history, constrained=False)
    assert _titles(figure) == ["objective", "residuals"]
    assert figure.axes[0].get_xlabel() == "round"
    assert [p.name for p in fm.plot(res, tmp_path / "dp")] == ["convergence.png"]
    prob, w = constrained_model(2, server_l1=False)
    res = prob.solve(backends.DALD(rho=2.0, max_iterations=30), topology=topologies.path(prob))
    figure = plotting.convergence_figure(res.history)
    assert {"primal residual", "dual residual"} <= {line.get_label() for line in figure.axes[2].lines}


def test_missing_and_none_values_and_no_history(tmp_path):
    history = History([{"round": 1, "objective": 2.0, "primal_residual": None},
                       {"round": 2, "objective": 1.0, "primal_residual": 0.5, "violation": 0.1}])
    figure = plotting.convergence_figure(history)
    assert _titles(figure) == ["objective", "constraint violation", "residuals"]
    assert np.isnan(figure.axes[2].lines[0].get_ydata()[0])      # a gap, not a made-up value
    assert plotting.clients_figure(history) is None
    prob, w = least_squares()
    exact = prob.solve("cvxpy")
    assert fm.plot(exact, tmp_path / "none") == []                 # CVXPY has no iterations


def test_bad_plot_arguments(tmp_path, proxal_run):
    _, res = proxal_run
    with pytest.raises(fm.FedModelError, match="takes a Result"):
        fm.plot(42, tmp_path)
    (tmp_path / "file.png").write_bytes(b"x")
    with pytest.raises(fm.FedModelError, match="is a file"):
        fm.plot(res, tmp_path / "file.png")
    with pytest.raises(fm.FedModelError, match="threshold"):
        fm.plot(res, tmp_path, threshold=-1.0)
    with pytest.raises(fm.FedModelError, match="reference"):
        fm.plot(res, tmp_path, reference="optimum")


def test_history_as_a_dataframe(proxal_run):
    _, res = proxal_run
    assert isinstance(res.history, list)
    frame = res.history.to_frame()
    assert len(frame) == len(res.history)
    assert list(frame["objective"]) == [r["objective"] for r in res.history]
    assert list(frame["client_violation[c1]"]) == [r["client_violation"]["c1"] for r in res.history]
    assert frame["inner_certificates"].iloc[0] == res.history[0]["inner_certificates"]


# ---- progress bar ----------------------------------------------------------------------------
class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_with_verbose(monkeypatch):
    prob, w = constrained_model(1, server_l1=False)
    make = lambda: backends.DALD(rho=2.0, max_iterations=5)      # noqa: E731
    # off a terminal (a notebook, a log, a pipe) too: newuser12 (its line every 10 s, the last kept)
    for stream, verbose, shown in ((_Terminal(), True, True), (_Terminal(), False, False),
                                   (io.StringIO(), True, True), (io.StringIO(), False, False)):
        monkeypatch.setattr(sys, "stderr", stream)
        prob.solve(make(), verbose=verbose)
        text = stream.getvalue()
        assert ("DALD-CC" in text) == shown and bool(text) == shown, text


def test_progress_bar_shows_residuals_and_follows_the_record(monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Terminal())
    from fedmodel.backends.common import progress
    bar = progress(10, True, "X")
    bar.update({"objective": 1.0, "violation": 0.0, "iteration": 4, "certificate": 1e-3,
                "primal_residual": 2e-3, "dual_residual": 3e-4, "multiplier_change": None})
    assert bar.bar.n == 4
    assert bar.bar.postfix == "obj=1, viol=0.0e+00, pri=2.0e-03, dual=3.0e-04, cert=1.0e-03"
    bar.update({"objective": 1.0})                                   # no position: one step
    assert bar.bar.n == 5
    bar.close()


@pytest.mark.integration     # the CLI end to end: CI runs it after the fast suite
def test_cli_plot_option(tmp_path, capsys):
    from fedmodel.cli import main
    assert main(["run", "--clients", "2", "--topology", "star", "--plot", str(tmp_path)]) == 0  # ProxAL
    out = capsys.readouterr().out
    assert "convergence.png" in out and "clients.png" in out and "topology.png" in out
    assert (tmp_path / "convergence.png").read_bytes().startswith(PNG)
    assert main(["run", "--backend", "cvxpy", "--clients", "2", "--plot", str(tmp_path / "exact")]) == 0
    assert "none (backend cvxpy records no convergence history)" in capsys.readouterr().out
