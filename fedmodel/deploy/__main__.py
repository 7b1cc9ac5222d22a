"""`python -m fedmodel.deploy flower-supernode ARGS`: a deployment's SuperNode (`supernode.py`)."""
import os
import sys

from .deployment import POLL_ENV
from .supernode import SUPERNODE_POLL_ENV, run_supernode

if sys.argv[1:2] != ["flower-supernode"]:
    raise SystemExit("usage: python -m fedmodel.deploy flower-supernode [flower-supernode args]")
run_supernode(sys.argv[2:], float(os.environ.get(SUPERNODE_POLL_ENV, POLL_ENV[SUPERNODE_POLL_ENV])))
