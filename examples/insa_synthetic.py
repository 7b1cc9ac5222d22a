"""FedADMM-InSa Example 1 (synthetic ridge regression, m = 100 clients, n = 1000): loss curves
and total local steps of vanilla FedADMM (E = 2, 5, 10), FedADMM-In and FedADMM-InSa. Same as
`fedmodel reproduce insa-table1 [--full]`; `--plot DIR` writes the loss curves."""
import sys

from fedmodel.reproductions.fedadmm_synthetic import run

if __name__ == "__main__":
    plot_dir = sys.argv[sys.argv.index("--plot") + 1] if "--plot" in sys.argv else None
    sys.exit(run(full="--full" in sys.argv, plot_dir=plot_dir))
