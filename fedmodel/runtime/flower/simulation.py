"""Flower's simulation engine for `FlowerExecutor` (no `grid` given): `flwr.simulation.run_simulation`
runs in a background thread and starts a ServerApp there whose `main` hands nothing out but
serves a queue of jobs, each `work(grid)` run in that thread, so the Grid is only ever used by
the thread Flower gave it to (docs/flower.md)."""
from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any, Callable

from ...errors import FedModelError
from .client_app import client_app

# how long `stop` waits for the simulation's thread: a ServerApp that started returns at once,
# one still starting takes its start (Flower, then Ray); a run stuck before it is left behind
# (a daemon thread) rather than hanging the caller
STOP_TIMEOUT = 60.0

try:
    from flwr.serverapp import ServerApp
except ImportError:     # optional extra: make_executor("flower") then says how to install it
    ServerApp = None


class Simulation:
    """Flower's simulation engine with `n` SuperNodes running fedmodel's ClientApp, started in a
    background thread (within `start_timeout` s, else a FedModelError); `ask` runs work on its
    grid, `stop` ends it."""

    def __init__(self, n: int, backend_config: dict, start_timeout: float):
        from flwr.simulation import run_simulation

        self.n = n
        self._failure: list[BaseException] = []
        self._jobs: queue.Queue = queue.Queue()
        ready_box: queue.Queue = queue.Queue()
        server_app = ServerApp()

        @server_app.main()
        def _main(grid: Any, context: Any) -> None:
            if hasattr(grid, "pull_interval"):     # the in-memory grid polls for replies: 0.1 s
                grid.pull_interval = 0.002
            ready_box.put(True)
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                work, box = job
                try:
                    box.put((True, work(grid)))
                except BaseException as err:    # handed to the caller's thread, which raises it
                    box.put((False, err))

        def _simulate() -> None:
            try:
                run_simulation(server_app=server_app, client_app=client_app, num_supernodes=n,
                               backend_config=json.loads(json.dumps(backend_config)))
            except BaseException as err:    # reported to the caller by `ask`
                self._failure.append(err)
            finally:
                ready_box.put(False)

        self._thread = threading.Thread(target=_simulate, name="fedmodel-flower", daemon=True)
        self._thread.start()
        try:
            ready = ready_box.get(timeout=start_timeout)
        except queue.Empty:
            ready = None
        if not ready:       # ended, not the thread left behind: a late ServerApp returns at once
            self.stop()
            raise FedModelError(f"Flower's simulation did not start within {start_timeout:g} s "
                                "(start_timeout)" if ready is None else
                                f"Flower's simulation failed to start: {self._failure_text()}")

    def _failure_text(self) -> str:
        return repr(self._failure[0]) if self._failure else "it ended"

    def ask(self, work: Callable[[Any], Any], timeout: float) -> Any:
        """`work(grid)` run in the ServerApp's thread: its result, or its exception raised here."""
        if not self._thread.is_alive():
            raise FedModelError(f"Flower's simulation is not running ({self._failure_text()})")
        box: queue.Queue = queue.Queue()
        self._jobs.put((work, box))
        deadline = time.monotonic() + timeout + 30.0     # the grid's own timeout ends it first
        while True:
            try:
                ok, value = box.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    raise FedModelError("Flower's ServerApp stopped answering "
                                        f"({self._failure_text()})") from None
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """End the simulation: its ServerApp returns; Flower then stops its workers and the Ray
        it started."""
        self._jobs.put(None)
        self._thread.join(timeout=STOP_TIMEOUT)
