"""Reproduce Table I (regression: AIO vs Fed-DALD-DC on a 3-node chain) of the DALD paper.
Same as `fedmodel reproduce tableI [--full]`."""
import sys

from fedmodel.reproductions.dald_table1 import run

if __name__ == "__main__":
    sys.exit(run(full="--full" in sys.argv))
