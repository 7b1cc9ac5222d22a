"""The Flower app a deployment runs on its server: the model file as a module, its problem,
and `server_app` (the ServerApp that solves it on the SuperNodes and writes the result as JSON)."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

from ..errors import FedModelError
from ..runtime.flower.driver import FlowerExecutor

try:
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
except ImportError:     # optional extra: Deployment then says how to install it
    ServerApp = None

APP_PACKAGE = "fedmodel_app"


def model_module(path: str | os.PathLike, name: str = "fedmodel_model") -> Any:
    """A model file (`fedmodel deploy`'s, `fedmodel run FILE`'s), the user's own, as a module
    (its `if __name__ == "__main__"` block does not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_problem(module: Any, n_clients: int):
    """The model file's problem: `make_problem(n_clients)` or its `problem`."""
    if hasattr(module, "make_problem"):
        return module.make_problem(n_clients)
    if hasattr(module, "problem"):
        return module.problem
    raise FedModelError(f"model file {getattr(module, '__file__', module)!r} defines neither "
                        "make_problem(n_clients) nor problem")


def _serve(grid: "Grid", context: "Context") -> None:
    """The ServerApp's main: solve the model with its clients on the SuperNodes, write the
    result (and a progress line per round) as JSON; a failure is written there too, so the
    launcher never waits for a result that will not come."""
    out = Path(str(context.run_config["out"]))
    try:
        _solve(grid, context.run_config, out)
    except Exception as err:
        out.write_text(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        raise


def _solve(grid: "Grid", config: Any, out: Path) -> None:
    model = importlib.import_module(f"{APP_PACKAGE}.model")
    problem = load_problem(model, int(config["clients"]))
    options = dict(getattr(model, "flower_options", {}))     # e.g. {"secure_sum": True}
    unknown = set(options) - {"secure_sum", "max_restarts"}
    if unknown:
        raise FedModelError(f"flower_options in the model file: {sorted(unknown)} are not options "
                            "of a deployment (allowed: secure_sum, max_restarts; the timeouts are "
                            "`fedmodel deploy` flags)")
    executor = FlowerExecutor(grid=grid, timeout=float(config["timeout"]),
                              start_timeout=float(config["start-timeout"]),
                              rejoin_timeout=float(config["rejoin-timeout"]), **options)
    progress = out.with_suffix(".progress")
    stamps: list[float] = []     # when each round ended (seconds per round, benchmarks)

    def callback(record: dict) -> None:
        stamps.append(time.perf_counter())
        # (round trips so far and where they went: a run stopped early still tells)
        line = {"objective": float(record.get("objective", float("nan"))),
                "round_trips": executor.round_trips, "trips": dict(executor.trips),
                "seconds": stamps[-1] - start,
                "breakdown": executor.round_trip_breakdown()}
        with open(progress, "a") as f:
            f.write(json.dumps(line) + "\n")

    start = time.perf_counter()
    # (no `backend` in the model file: Problem.solve's default backend)
    chosen = {"backend": model.backend} if hasattr(model, "backend") else {}
    result = problem.solve(executor=executor, callback=callback, **chosen,
                           **getattr(model, "solve_options", {}))
    summary = {
        "status": result.status, "objective": result.objective,
        "max_violation": result.max_violation, "backend": result.backend,
        "auto": result.info.get("auto"),        # what backend="auto" picked and why
        "values": {label: value.tolist() for label, value in result.values_by_label().items()},
        # (NaN where a round has no report, e.g. FedADMM's rounds(report=False))
        "history": [float(h.get("objective", float("nan"))) for h in result.history],
        "ledger": {"down": result.ledger.total("down"), "up": result.ledger.total("up")},
        "wire_bytes": {"down": executor.wire_total("down"), "up": executor.wire_total("up")},
        "round_trips": executor.round_trips, "trips": dict(executor.trips),
        "faults": executor.faults,
        "node_ids": executor.node_ids, "seconds": time.perf_counter() - start,
        "round_ends": [t - start for t in stamps],
        "secure_sum": executor.sum_only,
        "breakdown": executor.round_trip_breakdown(),
    }
    out.write_text(json.dumps(summary, default=str))


if ServerApp is not None:
    server_app = ServerApp()
    server_app.main()(_serve)
else:
    server_app = None

