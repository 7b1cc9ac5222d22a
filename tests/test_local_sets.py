"""Local solves of a node whose prox terms are sets (ProxAL's `client_sets`: a client ball
projected in (19)) and the chord Newton matrices across weight changes (issue 25 item 3: the
MNIST d = 784 default spent 422 of 437 s in FISTA steps, then 103 of 171 s inverting Newton
matrices each time an ADMM ρ_i changed; docs/BENCHMARKS.md "Many features")."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.runtime import local_solvers
from fedmodel.runtime.program import compile_programs

D = 30


def _client(radius: float, private: bool = False, spread: float = 1.5):
    """One client: a logistic loss on columns scaled over `spread` decades (first-order steps
    slow down with it) and the ball ‖w‖₂ ≤ radius, projected in its local solves (client_sets)."""
    rng = np.random.default_rng(3)
    A = rng.normal(size=(200, D)) * np.logspace(0, spread, D)
    y = np.sign(rng.normal(size=200))
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    c = prob.add_client("c0")
    X = c.data(A * y[:, None], name="X")
    loss = fm.mean(fm.logistic(-(X @ w)))
    if private:
        s = c.variable(name="s")
        loss = loss + fm.square(s - 0.5)
    c.minimize(loss)
    c.subject_to(fm.norm2(w) <= radius)
    program = compile_programs(prob, client_sets=True)["c0"]
    program.configure(beta=300.0, prox_weight=1e-4, center=np.zeros(D))
    return program


def _counted(program, monkeypatch) -> list:
    """Count the merit's evaluations (the node's one data pass each)."""
    calls, inner = [], program.compiled.value_grad

    def value_grad(x, y):
        calls.append(1)
        return inner(x, y)
    monkeypatch.setattr(program.compiled, "value_grad", value_grad)
    return calls


def _solve(program, x0, tol):
    linear = np.linspace(-1e-2, 1e-2, D)
    return program.solve_local(linear=linear, weight=0.05, anchor=np.full(D, 0.1), x0=x0, tol=tol)


def _kkt(program, x) -> float:
    """‖∇ + normal cone element‖∞ of the local problem at x (its optimality residual)."""
    linear = np.linspace(-1e-2, 1e-2, D)
    g = program.merit(x)["grad"] + linear + 0.05 * (x - 0.1)
    return float(np.max(np.abs(program.prox_remainder(x, g))))


def test_an_inactive_ball_is_solved_by_newton_in_few_evaluations(monkeypatch):
    """The ball is inactive at the warm start and at the answer: Newton on the smooth part,
    a few evaluations (main's FISTA: 32,056 on this scaling at tol 1e-10), the same point as an
    unconstrained Newton solve, inside the ball."""
    program = _client(radius=100.0)
    calls = _counted(program, monkeypatch)
    out = _solve(program, np.zeros(D), 1e-10)
    assert local_solvers.choose(program, "auto") == "prox"
    assert len(calls) <= 30, len(calls)
    assert out["grad_norm"] <= 1e-10 and np.linalg.norm(out["x"]) < 100.0
    free = _client(radius=100.0)
    reference = free.solve_local(linear=np.linspace(-1e-2, 1e-2, D), weight=0.05, anchor=np.full(D, 0.1),
                                 x0=np.zeros(D), tol=1e-12, method="newton")["x"]
    np.testing.assert_allclose(out["x"], reference, rtol=0, atol=1e-9)


def test_a_minimizer_outside_the_ball_falls_back_to_projected_steps():
    """Warm start inside, the smooth minimizer outside: the constrained problem is solved
    (Newton inside the ball, `ball_newton`; main: FISTA): on the sphere, KKT residual ≤ tol."""
    program = _client(radius=0.2, spread=0.5)
    out = _solve(program, np.zeros(D), 1e-8)
    assert abs(np.linalg.norm(out["x"]) - 0.2) <= 1e-9
    assert _kkt(program, out["x"]) <= 1e-7


def test_a_ball_active_at_the_warm_start_is_not_tried_by_newton(monkeypatch):
    """A warm start on the sphere with the gradient pointing out (the normal cone active):
    no smooth Newton matrix (`newton_matrix`) formed — Newton inside the ball (`ball_newton`)
    from the start; the same answer as from 0."""
    program = _client(radius=0.2, spread=0.5)
    start = _solve(program, np.zeros(D), 1e-8)["x"]
    formed = []
    monkeypatch.setattr(local_solvers, "newton_matrix", lambda *a: formed.append(1))
    again = _solve(program, start, 1e-10)
    assert formed == []
    assert abs(np.linalg.norm(again["x"]) - 0.2) <= 1e-9 and _kkt(program, again["x"]) <= 1e-9


def _newton_direction(inverse, g):
    return inverse.matrix @ g


def test_a_new_uniform_weight_reuses_the_hessian_s_eigendecomposition(monkeypatch):
    """The chord Hessian with weights 0.1, 0.2, 0.4, 0.8, 0.2 (an ADMM's ρ_i rebalanced): one
    eigendecomposition in all and no inversion (main: an inversion per weight), each
    direction (∇² + wI)⁻¹g to 1e-10 relative; a node resumed with that Hessian (the factors
    forgotten) takes bitwise the same directions."""
    program = _client(radius=100.0)
    z = np.full(D, 0.01)
    counts = {"inv": 0, "eigh": 0}
    for name in counts:
        inner = getattr(np.linalg, name)

        def counted(A, _name=name, _inner=inner):
            counts[_name] += 1
            return _inner(A)
        monkeypatch.setattr(np.linalg, name, counted)
    g = np.random.default_rng(0).normal(size=D)
    H = program.hessian(z)
    for weight in (0.1, 0.2, 0.4, 0.8, 0.2):
        inverse = local_solvers.newton_matrix(program, z, np.full(D, weight), fresh=False)
        exact = np.linalg.solve(H + weight * np.eye(D), g)
        np.testing.assert_allclose(_newton_direction(inverse, g), exact, rtol=1e-10, atol=0)
    assert counts == {"inv": 0, "eigh": 1}
    before = _newton_direction(inverse, g)
    program._factor_cache = None            # as `load_state` leaves it
    np.testing.assert_array_equal(
        _newton_direction(local_solvers.newton_matrix(program, z, np.full(D, 0.2), fresh=False), g), before)


@pytest.mark.parametrize("private", [False, True])
def test_other_weights_still_invert(monkeypatch, private):
    """Weights that differ by entry, or a node with private variables (the weight shifts only
    the shared block), are inverted as before, one inversion per weight."""
    program = _client(radius=100.0, private=private)
    N = D + (1 if private else 0)
    z = np.full(N, 0.01)
    inversions = []
    inner = np.linalg.inv
    monkeypatch.setattr(np.linalg, "inv", lambda A: inversions.append(1) or inner(A))
    H = program.hessian(z)
    g = np.random.default_rng(1).normal(size=N)
    weights = [np.linspace(0.1, 0.2, D), np.linspace(0.2, 0.3, D)] if not private else [np.full(D, 0.1), np.full(D, 0.3)]
    for weight in weights:
        inverse = local_solvers.newton_matrix(program, z, weight, fresh=False)
        A = H.copy()
        A[np.arange(D), np.arange(D)] += weight
        np.testing.assert_allclose(_newton_direction(inverse, g), np.linalg.solve(A, g), rtol=1e-9, atol=0)
    assert len(inversions) == 2
