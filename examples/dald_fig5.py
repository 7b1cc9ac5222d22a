"""Reproduce Fig. 5 (accuracy curves over the first 300 iterations) of "Distributed optimization: designed for federated learning" (DALD).
Same as `fedmodel reproduce fig5 [--full]`."""
import sys

from fedmodel.reproductions.dald_fig5 import run

if __name__ == "__main__":
    sys.exit(run(full="--full" in sys.argv))
