import os
import sys, numpy as np
import fedmodel.backends.dald.spectral as sp
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure
captured = []
def settle(weights, now, hist=None):
    captured.append(np.array(weights)); return 1.0
sp.settle = settle; sp.SETTLE = "x"
for name in sys.argv[1:]:
    del captured[:]
    getattr(measure, name)()
    for w in captured:
        ch = np.r_[0, np.flatnonzero(np.diff(w)) + 1]
        print(" ".join(f"{i}:{w[i]:.2g}" for i in ch))
