"""A resumed ProxAL run is the uninterrupted one also where its distance test asked the nodes
for their flat directions and curvatures (`proxal_flat`: the asked bases and the last iterates
are kept in the run's memo, which the checkpoint now carries). Before, a run stopped after the
memo was filled restarted it empty: it asked again (a round trip more) or later, and could stop
an outer iteration later at another point (newuser10's reproducer
nu10_resume_proxal_flat_memo.py: wine in raw units ×1e3)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedmodel as fm


class _Stop(Exception):
    pass


def _model():
    """Least squares on raw columns (means ±50, spreads 0.1–100) with an intercept, clients of 1,
    7, 40 and 300 rows, ridge 1e-2: ProxAL took 10 outer iterations and asked the nodes'
    curvature three times (at outer 5, 7 and 9) and their flat directions once; now 8, the
    clients' Hessians asked at outer 7 and 8 (`proxal_certificate`)."""
    rng = np.random.default_rng(1)
    d = 5
    w = fm.Variable(d + 1, name="w")
    prob = fm.Problem()
    mean, spread = rng.uniform(-50, 50, d), 10.0 ** rng.uniform(-1, 2, d)
    truth = rng.normal(size=d + 1)
    for n in (1, 7, 40, 300):
        X = np.hstack([mean + spread * rng.normal(size=(n, d)), np.ones((n, 1))])
        c = prob.add_client()
        c.minimize(fm.sum_squares(c.data(X) @ w - c.data(X @ truth + rng.normal(size=n))) / 348)
    prob.server.minimize(1e-2 * fm.sum_squares(w))
    return prob, w


def _summary(res, w):
    return (res.status, dict(res.iterations), res.info["communication"]["round_trips"],
            res.info["communication"]["by_kind"].get("proxal_newton_eval"), res.value(w).tobytes())


@pytest.mark.integration
def test_a_run_stopped_after_its_distance_test_asked_the_nodes_resumes_bit_for_bit(tmp_path):
    prob, w = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = _summary(prob.solve("proxal", inner="admm"), w)      # (Algorithm 2's distance test)
        # (branch newtoncert: the clients' Hessians now decide the distance here — refused at
        # outer 7, the run goes on from their Newton point, confirmed at outer 8 — and the nodes'
        # curvature memo is not asked: this checks the resume across that refusal)
        assert full[3] == 2 and full[1]["outer"] == 8
        for k in (6, full[1]["outer"] - 1):
            path = tmp_path / f"run{k}.ckpt"

            def stop(record, k=k, seen=[]):
                seen.append(record)
                if len(seen) == k:
                    raise _Stop
            with pytest.raises(_Stop):
                prob.solve("proxal", inner="admm", checkpoint=path, checkpoint_every=1, callback=stop)
            assert _summary(prob.solve("proxal", inner="admm", checkpoint=path, resume=True), w) == full, k
