"""FedADMM-InSa, Example 2 (Song, Wang, Zuazua, arXiv 2402.13989, Sec. 4.4, Table 2 and Fig. 3;
../shared/spec/fedadmm_insa.md §4.2): MNIST, m = 100 clients with the pathological label-sorted
shard split (200 shards of 50 same-label images, 2 per client), 10 % of the clients per round,
full-batch gradient steps with lr 0.01, K = 200 rounds, α_i = 0.01.

    min_z Σ_i α_i f_i(z),  f_i = mean softmax cross-entropy of client i's 100 images

Algorithms (`backends.FedADMM`): vanilla FedADMM β = 2 with E = 2, 5, 10 (δ = 0), FedADMM-In
(β = 2, criterion with reference z^k, σ = √2/(√2+√β), ≤ 10 steps, δ = 0.01) and FedADMM-InSa
(β^0 = 2, μ = 20, τ = 2). Reported as Table 2: test accuracy and training loss at round K, total
local steps, and the steps reduction against E = 10.

Differences from the paper (each explained in docs/REPRODUCTION.md):
- Model: multinomial logistic regression (784 pixels + a bias column → 10 classes, 7,850
  parameters) instead of the paper's 784-200-200-10 ReLU MLP: the modeling language has no relu
  atom, so the MLP cannot be written. The problem is convex here; the paper's is not.
- Data: the balanced subset the spec infers (first 1,000 training and first 100 test images of
  each class, as the authors' `get_subset`); pixels /255 (the code also standardizes with
  mean 0.1307, std 0.3081: that multiplies the logistic model's curvature by ≈10 and makes
  GD at lr 0.01 unstable, so it is not used).
- z^0 = 0 (the paper: PyTorch's random initialization of the MLP). One seed for the shard
  assignment and the client sampling (the paper states neither).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from .fedadmm_synthetic import algorithms, curves
from .models import error_rate, softmax_loss, softmax_regression
from .report import finish, print_checks, print_header, save, subplots, print_subset

CLIENTS, ROUNDS, CLASSES = 100, 200, 10
# default subset: K = 25 took 134 CPU-s (5 runs; every round also evaluates the loss on all 100
# clients for the history), K = 10 takes ≈ 100 CPU-s: under 2 minutes (docs/REPRODUCTION.md)
FAST_ROUNDS = 10
# Table 2: test accuracy (%), training loss, local update steps (MLP, their seed)
PAPER = {
    "FedADMM (E = 2)": (81.6, 0.528, 4000),
    "FedADMM (E = 5)": (71.9, 0.762, 10000),
    "FedADMM (E = 10)": (62.6, 0.955, 20000),
    "FedADMM-In": (70.9, 0.730, 10036),
    "FedADMM-InSa": (87.8, 0.325, 7139),
}


def balanced_subset(X: np.ndarray, y: np.ndarray, per_class: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `per_class` images of each class, in file order (the authors' `get_subset`)."""
    rows = np.sort(np.concatenate([np.flatnonzero(y == c)[:per_class] for c in range(CLASSES)]))
    return X[rows], y[rows]


def with_bias(X: np.ndarray) -> np.ndarray:
    """X with a trailing column of ones (the bias row of W)."""
    return np.column_stack([X, np.ones(len(X))])


def load(train_per_class: int = 1000, test_per_class: int = 100, clients: int = CLIENTS,
         seed: int = 0, root=None):
    """Client parts from the label-sorted shards (2 per client) and the test set."""
    from fedmodel.datasets import load_mnist
    from fedmodel.partitioners import label_skew_split
    train, test = load_mnist("train", root=root), load_mnist("test", root=root)
    X, y = balanced_subset(train.X, train.y, train_per_class)
    Xt, yt = balanced_subset(test.X, test.y, test_per_class)
    X, Xt = with_bias(X), with_bias(Xt)
    parts = [(X[r], y[r]) for r in label_skew_split(y, clients, 2, seed=seed)]
    return parts, (X, y), (Xt, yt)


def solve(parts, options: dict, rounds: int, seed: int = 0, participation: float = 0.1) -> dict:
    """One FedADMM run on Σ α_i f_i (α_i = 1/m); loss per round from the history."""
    from fedmodel.backends.fedadmm import FedADMM
    alpha = [1.0 / len(parts)] * len(parts)
    prob, W = softmax_regression(parts, CLASSES, scale="client", alpha=alpha, name="insa-mnist")
    algo = FedADMM.paper(lr=0.01, participation=participation, max_rounds=rounds, seed=seed, **options)
    start = time.perf_counter()
    res = prob.solve(algo, scaling=False)   # the paper's model as written
    h = res.history
    first = res.history[0]["participants"][0] if h else None
    return {"W": res.value(W), **curves(res), "client_steps": [r["client_steps"].get(first) for r in h],
            "seconds": time.perf_counter() - start}


def plot(results: dict, path: Path) -> Path:
    """Training loss per round and mean β (Fig. 3b, 3c)."""
    fig, (a, b) = subplots(1, 2, figsize=(10, 3.6))
    for name, out in results.items():
        rounds = np.arange(1, len(out["loss"]) + 1)
        a.plot(rounds, out["loss"], label=name)
        b.plot(rounds, out["mean_beta"], label=name)
    a.set_xlabel("round k")
    a.set_ylabel("training loss Σα_i f_i(z^k)")
    a.set_yscale("log")
    b.set_xlabel("round k")
    b.set_ylabel("mean β_i over the 100 clients")
    a.legend(fontsize=8)
    a.set_title("MNIST, label shards, multinomial LR")
    return save(fig, path)


def run(full: bool = False, rounds: int | None = None, seed: int = 0, plot_dir=None, root=None) -> int:
    """Fast subset (full=False): the same 100 clients and split, K = `FAST_ROUNDS` rounds.
    full=True: the paper's K = 200."""
    rounds = rounds or (ROUNDS if full else FAST_ROUNDS)
    parts, (X, y), (Xt, yt) = load(seed=seed, root=root)
    print(f"FedADMM-InSa Table 2 (MNIST): {len(y)} training / {len(yt)} test images (first 1000 / "
          f"100 per class), 100 clients × 2 label shards of 50, 10 % participation, lr 0.01, "
          f"K = {rounds} (paper: {ROUNDS}), β = 2, multinomial LR (7,850 parameters; the paper: "
          f"MLP 784-200-200-10), z^0 = 0, seed {seed}")
    if not full:
        print_subset("insa-table2", f"the same clients, split and algorithms, K = {rounds} rounds",
                     f"the paper's K = {ROUNDS}")
    results = {name: solve(parts, options, rounds, seed) for name, options in algorithms().items()}
    base = results["FedADMM (E = 10)"]["total_steps"]
    print_header("algorithm<18 | test acc %>10 paper>6 | train loss>10 paper>6 | local steps>11 paper>6 | "
                 "reduction>9 paper>6 | β̄ end>6 s>5")
    for name, out in results.items():
        acc = 100 * (1 - error_rate(out["W"], Xt, yt))
        out["accuracy"] = acc
        p_acc, p_loss, p_steps = PAPER[name]
        red = 1 - out["total_steps"] / base
        print(f"{name:<18} | {acc:>10.1f} {p_acc:>6.1f} | {out['loss'][-1]:>10.3f} {p_loss:>6.3f} | "
              f"{out['total_steps']:>11d} {p_steps * rounds // ROUNDS:>6d} | {100 * red:>8.1f}% "
              f"{100 * (1 - p_steps / 20000):>5.1f}% | {out['mean_beta'][-1]:>6.3f} {out['seconds']:>5.1f}")
    if not full:
        print("(paper's step counts scaled to our K; its accuracies and losses are after 200 rounds)")
    if plot_dir is not None:
        print("plot:", plot(results, Path(plot_dir) / "insa_mnist_loss.png"))
    insa, vanilla10 = results["FedADMM-InSa"], results["FedADMM (E = 10)"]
    selected = math.ceil(0.1 * len(parts)) * rounds
    numpy_loss = float(np.mean([softmax_loss(insa["W"], Xi, yi) for Xi, yi in parts]))
    # implementation checks (the exit code) ...
    checks = [
        ("history loss = numpy Σα_i f_i(z^K) (rel 1e-9)",
         abs(insa["loss"][-1] - numpy_loss) <= 1e-9 * numpy_loss),
        (f"vanilla step counts are exactly {selected}·E (paper: 4000 / 10000 / 20000 at K = 200)",
         all(results[f"FedADMM (E = {e})"]["total_steps"] == selected * e for e in (2, 5, 10))),
        ("In and InSa take fewer local steps than vanilla E = 10 (the cap is 10)",
         max(results["FedADMM-In"]["total_steps"], insa["total_steps"]) < vanilla10["total_steps"]),
        ("every run lowers the loss below its value ln 10 at z^0 = 0",
         all(o["loss"][-1] < math.log(CLASSES) for o in results.values())),
    ]
    ok = print_checks(checks)
    # ... and the paper's MLP claims, reported (not expected to carry over to a convex model)
    acc = {n: o["accuracy"] for n, o in results.items()}
    red = 1 - insa["total_steps"] / vanilla10["total_steps"]
    claims = [
        ("InSa has the best test accuracy (paper 87.8 %)", acc["FedADMM-InSa"] >= max(acc.values()) - 1e-9),
        ("vanilla accuracy falls as E grows (paper 81.6 > 71.9 > 62.6: client drift)",
         acc["FedADMM (E = 2)"] > acc["FedADMM (E = 5)"] > acc["FedADMM (E = 10)"]),
        (f"InSa saves ≥ 50 % of E = 10's local steps (paper 64.3 %; ours {100 * red:.1f} %)", red >= 0.5),
        ("InSa lowers the mean β (paper: 2 → about 1)", insa["mean_beta"][-1] < 2.0),
    ]
    print("paper claims (MLP) with our convex model, reported only:")
    for what, held in claims:
        print(f"  [{'reproduced' if held else 'not reproduced'}] {what}")
    print("\nNotes: the model is multinomial logistic regression, not the paper's MLP (no relu atom), "
          "so accuracies and losses are not the paper's. With this convex model a longer local solve "
          "does not cause harmful drift (E = 10 is best among the vanilla runs), and GD at lr 0.01 "
          "contracts the subproblem residual by only ≈(1 − 0.01·β) per step along flat directions, "
          "so the criterion σ ≈ 0.5 is rarely met within the cap of 10 steps: In/InSa save few "
          "steps. See docs/REPRODUCTION.md.")
    return finish(ok)
