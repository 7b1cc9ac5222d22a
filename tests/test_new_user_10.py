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
