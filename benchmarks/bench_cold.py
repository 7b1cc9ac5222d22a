"""Cheap rounds and a cold first solve (issue 27, item 3).

Two measurements, CPU seconds (`time.process_time`; wall beside it where it matters) with
BLAS on one thread:

1. **Cold first solve**: a fresh interpreter runs `import fedmodel`, `import fedmodel.backends`,
   builds NP monks-1 one-hot at n = 5 (the ProxAL Table 1 reproduction's loader and split) and
   runs `prob.solve("proxal")` (the defaults: Newton steps where they fit, since branch
   proxaldefault); each phase timed in the child, `--repeats`
   fresh processes (after one that writes the bytecode caches), the fastest kept. `--max-outer K` caps ProxAL's outer iterations (the
   default solve's round trips are item 2's business; the cap keeps the phases comparable).
2. **Per ADMM step per client**: default ProxAL with Algorithm 2 (`inner="admm"`) stopped after 1 and after 4 outer iterations
   (K1 < K2 ADMM iterations), on the serial and the batched executor; (CPU(4) − CPU(1)) /
   ((K2 − K1)·n) is one round of Algorithm 2 (the server's solve (18), every client's step
   (19)–(22), the messages, the outer steps' share) per client, set-up cancelled. Beside it
   "held": the first outer iteration stopped after 10 and after 40 ADMM iterations, i.e. steps
   while the clients hold their constraints in their local solves (local solver "local-al";
   a first ADMM run that ends unsolved puts them back in the augmented Lagrangian, so the
   outer 1 → 4 figure may time the AL path: the script prints where they were). `--executors
   serial batched jax`. Beside them the node program's own costs: one merit evaluation (value
   and gradient plan), one Hessian, and the first Hessian (its plan derived and compiled).

3. **Where a serial step goes** (`--part breakdown`): exclusive CPU time per layer of one ADMM
   step per client (NP monks-1 n = 5, 3 outer iterations), each layer's functions wrapped by
   a timer (the wrappers' own cost is printed beside: subtract it when comparing with part 2).

Models (d ≤ 50): np-monks1 (556 × 17), logistic-ball-50 (mean logistic loss, 40 rows a
client, d = 50, client ball ‖w‖₂ ≤ 1 and a server ridge), np-adult (32,561 × 14; `--adult`),
least-squares-ball-10/17/50 (quadratic clients, 40 rows each, an active server ball).

    python benchmarks/bench_cold.py                  # both parts (~5 min on a quiet machine)
    python benchmarks/bench_cold.py --part steps --n 5 40 --models logistic-ball-50
    python benchmarks/bench_cold.py --part steps --n 5 40 200 --models np-monks1 \
        --executors serial batched jax --skip-default serial:200 --repeats 2
    python benchmarks/bench_cold.py --part cold --max-outer 3
    python benchmarks/bench_cold.py --part breakdown --executor serial
    python benchmarks/bench_cold.py --part phases --model mnist --repeats 3   # DALD, d = 784
    python benchmarks/bench_cold.py --part phases --model monks --max-outer 1
    python benchmarks/bench_cold.py --part form --n 5 --executors serial --repeats 3

5. **The client step alone** (`--part form`): CPU of ProxAL's client step form per client step
   in steady state (`form_step`: local solve (19), certificate (22), (20), (21)), without the
   executor and the server.

4. **Phases of a cold solve** (`--part phases`, `cold_phases.py` in fresh processes): imports,
   model, and inside the solve the backend's look-up, equilibration, the set-emptiness check,
   the node programs, numba (import, first calls), the first outer iteration and the rest.

It imports the fedmodel its interpreter has installed (it does not put this checkout on the
path), so one script measures two checkouts: run it with each one's interpreter.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before numpy: a shared machine's cores

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

COLD = r"""
import json, os, sys, time
marks = [("start", time.perf_counter(), time.process_time())]
def mark(name):
    marks.append((name, time.perf_counter(), time.process_time()))
import fedmodel as fm
mark("import fedmodel")
import fedmodel.backends
mark("import backends")
from fedmodel.reproductions import proxal_table1
X, y = proxal_table1.load("monks-1")
prob, w, _ = proxal_table1.build(X, y, 5)
mark("data + model")
options = json.loads(sys.argv[1])
res = prob.solve("proxal", **options)
mark("solve")
warm_start = (time.perf_counter(), time.process_time())
again = prob.solve("proxal", **options)
warm = (time.perf_counter() - warm_start[0], time.process_time() - warm_start[1])
phases = {name: (t - marks[i][1], c - marks[i][2]) for i, (name, t, c) in enumerate(marks[1:])}
print(json.dumps({"phases": phases, "total": (marks[-1][1] - marks[0][1], marks[-1][2] - marks[0][2]),
                  "warm": warm, "status": str(res.status), "iterations": res.iterations,
                  "rounds": res.ledger.rounds, "objective": res.objective,
                  "same_again": bool(again.objective == res.objective),
                  "scipy": any(m.split(".")[0] == "scipy" for m in sys.modules),
                  "fedmodel": fm.__file__}))
"""


def _fresh(args: list[str], repeats: int) -> list[dict]:
    """`repeats` fresh interpreters running `args` (after one untimed run that writes the
    bytecode caches: see `cold_solve`), each one's last stdout line read as JSON."""
    runs = []
    with tempfile.TemporaryDirectory() as where:     # not a checkout: the installed fedmodel
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = os.path.join(where, "pycache")
        for _ in range(repeats + 1):
            out = subprocess.run([sys.executable, *args], cwd=where, env=env, capture_output=True,
                                 text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs[1:]


def phases(model: str, repeats: int, max_outer: int | None) -> None:
    """Print each phase of a cold solve (`cold_phases.py`): the fastest of `repeats` fresh
    processes by total CPU, and every run's CPU beside it."""
    options = {} if max_outer is None else {"max_outer": max_outer}
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cold_phases.py")
    runs = _fresh([script, model, json.dumps(options)], repeats)
    best = min(runs, key=lambda r: r["total"][1])
    print(f"\ncold solve phases, {model}: {best['status']}, {best['iterations']}, objective "
          f"{best['objective']:.10g}; imported in the solve: {best['imported in solve']}")
    print("| phase | wall s | CPU s | CPU s, every run |\n|---|---:|---:|---|")
    rows = [*best["phases"].items(), *best["solve"].items(), ("total", best["total"])]
    for name, (wall, cpu) in rows:
        every = [r["total"] if name == "total" else r["phases"].get(name, r["solve"].get(name, (0, 0)))
                 for r in runs]
        print(f"| {'  ' if name in best['solve'] else ''}{name} | {wall:.3f} | {cpu:.3f} | "
              f"{' / '.join(f'{c:.3f}' for _, c in every)} |")


def cold_solve(repeats: int, max_outer: int | None) -> dict:
    """The fastest (by total CPU) of `repeats` fresh-process cold solves, after one untimed
    run that writes the bytecode caches (an installed package has them; with
    PYTHONDONTWRITEBYTECODE set, as on this project's machines, every process would compile
    fedmodel's sources again: ~0.2 s CPU)."""
    options = {} if max_outer is None else {"max_outer": max_outer}
    return min(_fresh(["-c", COLD, json.dumps(options)], repeats), key=lambda r: r["total"][1])


# ---- models ----------------------------------------------------------------------------------
def np_data(name: str):
    from fedmodel.reproductions import proxal_table1
    return proxal_table1.load(name)


def neyman_pearson(data, n: int):
    from fedmodel.reproductions import proxal_table1
    X, y = data
    prob, w, _ = proxal_table1.build(X, y, n)
    return prob


def logistic_ball(n: int, d: int = 50, rows: int = 40, radius: float = 1.0, ridge: float = 0.01):
    """Mean logistic loss (labels from a logistic model), client balls ‖w‖₂ ≤ radius (active)
    and a server ridge: bench_rounds' logistic-ball at d = 50."""
    import fedmodel as fm
    rng = np.random.default_rng(2)
    w_true = 6.0 * rng.standard_normal(d) / np.sqrt(d)        # ‖w_true‖ ≈ 6: the ball is active
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name="logistic-ball-50")
    for i in range(n):
        X = rng.standard_normal((rows, d)) + 0.3 * rng.standard_normal(d)
        margin = X @ w_true
        y = np.where(rng.random(rows) < 1 / (1 + np.exp(-margin)), 1.0, -1.0)
        c = prob.add_client(f"c{i}")
        c.minimize(fm.mean(fm.logistic(c.data(-y[:, None] * X, name="Z") @ w)) / n)
        c.subject_to(fm.norm2(w) <= radius)
    prob.server.minimize(0.5 * ridge * fm.sum_squares(w))
    return prob


def least_squares_ball(n: int, d: int = 10, rows: int = 40, radius: float = 1.0):
    """Mean squared error clients (quadratic: ProxAL's local solve (19) is one linear solve,
    `fedmodel.runtime.exact_step`) and a server ball ‖w‖₂ ≤ radius that is active — the wine
    reproducer's form (docs/BENCHMARKS.md, section stepcost) at d = 10, 17, 50."""
    import fedmodel as fm
    rng = np.random.default_rng(3)
    w_true = 3.0 * rng.standard_normal(d) / np.sqrt(d)        # ‖w_true‖ ≈ 3: the ball is active
    w = fm.Variable(d, name="w")
    prob = fm.Problem(name=f"least-squares-ball-{d}")
    for i in range(n):
        X = rng.standard_normal((rows, d)) + 0.3 * rng.standard_normal(d)
        y = X @ w_true + 0.1 * rng.standard_normal(rows)
        c = prob.add_client(f"c{i}")
        c.minimize(fm.sum_squares(c.data(X, name="X") @ w - c.data(y, name="y")) / (rows * n))
    prob.server.subject_to(fm.norm2(w) <= radius)
    return prob


# ---- per step --------------------------------------------------------------------------------
def _run(prob, executor: str, outer: int, **options) -> tuple[float, int, str]:
    """CPU seconds, ADMM iterations and where the clients' constraints were
    (`info["client_constraints"]`) of default ProxAL with Algorithm 2 (`inner="admm"`: its
    default inner takes Newton steps where they fit) stopped after `outer` outer iterations."""
    start = time.process_time()
    res = prob.solve("proxal", executor=executor, max_outer=outer, inner="admm", **options)
    return time.process_time() - start, int(res.iterations["inner"]), \
        str(res.info.get("client_constraints") or "-")


def per_step(prob, n: int, executor: str, outer=(1, 4), repeats: int = 3) -> tuple[float, int]:
    """(µs of CPU per ADMM iteration per client, iterations in the difference): default ProxAL
    stopped after outer[0] and after outer[1] outer iterations, set-up cancelled by the
    difference (the iterations between are the default run's own)."""
    best, count, _ = per_step_where(prob, n, executor, outer, repeats)
    return best, count


def per_step_where(prob, n: int, executor: str, outer=(1, 4), repeats: int = 3,
                   **options) -> tuple[float, int, str]:
    """`per_step`, and where the client constraints were in the longer run (a run whose first
    ADMM run ends unsolved puts them back in the augmented Lagrangian: then the steps timed
    are the AL path's)."""
    best, count, where = np.inf, 0, ""
    _run(prob, executor, outer[0], **options)   # warm-up: the first run compiles the plans' structures
    for _ in range(repeats):
        (t1, k1, _), (t2, k2, where) = _run(prob, executor, outer[0], **options), \
            _run(prob, executor, outer[1], **options)
        if k2 > k1:
            best, count = min(best, (t2 - t1) / ((k2 - k1) * n)), k2 - k1
    return best * 1e6, count, where


HELD = (10, 40)     # ADMM iterations of the first outer iteration timed by `held_step`


def held_step(prob, n: int, executor: str, repeats: int = 3) -> tuple[float, int]:
    """µs of CPU per ADMM iteration per client while the clients hold their constraints in
    their local solves (local solver "local-al"): the first outer iteration stopped after
    HELD[0] and after HELD[1] ADMM iterations (`max_inner`), the difference per step and
    client (fewer when the first ADMM run ends sooner)."""
    best = np.inf
    count = 0
    _run(prob, executor, 1, max_inner=HELD[0])
    for _ in range(repeats):
        (t1, k1, _), (t2, k2, _) = _run(prob, executor, 1, max_inner=HELD[0]), \
            _run(prob, executor, 1, max_inner=HELD[1])
        if k2 > k1:
            best, count = min(best, (t2 - t1) / ((k2 - k1) * n)), k2 - k1
    return best * 1e6, count


def program_costs(prob) -> dict:
    """µs of CPU: one merit evaluation, one Hessian, and the first Hessian (derive + compile)
    of the first client, at a point and parameters of a run (β = 300, ω = 0.1)."""
    from fedmodel.runtime.program import compile_programs
    program = compile_programs(prob)[prob.clients[0].name]
    program.configure(300.0, 0.1, np.zeros(program.n_shared))
    z = np.linspace(-0.3, 0.3, program.n_shared + program.n_private)
    x, y = z[:program.n_shared], z[program.n_shared:]
    start = time.process_time()
    program.hessian(z)
    first = time.process_time() - start

    def best(fn, number=200):
        times = []
        for _ in range(5):
            t = time.process_time()
            for _ in range(number):
                fn()
            times.append((time.process_time() - t) / number)
        return min(times) * 1e6
    values = program._values(x, y)
    return {"merit": best(lambda: program.value_grad_plan(*values)),
            "hessian": best(lambda: program.hessian(z)), "first hessian": first * 1e6,
            "d": program.n_shared + program.n_private}


def form_step(prob, n: int, executor: str, steps: int = 200) -> float:
    """µs of CPU per client step of ProxAL's client step form (local solve (19), certificate
    (22), (20), (21)) in steady state: the clients' programs configured (β = 1e3, ω = 1) and
    initialized ("proxal_admm_init" at w = 0.1·1), then `steps` steps at a server point that
    moves a little each step; "serial": each client's step on its own (`NodeRows`: what the
    serial executor runs), "batched": one step of the whole group (`Group`). The executor's
    messages, the ledger and the server's solve are not in it; the first step is untimed
    (Hessians, factors and plans built)."""
    import fedmodel.backends.proxal_nodes as proxal_nodes
    from fedmodel.runtime.batched_group import Group
    from fedmodel.runtime.client_step import NodeRows
    from fedmodel.runtime.program import compile_programs
    programs = [p for p in compile_programs(prob).values() if p.role == "client"]
    d = programs[0].n_shared
    w0 = np.full(d, 0.1)
    init = {"w": w0, "rho": 10.0, "anderson": 0.0, "beta": 1e3, "prox_weight": 1.0}
    for p in programs:
        proxal_nodes._admm_init(NodeRows(p), [p.name], {p.name: dict(init)})
    names = [p.name for p in programs]
    group = Group(names, programs) if executor == "batched" else None
    times = []
    for t in range(steps + 1):
        w = w0 + 1e-3 * np.sin(t + np.arange(d))
        payload = {"w": w, "eps": 1e-9, "adaptive": 0.0, "solver": "auto", "restart": 0.0}
        start = time.process_time()
        if group is not None:
            proxal_nodes._admm_step(group, names, {m: payload for m in names})
        else:
            for p in programs:
                proxal_nodes._admm_step(NodeRows(p), [p.name], {p.name: payload})
        times.append(time.process_time() - start)
    return 1e6 * float(np.sum(times[1:])) / (steps * len(programs))


def step_breakdown(executor: str = "serial", outer: int = 3) -> None:
    """Print the exclusive CPU µs per client step of each layer of a default ProxAL run on NP
    monks-1 n = 5 (module docstring, part 3). Patches fedmodel's classes in this process."""
    import fedmodel.backends.anderson as anderson
    import fedmodel.backends.proxal_nodes as proxal_nodes
    import fedmodel.runtime.batched_group as batched_group
    import fedmodel.runtime.client_step as client_step
    import fedmodel.runtime.compiled_merit as compiled_merit
    import fedmodel.runtime.executor as executors
    import fedmodel.runtime.local_solvers as local_solvers
    import fedmodel.runtime.program as program
    import fedmodel.runtime.solvers as solvers
    from fedmodel.compiler import codegen
    clock, spent, stack = time.process_time, {}, []

    def timed(label, fn):
        def wrapper(*args, **kwargs):
            start = clock()
            stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = clock() - start
                inner = stack.pop()
                entry = spent.setdefault(label, [0, 0.0])
                entry[0] += 1
                entry[1] += elapsed - inner
                if stack:
                    stack[-1] += elapsed
        return wrapper
    layers = [(executors.Executor, "map", "executor map, payload checks, ledger"),
              (client_step.OneNode, "__call__", "client step on one node (NodeRows built)"),
              (anderson.ClientHistory, "mix", "Anderson, client side"),
              (anderson.ClientHistory, "push", "Anderson, client side"),
              (batched_group.Group, "_solve_each", "Group._solve_each (rows → one solve)"),
              (program.NodeProgram, "solve_local", "NodeProgram.solve_local (local problem)"),
              (solvers, "newton", "Newton loop (solvers.newton)"),
              (solvers, "backtrack", "backtracking (solvers.backtrack)"),
              (local_solvers, "newton_matrix", "Newton matrix (chord Hessian, inverse)"),
              (compiled_merit.CompiledMerit, "value_grad", "CompiledMerit.value_grad (memo, copies)"),
              (compiled_merit.CompiledMerit, "gradient_z", "CompiledMerit.gradient_z (memo)"),
              (compiled_merit.CompiledMerit, "hessian", "Hessian (its plan)")]
    for owner, name, label in layers:
        if hasattr(owner, name):
            setattr(owner, name, timed(label, getattr(owner, name)))
    built = codegen.Plan.__init__

    def init(self, *args, **kwargs):
        built(self, *args, **kwargs)
        self._run = timed("plan evaluations (numpy)", self._run)
    codegen.Plan.__init__ = init
    serve = proxal_nodes._admm_step.procedure.serve
    object.__setattr__(serve, "form", timed("ProxAL's step form (backends/proxal_nodes.py)", serve.form))
    prob = neyman_pearson(np_data("monks-1"), 5)
    prob.solve("proxal", max_outer=outer, executor=executor, inner="admm")       # plans built, wrapped
    empty, start = timed("-", lambda: None), clock()
    for _ in range(20000):
        empty()
    overhead = (clock() - start) / 20000
    spent.clear()
    start = clock()
    res = prob.solve("proxal", max_outer=outer, executor=executor, inner="admm")   # (Algorithm 2's steps)
    total = clock() - start
    steps = int(res.iterations["inner"]) * 5
    calls = sum(n for n, _ in spent.values())
    print(f"\nwhere a client step goes: ProxAL defaults, NP monks-1 n = 5, executor={executor!r}, "
          f"{outer} outer iterations ({steps} client steps): {1e6 * total / steps:.0f} µs CPU a "
          f"step as wrapped; the timers' own cost ~{overhead * 1e6:.1f} µs × {calls / steps:.1f} "
          f"calls = {overhead * calls / steps * 1e6:.0f} µs of it")
    print("| layer (exclusive) | calls / step | µs / step | share |\n|---|---:|---:|---:|")
    for label, (count, seconds) in sorted(spent.items(), key=lambda item: -item[1][1]):
        print(f"| {label} | {count / steps:.2f} | {1e6 * seconds / steps:.0f} | {seconds / total:.0%} |")
    rest = total - sum(seconds for _, seconds in spent.values())
    print(f"| the rest (ProxAL's server loop and solve, outer steps) | | {1e6 * rest / steps:.0f} | "
          f"{rest / total:.0%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("cold", "steps", "both", "breakdown", "phases", "form"), default="both")
    parser.add_argument("--model", choices=("monks", "mnist"), default="monks", help="of --part phases")
    parser.add_argument("--executor", default="serial", help="the executor of --part breakdown")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-outer", type=int, default=None)
    parser.add_argument("--n", type=int, nargs="+", default=[5, 40])
    parser.add_argument("--adult", action="store_true", help="also NP adult (32,561 rows)")
    parser.add_argument("--models", nargs="+", default=None, help="only these models (per-step part)")
    parser.add_argument("--executors", nargs="+", default=["serial", "batched"],
                        help="executors of the per-step part (serial, batched, jax)")
    parser.add_argument("--skip-default", nargs="+", default=[], metavar="EXECUTOR:N",
                        help="no outer 1 → 4 figure for these (e.g. serial:200: minutes a run)")
    args = parser.parse_args()
    skip: dict = {}
    for item in args.skip_default:
        executor, n = item.split(":")
        skip.setdefault(executor, set()).add(int(n))
    args.skip_default = skip
    import fedmodel
    print(f"fedmodel: {fedmodel.__file__}; python {sys.version.split()[0]}; numpy {np.__version__}; "
          f"load average {os.getloadavg()[0]:.1f}")
    if args.part == "breakdown":
        step_breakdown(args.executor)
        return
    if args.part == "phases":
        phases(args.model, args.repeats, args.max_outer)
        return
    if args.part in ("cold", "both"):
        run = cold_solve(args.repeats, args.max_outer)
        print(f"\ncold first solve, NP monks-1 n = 5, ProxAL defaults"
              f"{'' if args.max_outer is None else f' (max_outer={args.max_outer})'}: "
              f"{run['status']}, {run['iterations']}, {run['rounds']} round trips, "
              f"objective {run['objective']:.10g}; scipy imported: {run['scipy']}")
        print("| phase | wall s | CPU s |\n|---|---:|---:|")
        for name, (wall, cpu) in run["phases"].items():
            print(f"| {name} | {wall:.3f} | {cpu:.3f} |")
        print(f"| **total (cold)** | **{run['total'][0]:.3f}** | **{run['total'][1]:.3f}** |")
        print(f"| the same solve again, warm | {run['warm'][0]:.3f} | {run['warm'][1]:.3f} |")
    if args.part in ("steps", "both", "form"):
        models = {"np-monks1": lambda n, data=np_data("monks-1"): neyman_pearson(data, n),
                  "logistic-ball-50": logistic_ball,
                  **{f"least-squares-ball-{d}": (lambda n, d=d: least_squares_ball(n, d)) for d in (10, 17, 50)}}
        if args.adult:
            models["np-adult"] = lambda n, data=np_data("adult-a"): neyman_pearson(data, n)
        if args.models:
            models = {name: build for name, build in models.items() if name in args.models}
        if args.part == "form":
            print("\n| model | d | n | executor | µs / client step in the form | client steps timed |"
                  "\n|---|---:|---:|---|---:|---:|", flush=True)
            for name, build in models.items():
                for n in args.n:
                    prob = build(n)
                    for executor in args.executors:
                        cost = min(form_step(prob, n, executor) for _ in range(args.repeats))
                        print(f"| {name} | {prob.variables()[0].size} | {n} | {executor} | {cost:.0f} | "
                              f"200 × {n} |", flush=True)
            return
        print("\n| model | d | n | executor | µs / step / client, outer 1 → 4 | ADMM iterations timed "
              "| held: µs / step / client, ADMM 10 → 40 | merit eval µs | Hessian µs "
              "| first Hessian µs |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|", flush=True)
        wheres = {}
        for name, build in models.items():
            for n in args.n:
                prob = build(n)
                costs = program_costs(prob)
                for executor in args.executors:
                    if n in args.skip_default.get(executor, ()):
                        default, count, where = np.nan, 0, "not run"
                    else:
                        default, count, where = per_step_where(prob, n, executor, repeats=args.repeats)
                    held, held_count = held_step(prob, n, executor, repeats=args.repeats)
                    wheres[(name, n, executor)] = where
                    print(f"| {name} | {costs['d']} | {n} | {executor} | {default:.0f} | {count} | "
                          f"{held:.0f} ({held_count}) | {costs['merit']:.0f} | {costs['hessian']:.0f} | "
                          f"{costs['first hessian']:.0f} |", flush=True)
        for key, where in wheres.items():
            print(f"client constraints in the outer 1 → 4 runs, {key}: {where}")


if __name__ == "__main__":
    main()
