"""Reproduce Fig. 5 of the DALD paper (per-client accuracy over the first 300 iterations,
n = 100 and 500, λ = 1e-3). Same as `fedmodel reproduce fig5 [--full]`; `--plot DIR` writes
dald_fig5.png."""
import sys

from fedmodel.reproductions.dald_fig5 import run

if __name__ == "__main__":
    plot_dir = sys.argv[sys.argv.index("--plot") + 1] if "--plot" in sys.argv else "."
    sys.exit(run(full="--full" in sys.argv, plot_dir=plot_dir))
