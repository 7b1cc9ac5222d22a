"""DALD backend (Fed-DALD-CC / Fed-DALD-DC): convergence to the CVXPY optimum on several
topologies, local constraints on a path, the Σμ_i = 0 invariant of (68), textbook consensus ADMM
equivalence, topology errors. Data are synthetic and known to the test."""
import networkx as nx
import numpy as np
import pytest

import fedmodel as fm
from fedmodel import topologies
from fedmodel.backends.dald import DALD
from fedmodel.runtime import SerialExecutor

D, N_CLIENTS, SAMPLES = 5, 5, 20
TIGHT = dict(eps_primal=1e-9, eps_dual=1e-9, max_iterations=3000)


def _data(n=N_CLIENTS, seed=0):
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=D)
    truth[2:4] = 0.0                                        # sparse: λ‖w‖₁ zeroes them
    parts = []
    for i in range(n):
        A = rng.normal(size=(SAMPLES, D)) + 0.3 * i         # heterogeneous (non-IID) clients
        parts.append((A, A @ truth + 0.1 * rng.normal(size=SAMPLES)))
    return parts


def _least_squares(n=N_CLIENTS, lam=0.0, seed=0):
    """Σ_i (1/m)‖A_i w − b_i‖² (+ λ‖w‖₁ on the server)."""
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for i, (A, b) in enumerate(_data(n, seed)):
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(A, name="A") @ w - c.data(b, name="b")) / SAMPLES)
    if lam:
        prob.server.minimize(lam * fm.norm1(w))
    return prob, w


def _rel_error(res, ref, w):
    x_star = ref.value(w)
    return np.max(np.abs(res.value(w) - x_star)) / max(1.0, np.max(np.abs(x_star)))


def test_cc_star_lasso_reaches_cvxpy_optimum():
    prob, w = _least_squares(lam=0.05)
    ref = prob.solve("cvxpy")
    assert np.sum(np.abs(ref.value(w)) < 1e-6) >= 1         # the L1 term is active
    res = prob.solve(DALD(**TIGHT), topology=topologies.star(prob))
    assert res.info["mode"] == "cc" and res.status == "converged"
    assert _rel_error(res, ref, w) <= 1e-5
    last = res.history[-1]
    assert last["primal_residual"] <= 1e-9 and last["dual_residual"] <= 1e-9
    assert abs(res.objective - ref.objective) <= 1e-7 * abs(ref.objective)


# every graph in CI's integration run (DC on a ring in the fast suite: test_dald_more's global constraints)
@pytest.mark.parametrize("name, build", [
    pytest.param("path", lambda p: topologies.path(p), marks=pytest.mark.integration),
    pytest.param("ring", lambda p: topologies.ring(p), marks=pytest.mark.integration),
    pytest.param("erdos_renyi", lambda p: topologies.erdos_renyi(p, 0.5, seed=3),
                 marks=pytest.mark.integration),
    pytest.param("tree", lambda p: topologies.from_networkx(
        nx.relabel_nodes(nx.balanced_tree(2, 2), {k: f"c{k}" for k in range(7)}), p),
        marks=pytest.mark.integration),
])
def test_dc_graphs_reach_cvxpy_optimum(name, build):
    n = 7 if name == "tree" else N_CLIENTS
    prob, w = _least_squares(n=n)
    ref = prob.solve("cvxpy")
    res = prob.solve(DALD(**TIGHT), topology=build(prob))
    assert res.info["mode"] == "dc" and res.status == "converged", name
    assert _rel_error(res, ref, w) <= 1e-5
    spread = max(np.max(np.abs(x - res.value(w))) for x in res.info["client_values"].values())
    assert spread <= 1e-8                                     # consensus reached


@pytest.mark.integration     # a DC run to 1e-9: CI runs it after the fast suite
def test_dc_hosts_server_block_on_a_client():
    """Server terms (λ‖w‖₁) on a graph without a server: the server block's program is one more
    DC node hosted by the last client of the sequence."""
    prob, w = _least_squares(lam=0.05)
    ref = prob.solve("cvxpy")
    res = prob.solve(DALD(**TIGHT), topology=topologies.ring(prob))
    assert res.info["order"] == ["c0", "c1", "c2", "c3", "c4", "server"]
    assert ("c4", "server") in res.info["consensus_multipliers"]
    assert res.status == "converged" and _rel_error(res, ref, w) <= 1e-5


def test_local_constraints_on_a_path_verify():
    prob, w = _least_squares(n=3)
    c0, c1, c2 = prob.clients
    c0.subject_to(fm.sum(w) <= -1.0)                          # active at the optimum
    c1.subject_to(w[0] >= 0.5)                                # active at the optimum
    c2.subject_to(fm.sum_squares(w) <= 2.0)                   # inactive (nonlinear)
    ref = prob.solve("cvxpy")
    res = prob.solve(DALD(eps_primal=1e-7, eps_dual=1e-7, max_iterations=3000),
                     topology=topologies.path(prob))
    assert res.status == "converged"
    report = fm.verify(res, ref, rtol=1e-3)
    assert report.ok, str(report)
    assert res.max_violation <= 1e-6
    assert abs(res.objective - ref.objective) <= 1e-5 * abs(ref.objective)
    assert np.sum(np.abs(res.value(w) - ref.value(w))) <= 1e-4
    for name in ("c0.con0", "c1.con0"):                       # multipliers of the active ones
        assert abs(res.multipliers[name] - ref.multipliers[name]) <= 1e-4 * abs(ref.multipliers[name])


def test_cc_sum_of_multipliers_is_zero_after_every_dual_step():
    """(68): with the exact server step (29), Σ_i μ_i^{k+1} = 0 — also for per-client,
    per-coordinate ρ_i vectors."""
    prob, w = _least_squares()
    rng = np.random.default_rng(1)
    rho = {f"c{i}": 0.5 + rng.random(D) for i in range(N_CLIENTS)}
    res = prob.solve(DALD(rho=rho, eps_primal=1e-8, eps_dual=1e-8, max_iterations=2000),
                     topology=topologies.star(prob))
    assert len(res.history) > 10
    assert max(r["sum_mu"] for r in res.history) <= 1e-12
    mus = res.info["consensus_multipliers"]
    assert np.max(np.abs(sum(mus.values()))) <= 1e-12
    assert np.max(np.abs(mus["c0"])) > 1e-3                   # the multipliers themselves are not 0
    ref = prob.solve("cvxpy")
    assert _rel_error(res, ref, w) <= 1e-5


def test_cc_equals_textbook_consensus_admm():
    """Fed-DALD-CC with B4, v_max = 1, exact solves ⇔ consensus ADMM with penalty c = 2ρ² (§2.9)."""
    parts = _data(n=3)
    prob, w = _least_squares(n=3)
    rho, c = 0.7, 2 * 0.7 ** 2
    x = [np.zeros(D) for _ in parts]
    mu = [np.zeros(D) for _ in parts]
    xhat = np.zeros(D)
    for k in range(1, 6):
        for i, (A, b) in enumerate(parts):   # argmin (1/m)‖Ax − b‖² − μᵀx + (c/2)‖x − x̂‖²
            H = 2 * A.T @ A / SAMPLES + c * np.eye(D)
            x[i] = np.linalg.solve(H, 2 * A.T @ b / SAMPLES + mu[i] + c * xhat)
        xhat = (sum(x) - sum(mu) / c) / len(parts)
        mu = [m + c * (xhat - xi) for m, xi in zip(mu, x)]
        res = prob.solve(DALD(rho=rho, eps_primal=0, eps_dual=0, max_iterations=k, adaptive_rho=False),
                         topology=topologies.star(prob), scaling=False)   # ρ in the model's units
        assert res.iterations == {"outer": k, "inner": k}
        assert np.allclose(res.value(w), xhat, rtol=0, atol=1e-12)
        for i in range(3):
            assert np.allclose(res.info["consensus_multipliers"][f"c{i}"], mu[i], atol=1e-11)


def test_dc_chain_prox_grad_matches_hand_coded_updates():
    """Fed-DALD-DC on a chain, B4 v_max = 1, one prox-grad step (64) per node (spec §4.2)."""
    parts = _data(n=3)
    prob, w = _least_squares(n=3)
    alpha, rho2 = 0.05, 1.0
    x = [np.zeros(D) for _ in parts]
    mu = [np.zeros(D) for _ in range(2)]
    for k in range(1, 5):
        for i, (A, b) in enumerate(parts):
            g = 2 * A.T @ (A @ x[i] - b) / SAMPLES
            if i < 2:
                g = g + mu[i] + 2 * rho2 * (x[i] - x[i + 1])
            if i > 0:
                g = g - (mu[i - 1] + 2 * rho2 * (x[i - 1] - x[i]))
            x[i] = x[i] - alpha * g
        mu = [mu[i] + 2 * rho2 * (x[i] - x[i + 1]) for i in range(2)]
        res = prob.solve(DALD(solver="prox-grad", step=alpha, local_steps=1, eps_primal=0, eps_dual=0,
                              max_iterations=k, adaptive_rho=False), topology=topologies.path(prob),
                         scaling=False)   # α and one ρ in the model's units, as the hand-coded steps
        for i in range(3):
            assert np.allclose(res.info["client_values"][f"c{i}"], x[i], atol=1e-13)
        assert np.allclose(res.info["consensus_multipliers"][("c0", "c1")], mu[0], atol=1e-13)


@pytest.mark.parametrize("options", [
    dict(inner_rule="B1"), dict(inner_rule="B2"), dict(inner_rule="B3", v_max=2),
    dict(solver="newton"), dict(solver="gd", step=0.1, local_steps=20),
])
def test_inner_rules_and_solvers_reach_the_optimum(options):
    prob, w = _least_squares(n=3)
    ref = prob.solve("cvxpy")
    res = prob.solve(DALD(eps_primal=1e-8, eps_dual=1e-8, max_iterations=4000, **options),
                     topology=topologies.path(prob))
    assert res.status == "converged", options
    assert _rel_error(res, ref, w) <= 1e-5


def test_hierarchy_matrix_gives_the_coordination_sequence():
    prob, w = _least_squares(n=3)
    H = topologies.hierarchy([[0, 0, 0], [1, 1, 0], [0, 1, 1]], prob)   # c2 → c1 → c0 (root)
    res = prob.solve(DALD(**TIGHT), topology=H)
    assert res.info["order"] == ["c2", "c1", "c0"]
    assert _rel_error(res, prob.solve("cvxpy"), w) <= 1e-5


@pytest.mark.integration     # DALD runs with dropped clients to 1e-6: CI runs it after the fast suite
@pytest.mark.parametrize("build", [topologies.star, topologies.ring])
def test_partial_participation_client_dropout_still_converges(build):
    """Partial-cycle coordination: each node takes part in an inner iteration with probability
    0.6; a dropped node keeps its iterate and its multipliers (edges: both ends must take part)."""
    prob, w = _least_squares(lam=0.05)
    res = prob.solve(DALD(coordination="partial", participation=0.6, seed=0, **TIGHT),
                     topology=build(prob))
    assert res.status == "converged"
    assert _rel_error(res, prob.solve("cvxpy"), w) <= 1e-5


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_divergence_is_reported_with_finite_values():
    prob, w = _least_squares(n=3)
    res = prob.solve(DALD(solver="gd", step=5.0, local_steps=3, max_iterations=500),
                     topology=topologies.path(prob))
    assert res.status == "diverged"
    assert np.all(np.isfinite(res.value(w)))


def test_disconnected_topology_raises():
    prob, _ = _least_squares(n=4)
    G = nx.Graph()
    G.add_nodes_from(["c0", "c1", "c2", "c3"], role="client")
    G.add_edges_from([("c0", "c1"), ("c2", "c3")])
    with pytest.raises(fm.TopologyError, match="disconnected"):
        prob.solve(DALD(), topology=G)


def test_cc_mode_requires_a_star():
    prob, _ = _least_squares(n=3)
    with pytest.raises(fm.TopologyError):
        prob.solve(DALD(mode="cc"), topology=topologies.path(prob))


def test_bad_options_raise():
    with pytest.raises(fm.FedModelError):
        DALD(inner_rule="B5")
    with pytest.raises(fm.FedModelError):
        DALD(solver="bfgs")
    prob, _ = _least_squares(n=3)
    with pytest.raises(fm.FedModelError, match="rho"):
        prob.solve(DALD(rho=np.ones(D + 1)), topology=topologies.star(prob))
    # an x0 of the wrong size is found once the executor knows the model's size: it is closed
    # first (its node programs freed: no Ray actors left running)
    ex = SerialExecutor()
    with pytest.raises(fm.FedModelError, match=f"x0 must be a scalar or the {D} shared variables"):
        prob.solve(DALD(x0=np.ones(D + 1)), topology=topologies.star(prob), executor=ex)
    assert ex.programs and all(p.holder is None for p in ex.programs.values())


def test_registry_name_and_ledger():
    prob, w = _least_squares(n=3)
    res = prob.solve("dald", topology=topologies.star(prob), max_iterations=5, eps_primal=0, eps_dual=0)
    assert res.backend == "dald" and res.iterations["inner"] == 5
    kinds = res.ledger.kinds()
    assert {"dald_cc_solve", "dald_cc_dual"} <= kinds
    # model-sized messages only: each client solve is x̂ down and x_i up
    assert res.ledger.floats[("server", "c0", "dald_cc_solve")] >= 5 * D
