"""The merit's value-only plan (a line search's trial points): the numbers of `value_grad`'s
value, bitwise, per client (`NodeRows`) and stacked (`Group`), with the AL and proximal terms."""
import numpy as np

from fedmodel.runtime.batched_group import Group
from fedmodel.runtime.client_step import NodeRows
from fedmodel.runtime.program import compile_programs
from test_batched import _logistic


def test_values_alone_equal_value_grad_s_values_bitwise():
    prob, _ = _logistic(n=6, constraint=True)      # ragged rows, a client constraint (AL terms)
    programs = [p for p in compile_programs(prob).values() if p.role == "client"]
    rng = np.random.default_rng(4)
    for p in programs:
        p.configure(beta=30.0, prox_weight=0.2, center=rng.normal(size=p.n_shared))
    group = Group([p.name for p in programs], programs)
    X, Y = rng.normal(size=(len(programs), group.n_x)), np.zeros((len(programs), group.n_y))
    assert np.array_equal(group.value(X, Y), group.value_grad(X, Y)[0])
    for p, x in zip(programs, X):
        one = NodeRows(p)
        assert np.array_equal(one.value(x[None, :], Y[:1]), one.value_grad(x[None, :], Y[:1])[0])
