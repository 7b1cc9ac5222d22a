"""Plans over many directions (`codegen.Plan(batched=...)`, `compiler.directions`) and the
Hessians `NodeProgram.hessian` builds from them (issue 27, item 3): one derived Hessian-vector
product, evaluated for all unit directions at once, instead of one derivation and one product
per column."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings

import fedmodel as fm
from fedmodel.atoms import add, multiply, sum as sum_
from fedmodel.compiler.codegen import Plan
from fedmodel.compiler.directions import Unbatchable
from fedmodel.expression import Parameter
from fedmodel.runtime.program import compile_programs

from test_gradients import set_values, smooth_models


def product_expressions(f, variables):
    """∇(∇f · v) per variable, with the directions v as Parameters (as NodeProgram derives it)."""
    directions = [Parameter(v.shape, name=f"dir[{v.name}]") for v in variables]
    gv = add(*[sum_(multiply(fm.grad(f, v), d)) for v, d in zip(variables, directions)])
    return [fm.grad(gv, v) for v in variables], directions


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(smooth_models(max_depth=2))
def test_a_plan_over_directions_equals_one_product_per_direction(model):
    """Random smooth models of a vector x and a matrix X (index, reshape, broadcast, sums
    along axes, matrix products on either side, log-sum-exp, ...): the product's plan run with
    k directions stacked on a trailing axis returns, per direction, what the single-direction
    plan returns (to rounding: a matrix product may sum in another order)."""
    f, x, X, values = model
    set_values(values)
    variables = [x, X]
    products, directions = product_expressions(f, variables)
    point = [np.asarray(values[v], float) for v in variables]
    batched = Plan(products, variables + directions, batched=directions)
    single = Plan(products, variables)
    rng = np.random.default_rng(0)
    k = 4
    stacks = [rng.standard_normal(v.shape + (k,)) for v in variables]
    out = batched(*point, *stacks)
    for j in range(k):
        for d, stack in zip(directions, stacks):
            d.value = stack[..., j]
        expected = single(*point)
        for o, carried, e, v in zip(out, batched.batched_outputs, expected, variables):
            got = np.broadcast_to(o[..., j] if carried else o, v.shape)
            np.testing.assert_allclose(got, np.broadcast_to(e, v.shape), rtol=1e-10, atol=1e-12)


def logistic_client(d: int, rows: int = 40, sparse: bool = False, seed: int = 0):
    """A client with a mean logistic loss over `rows` × d data (sparse or dense), a logistic
    constraint (the AL term) and the proximal term; configured and given a multiplier."""
    rng = np.random.default_rng(seed)
    A0, A1 = rng.standard_normal((rows, d)), rng.standard_normal((rows // 2, d))
    if sparse:
        A0[rng.random(A0.shape) < 0.7] = 0.0
        A0 = sp.csr_matrix(A0)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    c = prob.add_client("c0")
    c.minimize(fm.mean(fm.logistic(c.data(A0, name="X0") @ w)))
    c.subject_to(fm.mean(fm.logistic(-(c.data(A1, name="X1") @ w))) <= 0.3)
    program = compile_programs(prob)["c0"]
    program.configure(beta=30.0, prox_weight=0.1, center=np.zeros(d))
    program.set_multipliers({next(iter(program.merit_ir.multipliers)): np.array(0.7)})
    return program, (A0.toarray() if sparse else A0), A1


def closed_form_hessian(A0, A1, z, beta=30.0, mu=0.7, prox=0.1, threshold=0.3):
    """∇² of mean(logistic(A0 z)) + (1/2β)([μ + β c]₊² − μ²) + (ω/2)‖z‖², c = mean(logistic(−A1 z)) − r."""
    s0 = 1.0 / (1.0 + np.exp(-(A0 @ z)))
    H = A0.T @ (A0 * (s0 * (1 - s0))[:, None]) / len(A0)
    s1 = 1.0 / (1.0 + np.exp(A1 @ z))                       # σ(−A1 z)
    c = np.mean(np.logaddexp(0.0, -(A1 @ z))) - threshold
    grad_c = -(A1.T @ s1) / len(A1)
    hess_c = A1.T @ (A1 * (s1 * (1 - s1))[:, None]) / len(A1)
    shifted = mu + beta * c
    if shifted > 0:
        H = H + beta * np.outer(grad_c, grad_c) + shifted * hess_c
    return H + prox * np.eye(len(z))


@pytest.mark.parametrize("sparse", [False, True])
def test_node_hessian_matches_the_closed_form(sparse):
    """Xᵀ diag(σ(1−σ)) X / m plus the AL term's β∇c∇cᵀ + [μ+βc]₊∇²c plus ω I, dense and sparse data."""
    program, A0, A1 = logistic_client(6, sparse=sparse)
    z = np.linspace(-0.5, 0.8, 6)
    H = program.hessian(z)
    np.testing.assert_allclose(H, closed_form_hessian(A0, A1, z), rtol=1e-12, atol=1e-14)
    assert program.compiled._hessian_plan is not None


def test_hessian_plan_is_derived_once_whatever_the_dimension():
    """The Hessian's plan has as many steps at d = 40 as at d = 4 (one product, run over all
    directions), where one derived product per column grew with d (346 steps at d = 17)."""
    small, _, _ = logistic_client(4)
    large, A0, A1 = logistic_client(40, rows=80)
    small.hessian(np.zeros(4))
    z = np.full(40, 0.05)
    np.testing.assert_allclose(large.hessian(z), closed_form_hessian(A0, A1, z), rtol=1e-12, atol=1e-14)
    assert large.compiled._hessian_plan.n_steps == small.compiled._hessian_plan.n_steps < 50


def test_a_step_without_a_rule_over_directions_is_refused_and_the_node_falls_back():
    """A plan over directions refuses a nonlinear step on a direction (Unbatchable); a node
    whose product plan could not carry directions computes its Hessian column by column."""
    d = Parameter(3, name="d")
    with pytest.raises(Unbatchable, match="exp"):
        Plan([fm.exp(d)], [d], batched=[d])
    program, A0, A1 = logistic_client(5)
    z = np.linspace(0.3, -0.2, 5)
    batched = program.hessian(z)
    program.compiled._hessian_plan = None
    np.testing.assert_allclose(program.hessian(z), batched, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(batched, closed_form_hessian(A0, A1, z), rtol=1e-12, atol=1e-14)


def test_a_newton_solve_loads_no_scipy():
    """The dense Newton path (Hessian plan, inversion, directions) needs numpy alone: a ProxAL
    solve of a constrained logistic model in a fresh interpreter imports no scipy, whose import
    was a third of a cold solve's (~0.3 s CPU of ~0.8 s). (Bound 0.7: at 0.6 client 1 alone is
    infeasible — its least class-1 loss is 0.659 by CVXPY — and the run ends before any solve.)"""
    import json
    import subprocess
    import sys
    code = """
import json, sys
import numpy as np
import fedmodel as fm
rng = np.random.default_rng(0)
w = fm.Variable(4, name="w")
prob = fm.Problem()
for i in range(2):
    c = prob.add_client(f"c{i}")
    c.minimize(fm.mean(fm.logistic(c.data(rng.standard_normal((30, 4)), name="X") @ w)))
    c.subject_to(fm.mean(fm.logistic(-(c.data(rng.standard_normal((20, 4)), name="Y") @ w))) <= 0.7)
res = prob.solve("proxal", max_outer=3, local_solver="newton")
print(json.dumps({"steps": res.iterations["inner"], "scipy": sorted(m for m in sys.modules if m.split(".")[0] == "scipy")}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["steps"] > 0
    assert found["scipy"] == []
