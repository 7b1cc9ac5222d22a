"""Reproduce Table II (MNIST 3 vs 7: FedProx vs Fed-DALD-CC / -DC) of the DALD paper.
Same as `fedmodel reproduce tableII [--full]`."""
import sys

from fedmodel.reproductions.dald_table2 import run

if __name__ == "__main__":
    sys.exit(run(full="--full" in sys.argv))
