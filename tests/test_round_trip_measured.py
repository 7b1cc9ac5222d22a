"""Issue 27, item 5's open point: `backend="auto"` reads a *measured* round-trip cost where the
executor has one (`Executor.measure_round_trip`: a no-op "probe" to every client, timed), the
executor's fixed hint `round_trip_cost` otherwise. The slow transport here is a serial executor
whose every request advances an injected clock (no sleeping, no wall-clock assertion). On main
there is no measurement: auto reads the class hint only, and these tests fail."""
from __future__ import annotations

import pytest

import fedmodel as fm
from benchmarks import bench_rounds
from fedmodel.backends import auto, proxal_inner
from fedmodel.runtime import executor as executors
from fedmodel.runtime.executor import SerialExecutor, round_trip_estimate
from fedmodel.runtime.program import compile_programs


class SlowWire(SerialExecutor):
    """A serial executor whose transport costs `delay` seconds a round trip on its own clock;
    its class hint (the serial one) says round trips are cheap."""

    def __init__(self, delay: float = 2.0):
        super().__init__()
        self.now, self.delay = 0.0, delay
        self.clock = lambda: self.now

    def _dispatch_batch(self, kind, payloads):
        self.now += self.delay          # the wire, before the nodes' own (untimed) work
        return super()._dispatch_batch(kind, payloads)


class SlowWireOnStart(SlowWire):
    """`SlowWire` that measures when a run opens it (as the Ray executor does)."""
    measure_on_start = True


@pytest.fixture(autouse=True)
def _forget_measurements(monkeypatch):
    """Each test starts with no measurement in the process (they are kept by class)."""
    monkeypatch.setattr(executors, "MEASURED_ROUND_TRIPS", {})


def test_a_measured_slow_executor_makes_auto_do_more_local_work(monkeypatch):
    # Algorithm 2's rule (a model beyond the Newton budget): Newton steps are picked at any cost
    monkeypatch.setattr(proxal_inner, "newton_reading", lambda problem, executor=None: (False, "off (the test)"))
    prob, _ = bench_rounds.logistic_ball(5)
    ex = SlowWire(delay=2.0)
    before = auto.Auto().choose(prob, executor=ex)          # the hint: cheap
    assert before.round_trip_cost == pytest.approx(1e-4)
    assert before.backend == "proxal" and "local_tol_cap" not in before.settings
    assert "fixed hint" in " ".join(before.reasons)

    ex.start(compile_programs(prob))
    assert ex.measure_round_trip() == pytest.approx(2.0)   # one probe: 2.0 > SLOW_PROBE
    assert ex.now == pytest.approx(2.0)
    after = auto.Auto().choose(prob, executor=ex)
    assert after.round_trip_cost == pytest.approx(2.0)
    assert after.settings == {"local_tol_cap": auto.DEAR_LOCAL_TOL_CAP}
    assert "measured on this executor" in " ".join(after.reasons)
    # a new instance of the same kind of executor: the measurement made in this process
    assert round_trip_estimate(SlowWire())[0] == pytest.approx(2.0)
    # other kinds keep their own: the serial executor's hint
    assert auto.round_trip_cost("serial") == auto.round_trip_cost(SerialExecutor()) == 1e-4
    ex.close()


def test_a_fast_probe_is_repeated_and_the_fastest_kept():
    prob, _ = bench_rounds.logistic_ball(5)
    ex = SlowWire(delay=1e-3)
    ex.start(compile_programs(prob))
    trips = ex.ledger.round_trips
    assert ex.measure_round_trip(repeats=3) == pytest.approx(1e-3)
    assert ex.now == pytest.approx(3e-3)                    # three probes, each under SLOW_PROBE
    assert ex.ledger.round_trips == trips                   # a probe is not the algorithm's traffic
    assert "local_tol_cap" not in auto.Auto().choose(prob, executor=ex).settings   # cheap: the default local work
    ex.close()


def test_an_executor_measures_when_a_run_opens_it_and_auto_uses_it(monkeypatch):
    monkeypatch.setattr(proxal_inner, "newton_reading", lambda problem, executor=None: (False, "off (the test)"))   # (as above)
    prob, _ = bench_rounds.logistic_ball(5)
    ex = SlowWireOnStart(delay=3.0)
    res = prob.solve("proxal", executor=ex, max_outer=1)
    assert ex.measured_round_trip_cost == pytest.approx(3.0)
    plain = prob.solve("proxal", executor="serial", max_outer=1)
    # the probe leaves the run as it was: the same iterates and the same booked round trips
    assert res.ledger.round_trips == plain.ledger.round_trips
    assert res.objective == plain.objective
    chosen = prob.solve(executor=ex, overrides={"proxal": {"max_outer": 1}})   # auto, measured
    assert chosen.info["auto"]["round_trip_cost"] == pytest.approx(3.0)
    assert chosen.info["auto"]["settings"]["local_tol_cap"] == auto.DEAR_LOCAL_TOL_CAP


def test_measuring_an_executor_that_holds_no_clients_is_refused():
    with pytest.raises(fm.FedModelError, match="start it on a run's programs first"):
        SerialExecutor().measure_round_trip()
