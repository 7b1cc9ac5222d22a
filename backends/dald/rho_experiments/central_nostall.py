import os, sys, importlib.util, numpy as np, warnings
warnings.simplefilter("ignore")
import fedmodel as fm
import fedmodel.backends.dald.spectral as sp
sp.ESTIMATE = os.environ.get("EST", "")
spec = importlib.util.spec_from_file_location("cf", "/work/wt_daldrho/examples/centralized_form.py")
cf = importlib.util.module_from_spec(spec); spec.loader.exec_module(cf)
rp = cf.make_problem(5); ref = rp.solve("cvxpy"); xr = ref.value(rp.shared_variables()[0])
prob = cf.make_problem(5); w = prob.shared_variables()[0]
res = prob.solve("dald", stall_window=None, max_iterations=int(os.environ.get("CAP", 1000)))
x = res.value(w)
print(res.status, res.iterations, np.max(np.abs(x - xr)) / np.max(np.abs(xr)))
for h in res.history[::50][:25]:
    print(h["iteration"], f"{h['primal_residual']:.2e} {h['dual_residual']:.2e} {h['constraint_residual']:.2e} w {h['weight']:.3g}")
