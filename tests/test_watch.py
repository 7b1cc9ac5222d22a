"""DivergenceWatch: the one rule every backend uses to say "diverged"."""

import numpy as np
import pytest

from fedmodel.backends.watch import DivergenceWatch


def test_non_finite_is_divergence_and_named():
    watch = DivergenceWatch("X", hint="lower lr")
    assert not watch.check(1, z=np.ones(2))
    assert watch.check(2, z=np.array([1.0, np.nan]))
    assert watch.message == "X diverged at iteration 2: z has non-finite entries; lower lr"


def test_growth_is_measured_from_the_smallest_size_floored():
    watch = DivergenceWatch("X", hint="h", growth=100.0, floor=1.0)
    # falling to 1e-9 and coming back to 50 is not divergence: sizes below the floor count as 1
    assert not any(watch.check(k, r=s) for k, s in enumerate([10.0, 1e-9, 50.0], 1))
    assert watch.check(4, r=101.0)
    assert "‖r‖∞ grew to 101" in watch.message and "iteration 4" in watch.message


def test_quantities_are_tracked_separately():
    watch = DivergenceWatch("X", hint="h", growth=10.0)
    assert not watch.check(1, a=5.0, b=1.0)
    assert not watch.check(2, a=9.0, b=9.0)
    assert watch.check(3, a=9.0, b=11.0) and "‖b‖∞" in watch.message


def test_report_warns_and_records():
    watch = DivergenceWatch("X", hint="h")
    watch.check(7, z=np.inf)
    info = {}
    with pytest.warns(RuntimeWarning, match="iteration 7"):
        assert watch.report(info) == "diverged"
    assert info["diverged"] == watch.message


def test_an_all_zero_start_sets_no_scale():
    """Backends start from zeros: a large but finite answer (targets of size 1e7) is not growth."""
    watch = DivergenceWatch("X", hint="h")
    assert not watch.check(0, z=np.zeros(3))
    assert not watch.check(1, z=np.full(3, 2e7)) and not watch.check(2, z=np.full(3, 3e7))
    assert watch.check(3, z=np.full(3, 3e13))


def test_a_run_that_blew_up_in_its_first_iteration_is_caught_at_the_ceiling():
    """A first size of 1e150 sets no baseline the growth test can use; 1e300 is not an answer."""
    watch = DivergenceWatch("X", hint="h")
    assert not watch.check(0, z=np.zeros(2))
    assert not watch.check(1, z=np.full(2, 1e90))
    assert watch.check(2, z=np.full(2, 1e150)) and "‖z‖∞ reached 1e+150" in watch.message


def test_fedadmm_with_a_step_that_blows_up_at_once_says_diverged():
    """Found in review: FedADMM(lr=1e6, safeguard=False, adaptive=False) on a logistic model
    ended "max_iterations" with iterates of 1e300 (the logistic's gradient is bounded: the
    first round is already huge and finite, so no growth was measured after it)."""
    import fedmodel as fm
    from fedmodel.backends import FedADMM
    rng = np.random.default_rng(0)
    w = fm.Variable(3, name="w")
    prob = fm.Problem()
    for i in range(4):
        c = prob.add_client(f"c{i}")
        X = c.data(rng.normal(size=(20, 3)), name="X")
        b = c.data(np.sign(rng.normal(size=20)), name="b")
        c.minimize(fm.sum(fm.logistic(-fm.multiply(b, X @ w))) / 20)
    with pytest.warns(RuntimeWarning, match="diverged"):
        result = prob.solve(FedADMM(lr=1e6, safeguard=False, adaptive=False, max_rounds=5))
    assert result.status == "diverged"


def _first_stop(trace) -> int | None:
    watch = DivergenceWatch("dp-admm", hint="")
    for t, value in enumerate(trace):
        if watch.check_shrinking(t, "residual", value, floor=1e-6):
            return t
    return None


def test_a_residual_that_rises_then_falls_is_not_called_infeasible():
    """The shape of non-private DP-IADMM on NP adult (3 clients, feasible): 2.6e-4 at round 0,
    rising to 8.7e-4 by round 650, then falling ~0.05 % a round. "Not shrinking" alone called it
    diverged at round 199 (the reproduction's fast subset failed)."""
    t = np.arange(3000)
    rising = 2.6e-4 + 6.1e-4 * (1 - np.exp(-t / 200.0))
    trace = np.where(t < 650, rising, rising[649] * np.exp(-5e-4 * (t - 649)))
    assert _first_stop(trace) is None


@pytest.mark.parametrize("shape, stop", [("settled", 199), ("grown", 200)])
def test_a_residual_that_settles_or_grows_is_called_infeasible(shape, stop):
    """An infeasible model's multipliers grow by its least violation every round: the residual
    settles at a constant (wobbling) or grows with them (the equilibrated NP model, r = 0.05)."""
    t = np.arange(3000)
    trace = 0.3 + 1e-3 * np.sin(t) if shape == "settled" else 1.0 + 40.0 * t
    assert _first_stop(trace) == stop      # the first two windows of 100 rounds (grown: past round 0)
