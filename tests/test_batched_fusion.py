"""The batched plans compute a logistic loss's logistic(a) and sigmoid(a) with one
`logistic_and_sigmoid` (one e^{−|a|}): the results are bitwise those of the separate steps, with
and without the proximal weight's pruned variant, NaN and large arguments included."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime.batched_plan import BatchedPlan
from fedmodel.runtime.program import compile_programs


def _programs(n=12, d=5, seed=0):
    rng = np.random.default_rng(seed)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    for i in range(n):
        m = 3 + i % 5
        c = prob.add_client(f"c{i}")
        X, y = c.data(rng.normal(size=(m, d)), name="X"), c.data(np.sign(rng.normal(size=m)), name="y")
        c.minimize(fm.sum(fm.logistic(-fm.multiply(y, X @ w))) / m)
    return [p for p in compile_programs(prob).values() if p.role == "client"]


@pytest.mark.parametrize("prox_weight", [0.0, 0.7])
def test_fused_pair_equals_separate_steps_bitwise(monkeypatch, prox_weight):
    programs = _programs()
    for p in programs:
        p.configure(1.0, prox_weight, np.zeros(5))
    fused = BatchedPlan([p.value_grad_plan for p in programs])
    assert [op.__name__ for op in fused._ops].count("both") == 1     # the pair was found
    monkeypatch.setattr(BatchedPlan, "_fuse_logistic_sigmoid", lambda self, first: None)
    separate = BatchedPlan([p.value_grad_plan for p in programs])
    W = np.random.default_rng(1).normal(size=12 * 5) * 40.0     # saturated terms too
    W[:5] = np.nan
    for a, b in zip(fused(W), separate(W)):
        np.testing.assert_array_equal(a, b)
    # and each client's own compiled plan (an independent evaluation), away from the NaN client
    value, grad = fused(W)
    for i, p in enumerate(programs[1:], start=1):
        v, g = p.value_grad_plan(W[5 * i:5 * i + 5])
        assert value[i] == pytest.approx(float(v), rel=1e-12)
        np.testing.assert_allclose(grad[5 * i:5 * i + 5], np.ravel(g), rtol=1e-11, atol=1e-14)
