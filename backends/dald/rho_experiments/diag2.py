import os
import sys, numpy as np
import fedmodel.backends.dald.spectral as sp
sp.LATE = "log"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure
for name in sys.argv[1:]:
    del sp.LATE_LOG[:]
    getattr(measure, name)()
    print(" ".join(f"{j}:{f:.2g}" for j, f in sp.LATE_LOG if j % 2 == 0)[:1500])
