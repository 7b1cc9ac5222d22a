"""Model builders shared by the FedADMM-InSa and DP-IADMM reproductions.

Each builder returns a `fm.Problem` written as the papers write the *total* objective (the sum
of the client blocks' objectives is what every backend minimizes), plus its variable(s), and a
numpy evaluator of the same objective so that a reproduction can check the federated numbers
against an independent computation.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.special import logsumexp

Part = tuple[np.ndarray, np.ndarray]


def one_hot(y: np.ndarray, classes: int) -> np.ndarray:
    """Rows of the K×K identity picked by the integer labels `y`."""
    return np.eye(classes)[np.asarray(y, int)]


def softmax_regression(parts: Sequence[Part], classes: int, beta: float = 0.0,
                       scale: str = "total", alpha: Sequence[float] | None = None,
                       name: str = "softmax-regression"):
    """Multinomial logistic regression with a J×K matrix variable W (no bias; append a column of
    ones to X for one), client p holding (X_p, y_p):

        f_p(W) = s_p Σ_i [log Σ_k exp(x_iᵀW)_k − (x_iᵀW)_{y_i}] + (β/P)‖W‖²_F

    with s_p = 1/I (scale="total", the DP paper's (2c): Σ_p f_p is the mean loss over all I
    records) or s_p = 1/I_p (scale="client", its A.8 and the authors' OutP code; FedADMM's f_i
    before the α_i weighting). `alpha` multiplies block p by α_p (FedADMM's Σ α_i f_i).
    Softmax cross-entropy is written with `log_sum_exp(·, axis=1)`."""
    import fedmodel as fm
    if scale not in ("total", "client"):
        from fedmodel.errors import FedModelError
        raise FedModelError(f"scale must be 'total' (1/I) or 'client' (1/I_p), got {scale!r}")
    J = parts[0][0].shape[1]
    total = sum(len(y) for _, y in parts)
    W = fm.Variable((J, classes), name="W")
    prob = fm.Problem(name=name)
    for p, (X, y) in enumerate(parts):
        c = prob.add_client(f"c{p}", weight=len(y))
        S = c.data(X, name="X") @ W
        Y = c.data(one_hot(y, classes), name="Y")
        loss = fm.sum(fm.log_sum_exp(S, axis=1)) - fm.sum(fm.multiply(Y, S))
        term = loss / (total if scale == "total" else len(y))
        if beta:
            term = term + (beta / len(parts)) * fm.sum_squares(W)
        c.minimize(term if alpha is None else float(alpha[p]) * term)
    return prob, W


def softmax_loss(W: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    """Mean softmax cross-entropy of W on (X, y), in numpy (the independent evaluator)."""
    S = X @ W
    return float(np.mean(logsumexp(S, axis=1) - S[np.arange(len(y)), np.asarray(y, int)]))


def error_rate(W: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    """1 − accuracy of argmax_k (xᵀW)_k (the DP paper's testing error)."""
    return float(np.mean(np.argmax(X @ W, axis=1) != np.asarray(y, int)))


def ridge_regression(parts: Sequence[Part], gamma: float = 1.0, alpha: Sequence[float] | None = None,
                     name: str = "ridge"):
    """FedADMM-InSa Example 1 (4.1): Σ_i α_i f_i(u), f_i(u) = (1/(2N_i))‖A_i u − b_i‖² +
    (γ/2)‖u‖², α_i = N_i/N by default. The α_i are part of the model (the backend's own
    α only rescales each block, see backends/fedadmm/), so the paper's loss is Σ of the blocks."""
    import fedmodel as fm
    sizes = np.array([len(b) for _, b in parts], float)
    weights = sizes / sizes.sum() if alpha is None else np.asarray(alpha, float)
    u = fm.Variable(parts[0][0].shape[1], name="u")
    prob = fm.Problem(name=name)
    for i, ((A, b), a_i) in enumerate(zip(parts, weights)):
        c = prob.add_client(f"c{i}", weight=len(b))
        residual = c.data(A, name="A") @ u - c.data(b, name="b")
        c.minimize(a_i * (fm.sum_squares(residual) / (2 * len(b)) + (gamma / 2) * fm.sum_squares(u)))
    return prob, u


def ridge_loss(u: np.ndarray, parts: Sequence[Part], gamma: float = 1.0,
               alpha: Sequence[float] | None = None) -> float:
    """Σ_i α_i f_i(u) of `ridge_regression`, in numpy."""
    sizes = np.array([len(b) for _, b in parts], float)
    weights = sizes / sizes.sum() if alpha is None else np.asarray(alpha, float)
    return float(sum(a * (np.sum((A @ u - b) ** 2) / (2 * len(b)) + gamma / 2 * u @ u)
                     for (A, b), a in zip(parts, weights)))


def ridge_optimum(parts: Sequence[Part], gamma: float = 1.0,
                  alpha: Sequence[float] | None = None) -> np.ndarray:
    """z* = (Σα_i(A_iᵀA_i/N_i + γI))⁻¹ Σα_i A_iᵀb_i/N_i (spec fedadmm_insa.md §5, test 6)."""
    sizes = np.array([len(b) for _, b in parts], float)
    weights = sizes / sizes.sum() if alpha is None else np.asarray(alpha, float)
    n = parts[0][0].shape[1]
    H = sum(a * (A.T @ A / len(b) + gamma * np.eye(n)) for (A, b), a in zip(parts, weights))
    g = sum(a * A.T @ b / len(b) for (A, b), a in zip(parts, weights))
    return np.linalg.solve(H, g)
