"""NodeProgram's parts (issue 26 item 4): a compiled merit, a state dataclass that save_state /
load_state copy whole (through the Flower wire codec too), and a table of local solvers that
`choose` picks from — a new solver is one table entry."""
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime import local_solvers, wire
from fedmodel.runtime.node_state import NodeState
from fedmodel.runtime.program import compile_programs

ROOT = Path(__file__).resolve().parents[1]


def _client(seed: int = 0, quadratic: bool = False):
    """A client with a logistic (or least-squares) loss, an inequality and an equality in its
    augmented Lagrangian and a private variable."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(4, name="w")
    prob = fm.Problem()
    c = prob.add_client("c0")
    A = c.data(rng.normal(size=(30, 4)), name="A")
    s = c.variable(name="s")
    loss = fm.sum_squares(A @ w - 1.0) / 30 if quadratic else fm.mean(fm.logistic(A @ w))
    c.minimize(loss + fm.square(s - 0.5))
    if not quadratic:
        c.subject_to((fm.sum_squares(w) <= 0.5).named("disk"))
    c.subject_to((w[0] + s == 0.2).named("link"))
    return prob


def _run_requests(program, rng):
    program.configure(beta=4.0, prox_weight=0.3, center=rng.normal(size=4))
    out = program.solve_local(linear=None, weight=0.0, anchor=None, x0=np.zeros(4), tol=1e-9,
                              method="newton")
    program.update_multipliers(out["x"])
    program.state["mine"] = {"u": np.arange(3.0), "k": 2, "name": "x"}
    return out["x"]


@pytest.mark.parametrize("quadratic", [False, True])
def test_save_state_copies_every_field_and_a_loaded_node_continues_bitwise(quadratic):
    """save_state's keys are NodeState's fields (none listed by hand); the state crosses the
    wire codec; a fresh program that loads it answers the next requests with the same bits as
    the node it came from (the chord Hessian of the Newton solve included)."""
    rng = np.random.default_rng(1)
    prob = _client(quadratic=quadratic)
    original = compile_programs(prob)["c0"]
    x = _run_requests(original, rng)
    state = original.save_state()["state"]
    assert set(state) == {f.name for f in fields(NodeState)}
    assert state["beta"] == 4.0 and state["prox_weight"] == 0.3 and state["hessian"].shape == (5, 5)
    assert set(state["mu"]) == ({"link"} if quadratic else {"disk", "link"})
    copy = compile_programs(prob)["c0"]        # a node rebuilt from the same model
    copy.load_state(wire.loads(wire.dumps(state, "node state"), "node state"))
    again = copy.save_state()["state"]
    for name in ("y", "y_center", "hessian"):
        assert np.array_equal(again[name], state[name])
    assert again["procedures"]["mine"]["k"] == 2 and again["beta"] == 4.0
    for request in (lambda p: p.merit(x + 0.01), lambda p: p.update_multipliers(x),
                    lambda p: p.solve_local(linear=np.ones(4), weight=0.2, anchor=x, x0=x,
                                            tol=1e-10, method="newton"),
                    lambda p: p.report(x)):
        mine, theirs = request(original), request(copy)
        for key in mine:
            assert np.array_equal(np.asarray(mine[key]), np.asarray(theirs[key])), key


def test_a_state_with_an_unknown_field_is_refused():
    program = compile_programs(_client())["c0"]
    state = program.save_state()["state"]
    with pytest.raises(fm.FedModelError, match="unknown fields \\['gamma'\\]"):
        program.load_state({**state, "gamma": 1.0})


def test_a_checkpoint_state_without_the_settings_keeps_the_node_s_own():
    """load_state of a state without β and ω (a checkpoint's) keeps the node's; ω_y = 1/β stays."""
    rng = np.random.default_rng(2)
    program = compile_programs(_client())["c0"]
    x = _run_requests(program, rng)
    saved = {k: v for k, v in program.save_state()["state"].items() if k not in NodeState.SETTINGS}
    before = program.merit(x)
    program.load_state(saved)
    assert program.node_state.beta == 4.0 and program.node_state.prox_weight == 0.3
    after = program.merit(x)
    assert after["value"] == before["value"] and np.array_equal(after["grad"], before["grad"])


def test_a_local_solver_is_one_table_entry(monkeypatch):
    """An entry added to `local_solvers.SOLVERS` is served by solve_local by its name; an
    unknown name is refused naming the table's entries."""
    program = compile_programs(_client())["c0"]
    program.configure(beta=2.0, prox_weight=0.0, center=np.zeros(4))
    seen = []

    def half_newton(prog, problem):     # Newton from the table, with half the steps allowed
        seen.append(problem.max_steps)
        return local_solvers.SOLVERS["newton"](prog, problem)
    monkeypatch.setitem(local_solvers.SOLVERS, "half-newton", half_newton)
    mine = program.solve_local(None, 0.0, None, np.zeros(4), 1e-10, method="half-newton", max_steps=50)
    assert seen == [50] and mine["grad_norm"] <= 1e-10
    other = compile_programs(_client())["c0"]
    other.configure(beta=2.0, prox_weight=0.0, center=np.zeros(4))
    reference = other.solve_local(None, 0.0, None, np.zeros(4), 1e-10, method="newton", max_steps=50)
    np.testing.assert_array_equal(mine["x"], reference["x"])
    with pytest.raises(fm.FedModelError, match="unknown local solver 'nope'.*'half-newton'"):
        program.solve_local(None, 0.0, None, np.zeros(4), 1e-8, method="nope")


def test_choose_picks_from_the_table_by_kind_and_size(monkeypatch):
    logistic, quadratic = compile_programs(_client())["c0"], compile_programs(_client(quadratic=True))["c0"]
    assert local_solvers.choose(logistic, "auto") == "newton"
    assert local_solvers.choose(quadratic, "auto") == "exact"
    monkeypatch.setattr(local_solvers.solvers, "DENSE_NEWTON_FLOATS", 10)    # 5 × 5 > 10
    assert local_solvers.choose(logistic, "auto") == "newton-cg"
    assert local_solvers.choose(quadratic, "auto") == "exact-cg"
    assert set(local_solvers.SOLVERS) >= {"prox", "exact", "newton", "exact-cg", "newton-cg", "gd", "lbfgs"}


@pytest.mark.parametrize("module", ["program", "compiled_merit", "node_state", "local_solvers"])
def test_the_node_program_modules_are_small(module):
    lines = len((ROOT / "fedmodel" / "runtime" / f"{module}.py").read_text().splitlines())
    assert lines < 400, f"fedmodel/runtime/{module}.py has {lines} lines; split it by concept"


@pytest.mark.parametrize("size", [12, 1000])       # bytes compared / array_equal on the bits
def test_the_merit_memo_matches_inputs_bit_for_bit(size):
    """`compiled_merit._same_bits`: equal bits only (-0.0 is not 0.0, a NaN is its own bits), the
    same shape, whatever the array's layout or integer dtype."""
    from fedmodel.runtime.compiled_merit import _same_bits
    x = np.linspace(-1.0, 1.0, size)
    assert _same_bits(x, x.copy()) and _same_bits(x, np.asfortranarray(x))
    y = x.copy()
    y[-1] = np.nextafter(y[-1], 2.0)
    assert not _same_bits(x, y)
    zero = np.zeros(size)
    assert not _same_bits(zero, -zero) and _same_bits(zero, np.zeros(size, dtype=int))
    nan = np.full(size, np.nan)
    assert _same_bits(nan, nan.copy())
    assert not _same_bits(x.reshape(-1, 2), x.reshape(2, -1)) and not _same_bits(x, x[:-1])
