"""Where a cold first solve's time goes, phase by phase, in this fresh process (`bench_cold.py
--part phases` runs it in a child; issue 27 item 3, issue 25 item 3).

    python benchmarks/cold_phases.py MODEL OPTIONS_JSON

MODEL: `monks` (NP monks-1 one-hot, n = 5, ProxAL: the cold-solve model of bench_cold) or
`mnist` (bench_large_d's MNIST 3v7 model, d = 784, 10 clients, DALD). Prints one JSON line:
CPU and wall seconds of each phase, exclusive (a nested phase's time is not its caller's):
imports, model building, and inside `prob.solve` the backend's look-up (its entry point and
modules), equilibration, the set-emptiness check in it (`projection.is_empty`), the node
programs (`compile_programs`), numba (its import and the compiled loops' module; then each
first call of a compiled loop: the on-disk cache's load or a compilation), the first outer
iteration and the rest. Phases are timed by wrapping fedmodel's functions in this process
only; nothing else changes. It imports the fedmodel its interpreter has installed.
"""
from __future__ import annotations

import json
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

CLOCKS = (time.perf_counter, time.process_time)
SPENT: dict[str, list[float]] = {}      # label → [wall, CPU], exclusive
STACK: list[list[float]] = []           # per running phase: its nested phases' [wall, CPU] so far
FIRST: list[float] = []                 # the loop's own [wall, CPU] up to its first outer iteration
LOOP_START: list[float] = []


def _now() -> list[float]:
    return [clock() for clock in CLOCKS]


def timed(label: str, fn):
    """`fn` whose time is booked to `label` (exclusive of phases nested in it)."""
    def wrapper(*args, **kwargs):
        start = _now()
        STACK.append([0.0, 0.0])
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = [b - a for a, b in zip(start, _now())]
            inner = STACK.pop()
            entry = SPENT.setdefault(label, [0.0, 0.0])
            for k in range(2):
                entry[k] += elapsed[k] - inner[k]
                if STACK:
                    STACK[-1][k] += elapsed[k]
    return wrapper


def patch(owner, name: str, label: str) -> None:
    """`owner.name` (a function, method or staticmethod) timed as `label`."""
    if owner is not None and hasattr(owner, name):
        original = owner.__dict__.get(name, getattr(owner, name)) if isinstance(owner, type) else getattr(owner, name)
        if isinstance(original, staticmethod):
            setattr(owner, name, staticmethod(timed(label, original.__func__)))
        else:
            setattr(owner, name, timed(label, original))


def _numba_hooks() -> None:
    """Once numba is in: every compiled loop's first call (cache load or compilation)."""
    dispatcher = sys.modules.get("numba.core.dispatcher")
    if dispatcher is not None and not getattr(dispatcher, "_cold_phases", False):
        dispatcher._cold_phases = True
        patch(dispatcher.Dispatcher, "_compile_for_args", "numba: first calls (cache load / compile)")


def _compiled_hook(module) -> None:
    if module is None:
        return
    original = module._compiled

    def wrapper():
        out = timed("numba: import + compiled loops' module", original)()
        _numba_hooks()
        return out
    module._compiled = wrapper


def _first_outer(owner, name: str) -> None:
    """Note the loop's own time (exclusive) when `name` (its outer-iteration record) first returns."""
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    fn = original.__func__ if isinstance(original, staticmethod) else original

    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        if not FIRST and STACK:
            loop = STACK[0]           # the loop's frame (`Backend.loop` runs at the outermost timed level)
            FIRST.extend(b - a - inner for a, b, inner in zip(LOOP_START, _now(), loop))
        return out
    setattr(owner, name, staticmethod(wrapper) if isinstance(original, staticmethod) else wrapper)


def _timed_loop(owner) -> None:
    """`owner.loop` timed as "the loop", its start noted for `_first_outer`."""
    loop = timed("the loop", owner.loop)

    def started(*args, **kwargs):
        LOOP_START[:] = _now()
        return loop(*args, **kwargs)
    owner.loop = started


def _loop_hooks() -> None:
    """Time the loops of DALD and ProxAL (the two models' backends) and note their first outer
    iteration, once their modules are in (the look-up imports them)."""
    dald, proxal = (sys.modules.get(m) for m in ("fedmodel.backends.dald.backend", "fedmodel.backends.proxal"))
    for module, owner, record in ((dald, "DALD", "_outer_step_done"), (proxal, "ProxAL", None)):
        if module is None or getattr(module, "_cold_phases", False):
            continue
        module._cold_phases = True
        if "compile" in vars(getattr(module, owner)):      # (ProxAL's own)
            patch(getattr(module, owner), "compile", "node programs (compile_programs)")
        _timed_loop(getattr(module, owner))
        _first_outer(getattr(module, owner), record) if record else _first_outer(module, "outer_record")
    kernels = sys.modules.get("fedmodel.backends.dald.kernels")
    if kernels is not None and not getattr(kernels, "_cold_phases", False):
        kernels._cold_phases = True
        _compiled_hook(kernels)


def main(model: str, options: dict) -> dict:
    marks = [("start", *_now())]

    def mark(name):
        marks.append((name, *_now()))
    import fedmodel as fm
    mark("import fedmodel")
    import fedmodel.backends  # noqa: F401
    mark("import fedmodel.backends")
    if model == "monks":
        from fedmodel.reproductions import proxal_table1
        X, y = proxal_table1.load("monks-1")
        prob, _, _ = proxal_table1.build(X, y, 5)
        backend = "proxal"
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_large_d import build
        prob, _ = build("mnist")
        backend = "dald"
    mark("data + model")
    import importlib
    from fedmodel import registry
    from fedmodel.compiler import projection
    base = importlib.import_module("fedmodel.backends.base")
    lookup = timed("backend look-up (entry point, backend modules)", registry.lookup)

    def looked_up(*args, **kwargs):         # the backend's modules are imported by now: hooks
        factory = lookup(*args, **kwargs)
        _loop_hooks()
        return factory
    registry.lookup = looked_up
    patch(base, "equilibrate", "equilibration (scaling.equilibrate)")
    patch(projection, "is_empty", "set-emptiness check (projection.is_empty)")
    patch(base.Backend, "compile", "node programs (compile_programs)")
    _compiled_hook(importlib.import_module("fedmodel.runtime.kernels"))   # (no numba until used)
    before = set(sys.modules)
    res = prob.solve(backend, **options)
    mark("solve")
    if FIRST and "the loop" in SPENT:       # the loop's own time split at its first outer iteration
        loop = SPENT.pop("the loop")
        SPENT["loop: first outer iteration"] = FIRST
        SPENT["loop: the rest"] = [loop[k] - FIRST[k] for k in range(2)]
    phases = {name: (t - marks[i][1], c - marks[i][2]) for i, (name, t, c) in enumerate(marks[1:])}
    return {"phases": phases, "solve": {k: tuple(v) for k, v in SPENT.items()},
            "total": (marks[-1][1] - marks[0][1], marks[-1][2] - marks[0][2]),
            "status": str(res.status), "iterations": res.iterations, "rounds": res.ledger.rounds,
            "objective": res.objective, "imported in solve": sorted(
                {m.split(".")[0] for m in set(sys.modules) - before} & {"scipy", "numba", "networkx"}),
            "fedmodel": fm.__file__}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})))
