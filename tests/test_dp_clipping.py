"""DP-IADMM with per-record clipping (sensitivity="clip"): the client's step uses the gradient
with every record's term clipped to L1 norm C/I_p, so Δ̄ = 2C/I_p bounds (11b) over all
neighbouring data sets — a formal guarantee. Checked: the clipped gradient against a brute-force
clip of each record's term, a record with a huge gradient moving a client's release by at most
Δ̄, a clip norm above every record's norm reproducing the unclipped run bit for bit, and the
`formal` flag. Data are synthetic."""
import numpy as np
import pytest
from scipy.special import expit, softmax

import fedmodel as fm
from fedmodel.backends.dp_admm import DPADMM
from fedmodel.runtime.privacy import clipped_record_gradients
from fedmodel.runtime.program import compile_programs
from test_dp_admm import D, I, M, P, REG, _data     # P clients of M records, D features


def _logistic(parts):
    """f_p(w) = (1/I) Σ_i log(1 + exp(−b_i a_iᵀw)) + (reg/P)‖w‖² (the paper's (2c) scaling)."""
    w = fm.Variable(D, name="w")
    prob = fm.Problem()
    for p, (A, b) in enumerate(parts):
        c = prob.add_client(f"c{p}")
        Ad, bd = c.data(A, name="A"), c.data(b, name="b")
        c.minimize(fm.sum(fm.logistic(-fm.multiply(bd, Ad @ w))) / I + REG / P * fm.sum_squares(w))
    return prob


def _clip_rows(terms, bound):
    """Each row (one record's term, flattened) scaled to L1 norm ≤ bound."""
    norms = np.abs(terms).reshape(len(terms), -1).sum(axis=1)
    scale = np.minimum(1.0, bound / norms)
    return terms * scale.reshape((-1,) + (1,) * (terms.ndim - 1))


def test_clipped_gradient_clips_each_records_term_logistic():
    parts = _data(kind="logistic")
    program = compile_programs(_logistic(parts))["c0"]
    A, b = parts[0]
    z = np.random.default_rng(1).normal(size=D)
    grad = program.merit(z)["grad"]
    terms = -(A * (b * expit(-b * (A @ z)))[:, None]) / I             # record i: a_i ⊗ u_i
    bound = 0.5 * np.median(np.abs(terms).sum(axis=1))                # clips about half
    expected = _clip_rows(terms, bound).sum(axis=0) + 2 * REG / P * z
    assert clipped_record_gradients(program, z, grad, bound) == pytest.approx(expected, rel=1e-12)
    assert clipped_record_gradients(program, z, grad, 1e9) is grad    # nothing to clip


def test_clipped_gradient_of_softmax_regression_with_a_matrix_variable():
    """The paper's model (A.8): record i's term x_i ⊗ (h_i − y_i)/I is clipped as a J×K block."""
    rng = np.random.default_rng(3)
    J, K, m = 6, 4, 12
    X, Y = rng.random((m, J)), np.eye(K)[rng.integers(K, size=m)]
    W = fm.Variable((J, K), name="W")
    prob = fm.Problem()
    c = prob.add_client("c0")
    Xd, Yd = c.data(X, name="X"), c.data(Y, name="Y")
    c.minimize((fm.sum(fm.log_sum_exp(Xd @ W, axis=1)) - fm.sum(fm.multiply(Yd, Xd @ W))) / 40
               + 1e-3 * fm.sum_squares(W))
    program = compile_programs(prob)["c0"]
    Z = rng.normal(size=(J, K))
    terms = X[:, :, None] * (softmax(X @ Z, axis=1) - Y)[:, None, :] / 40
    bound = float(np.median(np.abs(terms).sum(axis=(1, 2))))
    expected = _clip_rows(terms, bound).sum(axis=0) + 2e-3 * Z
    got = clipped_record_gradients(program, Z.ravel(), program.merit(Z.ravel())["grad"], bound)
    assert got == pytest.approx(expected.ravel(), rel=1e-12)


def test_a_record_with_a_huge_gradient_moves_the_release_by_at_most_the_bound():
    """Neighbouring data sets (record 0 of c0 replaced by one with features × 1e6), the same noise
    seed, one ObjP round from w = z = λ = 0: z_p^1 = −(f̃'_p(0) + ξ̃)/(ρ + 1/η^1) (8), so
    (ρ + 1/η^1)(z(D) − z(D')) is the change of the un-noised gradient the step used — at most
    Δ̄ = 2C/I_p in L1 with clipping, far above the paper's nominal Δ̄ without."""
    parts = _data(kind="logistic")
    huge = [(A.copy(), b) for A, b in parts]
    huge[0][0][0] *= 1e6
    C, eps = 1.0, 0.5

    def release(data, **options):
        res = _logistic(data).solve(DPADMM(epsilon=eps, max_rounds=1, tol=0, seed=4,
                                           record_noise=True, **options))
        step = res.history[0]["rho"] + res.history[0]["prox"]
        return res, step * res.info["client_values"]["c0"]

    (res, zd), (res2, zd2) = release(parts, sensitivity="clip", clip=C), \
        release(huge, sensitivity="clip", clip=C)
    assert np.array_equal(res.info["noise"]["c0"], res2.info["noise"]["c0"])    # same ξ̃
    assert res.info["sensitivity"]["c0"][0] == res2.info["sensitivity"]["c0"][0] == 2 * (C / M)
    assert 0 < np.abs(zd - zd2).sum() <= 2 * C / M * (1 + 1e-12)
    assert np.array_equal(res.info["client_values"]["c1"], res2.info["client_values"]["c1"])
    (paper, zp), (_, zp2) = release(parts, sensitivity="paper"), release(huge, sensitivity="paper")  # (20)
    assert np.abs(zp - zp2).sum() > 1e4 * paper.info["sensitivity"]["c0"][0]


@pytest.mark.parametrize("variant", ["objP", "objT"])
def test_a_clip_norm_above_every_record_reproduces_the_unclipped_run_bitwise(variant):
    """With C above every record's mean-scale norm I_p‖t_i‖₁ (logistic: ≤ I_p‖a_i‖₁/I), the
    clipped run is the run with the fixed bound Δ̄ = 2C/I_p, bit for bit; a small C changes it."""
    parts = _data(kind="logistic")
    C = 10.0 * max(M * np.abs(A).sum(axis=1).max() / I for A, _ in parts)
    common = dict(variant=variant, epsilon=1.0, max_rounds=15, tol=0, seed=7)
    clipped = _logistic(parts).solve(DPADMM(sensitivity="clip", clip=C, **common))
    fixed = _logistic(parts).solve(DPADMM(sensitivity=2.0 * (C / M), **common))
    for c in clipped.info["client_values"]:
        assert np.array_equal(clipped.info["client_values"][c], fixed.info["client_values"][c])
    assert [h["objective"] for h in clipped.history] == [h["objective"] for h in fixed.history]
    small = _logistic(parts).solve(DPADMM(sensitivity="clip", clip=1e-3, **common))
    tight = _logistic(parts).solve(DPADMM(sensitivity=2.0 * (1e-3 / M), **common))
    assert not np.array_equal(small.info["client_values"]["c0"], tight.info["client_values"]["c0"])


def test_formal_with_clip_nominal_with_the_paper_sensitivity():
    prob = _logistic(_data(kind="logistic"))
    clip = prob.solve(DPADMM(epsilon=1.0, max_rounds=2, tol=0, seed=0, sensitivity="clip"))
    paper = prob.solve(DPADMM(epsilon=1.0, max_rounds=2, tol=0, seed=0, sensitivity="paper"))
    assert clip.info["privacy"]["formal"] and not paper.info["privacy"]["formal"]
    assert clip.info["readings"]["sensitivity"] == "clip"
    assert np.all(clip.info["sensitivity"]["c1"] == 2 * (1.0 / M))       # default C = 1


def test_a_private_run_is_formal_by_default():
    """Issue 15: with no `sensitivity` given a private run clips (C = 1), bit for bit the explicit
    sensitivity="clip" run, and is formal; `DPADMM.paper()` keeps the paper's nominal Δ̄ (20)."""
    prob = _logistic(_data(kind="logistic"))
    assert DPADMM(epsilon=1.0).sensitivity == "clip" and DPADMM.paper().sensitivity == "paper"
    default = prob.solve(DPADMM(epsilon=1.0, max_rounds=2, tol=0, seed=0))
    explicit = prob.solve(DPADMM(epsilon=1.0, max_rounds=2, tol=0, seed=0, sensitivity="clip", clip=1.0))
    assert default.info["privacy"]["formal"] and default.info["readings"]["sensitivity"] == "clip"
    for c in default.info["client_values"]:
        assert np.array_equal(default.info["client_values"][c], explicit.info["client_values"][c])
    reproduction = prob.solve(DPADMM.paper(epsilon=1.0, max_rounds=2))
    assert reproduction.info["readings"]["sensitivity"] == "paper"
    assert not reproduction.info["privacy"]["formal"]


@pytest.mark.parametrize("clip", [0.0, -1.0, float("inf"), True, "1"])
def test_clip_norm_must_be_positive_and_finite(clip):
    with pytest.raises(fm.FedModelError, match="clip"):
        DPADMM(sensitivity="clip", clip=clip)


def test_clip_needs_per_record_gradients():
    prob = _logistic(_data(kind="logistic"))
    c0 = prob.clients[0]
    c0.minimize(1e-3 * fm.log_sum_exp(c0.data_items[0] @ prob.shared_variables()[0]))
    with pytest.raises(fm.FedModelError, match="sensitivity='clip' needs"):
        prob.solve(DPADMM(epsilon=1.0, max_rounds=2, sensitivity="clip"))
