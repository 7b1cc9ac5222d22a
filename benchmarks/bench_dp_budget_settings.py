"""`DPADMM(epsilon_total=E)` with user settings beside its defaults (issue 28): a constant
penalty ρ = 1 and T = 1000 rounds instead of the paper's ρ schedule (21) and T = 100, on the
dp-budget models (NP on adult, MNIST 3v7 with client balls; 5 clients, all the data), E ∈ {1, 8},
seed 0. Prints one line per run: test error, objective, violation, total ε, time.

    python benchmarks/bench_dp_budget_settings.py [--seeds 1]
"""
from __future__ import annotations

import argparse
import logging
import time

logging.getLogger("absl").setLevel(logging.ERROR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    args = parser.parse_args()
    from fedmodel.backends.dp_admm import DPADMM
    from fedmodel.reproductions.dpadmm_constrained import mnist_ball, neyman_pearson
    for exp in (neyman_pearson(), mnist_ball()):
        for budget in (8.0, 1.0):
            for seed in range(args.seeds):
                start = time.perf_counter()
                res = exp.problem.solve(DPADMM(epsilon_total=budget, seed=seed, rho_schedule=1.0,
                                               max_rounds=1000), scaling=False)
                print(f"{exp.name} | E={budget:g} | rho=1, T=1000 | seed {seed} | test error "
                      f"{100 * exp.test_error(res.value(exp.w)):.2f} % | objective {res.objective:.4f} | "
                      f"violation {res.max_violation:.1e} | total ε {res.info['privacy']['pld'][0]:.4g} | "
                      f"{time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
