"""FedADMM-InSa vs vanilla FedADMM (E = 10): local gradient steps and wall time to the same
accuracy, one run, as ratios (issue 5's benchmark).

Model: the paper's Example 1 (4.1) scaled down — ridge regression f_i(u) = ‖A_i u − b_i‖²/(2N) +
(γ/2m)‖u‖² with γ = 1 (so Σ_i f_i is the paper's Σ α_i f_i with α_i = N_i/N), features and labels
drawn i.i.d. from N(0,1) / Student-t(5) / U[−5,5] thirds as in [42]; m clients of N_i samples.
Settings: the paper's (lr = 0.01, β = 2 / β⁰ = 2, μ = 20, τ = 2, δ = 0.01 for InSa, reference
z^k, ≤ 10 local steps), full participation and 10%. Accuracy: relative objective gap
(F(z^k) − F*)/F* ≤ target, with F* from the closed form (numpy solve, independent of fedmodel).
Time: the backend's own time per round (the per-round objective report is excluded).

    python benchmarks/bench_fedadmm.py [--quick]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fedmodel as fm  # noqa: E402
from fedmodel.backends.fedadmm import FedADMM  # noqa: E402


def example1(m: int, n: int, per_client: int, seed: int = 0, gamma: float = 1.0):
    rng = np.random.default_rng(seed)
    total = m * per_client
    third = -(-total // 3)
    rows = np.vstack([rng.normal(size=(third, n + 1)), rng.standard_t(5, size=(third, n + 1)),
                      rng.uniform(-5, 5, size=(total - 2 * third, n + 1))])
    rows = rows[rng.permutation(total)]
    A, b = rows[:, :n], rows[:, n]
    w = fm.Variable(n, name="w")
    prob = fm.Problem(name="fedadmm-example1")
    for i in range(m):
        sl = slice(i * per_client, (i + 1) * per_client)
        c = prob.add_client(weight=per_client)
        c.minimize(0.5 * fm.sum_squares(c.data(A[sl]) @ w - c.data(b[sl])) / total
                   + 0.5 * gamma / m * fm.sum_squares(w))
    z_star = np.linalg.solve(A.T @ A / total + gamma * np.eye(n), A.T @ b / total)
    f_star = 0.5 * np.sum((A @ z_star - b) ** 2) / total + 0.5 * gamma * z_star @ z_star
    return prob, f_star


TARGETS = (1e-3, 1e-6)


def to_targets(prob, f_star, backend):
    """Per target: rounds, local steps and seconds until the relative gap first reaches it."""
    hits = {t: {"rounds": None, "steps": None, "time": None} for t in TARGETS}
    steps = [0]

    def watch(record):
        steps[0] += record["local_steps"]
        gap = (record["objective"] - f_star) / abs(f_star)
        for t, hit in hits.items():
            if hit["rounds"] is None and gap <= t:
                hit.update(rounds=record["round"], steps=steps[0], time=record["time"])
    res = prob.solve(backend, callback=watch)
    return hits, (res.objective - f_star) / abs(f_star), res


def main(quick: bool = False) -> None:
    m, n, per_client, rounds = (20, 50, 20, 300) if quick else (50, 100, 50, 600)
    prob, f_star = example1(m, n, per_client)
    print(f"Example 1 (scaled): m = {m}, n = {n}, N_i = {per_client}, γ = 1, lr = 0.01, F* = {f_star:.6f}")
    print("| participation | target gap | vanilla E=10 rounds / steps / s | InSa rounds / steps / s "
          "| steps ratio InSa/vanilla | time ratio | final gap vanilla / InSa |")
    print("|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for participation in (1.0, 0.1):
        common = dict(lr=0.01, beta=2.0, participation=participation, max_rounds=rounds, seed=0)
        vanilla, gv, _ = to_targets(prob, f_star, FedADMM.paper(local_steps=10, **common))
        insa, gi, ri = to_targets(prob, f_star, FedADMM.paper(inexact=True, adaptive=True, **common))
        rows.append(ri.info["final_beta"])
        for target in TARGETS:
            v, i = vanilla[target], insa[target]
            ratio = (i["steps"] / v["steps"]) if v["steps"] and i["steps"] else float("nan")
            tratio = (i["time"] / v["time"]) if v["time"] and i["time"] else float("nan")
            fmt = lambda h: "not reached" if h["rounds"] is None else f"{h['rounds']} / {h['steps']} / {h['time']:.2f}"
            print(f"| {participation:g} | {target:g} | {fmt(v)} | {fmt(i)} | {ratio:.3f} | {tratio:.3f} "
                  f"| {gv:.2e} / {gi:.2e} |", flush=True)
    betas = np.array(list(rows[0].values()))
    print(f"InSa final β (full participation): mean {betas.mean():.3f}, min {betas.min():.3f}, max {betas.max():.3f}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
