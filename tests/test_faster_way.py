"""`FasterWay`: runs the way whose recent blocks of calls were faster, probes the other one block
at a time with a doubling interval, and follows the timings when they change (fake timings)."""
from fedmodel.runtime.faster_way import BLOCK, MAX_INTERVAL, FasterWay


def _calls(faster: FasterWay, seconds: tuple[float, float], count: int) -> list[int]:
    """`count` calls, way w taking seconds[w]; the ways that ran."""
    ways = []
    for _ in range(count):
        way = faster.choose()
        faster.record(seconds[way])
        ways.append(way)
    return ways


def test_first_calls_of_each_way_are_not_timed():
    faster = FasterWay()
    _calls(faster, (1.0, 1.0), 1)                       # (way 0's first call: compiling, say)
    _calls(faster, (1e-3, 1.0), BLOCK)
    assert faster.means[0] == 1e-3


def test_the_slower_way_is_probed_at_doubling_intervals_up_to_the_cap():
    faster = FasterWay()
    ways = _calls(faster, (1.0, 2.0), 2 + BLOCK * 2000)
    assert faster.current == 0 and faster.interval == MAX_INTERVAL
    probes = [i for i in range(1, len(ways)) if ways[i] == 1 and ways[i - 1] == 0]
    gaps = [(b - a) // BLOCK - 1 for a, b in zip(probes, probes[1:])]   # blocks of way 0 between
    assert gaps[:8] == [2, 4, 8, 16, 32, 64, 128, 128]
    assert sum(ways) < 0.02 * len(ways)                 # the slower way: ≤ 1 block in 129 at the cap


def test_switches_to_the_faster_way_and_back_when_the_timings_change():
    faster = FasterWay()
    _calls(faster, (1.0, 0.5), 2 + BLOCK * 20)          # threads faster (an idle machine)
    assert faster.current == 1
    ways = _calls(faster, (1.0, 3.0), BLOCK * 3)        # load arrives: threads 3× slower
    assert faster.current == 0 and ways[-BLOCK:] == [0] * BLOCK
    _calls(faster, (1.0, 3.0), BLOCK * 1000)
    assert faster.current == 0 and faster.interval == MAX_INTERVAL
    _calls(faster, (1.0, 0.5), BLOCK * (MAX_INTERVAL + 2))   # the load leaves: found by a probe
    assert faster.current == 1


def test_a_running_way_that_slows_down_has_the_other_probed_at_once():
    faster = FasterWay()
    _calls(faster, (1.0, 2.0), 2 + BLOCK * 1000)        # way 1 probed rarely by now
    assert faster.interval == MAX_INTERVAL
    ways = _calls(faster, (2.5, 2.0), BLOCK * 3)        # way 0 slows to above way 1's last probe
    assert faster.current == 1 and ways[-BLOCK:] == [1] * BLOCK
