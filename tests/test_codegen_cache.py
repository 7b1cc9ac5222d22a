"""Plans of one structure share their generated code (codegen's `_STRUCTURES`), and each keeps
its own data and parameters; plans of other structures do not share it."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.compiler import codegen
from fedmodel.runtime.program import compile_programs

RNG = np.random.default_rng(7)


def _logistic_client(prob, name, w, m):
    X, b = RNG.standard_normal((m, w.size)), np.sign(RNG.standard_normal(m))
    c = prob.add_client(name)
    c.minimize(fm.sum(fm.logistic(-fm.multiply(c.data(b, name="b"), c.data(X, name="X") @ w))) / 7.0)
    return X, b


def _logistic_value_grad(X, b, w):
    """f = Σ log(1 + exp(−b ⊙ Xw)) / 7 and its gradient, written out in numpy."""
    z = -b * (X @ w)
    return np.sum(np.logaddexp(0.0, z)) / 7.0, X.T @ (-b / (1.0 + np.exp(-z))) / 7.0


def test_clients_of_one_structure_share_the_function_and_give_their_own_numbers():
    w = fm.Variable(4, name="w")
    prob = fm.Problem()
    # c0, c1: same shapes; c2: other row count (shape classes of its steps are the same)
    data = [_logistic_client(prob, f"c{i}", w, m) for i, m in enumerate((5, 5, 9))]
    programs = compile_programs(prob)
    clients = [programs[f"c{i}"] for i in range(3)]
    plans = [p.value_grad_plan for p in clients]
    assert len({p.structure_key for p in plans}) == 1
    assert plans[0]._run.__code__ is plans[1]._run.__code__ is plans[2]._run.__code__
    x = RNG.standard_normal(4)
    for program, (X, b) in zip(clients, data):
        program.configure(beta=2.0, prox_weight=0.5, center=np.ones(4))
        value, grad = _logistic_value_grad(X, b, x)
        value += 0.25 * np.sum((x - 1.0) ** 2)       # (ω/2)‖x − x̄‖², ω = 0.5
        grad += 0.5 * (x - 1.0)
        got = program.merit(x)
        assert got["value"] == pytest.approx(value, rel=1e-12)
        np.testing.assert_allclose(got["grad"], grad, rtol=1e-12, atol=1e-14)
        assert program.report(x)["objective"] == pytest.approx(value - 0.25 * np.sum((x - 1.0) ** 2),
                                                               rel=1e-12)
    # each plan reads its own parameters: changing one client's ω changes only its merit
    before = clients[1].merit(x)["value"]
    clients[0].configure(beta=2.0, prox_weight=3.0, center=np.ones(4))
    assert clients[1].merit(x)["value"] == before
    X0, b0 = data[0]
    assert clients[0].merit(x)["value"] == pytest.approx(
        _logistic_value_grad(X0, b0, x)[0] + 1.5 * np.sum((x - 1.0) ** 2), rel=1e-12)


def test_bitwise_equal_to_a_plan_compiled_without_the_cache():
    """A plan bound to cached code computes exactly what its own freshly generated code does."""
    w = fm.Variable(3, name="w")
    A1, A2 = RNG.standard_normal((6, 3)), RNG.standard_normal((6, 3))
    p1 = codegen.Plan([fm.sum_squares(A1 @ w - 1.0), fm.grad(fm.sum_squares(A1 @ w - 1.0), w)], [w])
    p2 = codegen.Plan([fm.sum_squares(A2 @ w - 1.0), fm.grad(fm.sum_squares(A2 @ w - 1.0), w)], [w])
    assert p1.structure_key == p2.structure_key and p1._run.__code__ is p2._run.__code__
    source, binders = p2._emit()
    namespace: dict = {}
    exec(compile(source, "<fresh>", "exec"), namespace)
    fresh = namespace["_make"](**{name: (p2.constant(ref) if kind == "const" else
                                         p2.constant(ref)[()] if kind == "scalar" else
                                         p2._steps[ref][0] if kind == "fn" else ref)
                                  for name, kind, ref in binders})
    x = RNG.standard_normal(3)
    for got, want in zip(p2(x), fresh(x)):
        assert np.array_equal(got, want)
    np.testing.assert_allclose(p2(x)[1], 2 * A2.T @ (A2 @ x - 1.0), rtol=1e-12)
    assert not np.allclose(p1(x)[1], p2(x)[1])


def test_different_structures_do_not_share():
    w = fm.Variable(3, name="w")
    s = fm.Variable(name="s")          # scalar: `pos` is inlined on it, called on a vector
    A = RNG.standard_normal((4, 3))
    squares = codegen.Plan([fm.sum_squares(A @ w)], [w])
    logistic = codegen.Plan([fm.sum(fm.logistic(A @ w))], [w])
    on_vector = codegen.Plan([fm.sum(fm.pos(A @ w))], [w])
    on_scalar = codegen.Plan([fm.pos(s)], [s])
    plans = [squares, logistic, on_vector, on_scalar]
    assert len({p.structure_key for p in plans}) == 4
    assert "max(" in on_scalar.source and "max(" not in on_vector.source
    # logistic and pos have the same source (a call of each step's bound function): the
    # compiled code may be one, the functions bound to it are each plan's own
    assert on_vector._run is not logistic._run
    x = RNG.standard_normal(3)
    assert squares(x)[0] == pytest.approx(np.sum((A @ x) ** 2), rel=1e-12)
    assert logistic(x)[0] == pytest.approx(np.sum(np.logaddexp(0.0, A @ x)), rel=1e-12)
    assert on_vector(x)[0] == pytest.approx(np.sum(np.maximum(A @ x, 0.0)), rel=1e-12)
    assert on_scalar(np.array(-2.0))[0] == 0.0 and on_scalar(np.array(1.5))[0] == 1.5


def test_a_parameter_and_a_constant_of_one_shape_do_not_share():
    """A parameter is read at call time, a constant is bound: different code."""
    w = fm.Variable(2, name="w")
    lam = fm.Parameter((), name="lam", value=3.0)
    by_parameter = codegen.Plan([lam * fm.sum_squares(w)], [w])
    by_constant = codegen.Plan([3.0 * fm.sum_squares(w)], [w])
    assert by_parameter.structure_key != by_constant.structure_key
    x = np.array([1.0, 2.0])
    assert by_parameter(x)[0] == by_constant(x)[0] == 15.0
    lam.value = 1.0
    assert by_parameter(x)[0] == 5.0 and by_constant(x)[0] == 15.0


def test_a_big_plan_reads_its_names_from_one_tuple_with_the_same_numbers(monkeypatch):
    """Above BIG_PLAN bound names the code indexes one tuple (Python compiles a closure over
    10⁵ names in quadratic time); the values are bitwise those of the named form."""
    w = fm.Variable(3, name="w")
    matrices = [RNG.standard_normal((4, 3)) for _ in range(30)]
    total = fm.sum(fm.logistic(matrices[0] @ w))
    for A in matrices[1:]:
        total = total + fm.sum(fm.logistic(A @ w))
    outputs = [total, fm.grad(total, w)]
    named = codegen.Plan(outputs, [w])
    monkeypatch.setattr(codegen, "BIG_PLAN", 10)
    monkeypatch.setattr(codegen, "_STRUCTURES", {})
    indexed = codegen.Plan(outputs, [w])
    assert "_b[" in indexed.source and "_b[" not in named.source
    x = RNG.standard_normal(3)
    for a, b in zip(named(x), indexed(x)):
        assert np.array_equal(a, b)
    assert indexed(x)[0] == pytest.approx(sum(np.sum(np.logaddexp(0.0, A @ x)) for A in matrices),
                                          rel=1e-12)
    np.testing.assert_allclose(indexed(x)[1], sum(A.T @ (1.0 / (1.0 + np.exp(-(A @ x))))
                                                  for A in matrices), rtol=1e-12)
