"""FedADMM-InSa Table 2 (MNIST, 100 clients, 10 % participation, label-sorted shards), with
multinomial logistic regression in place of the paper's MLP. Same as `fedmodel reproduce
insa-table2 [--full]`; `--plot DIR` writes the loss and mean-β curves."""
import sys

from fedmodel.reproductions.fedadmm_mnist import run

if __name__ == "__main__":
    plot_dir = sys.argv[sys.argv.index("--plot") + 1] if "--plot" in sys.argv else None
    sys.exit(run(full="--full" in sys.argv, plot_dir=plot_dir))
