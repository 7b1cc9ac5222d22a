"""Start cost of the batched executor per engine (numpy, JAX): grouping the clients by
structure and building each group (`BatchedExecutor.start`), on n compiled clients of two
structures (logistic and least squares, each + λ‖w‖₁, d features, 10–29 rows each).

    python benchmarks/bench_engine_start.py child 1000 10 15
        per engine: median CPU ms of `start`, and of the group constructors inside it
    python benchmarks/bench_engine_start.py drive 1000 10 15 3 BASE_PYTHON BASE_DIR NEW_PYTHON NEW_DIR
        alternates child processes of two checkouts (each run with its own interpreter and
        editable install, from its own root) and prints the ratios new / base

CPU time (time.process_time), not wall time: the machine is shared. Issue 26 (one executor,
two engines): the JAX engine built every group twice before (numpy's Group, then a JaxGroup).
Not part of the test suite.
"""
import json, os, statistics, subprocess, sys, time


def child(n, d, reps):
    import numpy as np
    import fedmodel as fm
    from fedmodel.runtime.program import compile_programs
    from fedmodel.runtime.batched_group import Group
    from fedmodel.runtime.batched import BatchedExecutor
    from fedmodel.runtime.jax_executor import JaxExecutor
    rng = np.random.default_rng(0)
    w = fm.Variable(d, name="w")
    prob = fm.Problem()
    for i in range(n):
        m = int(rng.integers(10, 30))
        c = prob.add_client(f"c{i}")
        X, y = c.data(rng.normal(size=(m, d)), name="X"), c.data(np.sign(rng.normal(size=m)), name="y")
        loss = fm.sum(fm.logistic(-fm.multiply(y, X @ w))) if i % 2 else fm.sum_squares(X @ w - y)
        c.minimize(loss / m + 0.01 * fm.norm1(w))
    programs = compile_programs(prob)
    inside = [0.0]
    init = Group.__init__

    def timed(self, *a, **k):
        t = time.process_time()
        init(self, *a, **k)
        inside[0] += time.process_time() - t
    Group.__init__ = timed
    out = {}
    for name, make in (("batched", BatchedExecutor), ("jax", JaxExecutor)):
        starts, groups = [], []
        for _ in range(reps):
            ex = make()
            inside[0] = 0.0
            t = time.process_time()
            ex.start(programs)
            starts.append(time.process_time() - t)
            groups.append(inside[0])
            ex.close()
        out[name] = (statistics.median(starts) * 1e3, statistics.median(groups) * 1e3)
    print(json.dumps(out))


def drive(n, d, reps, pairs, base_py, base_dir, new_py, new_dir):
    results = {"base": [], "new": []}
    for _ in range(pairs):
        for label, py, where in (("base", base_py, base_dir), ("new", new_py, new_dir)):
            out = subprocess.run([py, os.path.abspath(__file__), "child", str(n), str(d), str(reps)],
                                 cwd=where, capture_output=True, text=True, check=True)
            results[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"# n={n} d={d}, {reps} starts per child, {pairs} alternating pairs, load {os.getloadavg()[0]:.1f}")
    for name in ("batched", "jax"):
        for k, what in ((0, "start"), (1, "group constructors")):
            b = statistics.median(r[name][k] for r in results["base"])
            a = statistics.median(r[name][k] for r in results["new"])
            print(f"{name:8s} {what:19s} base {b:7.2f} ms  new {a:7.2f} ms  new/base {a / b:.2f}")


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(*map(int, sys.argv[2:5]))
    else:
        drive(*map(int, sys.argv[2:6]), *sys.argv[6:10])
