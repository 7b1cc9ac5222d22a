"""A checkpoint's cost per save does not grow with the run (issue 25): the history's records
are encoded once (runtime/checkpoint_history.py), and a run checkpointed every round, stopped
and resumed (twice), still equals the uninterrupted run bitwise."""
import pytest

from fedmodel import backends
from fedmodel.runtime import checkpoint as ck
from conftest import StopRun, stop_after
from test_checkpoint import _same, least_squares


def _fedprox(rounds):
    return backends.FedProx(mu=1.0, step=0.05, local_steps=2, max_rounds=rounds, tol=0.0)


def test_the_work_of_a_save_stays_bounded_as_the_history_grows(tmp_path, monkeypatch):
    """The `_remap` visits of each save (a time-free measure of its encoding work): before, each
    save re-walked the whole history: 110 visits at the 1st save, 627 at the 40th (119 after)."""
    prob, _ = least_squares()
    visits, per_save = [0], []
    remap, write = ck._remap, ck.atomic_write

    def counting_remap(*args):
        visits[0] += 1
        return remap(*args)

    def counting_write(path, data):
        per_save.append(visits[0])
        visits[0] = 0
        write(path, data)
    monkeypatch.setattr(ck, "_remap", counting_remap)
    monkeypatch.setattr(ck, "atomic_write", counting_write)
    prob.solve(_fedprox(40), checkpoint=tmp_path / "run.ckpt", checkpoint_every=1)
    saves = per_save[:-1]                      # (the last write: the finished run's outcome)
    assert len(saves) == 40 and min(saves) > 0
    assert max(saves[15:]) <= max(saves[:15])
    saved = ck.read(tmp_path / "run.ckpt")
    assert saved["outcome"] is not None and len(saved["outcome"]["history"]) == 40


def test_a_run_saved_every_round_resumes_twice_to_the_uninterrupted_run(tmp_path):
    prob, _ = least_squares(seed=3)
    reference = prob.solve(_fedprox(25))
    path = tmp_path / "run.ckpt"
    with pytest.raises(StopRun):
        prob.solve(_fedprox(25), checkpoint=path, callback=stop_after(8))
    saved = ck.read(path)
    assert saved["iteration"] == 7 and ck.FORMAT == 5
    # (in the loop a record's round is its "iteration": FedProx renames it when the run ends)
    strip = lambda h: repr([sorted((("round" if k == "iteration" else k), v)  # noqa: E731
                                   for k, v in r.items() if k != "time") for r in h])
    assert strip(saved["loop"]["history"]) == strip(reference.history[:7])
    with pytest.raises(StopRun):               # the resumed run appends to the records it read
        prob.solve(_fedprox(25), checkpoint=path, resume=True, callback=stop_after(9))
    assert ck.read(path)["iteration"] == 15
    _same(prob.solve(_fedprox(25), checkpoint=path, resume=True), reference)
    _same(prob.solve(_fedprox(25), checkpoint=path, resume=True), reference)   # finished: as recorded


def test_a_history_handed_over_anew_is_encoded_afresh(tmp_path):
    """A list that does not continue the one saved before (another list, shorter, or with other
    records) is encoded whole: the cache never stitches two histories together."""
    from fedmodel.runtime.checkpoint_history import AppendedHistory
    import pickle
    import io
    cache, encode = AppendedHistory(), dict
    first = [{"round": 1}, {"round": 2}]
    cache.bytes_of(first, encode)
    first.append({"round": 3})
    assert cache.bytes_of(first, encode) and cache.encoded == 3
    other = [{"round": 1, "x": 0.5}, {"round": 2}, {"round": 3}, {"round": 4}]

    def records(pickles):
        stream, out = io.BytesIO(pickles), []
        while stream.tell() < len(pickles):
            out.append(pickle.load(stream))
        return out
    assert records(cache.bytes_of(other, encode)) == other and cache.encoded == 7
    assert records(cache.bytes_of(other[:2], encode)) == other[:2]
