import os
import sys, numpy as np
import fedmodel.backends.dald.spectral as sp
log = []
orig = sp.penalty
def penalty(tau, client, server, correlation=sp.CORRELATION):
    a, ac = sp.curvature(*client); b, bc = sp.curvature(*server)
    new = orig(tau, client, server, correlation)
    log.append((tau, a, ac, b, bc, new))
    return new
sp.penalty = penalty
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure
getattr(measure, sys.argv[1])()
for i, r in enumerate(log):
    print(f"{2*(i+1):4d} tau {r[0]:9.3g} alpha {r[1]:9.3g} ({r[2]:.2f}) beta {r[3]:9.3g} ({r[4]:.2f}) -> {r[5]:9.3g}")
