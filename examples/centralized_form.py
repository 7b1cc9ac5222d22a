"""Write the model as if it were centralized and let the compiler split it over the clients.

Least squares over 4 clients' private data with a budget on the *total* loss of one group of
samples, `Σ_i mean(square(B_i w - c_i)) ≤ budget`: a constraint that couples every client.
`prob.minimize` / `prob.subject_to` take the centralized model; the compiler gives each term to
the client whose data it reads and decouples the coupling constraint into local constraints
with slack variables plus one global constraint on the slacks (docs/api.md §2).
Run: `python examples/centralized_form.py` (a few seconds). Deploy it on Flower (docs/flower.md):
`fedmodel deploy examples/centralized_form.py --clients 4`.
"""
import numpy as np

import fedmodel as fm


def make_problem(n_clients: int = 4) -> fm.Problem:
    """The model over `n_clients` clients, each with its own random data."""
    rng = np.random.default_rng(1)
    d = 5
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name="budgeted-least-squares")
    loss, group_loss = 0, 0
    for i in range(n_clients):
        c = prob.add_client(f"c{i}")
        A, b = c.data(rng.normal(size=(30, d)), name="A"), c.data(rng.normal(size=30), name="b")
        B, t = c.data(rng.normal(size=(10, d)), name="B"), c.data(1.0 + rng.normal(size=10), name="t")
        loss = loss + fm.sum_squares(A @ w - b)
        group_loss = group_loss + fm.mean(fm.square(B @ w - t))
    prob.minimize(loss)
    # couples all clients; binds at 4 clients (unconstrained: 7.09), scaled with their number
    prob.subject_to(group_loss <= 7.0 * n_clients / 4)
    return prob


backend = "proxal"

if __name__ == "__main__":
    res = make_problem(4).solve(backend)
    print(res)
    report = fm.verify(res)
    print(report)
    raise SystemExit(0 if report.ok else 1)
