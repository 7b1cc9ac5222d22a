"""Solve one model on two topologies: a star (server) and a peer-to-peer ring without a server.

A sparse regression (lasso) whose rows are spread over 6 clients; each client holds its own
(A_i, b_i) and the λ‖w‖₁ term is split evenly among them, so the model needs no server.
DALD runs Fed-DALD-CC on the star and Fed-DALD-DC on the ring; both should match CVXPY's
centralized solve. Run: `python examples/ring_lasso.py` (a few seconds). Deploy it on Flower
(the star: Flower is hub-and-spoke, docs/flower.md): `fedmodel deploy examples/ring_lasso.py
--clients 6`.
"""
import numpy as np

import fedmodel as fm
from fedmodel import topologies

D, LAM = 20, 20.0


def make_problem(n_clients: int = 6) -> fm.Problem:
    """The lasso over `n_clients` clients, 40 rows each, from one sparse ground truth."""
    rng = np.random.default_rng(0)
    w_true = np.where(rng.random(D) < 0.3, rng.normal(size=D), 0.0)     # sparse ground truth
    w = fm.Variable(D, name="w")
    prob = fm.Problem(name="lasso")
    for i in range(n_clients):
        A = rng.normal(size=(40, D))
        b = A @ w_true + 0.1 * rng.normal(size=40)
        c = prob.add_client(f"c{i}")
        Ai, bi = c.data(A, name="A"), c.data(b, name="b")
        c.minimize(0.5 * fm.sum_squares(Ai @ w - bi) + (LAM / n_clients) * fm.norm1(w))
    return prob


backend = "dald"

if __name__ == "__main__":
    prob = make_problem(6)
    w = prob.shared_variables()[0]
    reference = prob.solve("cvxpy")
    ok = True
    for topology in (topologies.star(prob), topologies.ring(prob)):
        res = prob.solve(backend, topology=topology)
        report = fm.verify(res, reference)
        where = "star" if topologies.has_server(topology) else "ring"
        print(f"{where}: {res.status}, objective {res.objective:.6f} (CVXPY {reference.objective:.6f}), "
              f"nonzeros {np.count_nonzero(np.abs(res.value(w)) > 1e-6)} of {D}; verified: {report.ok}")
        ok = ok and report.ok
    raise SystemExit(0 if ok else 1)
