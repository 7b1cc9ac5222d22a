"""Reproduce Table 2 of "Federated learning with convex global and local constraints"
(fairness-constrained logistic regression with nonconvex loss-disparity constraints on adult
rebuilt from the raw UCI files). Same as `fedmodel reproduce table2 [--full]`."""
import sys

from fedmodel.reproductions.proxal_table2 import run

if __name__ == "__main__":
    sys.exit(run(full="--full" in sys.argv))
