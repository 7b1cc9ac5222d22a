"""Client-level DP (DP-FedAvg, issue 28 item 3/4) on MNIST 3 vs 7 with the norm ball: the 12,300
training 3s and 7s over 100 clients (contiguous split, ~123 records each), ‖w‖₂ ≤ 1 as the
server's constraint (the same set as every client's ball, so the same model; FedAvg projects the
noisy average on it), q = 1, T = 100 rounds, δ = 1e-6, E ∈ {8, 1}, seeds 0–2. Settings from
public facts only: pixels lie in [0, 1] and d = 784, so ‖a‖ ≤ 28 and client i's objective
mean-logistic/n has curvature ≤ 784/(4n): the step α = 4n/784 ≈ 0.51; an update α‖∇f_i‖ is at
most S_max = 28α/n. Clip S ∈ {S_max (nothing is ever clipped), S_max/10}. Beside them: the
same FedAvg without noise (same step and rounds) and CVXPY.

    python benchmarks/bench_dp_client_level.py [--seeds 3]
"""
from __future__ import annotations

import argparse
import logging
import time

import numpy as np

logging.getLogger("absl").setLevel(logging.ERROR)
CLIENTS, ROUNDS = 100, 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--no-cvxpy", action="store_true", help="skip the CVXPY row (~5 min)")
    args = parser.parse_args()
    from fedmodel.backends import CVXPY, FedAvg
    from fedmodel.reproductions.dpadmm_constrained import mnist_ball
    exp = mnist_ball(clients=CLIENTS, server_ball=True)
    step = 4 * CLIENTS / 784
    s_max = 28 * step / CLIENTS
    print("| run | clip S | objective | violation | test error % (mean / max) | total ε (PLD) | σ | time per seed |")
    print("|---|---|---|---|---|---|---|---|")

    def row(name, clip, runs):
        objective = np.mean([r[0].objective for r in runs])
        violation = max(r[0].max_violation for r in runs)
        errors = [100 * exp.test_error(r[0].value(exp.w)) for r in runs]
        privacy = runs[0][0].info.get("privacy", {})
        epsilon = f"{privacy['pld'][0]:.4g}" if privacy else "inf"
        sigma = f"{privacy['noise_multiplier']:.3g}" if privacy else "–"
        print(f"| {name} | {clip} | {objective:.4f} | {violation:.1e} | {np.mean(errors):.2f} / "
              f"{np.max(errors):.2f} | {epsilon} | {sigma} | {np.mean([r[1] for r in runs]):.0f} s |", flush=True)

    def timed(backend):
        start = time.perf_counter()
        res = exp.problem.solve(backend, scaling=False, executor="batched")
        return res, time.perf_counter() - start

    row(f"FedAvg, no noise (α = {step:.2f}, T = {ROUNDS})", "–",
        [timed(FedAvg(step=step, max_rounds=ROUNDS, tol=0.0))])
    for budget in (8.0, 1.0):
        for clip, label in ((s_max, "S_max"), (s_max / 10, "S_max/10")):
            row(f"DP-FedAvg E={budget:g}", f"{label} = {clip:.4f}",
                [timed(FedAvg(step=step, epsilon_total=budget, clip=clip, seed=seed))
                 for seed in range(args.seeds)])
    if not args.no_cvxpy:
        row("CVXPY (non-private)", "–", [timed(CVXPY())])


if __name__ == "__main__":
    main()
