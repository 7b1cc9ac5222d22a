"""Reproduce Table 4 of "Federated learning with convex global and local constraints" (the
linearly constrained QP). Same as `fedmodel reproduce table4 [--full]`."""
import sys

from fedmodel.reproductions.proxal_table4 import run

if __name__ == "__main__":
    sys.exit(run(full="--full" in sys.argv))
