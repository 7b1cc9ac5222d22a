"""A held-constraint local step's cost (issue 27 item 3, branch held100): the method of
multipliers of "local-al" writes the multipliers without the Parameter setter's checks (the
same evaluations; a non-finite ν still meets them)."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.errors import DataError
from fedmodel.runtime import local_al
from fedmodel.runtime.program import compile_programs
from test_proxal_local import one_client


def test_multipliers_written_unchecked_evaluate_as_checked():
    prob, _, _, _ = one_client(threshold=0.4)
    programs = [compile_programs(prob, client_sets=True, client_constraints=True)["c0"] for _ in range(2)]
    x, count = np.full(4, 0.2), fm.Parameter.assignments
    programs[0].set_multipliers({"np": np.array(1.7)})
    programs[1].set_multipliers({"np": np.array(1.7)}, checked=False)
    assert fm.Parameter.assignments == count + 2        # (compiled caches compare the count)
    v0, g0 = programs[0].value_grad(x, programs[0].y)
    v1, g1 = programs[1].value_grad(x, programs[1].y)
    assert v0 == v1 and np.array_equal(g0, g1)
    assert float(programs[1].node_state.mu["np"]) == 1.7


def test_a_nan_multiplier_still_meets_the_setters_check():
    """A round whose g is NaN: ν + σg is not finite, written through the checked setter,
    which refuses it (the user's `param.value = nan` as well)."""
    prob, _, _, _ = one_client(threshold=0.4)
    program = compile_programs(prob, client_sets=True, client_constraints=True)["c0"]
    z0 = np.zeros((1, program.n_shared + program.n_private))

    def rest(Z, idx):
        return Z[idx], np.zeros(len(idx), dtype=int), np.zeros(len(idx))
    with pytest.raises(DataError, match="non-finite"):
        local_al.solve_rows([program], z0, 1e-8, rest, lambda Z, idx: np.full((len(idx), 1), np.nan))
    with pytest.raises(DataError, match="non-finite"):
        program.merit_ir.multipliers["np"].value = np.nan
