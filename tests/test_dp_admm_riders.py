"""Issue 27 items 1/4 for DP-ADMM's OutP: round t's client step carries the old w^t (output
perturbation of the prox step at w^t), so the history's report at w^{t+1} cannot ride on it; it
rides on round t + 1's step, which carries w^{t+1}, served before that step (the clients' state
the report would have seen by itself). Round t's record is completed — and handed to the
callback — then; the last round's report goes alone, and a run that checkpoints asks each
report at the end of its round (the callback runs before the checkpoint is written). The
reference is `_Unfolded`, an executor that sends every rider as a request of its own."""
from __future__ import annotations

import numpy as np
import pytest

from fedmodel import backends
from test_ledger_riders import _Unfolded, _history, _model, check_report_rides

ROUNDS = 7


def _outp(**options):
    return backends.DPADMM(epsilon=1.0, max_rounds=ROUNDS, seed=3, tol=0, variant="outP", **options)


@pytest.mark.parametrize("executor", ["serial", "batched"])
def test_outp_report_rides_on_the_next_rounds_step(executor):
    new, old = check_report_rides(_outp, executor, ROUNDS)
    assert all(r["violation"] == 0.0 for r in new["history"])
    assert new["ledger"].requests["dp_admm_step"] == ROUNDS
    assert sum(new["ledger"].requests.values()) == sum(old["ledger"].requests.values()) - (ROUNDS - 1)


def test_outp_thinned_reports_ride_on_the_round_after_theirs():
    """`log_every=3`: rounds 3 and 6 are logged (and the last, 7); the reports of 3 and 6 ride
    on rounds 4 and 7, the last one's goes alone."""
    prob, w, _ = _model(constrained=False)
    old, new = _outp(log_every=3).run(prob, executor=_Unfolded()), _outp(log_every=3).run(prob, executor="serial")
    assert [h["round"] for h in new["history"]] == [3, 6, 7]
    assert _history(new) == _history(old)
    np.testing.assert_array_equal(new["values"][w.uid], old["values"][w.uid])
    assert old["ledger"].requests["report"] == 3 and new["ledger"].requests["report"] == 1

