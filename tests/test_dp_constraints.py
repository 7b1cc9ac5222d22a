"""DP-IADMM with local constraints (backends/dp_admm/constrained.py): clients' norm balls and
prox-able terms by their prox after the ObjP step, data-dependent constraints (Neyman-Pearson's
class-1 loss ≤ r) through the Lagrangian with multipliers from released values. Checked: the
non-private runs against CVXPY; the clipped releases against their bounds on neighbouring data
sets (a record with a huge loss and gradient); the accounting of a round's two releases against
dp-accounting composed by hand; seeded runs; the refusals. Data are synthetic."""
import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld

import fedmodel as fm
from fedmodel.backends import CVXPY
from fedmodel.backends.dp_admm import DPADMM
from fedmodel.backends.dp_admm.constrained import LocalConstraints
from fedmodel.runtime.privacy import clipped_record_value
from fedmodel.runtime.program import compile_programs

D = 4


def _np_model(n=3, r=0.6, seed=0, X1_first=None):
    """Neyman-Pearson on `n` clients: minimize Σ_i mean class-0 logistic loss / n s.t. every
    client's mean class-1 loss ≤ r (active at r = 0.6: the classes overlap)."""
    rng = np.random.default_rng(seed)
    w = fm.Variable(D, name="w")
    prob = fm.Problem(name="np-small")
    for i in range(n):
        c = prob.add_client(f"c{i}")
        X0, X1 = rng.normal(size=(40, D)) + 0.5, rng.normal(size=(30, D)) + 0.5
        if i == 0 and X1_first is not None:
            X1[0] = X1_first
        X0d, X1d = c.data(X0, name=f"X0_{i}"), c.data(X1, name=f"X1_{i}")
        c.minimize(fm.mean(fm.logistic(X0d @ w)) / n)
        c.subject_to((fm.mean(fm.logistic(-(X1d @ w))) <= r).named(f"np[{c.name}]"))
    return prob, w


def _logistic_clients(n=3, seed=1):
    rng = np.random.default_rng(seed)
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    clients = []
    for i in range(n):
        c = prob.add_client(f"c{i}")
        A = rng.normal(size=(50, D)) + 1.0
        b = np.sign(rng.normal(size=50) + 0.3)
        clients.append((c, c.data(A, name=f"A{i}"), c.data(b, name=f"b{i}")))
    return prob, w, clients


@pytest.fixture(scope="module")
def neyman_pearson():
    prob, w = _np_model()
    return prob, w, prob.solve(CVXPY())


def test_non_private_neyman_pearson_matches_cvxpy(neyman_pearson):
    prob, w, ref = neyman_pearson
    assert max(ref.multipliers.values()) > 0.05            # the class-1 constraints are active
    res = prob.solve(DPADMM(max_rounds=5000, tol=1e-6))
    assert res.status == "converged"
    assert res.objective == pytest.approx(ref.objective, rel=1e-5)
    assert res.history[-1]["violation"] <= 1e-5
    assert np.max(np.abs(res.value(w) - ref.value(w))) < 1e-3
    for name, mu in ref.multipliers.items():                 # the clients' multipliers are μ*
        assert float(res.multipliers[name]) == pytest.approx(float(mu), abs=1e-3)


def test_norm_ball_and_l1_written_the_ordinary_way_match_cvxpy():
    """Every client has ‖w‖₂ ≤ 1 and its objective is `loss + λ·norm1(w)`: projection and prox
    after the ObjP step, no multiplier."""
    prob, w, clients = _logistic_clients()
    for c, A, b in clients:
        c.minimize(fm.mean(fm.logistic(-fm.multiply(b, A @ w))) + 0.02 * fm.norm1(w))
        c.subject_to(fm.norm2(w) <= 1.0)
    ref = prob.solve(CVXPY())
    res = prob.solve(DPADMM(max_rounds=5000, tol=1e-7))
    assert res.status == "converged"
    assert res.objective == pytest.approx(ref.objective, rel=1e-6)
    assert np.linalg.norm(res.value(w)) <= 1.0 + 1e-9
    assert np.max(np.abs(res.value(w) - ref.value(w))) < 1e-4


def test_private_run_keeps_the_ball_and_reports_a_formal_guarantee():
    prob, w, clients = _logistic_clients()
    for c, A, b in clients:
        c.minimize(fm.mean(fm.logistic(-fm.multiply(b, A @ w))))
        c.subject_to(fm.norm2(w) <= 0.5)
    res = prob.solve(DPADMM(epsilon=0.5, max_rounds=200, seed=3))
    assert np.linalg.norm(res.info["client_values"]["c0"]) <= 0.5 + 1e-12   # projected z_p
    privacy = res.info["privacy"]
    assert privacy["formal"] and privacy["round_shares"] == (1.0,)          # a set costs nothing
    assert privacy["basic"][0] == pytest.approx(200 * 0.5)
    line = str(res).splitlines()[-1]                            # the printed result says it too
    assert line.startswith("  privacy        ε = ") and "(PLD)" in line and line.endswith("formal")
    assert f"{privacy['pld'][0]:.4g} (PLD), {privacy['rdp'][0]:.4g} (RDP)" in line


def test_releases_move_by_at_most_their_bounds_on_neighbouring_data():
    """Replacing one class-1 record by one with a huge loss and gradient moves the released
    constraint value by ≤ 2B/I_1 and the Lagrangian's constraint part by ≤ its sensitivity."""
    C, B, mu = 1.0, 5.0, 0.7
    releases = []
    for first in (None, np.full(D, -40.0)):                   # loss ≈ 80·‖·‖, gradient ≈ 40·D
        prob, _ = _np_model(X1_first=first)
        program = compile_programs(prob, client_sets=True)["c0"]
        local = LocalConstraints()
        local.privatize(program, C, B, epsilon_c=1.0)
        (constraint,) = program.constraints
        program.merit_ir.multipliers[constraint.name].value = np.array(mu)
        z = np.random.default_rng(5).normal(size=D)
        _, extra, bound = local.gradient(program, z)
        value = constraint.expr
        releases.append((extra, bound, clipped_record_value(program, z, B / 30, of=value)))
    (g0, bound0, v0), (g1, bound1, v1) = releases
    assert bound0 == bound1 == pytest.approx(mu * 2 * C / 30)
    assert 0 < np.abs(g1 - g0).sum() <= bound0 + 1e-12
    assert 0 < abs(v1 - v0) <= 2 * B / 30 + 1e-12


def test_a_rounds_two_releases_are_accounted_by_dp_accounting():
    prob, _ = _np_model()
    eps, rounds = 0.5, 40
    res = prob.solve(DPADMM(epsilon=eps, max_rounds=rounds, tol=0, seed=1, constraint_share=0.25))
    privacy = res.info["privacy"]
    assert privacy["round_shares"] == (0.75, 0.25) and privacy["formal"]
    one = dp_accounting.ComposedDpEvent([dp_accounting.LaplaceDpEvent(1 / (eps * 0.75)),
                                         dp_accounting.LaplaceDpEvent(1 / (eps * 0.25))])
    accountant = pld.PLDAccountant(value_discretization_interval=1e-3)
    by_hand = accountant.compose(dp_accounting.SelfComposedDpEvent(one, rounds)).get_epsilon(1e-6)
    assert privacy["pld"][0] == pytest.approx(by_hand, rel=2e-3)
    assert privacy["pld"][0] <= privacy["advanced"][0] and privacy["basic"][0] == rounds * eps
    noise = res.info["sensitivity"]["c0"]                      # Δ̄ per round grows with μ
    assert noise[0] == pytest.approx(2 * 1.0 / 40) and noise.max() >= noise[0]


def test_private_runs_are_seeded_and_the_budget_holds():
    prob, w = _np_model()
    runs = [prob.solve(DPADMM(epsilon=1.0, max_rounds=60, seed=s, tol=0)) for s in (7, 7, 8)]
    assert np.array_equal(runs[0].value(w), runs[1].value(w))
    assert not np.allclose(runs[0].value(w), runs[2].value(w))
    budget = prob.solve(DPADMM(epsilon=1.0, max_rounds=10000, seed=7, epsilon_total=20.0))
    assert budget.status == "budget_exhausted" and budget.info["privacy"]["pld"][0] <= 20.0


def test_refusals_name_what_to_change():
    prob, _ = _np_model()
    with pytest.raises(fm.FedModelError, match="sensitivity='clip'"):
        prob.solve(DPADMM(epsilon=1.0, sensitivity="paper", max_rounds=2))
    with pytest.raises(fm.FedModelError, match="not in outP"):
        prob.solve(DPADMM(epsilon=1.0, variant="outP", max_rounds=2))
    prob, w, clients = _logistic_clients()
    for c, A, b in clients:
        c.minimize(fm.mean(fm.logistic(-fm.multiply(b, A @ w))))
        c.subject_to(fm.logistic(A @ w) <= 0.9)                 # one constraint per record
    with pytest.raises(fm.FedModelError, match="scalar constraint"):
        prob.solve(DPADMM(epsilon=1.0, max_rounds=2))
    for bad in (dict(dual_step=0.0), dict(constraint_share=1.0), dict(value_clip=-1.0)):
        with pytest.raises(fm.FedModelError):
            DPADMM(**bad)


def test_infeasible_constraints_are_never_reported_converged():
    """The residual settles (0.57: the least violation, by which the multipliers grow every
    round): "stalled", saying the model may be infeasible — not "diverged", nothing grew."""
    prob, _ = _np_model(r=0.05)                                 # no w has class-1 loss ≤ 0.05
    backend = DPADMM(max_rounds=3000, tol=1e-6)
    # each client alone is infeasible: the clients' check before the run would say so
    # (tests/test_client_infeasible.py); off, to pin DP-ADMM's own verdict
    backend.checks_clients_alone = False
    with pytest.warns(RuntimeWarning, match="common feasible point"):
        res = prob.solve(backend)     # equilibrated (the default)
    assert res.status == "stalled" and res.history[-1]["violation"] > 0.05
    assert "did not shrink" in res.info["stalled"] and "may be infeasible" in res.info["stalled"]


def test_record_values_split_a_value_by_records():
    """RecordGradients.record_values against each form's per-record terms written by hand."""
    from fedmodel.compiler.per_record import NotRecordSeparable, RecordGradients
    rng = np.random.default_rng(0)
    A, x = rng.normal(size=(7, 3)), rng.normal(size=3)
    w = fm.Variable(3, name="w")
    Ad = fm.Problem().add_client("c").data(A, name="A")
    cases = [(fm.mean(fm.logistic(-(Ad @ w))) - 0.3, np.logaddexp(0, -(A @ x)) / 7),
             (2 * fm.sum_squares(Ad @ w - 1.0) + fm.sum_squares(w), 2 * (A @ x - 1) ** 2),
             (-fm.norm1(Ad @ w) / 7 + 0.5, -np.abs(A @ x) / 7),
             (fm.sum(fm.logistic(Ad @ w)) * 3, 3 * np.logaddexp(0, A @ x))]
    for expr, terms in cases:
        records = RecordGradients(expr, [w], "c")
        assert records.record_values([x]) == pytest.approx(terms, rel=1e-12, abs=1e-15)
        w.value = x
        assert records.clipped_value([x], 1e9) == pytest.approx(expr.value, rel=1e-12)
        bound = np.median(np.abs(terms))
        expected = expr.value - terms.sum() + np.clip(terms, -bound, bound).sum()
        assert records.clipped_value([x], bound) == pytest.approx(expected, rel=1e-12)
    W = fm.Variable((3, 2), name="W")
    per_column = fm.sum(fm.logistic(Ad @ W), axis=0)          # a vector of sums over records
    records = RecordGradients(fm.mean(per_column), [W], "c")
    X = rng.normal(size=(3, 2))
    assert records.record_values([X]) == pytest.approx(np.logaddexp(0, A @ X).sum(axis=1) / 2)
    weighted = RecordGradients(fm.sum(fm.multiply(np.array([1.0, 2.0]), per_column)), [W], "c")
    with pytest.raises(NotRecordSeparable, match="cannot split"):
        weighted.record_values([X])                           # columns weighted differently


# ---- `fedmodel reproduce dp-constrained`: its fast subset (the full table: docs/privacy.md) ----
@pytest.fixture
def needs_data():
    from conftest import missing_data
    from fedmodel import datasets
    if not (datasets.data_dir() / "mnist37_train.npz").is_file():
        missing_data(f"MNIST 3 vs 7 not found in {datasets.data_dir()}")


def test_reproduction_models_are_the_stated_ones(needs_data):
    """The two models against numpy: NP's objective and class-1 losses, the ball, the errors."""
    from fedmodel.reproductions import dpadmm_constrained as rep
    np_exp, ball = rep.neyman_pearson(3, 300), rep.mnist_ball(3, 100)
    v = np.random.default_rng(0).normal(size=np_exp.w.shape) * 0.1
    np_exp.w.value = v
    objective = sum(float(t.value) for c in np_exp.problem.clients for t in c.terms)
    X0 = [c.terms[0].leaves() for c in np_exp.problem.clients]
    rows0 = [next(x.value for x in leaves if x.name.startswith("X0")) for leaves in X0]
    assert objective == pytest.approx(np.mean([np.mean(np.logaddexp(0, X @ v)) for X in rows0]))
    for c in np_exp.problem.clients:
        (constraint,) = c.constraints
        X1 = next(x.value for x in constraint.expr.leaves() if x.name.startswith("X1"))
        assert float(constraint.expr.value) == pytest.approx(np.mean(np.logaddexp(0, -X1 @ v)) - 0.3)
    from fedmodel.datasets import load_mnist, load_mnist37
    train, test = load_mnist37(), load_mnist("test")
    u = np.random.default_rng(1).normal(size=784) * 0.05
    ball.w.value = u
    A, b = train.X[:300], 2.0 * train.y[:300] - 1.0               # the 3 contiguous clients
    objective = sum(float(t.value) for c in ball.problem.clients for t in c.terms)
    assert objective == pytest.approx(np.mean(np.logaddexp(0, -b * (A @ u))))
    assert all(float(c.constraints[0].expr.value) == pytest.approx(np.linalg.norm(u) - 1.0)
               for c in ball.problem.clients)
    keep = (test.y == 3) | (test.y == 7)
    wrong = (test.X[keep] @ u > 0) != (test.y[keep] == 7)
    assert ball.test_error(u) == pytest.approx(np.mean(wrong))


@pytest.mark.integration     # a reproduction's subset on MNIST: CI runs it after the fast suite
def test_dp_constrained_fast_subset(needs_data, capsys):
    from fedmodel.reproductions import dpadmm_constrained as rep
    assert rep.run() == 0
    out = capsys.readouterr().out
    assert "| neyman-pearson (adult) | DP-IADMM ε̄=1 |" in out and "| mnist 3v7, norm ball | CVXPY |" in out
    assert "result: OK" in out


def test_noise_calibrated_to_a_total_budget():
    """epsilon="budget": the largest ε̄ whose max_rounds rounds (two releases each here) spend at
    most epsilon_total by PLD; 0.2 % more ε̄ would exceed it. The run uses every round."""
    from fedmodel.backends.dp_admm.accounting import pld_epsilon, round_event
    prob, _ = _np_model()
    rounds, budget = 50, 3.0
    res = prob.solve(DPADMM(epsilon="budget", epsilon_total=budget, max_rounds=rounds, seed=0, tol=0))
    privacy = res.info["privacy"]
    eps = privacy["per_round"][0]
    assert res.status == "max_iterations" and res.iterations["rounds"] == rounds
    assert budget / rounds < eps < budget and privacy["pld"][0] <= budget

    def spent(e):
        return pld_epsilon(dp_accounting.SelfComposedDpEvent(round_event("laplace", e, 0.0, (0.8, 0.2)),
                                                              rounds), 1e-6)
    assert spent(eps) <= budget < spent(eps * 1.002)
    with pytest.raises(fm.FedModelError, match="give epsilon_total"):
        DPADMM(epsilon="budget")
