"""The default path's cost per Newton step (issue 27 item 3, issue 25 item 3): the server's model
solved by one Cholesky solve where its unconstrained minimizer lies in its sets, the server's
value alone asked of it, the shorter steps' values left out after a confident full step, the
low-rank Hessians' check on the batched product and their sum by rank-k updates (also with
negative curvature), and β's cap on slow outer steps where the summed Hessian is singular."""
import numpy as np
import pytest

import fedmodel as fm
from fedmodel.backends import ProxAL
from fedmodel.backends.proxal_newton import NewtonInner
from fedmodel.backends.proxal_verdict import slow_rise_cap
from fedmodel.backends.proxal_newton_model import model_minimizer
from fedmodel.runtime import low_rank
from fedmodel.runtime.batched import BatchedExecutor
from fedmodel.runtime.executor import SerialExecutor, open_executor
from fedmodel.runtime.hessian_sum import hessian_sum
from fedmodel.runtime.program import NodeProgram

from test_newton_big import logistic


def _opened(prob, executor):
    backend = ProxAL(inner=NewtonInner())
    return open_executor(executor, backend.compile(prob), backend.procedures)


def _server_with_ball(radius: float, d: int = 6):
    """A problem whose server holds the ball ‖w‖₂ ≤ radius (its prox), and its server program."""
    prob, w = logistic(n=2, d=d, rows=4)
    prob.server.subject_to(fm.norm2(w) <= radius)
    return prob, ProxAL(inner=NewtonInner()).compile(prob)["server"]


def _quadratic(d: int = 6):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((2 * d, d))
    return np.full(d, 0.1), rng.standard_normal(d), A.T @ A / d + 0.1 * np.eye(d)


def test_an_inactive_set_takes_the_newton_point():
    """The model's unconstrained minimizer inside the server's ball is returned exactly (main's
    FISTA stopped at its tolerance: ~1e-4 off with tol 1e-3)."""
    _, server = _server_with_ball(radius=100.0)
    z, G, H = _quadratic()
    u = model_minimizer(server, z, G, H, np.zeros(6), 1e-3)
    np.testing.assert_allclose(u, z - np.linalg.solve(H, G), rtol=1e-12, atol=1e-12)


def test_an_active_set_still_takes_fista():
    """Outside the ball the Newton point is not the answer: FISTA's is, on the sphere, where the
    model's gradient points outward (KKT)."""
    _, server = _server_with_ball(radius=0.05)
    z, G, H = _quadratic()
    u = model_minimizer(server, z, G, H, np.zeros(6), 1e-9)
    assert np.linalg.norm(z - np.linalg.solve(H, G)) > 0.05
    assert np.linalg.norm(u) == pytest.approx(0.05, rel=1e-9)
    slope = -(G + H @ (u - z))                      # = ν u, ν ≥ 0
    np.testing.assert_allclose(slope, (slope @ u / (u @ u)) * u, atol=1e-6)
    assert slope @ u > 0


def test_the_server_value_alone_is_its_evaluations(monkeypatch):
    """`proxal_newton_value`: the server's value and trial values as "proxal_newton_eval" gives
    them, bit for bit, with no Hessian (computed twice a step before: d × d at d = 784)."""
    prob, _ = _server_with_ball(radius=100.0)
    z, d, offsets = np.linspace(-0.3, 0.3, 6), np.ones(6), np.array([-0.5, -0.75])
    with _opened(prob, SerialExecutor()) as ex:
        full = ex.call("server", "proxal_newton_eval", x=z, direction=d, offsets=offsets)
        asked = []
        monkeypatch.setattr(NodeProgram, "hessian", lambda self, z: asked.append(z))
        alone = ex.call("server", "proxal_newton_value", x=z, direction=d, offsets=offsets)
        bare = ex.call("server", "proxal_newton_value", x=z)
    assert not asked
    assert alone["value"] == full["value"] == bare["value"] and np.array_equal(alone["values"], full["values"])
    assert np.asarray(bare["values"]).size == 0


@pytest.mark.integration      # (~1 s: two Newton runs and CVXPY)
def test_a_confident_full_step_asks_no_shorter_steps(monkeypatch):
    """After a full step that decreased ℓ as its quadratic model said the next one is asked without the 8
    trial values (the line search's message), and the answer is CVXPY's."""
    prob, w = logistic(n=4, d=8, rows=30, seed=2)
    asked = []
    original = NewtonInner._evaluate

    def spy(self, ex, z, settings=None, direction=None, offsets=None):
        asked.append("first" if settings else "trials" if direction is not None else "alone")
        return original(self, ex, z, settings, direction, offsets)
    monkeypatch.setattr(NewtonInner, "_evaluate", spy)
    res = prob.solve(ProxAL(inner=NewtonInner()))
    ref = prob.solve("cvxpy")
    assert res.status == "converged"
    np.testing.assert_allclose(res.value(w), ref.value(w), atol=1e-4 * max(1.0, np.abs(ref.value(w)).max()))
    assert asked.count("alone") >= 1 and asked.count("trials") >= 1, asked     # (main: every step "trials")


def test_the_low_rank_check_rides_on_the_batched_product(monkeypatch):
    """The packed Hessian's check direction comes out of the product that makes C (no
    Hessian-vector plan call of its own) and the packed form is the dense Hessian."""
    monkeypatch.setattr(low_rank, "MIN_UNKNOWNS", 0)      # the packed form at d = 12
    prob, _ = logistic(n=3, d=12, rows=3, seed=4)
    with _opened(prob, BatchedExecutor()) as ex:
        program = ex.groups[0].programs[0]
        z = np.linspace(-1, 1, 12)
        assert low_rank.applies(program)
        calls = []
        monkeypatch.setattr(NodeProgram, "hvp", lambda self, z, v: calls.append(v))
        packed = low_rank.hessian(program, z)
        monkeypatch.undo()
        dense = program.hessian(z)
    assert packed is not None and not calls
    np.testing.assert_allclose(low_rank.dense(packed, low_rank.basis_of(program)), dense,
                               rtol=1e-12, atol=1e-12 * np.abs(dense).max())


def test_the_rank_k_sum_takes_negative_curvature(monkeypatch):
    """Clients with a concave data term (C of both signs) sum to the dense Hessians' sum."""
    monkeypatch.setattr(low_rank, "MIN_UNKNOWNS", 0)      # the packed form at d = 12
    rng = np.random.default_rng(5)
    prob, w = fm.Problem(name="signs"), fm.Variable(12, name="w")
    for i in range(4):
        c = prob.add_client(f"c{i}")
        Z = c.data(rng.standard_normal((3, 12)), name="Z")
        c.minimize(fm.mean(fm.logistic(Z @ w)) - 0.05 * fm.sum_squares(Z @ w) + fm.sum_squares(w))
    with _opened(prob, BatchedExecutor()) as ex:
        group = ex.groups[0]
        assert low_rank.applies(group.programs[0])
        X, Y = np.tile(np.linspace(-1, 1, 12), (group.n, 1)), np.zeros((group.n, 0))
        total = hessian_sum(group, X, Y, range(group.n))
        dense = sum(group.programs[r].hessian(X[r]) for r in range(group.n))
    assert np.linalg.eigvalsh(dense - 2 * group.n * np.eye(12)).min() < 0     # (negative data curvature)
    np.testing.assert_allclose(total, dense, rtol=1e-12, atol=1e-12 * np.abs(dense).max())


def test_the_slow_rise_cap_reads_the_hessian():
    """β's rise on slow outer steps stops at 1e7 where the last summed Hessian was singular (no
    curvature read) and at `beta_max` where it was positive definite, or while the iterates run
    outward (a model with no minimizer: `runaway` needs β to rise); `beta_max` for Algorithm 2."""
    inner = NewtonInner()
    backend = ProxAL(inner=inner)
    assert slow_rise_cap(backend, []) == inner.singular_beta_max == 1e7
    inner.last_reading = (None, None, {"distance": 1.0, "curvature": 1e-9, "gradient": 1.0})
    assert slow_rise_cap(backend, []) == NewtonInner.beta_max == 1e12
    inner.last_reading = (None, None, {"distance": np.inf, "curvature": 0.0, "gradient": np.inf})
    assert slow_rise_cap(backend, []) == 1e7
    outward = [{"violation": 0.0, "step": 1.0, "objective": 10.0 - k, "size": 2.0 * k} for k in range(8)]
    assert slow_rise_cap(backend, outward) == NewtonInner.beta_max
    assert slow_rise_cap(ProxAL(), []) == ProxAL().beta_max
