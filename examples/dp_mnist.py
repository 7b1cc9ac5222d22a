"""DP-IADMM on MNIST (Ryu & Kim): testing error of ObjT / ObjP / OutP for ε̄ ∈ {0.05, 0.1, 1, 5}
and non-private. Same as `fedmodel reproduce dp-mnist [--full]`; `--rounds T` sets the number
of rounds (the paper: 20,000), `--plot DIR` writes the training-cost curves."""
import sys

from fedmodel.reproductions.dpadmm_mnist import run


def _option(name: str):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


if __name__ == "__main__":
    rounds = _option("--rounds")
    sys.exit(run(full="--full" in sys.argv, rounds=int(rounds) if rounds else None,
                 plot_dir=_option("--plot")))
