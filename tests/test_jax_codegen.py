"""The JAX lowering of plans (fedmodel/compiler/jax_codegen.py) against the numpy plans:
values, gradients, Hessian-vector products and constraint residuals agree to 1e-10 on the
random models of tests/test_gradients.py (hypothesis), on node programs, and for a group of
ragged clients evaluated by one vmap (padding must not change any client's numbers)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

pytest.importorskip("jax")

import fedmodel as fm
from fedmodel.compiler.codegen import Plan
from fedmodel.compiler.jax_codegen import JaxGroupPlan, JaxPlan
from fedmodel.runtime.program import NodeProgram
from test_gradients import FIXED, _point, smooth_models

pytestmark = pytest.mark.integration     # JAX equivalence (compiles per shape): CI runs it after the fast suite

TOL = 1e-10


def assert_agree(numpy_out, jax_out, tol=TOL):
    assert len(numpy_out) == len(jax_out)
    for a, b in zip(numpy_out, jax_out):
        a = np.asarray(a, dtype=float)
        scale = max(1.0, float(np.max(np.abs(a), initial=0.0)))
        np.testing.assert_allclose(np.broadcast_to(b, a.shape) if np.ndim(b) < a.ndim else b, a,
                                   rtol=tol, atol=tol * scale)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(smooth_models())
def test_random_models_value_gradient_and_hvp_agree_with_numpy(model):
    f, x, X, values = model
    d_x = fm.Parameter(x.shape, name="dx", value=np.linspace(-1, 1, x.size))
    d_X = fm.Parameter(X.shape, name="dX", value=np.cos(np.arange(X.size)).reshape(X.shape))
    gx, gX = fm.grad(f, x), fm.grad(f, X)
    gv = fm.sum(fm.multiply(gx, d_x)) + fm.sum(fm.multiply(gX, d_X))   # ∇f · d
    outputs = [f, gx, gX, fm.grad(gv, x), fm.grad(gv, X)]              # value, ∇f, ∇²f d
    plan = Plan(outputs, [x, X])
    point = [values[x], values[X]]
    expected = plan(*point)
    assert np.isfinite(float(expected[0]))
    assert_agree(expected, JaxPlan(plan)(*point))


@pytest.mark.parametrize("name", list(FIXED))
def test_fixed_models_of_test_gradients_agree_with_numpy(name):
    """Every fixed model of tests/test_gradients.py (indexing, reshapes, broadcasts, powers,
    quad_form, log-sum-exp along axes, …): value and gradient."""
    shape, build, domain = FIXED[name]
    var = fm.Variable(shape, name="v")
    f = build(var)
    plan = Plan([f, fm.grad(f, var)], [var])
    point = _point(shape, domain, np.random.default_rng(11))
    assert_agree(plan(point), JaxPlan(plan)(point))


def test_nonsmooth_atoms_values_agree_with_numpy():
    """Atoms outside the smooth generator: norms, maximum, abs and the steps and argmax that
    nonsmooth derivatives are made of."""
    from fedmodel.atoms import ArgmaxAbs, Clip, Sign, Step
    w = fm.Variable(5, name="w")
    c = np.array([0.3, -1.0, 2.0, 0.0, -0.5])
    outputs = [fm.norm1(w - c), fm.norm2(w), fm.norm_inf(w - c), fm.maximum(w, c), fm.abs(w),
               Clip(w, -0.5, 0.7), Sign(w - c), Step(w), ArgmaxAbs(w - c), fm.huber(w, 0.4)]
    plan = Plan(outputs, [w])
    point = np.array([0.9, -0.2, 2.5, -1.1, 0.1])
    assert_agree(plan(point), JaxPlan(plan)(point))


def _client(rng, m, w, constrained=True):
    X, y = rng.standard_normal((m, 3)), rng.integers(0, 2, m) * 2.0 - 1
    terms = [fm.mean(fm.logistic(-fm.multiply(y, X @ w))) + 0.1 * fm.sum_squares(w)]
    constraints = [fm.sum_squares(X @ w) / m <= 2.0, X[0] @ w >= -1.0, X @ w <= 3.0] if constrained else []
    return terms, constraints


@pytest.mark.parametrize("constrained", [False, True])
def test_node_program_plans_agree_with_numpy(constrained):
    """A client's merit (AL terms, proximal term), objective and residual plans."""
    rng = np.random.default_rng(0)
    w = fm.Variable(3, name="w")
    terms, constraints = _client(rng, 20, w, constrained)
    program = NodeProgram("c0", "client", terms, constraints, [w], [])
    program.configure(beta=3.0, prox_weight=0.5, center=np.array([0.1, -0.2, 0.3]))
    if constrained:
        program.set_multipliers({name: np.full(np.shape(p.value), 0.7)
                                 for name, p in program.merit_ir.multipliers.items()})
    v = rng.standard_normal(3)
    for plan in (program.value_grad_plan, program.objective_plan, program.compiled.all_residuals):
        assert_agree(plan(v), JaxPlan(plan)(v))
    # a parameter changed after lowering is read at call time
    jplan = JaxPlan(program.value_grad_plan)
    program.configure(beta=7.0, prox_weight=0.0, center=np.zeros(3))
    assert_agree(program.value_grad_plan(v), jplan(v))


def test_group_of_ragged_clients_agrees_with_each_clients_plan():
    """One vmap over clients with 5 … 40 rows (zero-padded): every client's value, gradient
    and residuals as its own numpy plan gives them; padding changes no loss (mean, logistic,
    log-sum-exp over the rows) and no ragged residual."""
    rng = np.random.default_rng(1)
    programs = []
    for i, m in enumerate([5, 40, 17, 5, 23]):
        w = fm.Variable(3, name="w")
        X = rng.standard_normal((m, 3))
        terms = [fm.mean(fm.logistic(X @ w)) + 0.01 * fm.log_sum_exp(X @ w)]
        constraints = [fm.sum_squares(X @ w) / m <= 2.0]
        programs.append(NodeProgram(f"c{i}", "client", terms, constraints, [w], []))
    for p in programs:
        p.configure(beta=2.0, prox_weight=0.3, center=np.ones(3))
        p.set_multipliers({name: np.array(0.4) for name in p.merit_ir.multipliers})
    V = rng.standard_normal((len(programs), 3))
    group = JaxGroupPlan([p.value_grad_plan for p in programs])
    assert group.layout.ragged, "the data slots must be ragged in this test"
    out = group(V)
    for i, p in enumerate(programs):
        assert_agree(p.value_grad_plan(V[i]), [o[i] for o in out])
    # an output whose length differs between clients (per-row residuals): padded with zeros
    plans = []
    for m in (5, 40, 17):
        w = fm.Variable(3, name="w")
        plans.append(Plan([fm.sum_squares(w), rng.standard_normal((m, 3)) @ w - 0.5], [w]))
    jplans = JaxGroupPlan(plans)
    out = jplans(V[:3])
    for i, plan in enumerate(plans):
        (m,) = jplans.output_shapes[1][i]
        assert_agree(plan(V[i]), [out[0][i], out[1][i][:m]])
        assert np.all(out[1][i][m:] == 0.0)       # padded entries stay exactly 0


def test_ragged_softmax_regression_agrees_with_each_clients_plan():
    """Log-sum-exp along the classes of ragged rows (rows that are all padding must give no
    -inf or NaN), a mean over each client's own rows, a matrix variable: value and gradient."""
    rng = np.random.default_rng(5)
    plans = []
    for m in (3, 9, 6):
        W = fm.Variable((4, 3), name="W")
        X, Y = rng.standard_normal((m, 4)), np.eye(3)[rng.integers(0, 3, m)]
        f = fm.mean(fm.log_sum_exp(X @ W, axis=1) - fm.sum(fm.multiply(Y, X @ W), axis=1)) \
            + 0.1 * fm.sum(fm.log(1.0 + fm.square(X @ W)))
        plans.append(Plan([f, fm.grad(f, W)], [W]))
    V = rng.standard_normal((3, 4, 3))
    out = JaxGroupPlan(plans)(V)
    assert np.all(np.isfinite(out[0])) and np.all(np.isfinite(out[1]))
    for i, plan in enumerate(plans):
        assert_agree(plan(V[i]), [out[0][i], out[1][i]])


def test_padding_that_could_change_a_result_is_refused():
    """A data vector of length 1 for one client (numpy broadcasts it over the rows) and of
    length m for another: zero-padding would not broadcast it, so the group is refused."""
    rng = np.random.default_rng(2)
    plans = []
    for m, k in ((4, 4), (5, 1)):
        w = fm.Variable(2, name="w")
        plans.append(Plan([fm.sum(fm.exp(rng.standard_normal((m, 2)) @ w + rng.standard_normal(k)))], [w]))
    with pytest.raises(fm.FedModelError, match="broadcasts an axis of length 1"):
        JaxGroupPlan(plans)
    # plans of different structures are refused too
    w = fm.Variable(2, name="w")
    with pytest.raises(fm.FedModelError, match="one structure"):
        JaxGroupPlan([Plan([fm.sum(fm.exp(w))], [w]), Plan([fm.sum(fm.square(w))], [w])])
    # ragged rows with the same index (normalized keys are equal): padded, same numbers
    same = []
    for m in (3, 6):
        w = fm.Variable(2, name="w")
        same.append(Plan([fm.exp((rng.standard_normal((m, 2)) @ w)[1]) + fm.sum((rng.standard_normal((m, 2)) @ w)[:2])], [w]))
    V = rng.standard_normal((2, 2))
    out = JaxGroupPlan(same)(V)
    for i, plan in enumerate(same):
        assert_agree(plan(V[i]), [out[0][i]])


def test_missing_parameter_and_wrong_arity_are_clear_errors():
    w = fm.Variable(2, name="w")
    lam = fm.Parameter(name="lam")
    jplan = JaxPlan(Plan([lam * fm.sum_squares(w)], [w]))
    with pytest.raises(fm.FedModelError, match="lam"):
        jplan(np.ones(2))
    with pytest.raises(fm.FedModelError, match="takes 1 value"):
        jplan(np.ones(2), np.ones(2))


def test_lowering_leaves_jax_default_precision_alone(monkeypatch):
    """float64 is scoped to the lowered plans' traces and calls: jax's global default stays."""
    import jax
    import jax.numpy as jnp
    if jax.config.jax_enable_x64:
        pytest.skip("this process runs jax in 64-bit mode globally")
    w = fm.Variable(2, name="w")
    value = JaxPlan(Plan([fm.sum_squares(w)], [w]))(np.array([1.0, 1e-9]))[0]
    assert value.dtype == np.float64 and value == 1.0 + 1e-18
    assert not jax.config.jax_enable_x64
    assert jnp.ones(2).dtype == jnp.float32


def test_fedmodel_does_not_import_jax_until_it_is_used():
    """JAX is optional: importing fedmodel, the backends, the registry's executor names and
    the batched executor loads no jax (it loads with the lowering or executor='jax')."""
    import subprocess
    import sys
    code = ("import sys, fedmodel, backends, backends.fedadmm, backends.dald\n"
            "from fedmodel import registry\n"
            "import fedmodel.runtime.batched\n"
            "assert 'jax' in registry.names('executor')\n"
            "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_without_jax_the_lowering_and_executor_say_how_to_install_it(monkeypatch):
    import sys
    from fedmodel.runtime.jax_executor import JaxExecutor
    monkeypatch.setitem(sys.modules, "jax", None)         # `import jax` now fails
    monkeypatch.setitem(sys.modules, "jax.numpy", None)
    w = fm.Variable(2, name="w")
    with pytest.raises(fm.FedModelError, match=r"pip install 'fedmodel\[jax\]'"):
        JaxPlan(Plan([fm.sum_squares(w)], [w]))
    with pytest.raises(fm.FedModelError, match=r"pip install 'fedmodel\[jax\]'"):
        JaxExecutor()


def test_a_sum_of_thousands_of_terms_compiles():
    """A whole model's objective at n = 10⁴ clients is one sum of 10⁴ terms: its numpy plan
    evaluates it (no chain of thousands of `+` in one generated line, which Python's compiler
    refused with a RecursionError). (Not lowered to JAX here: XLA takes minutes to compile
    thousands of unstructured terms; clients' plans are vmapped instead.)"""
    from fedmodel.atoms import add
    w = fm.Variable(2, name="w")
    f = add(*[fm.sum_squares(w - np.full(2, float(i))) for i in range(5000)])
    expected = sum(2.0 * (1.0 - i) ** 2 for i in range(5000))
    assert Plan([f], [w])(np.ones(2))[0] == pytest.approx(expected, rel=1e-14)
