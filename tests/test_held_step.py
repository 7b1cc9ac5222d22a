"""A held-constraint local step's cost (issue 27 item 3, branch held100): the method of
multipliers of "local-al" steps ν by the secant of its last two rounds (`local_al._dual_steps`:
the exact step where g is linear in ν, fewer rounds, the same answer), and writes the
multipliers without the Parameter setter's checks (a non-finite ν still meets them)."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.errors import DataError
from fedmodel.runtime import local_al, local_solvers
from fedmodel.runtime.program import compile_programs
from test_proxal_local import one_client

SIGMA = 300.0


def test_the_secant_step_lands_on_the_root_of_a_linear_g():
    """g(ν) = a(ν − ν*): from the rounds at ν0 and ν1 the factor is s = −1/(σa), and
    ν1 + sσg(ν1) = ν* exactly; s stays in [1, MAX_DUAL_STEP] (an increasing or flat g: the
    cap) and is kept where two rounds at positive ν are not known."""
    star = np.array([[2.0], [5.0], [1.0]])
    a = np.array([[-0.9], [-0.1], [-2.0]]) / SIGMA         # ρ = 0.1, 0.9, −1 a round
    nu0 = np.array([[1.0], [4.0], [0.5]])
    nu1 = nu0 + SIGMA * a * (nu0 - star)                   # a round of the method of multipliers
    g0, g1 = a * (nu0 - star), a * (nu1 - star)
    sigma = np.full((3, 1), SIGMA)
    step = local_al._dual_steps(np.ones((3, 1)), nu1, g1, nu0, g0, sigma)
    np.testing.assert_allclose(step, [[1 / 0.9], [local_al.MAX_DUAL_STEP], [1.0]], rtol=1e-10)
    np.testing.assert_allclose(nu1[0] + step[0] * SIGMA * g1[0], star[0], rtol=1e-12)
    kept = np.full((4, 1), 1.3)
    flat = local_al._dual_steps(kept, np.array([[2.0], [2.0], [0.0], [3.0]]),
                                np.array([[1e-3], [1e-3], [1e-3], [2e-3]]),
                                np.array([[1.0], [np.nan], [1.0], [2.0]]),
                                np.array([[1e-3], [np.nan], [2e-3], [1e-3]]), np.full((4, 1), SIGMA))
    # g unchanged: the cap; no last round / ν = 0 now: kept; g rising with ν: the cap
    np.testing.assert_allclose(flat, [[local_al.MAX_DUAL_STEP], [1.3], [1.3], [local_al.MAX_DUAL_STEP]])


def held_solve(monkeypatch, max_step: float) -> tuple[np.ndarray, float, int]:
    """test_proxal_local's active one-client local solve with the dual step capped at
    `max_step` (1: the plain method of multipliers): (x, ν, rounds)."""
    prob, _, _, _ = one_client(threshold=0.4)
    program = compile_programs(prob, client_sets=True, client_constraints=True)["c0"]
    method = local_solvers.choose(program, "auto", local=False)
    rest, rounds = local_solvers.SOLVERS[method], []
    monkeypatch.setitem(local_solvers.SOLVERS, method, lambda p, lp: rounds.append(1) or rest(p, lp))
    monkeypatch.setattr(local_al, "MAX_DUAL_STEP", max_step)
    out = program.solve_local(linear=np.array([0.3, -0.2, 0.1, 0.4]), weight=0.5,
                              anchor=np.array([1.0, -1.0, 0.5, 0.0]), x0=np.zeros(4), tol=1e-10)
    assert "local_failed" not in program.state
    return out["x"], float(program.multipliers()["multipliers"]["np"]), len(rounds)


def test_secant_rounds_give_the_multiplier_method_answer_in_fewer_rounds(monkeypatch):
    """Both stop at KKT ≤ 1e-10 (test_proxal_local checks this solve against CVXPY): the same
    x and ν to that accuracy, the secant in fewer rounds."""
    x, nu, rounds = held_solve(monkeypatch, local_al.MAX_DUAL_STEP)
    x_mom, nu_mom, rounds_mom = held_solve(monkeypatch, 1.0)
    assert nu > 0.1                                     # active: the rounds mean something
    np.testing.assert_allclose(x, x_mom, atol=1e-8)
    assert nu == pytest.approx(nu_mom, rel=1e-7)
    assert rounds < rounds_mom


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
