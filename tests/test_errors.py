"""Errors for bad input (docs/api.md §6): each test checks the exception type and that the message
names the offending block, data or expression. Every error is an `fm.FedModelError`, a
`ValueError`; nothing escapes as a bare KeyError / IndexError / numpy error."""
from __future__ import annotations

import numpy as np
import pytest

import fedmodel as fm


def raises(exc_type, *fragments):
    """pytest.raises plus: the message contains every fragment (names of blocks, data, …)."""
    class _Check:
        def __enter__(self):
            self.ctx = pytest.raises(exc_type)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            if not handled:              # another exception type: let it show as it is
                return False
            message = str(self.info.value)
            for fragment in fragments:
                assert fragment in message, f"{fragment!r} not in error message: {message}"
            assert isinstance(self.info.value, fm.FedModelError)
            assert isinstance(self.info.value, ValueError)
            return handled
    return _Check()


@pytest.fixture
def two_clients():
    w = fm.Variable(3, name="w")
    prob = fm.Problem(name="P")
    alice, bob = prob.add_client("alice"), prob.add_client("bob")
    Za = alice.data(np.ones((4, 3)), name="Za")
    Zb = bob.data(np.arange(12.0).reshape(4, 3), name="Zb")
    return prob, w, alice, bob, Za, Zb


def test_error_hierarchy():
    for cls in (fm.ShapeError, fm.DataError, fm.CurvatureError, fm.SmoothnessError,
                fm.TopologyError):
        assert issubclass(cls, fm.FedModelError)
    assert issubclass(fm.FedModelError, ValueError)


# ---- shapes ---------------------------------------------------------------------------------
def test_shape_error_add_names_both_operands_and_shapes():
    w, v = fm.Variable(3, name="w"), fm.Variable(4, name="v")
    with raises(fm.ShapeError, "w", "v", "(3,)", "(4,)"):
        w + v
    with raises(fm.ShapeError, "w", "v", "(3,)", "(4,)"):
        w - v
    with raises(fm.ShapeError, "w", "v", "(3,)", "(4,)"):
        fm.multiply(w, v)


def test_shape_error_matmul_names_both_operands_and_shapes(two_clients):
    prob, w, alice, *_ = two_clients
    X = alice.data(np.ones((5, 4)), name="X")
    with raises(fm.ShapeError, "X", "w", "(5, 4)", "(3,)"):
        X @ w
    with raises(fm.ShapeError, "w", "(3,)", "(5, 4)"):
        w @ np.ones((5, 4))
    W = fm.Variable((2, 3), name="W")
    with raises(fm.ShapeError, "W", "(2, 3)", "(2,)"):
        W @ fm.Variable(2, name="u")


def test_shape_error_constraint_sides():
    w, v = fm.Variable(3, name="w"), fm.Variable(4, name="v")
    with raises(fm.ShapeError, "w", "(3,)", "(4,)"):
        w <= np.ones(4)
    with raises(fm.ShapeError, "w", "v", "(3,)", "(4,)"):
        w == v
    with raises(fm.ShapeError, "w", "v", "(3,)", "(4,)"):
        w >= v


def test_shape_errors_of_indexing_and_values():
    w = fm.Variable(3, name="w")
    with raises(fm.ShapeError, "5", "3"):
        w[5]
    with raises(fm.ShapeError, "w", "(3,)", "(7,)"):
        fm.reshape(w, 7)
    with raises(fm.ShapeError, "'w'", "(3,)", "(2,)"):
        w.value = [1.0, 2.0]
    with raises(fm.ShapeError, "(2, 0)"):
        fm.Variable((2, 0), name="bad")


def test_nonscalar_objective_term_names_the_block(two_clients):
    prob, w, alice, bob, Za, Zb = two_clients
    with raises(fm.FedModelError, "'alice'", "Za @ w", "(4,)"):
        alice.minimize(Za @ w)
    with raises(fm.FedModelError, "(4,)"):
        prob.minimize(Za @ w)


# ---- data -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.array([1.0, np.nan]), np.array([[1.0], [np.inf]]),
                                 [1.0, -np.inf]], ids=["nan", "inf", "-inf-list"])
def test_non_finite_data_names_block_and_data(bad):
    prob = fm.Problem()
    client = prob.add_client("alice")
    with raises(fm.DataError, "'alice'", "Z", "non-finite"):
        client.data(bad, name="Z")
    assert client.data_items == []
    with raises(fm.DataError, "'server'", "S"):
        prob.server.data(bad, name="S")


@pytest.mark.parametrize("bad", [np.array(["a", "b"]), ["1.0", "x"], {"a": 1},
                                 np.array([object(), 1.0], dtype=object)],
                         ids=["str-array", "str-list", "dict", "object"])
def test_non_numeric_data_names_block_and_data(bad):
    client = fm.Problem().add_client("alice")
    with raises(fm.DataError, "'alice'", "'Z'", "numeric"):
        client.data(bad, name="Z")


def test_other_bad_data_names_block_and_data():
    client = fm.Problem().add_client("alice")
    with raises(fm.DataError, "'alice'", "'E'", "empty"):
        client.data(np.zeros((0, 3)), name="E")
    with raises(fm.DataError, "'alice'", "'E1'", "empty"):
        client.data([], name="E1")
    with raises(fm.DataError, "'alice'", "'N'", "None"):
        client.data(None, name="N")
    with raises(fm.DataError, "'alice'", "'C'", "complex"):
        client.data(np.array([1 + 2j, 3.0]), name="C")
    with raises(fm.DataError, "'alice'", "'R'"):
        client.data([[1.0, 2.0], [3.0]], name="R")
    with raises(fm.ShapeError, "'alice'", "'T'", "(2, 2, 2)"):
        client.data(np.ones((2, 2, 2)), name="T")
    with raises(fm.DataError, "'alice'", "'X'", "expression"):
        client.data(fm.Variable(2, name="x"), name="X")
    client.data(np.ones(2), name="D")
    with raises(fm.FedModelError, "'alice'", "'D'"):
        client.data(np.zeros(2), name="D")
    # numeric input that numpy can read is fine: booleans, ints, nested lists
    assert client.data([[True, False]], name="B").value.dtype == float


def test_non_finite_values_and_constants():
    w = fm.Variable(2, name="w")
    with raises(fm.DataError, "'w'"):
        w.value = [np.nan, 1.0]
    with raises(fm.DataError, "non-finite"):
        w + np.array([1.0, np.inf])
    p = fm.Parameter(2, name="lam")
    with raises(fm.DataError, "'lam'"):
        p.value = [1.0, np.nan]


def test_empty_client_is_reported_at_solve_time():
    w = fm.Variable(2, name="w")
    prob = fm.Problem(name="P")
    busy = prob.add_client("busy")
    idle = prob.add_client("idle")                       # no error while building
    idle.data(np.ones(2), name="unused")
    idle.variable(2, name="u_idle")
    busy.minimize(fm.sum_squares(w - busy.data(np.ones(2), name="z")))
    with raises(fm.DataError, "'idle'"):
        prob.solve("cvxpy")
    idle.subject_to(fm.sum(w) <= 3)                      # a constraint is enough
    assert prob.solve("cvxpy").status == "converged"


def test_empty_problem_and_problem_without_variables():
    with raises(fm.FedModelError, "'nothing'", "empty"):
        fm.Problem(name="nothing").solve("cvxpy")
    prob = fm.Problem(name="constant")
    client = prob.add_client("alice")
    client.minimize(fm.sum(client.data([1.0, 2.0], name="z")))
    with raises(fm.FedModelError, "'constant'", "no variables"):
        prob.solve("cvxpy")


# ---- names ----------------------------------------------------------------------------------
def test_duplicate_client_names():
    prob = fm.Problem(name="P")
    prob.add_client("alice")
    with raises(fm.FedModelError, "'alice'", "unique"):
        prob.add_client("alice")
    with raises(fm.FedModelError, "'server'"):
        prob.add_client("server")
    with raises(fm.FedModelError, "5"):
        prob.add_client(5)
    prob.add_client()                                     # default name c1 (second client)
    with raises(fm.FedModelError, "'c1'"):
        prob.add_client("c1")
    assert [c.name for c in prob.clients] == ["alice", "c1"]


def test_bad_client_weight():
    prob = fm.Problem()
    with raises(fm.FedModelError, "'alice'", "weight"):
        prob.add_client("alice", weight=-1.0)
    with raises(fm.FedModelError, "'bob'", "weight"):
        prob.add_client("bob", weight="heavy")
    assert prob.clients == []


def test_duplicate_constraint_names(two_clients):
    prob, w, alice, bob, Za, Zb = two_clients
    alice.subject_to((fm.sum(Za @ w) <= 1).named("limit"))
    with raises(fm.FedModelError, "'limit'", "'alice'", "'bob'"):
        bob.subject_to((fm.sum(Zb @ w) <= 2).named("limit"))
    with raises(fm.FedModelError, "'limit'", "'alice'", "'server'"):
        prob.subject_to((fm.sum(w) <= 2).named("limit"))
    with raises(fm.FedModelError, "'twice'"):
        bob.subject_to((w <= 1).named("twice"), (w >= -1).named("twice"))
    assert bob.constraints == []                          # all-or-nothing
    con = (fm.sum(Zb @ w) <= 2).named("once")
    bob.subject_to(con)
    with raises(fm.FedModelError, "once", "'bob'"):
        bob.subject_to(con)
    with raises(fm.FedModelError, "once", "'bob'"):
        con.named("renamed")
    with raises(fm.FedModelError, "name 3"):
        (w <= 1).named(3)


def test_duplicate_variable_names_in_one_problem(two_clients):
    prob, w, alice, bob, Za, Zb = two_clients
    other_w = fm.Variable(3, name="w")
    alice.minimize(fm.sum_squares(Za @ w))
    bob.minimize(fm.sum_squares(Zb @ other_w))
    with raises(fm.FedModelError, "'w'", "'alice'", "'bob'"):
        prob.solve("cvxpy")
    prob2 = fm.Problem()
    client = prob2.add_client("carol")
    client.variable(2, name="shared")
    shared = fm.Variable(2, name="shared")
    priv = client.private_variables[0]
    client.minimize(fm.sum_squares(priv - shared))
    with raises(fm.FedModelError, "'shared'"):
        prob2.solve("cvxpy")


# ---- ownership ------------------------------------------------------------------------------
def test_client_reading_another_clients_data(two_clients):
    prob, w, alice, bob, Za, Zb = two_clients
    with raises(fm.FedModelError, "'alice'", "'bob'"):
        alice.minimize(fm.sum_squares(Zb @ w))
    with raises(fm.FedModelError, "'alice'", "'bob'"):
        alice.subject_to(fm.sum(Zb @ w) <= 1)
    with raises(fm.FedModelError, "'server'", "'alice'"):
        prob.server.minimize(fm.sum(Za @ w))
    with raises(fm.FedModelError, "'server'", "'bob'"):
        prob.server.subject_to(fm.norm2(Zb @ w) <= 1)
    assert alice.terms == [] and alice.constraints == [] and prob.server.terms == []


def test_private_variable_used_by_another_block(two_clients):
    prob, w, alice, bob, Za, Zb = two_clients
    u = alice.variable(3, name="u_alice")
    alice.minimize(fm.sum_squares(u - w))                 # fine on its owner
    with raises(fm.FedModelError, "'bob'", "'u_alice'", "'alice'"):
        bob.minimize(fm.sum_squares(u))
    with raises(fm.FedModelError, "'bob'", "'u_alice'", "'alice'"):
        bob.subject_to(u <= 1)
    with raises(fm.FedModelError, "'server'", "'u_alice'", "'alice'"):
        prob.server.minimize(fm.sum_squares(u))


def test_data_and_variables_of_another_problem(two_clients):
    prob, w, alice, bob, Za, Zb = two_clients
    other = fm.Problem(name="Q")
    q_client = other.add_client("alice")                  # same client name, other problem
    Zq = q_client.data(np.ones(3), name="Zq")
    uq = q_client.variable(3, name="uq")
    with raises(fm.FedModelError, "'alice'", "'Zq'", "another Problem"):
        alice.minimize(fm.sum(fm.multiply(Zq, w)))
    with raises(fm.FedModelError, "'alice'", "'uq'", "another Problem"):
        alice.minimize(fm.sum_squares(uq))
    with raises(fm.FedModelError, "'server'", "'uq'", "another Problem"):
        prob.server.subject_to(uq <= 1)
    with raises(fm.FedModelError, "'Zq'", "another Problem"):
        prob.minimize(fm.sum(fm.multiply(Zq, w)))
    with raises(fm.FedModelError, "'Zq'", "another Problem"):
        prob.subject_to(fm.sum(fm.multiply(Zq, w)) <= 1)
    assert all(not b.terms and not b.constraints for b in prob.blocks)
    # shared variables (made by fm.Variable) may appear in several problems, as in CVXPY
    q_client.minimize(fm.sum_squares(w - Zq))
    alice.minimize(fm.sum_squares(Za @ w))
    bob.minimize(fm.sum_squares(Zb @ w))
    assert other.solve("cvxpy").status == prob.solve("cvxpy").status == "converged"


def test_mixing_two_clients_in_one_central_term(two_clients):
    prob, w, alice, bob, Za, Zb = two_clients
    with raises(fm.FedModelError, "'alice'", "'bob'", "cannot be split"):
        prob.minimize(fm.sum(fm.multiply(Za @ w, Zb @ w)))
    with raises(fm.FedModelError, "'alice'", "'bob'"):
        prob.subject_to(fm.sum(fm.logistic(Za @ w + Zb @ w)) <= 1)


# ---- curvature, truth values, backends --------------------------------------------------------
def test_cvxpy_on_nonconvex_objective_names_the_term():
    w = fm.Variable(2, name="w")
    prob = fm.Problem(name="ncv")
    client = prob.add_client("alice")
    client.minimize(fm.sum_squares(w - client.data([1.0, 2.0], name="z")))
    client.minimize(-0.1 * fm.sum_squares(w))
    with raises(fm.CurvatureError, "'ncv'", "'alice'", "sum_squares(w)", "not convex"):
        prob.solve("cvxpy")


def test_cvxpy_on_nonconvex_constraint_names_it():
    w = fm.Variable(2, name="w")
    prob = fm.Problem(name="ncv")
    client = prob.add_client("bob")
    client.minimize(fm.sum_squares(w - client.data([1.0, 2.0], name="z")))
    client.subject_to((fm.sum_squares(w) >= 1).named("outside"))
    prob.server.subject_to((fm.square(w[0]) == 1).named("sphere"))
    with raises(fm.CurvatureError, "'outside'", "'sphere'"):
        prob.solve("cvxpy")
    assert not prob.is_convex()


def test_truth_value_of_constraints_and_expressions():
    w = fm.Variable(2, name="w")
    with raises(fm.FedModelError, "constraint", "truth value"):
        bool(w <= 1)
    with raises(fm.FedModelError, "truth value"):
        if fm.sum(w):
            pass
    with raises(fm.FedModelError, "truth value"):
        0 <= w <= 1                                       # chained comparison
    with raises(fm.FedModelError, "truth value"):
        (w <= 1) and (w >= 0)


def test_subject_to_and_minimize_take_the_right_things(two_clients):
    prob, w, alice, bob, Za, Zb = two_clients
    with raises(fm.FedModelError, "'alice'", "True"):
        alice.subject_to(True)
    with raises(fm.FedModelError, "'alice'", "w"):
        alice.subject_to(w)
    with raises(fm.FedModelError, "str"):
        alice.minimize("loss")
    with raises(fm.FedModelError, "1.5"):
        prob.subject_to(1.5)


def test_unknown_backend_and_solver():
    w = fm.Variable(2, name="w")
    prob = fm.Problem()
    prob.server.minimize(fm.sum_squares(w))
    with raises(fm.FedModelError, "'gurobi-magic'", "cvxpy"):
        prob.solve("gurobi-magic")
    with raises(fm.FedModelError, "3"):
        prob.solve(3)
    with raises(fm.FedModelError, "'NOPE'", "CLARABEL"):
        prob.solve("cvxpy", solver="NOPE")
    with raises(fm.FedModelError, "bogus"):
        prob.solve("cvxpy", bogus=1)
    from fedmodel.backends import CVXPY
    with raises(fm.FedModelError, "solver"):
        prob.solve(CVXPY(), solver="SCS")


def test_parameter_without_value_names_it_and_the_block():
    w = fm.Variable(2, name="w")
    target = fm.Parameter(2, name="target")
    prob = fm.Problem()
    client = prob.add_client("alice")
    client.minimize(fm.sum_squares(w - target))
    with raises(fm.FedModelError, "'target'", "'alice'", "value"):
        prob.solve("cvxpy")


def test_result_value_of_a_wrong_argument():
    w, v = fm.Variable(2, name="w"), fm.Variable(2, name="v")
    prob = fm.Problem()
    prob.server.minimize(fm.sum_squares(w))
    res = prob.solve("cvxpy")
    with raises(fm.FedModelError, "'v'"):
        res.value(v)
    with raises(fm.FedModelError, "str"):
        res.value("w")


def test_division_by_zero_names_the_expression():
    w = fm.Variable(2, name="w")
    with raises(fm.FedModelError, "w", "zero"):
        w / 0
