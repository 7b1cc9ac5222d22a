"""FedADMM's server loop (Song, Wang, Zuazua, arXiv 2402.13989, Algorithms 1 and 3; equation
numbers: that paper): the rounds on a started executor — the clients' updates, the z-step
(3.1)/(3.2), the divergence watch, the history, checkpoints. With every client taking part a
round sends one group request (`Executor.map_stacked`: common z, the replies as stacks), which
the batched and JAX executors serve as one block and the others split into per-node messages;
partial participation sends per-node requests to the round's sample (`map(missing="drop")`: a client
that does not reply is dropped)."""
from __future__ import annotations

import math
import time

import numpy as np

from fedmodel.errors import FedModelError
from fedmodel.runtime.checkpoint import NO_CHECKPOINT, Checkpointer
from fedmodel.runtime.executor import Rider
from ..common import complete_record, progress, stacked_report
from ..watch import DivergenceWatch
from .insa import sustained_growth
from ..outcome import Status


def rounds(backend, ex, z: np.ndarray, alpha: np.ndarray, max_rounds: int, callback=None, bar=None, *,
           lam_start: str = "zero", keep_beta: bool = False, stop=None, report: bool = True,
           server_tol: float | None = None, checkpointer: Checkpointer = NO_CHECKPOINT,
           info: dict | None = None) -> tuple[np.ndarray, list[dict], str, int]:
    """`FedADMM.rounds` for the backend `backend` (its options): at most `max_rounds` rounds of
    Algorithms 1/3 on the started executor `ex` from z^0 = z with weights α = `alpha`; returns
    (z, history, status, total local steps)."""
    if bar is None:
        bar = progress(max_rounds, False, backend.variant)
    info = {} if info is None else info
    clients = tuple(ex.clients)     # (a tuple sent every round: the executor finds it by identity)
    m = len(clients)
    rng = np.random.default_rng(backend.seed)
    beta0 = None if keep_beta else backend.beta
    # server caches: the last w_i = β_i u_i − λ_i and β_i of every client (u^0 = z^0)
    first = ex.map_stacked("fedadmm_init", clients, rows={"alpha": np.asarray(alpha, float)},
                           common=backend._client_config(z, beta0, lam_start))    # one group request
    w_cache = np.asarray(first["w"], float).reshape(m, -1)
    b_cache = np.asarray(first["beta"], float)
    size = max(1, math.ceil(backend.participation * m))
    server_terms = _needs_server_solve(ex)
    has_server_step = stop is not None or server_terms
    history, status, total_steps, elapsed = [], Status.MAX_ITERATIONS, 0, 0.0
    watch = DivergenceWatch(backend.variant, hint=backend._hint())
    saved = checkpointer.restore(ex)
    if saved:
        z, w_cache, b_cache = saved["z"], saved["w_cache"], saved["b_cache"]
        history, total_steps, elapsed = saved["history"], saved["total_steps"], saved["elapsed"]
        rng.bit_generator.state = saved["rng"]
        watch.smallest = dict(saved["watch"])           # the growth test's memory
    else:                       # the sizes at the start: the growth test's baseline
        watch.check(0, client_messages=w_cache, z=z, z_bar=z)
    memory = backend.memory
    # a round's record whose report (objective, violation at its z) rides on the next round's
    # request (`Rider`, before the step: the clients' state is the one the report would have
    # seen), completed — and handed to the callback — then; one message per round
    pending = history[-1] if report and history and "objective" not in history[-1] else None

    def complete(reports=None):
        nonlocal pending
        if pending is None:
            return
        complete_record(pending, _report(ex, clients, z, server_terms, reports), callback, bar)
        pending = None

    for k in range(len(history), max_rounds):
        start = time.perf_counter()
        rider = None
        if pending is not None:
            if backend.participation >= 1 and not ex.lost:
                rider = Rider("report", {"x": z}, before=True)
            else:               # (a sample of the clients is asked: the report by itself)
                complete()
        chosen, steps, drift, w_cache, b_cache = _client_round(backend, ex, clients, z, rng, size,
                                                               w_cache, b_cache, rider)
        if rider is not None:
            complete(rider.replies)
        s_beta = float(alpha @ b_cache)
        z_hat = (alpha @ w_cache) / s_beta                                            # (3.1a)
        z_bar = (z_hat + memory * z) / (1.0 + memory)                                 # (3.1b)
        server_residual = 0.0
        messages = w_cache if chosen is None else w_cache[chosen]
        # z̄ apart from z: a far start's memory (the clients' λ_i) shrinks in z̄ over rounds while
        # the server's projection brings z into its set at once — one baseline read 1e8 → 9e6 as
        # a 1e6-fold growth from the projected z's 1 (w.value = 1e8·1, a unit ball)
        if watch.check(k + 1, client_messages=messages, client_drift=drift, z_bar=z_bar):
            status = watch.report(info)
            break
        if has_server_step:                                                           # (3.2) + h
            out = ex.call("server", "solve_local", linear=None, weight=(1 + memory) * s_beta,
                          anchor=z_bar, x0=z, method="auto",
                          tol=backend.server_tol if server_tol is None else server_tol)
            z_new, server_residual = out["x"], float(out["grad_norm"])
            info["server_step"] = (z_bar, (1 + memory) * s_beta)    # its multipliers (`FedADMM.run`)
        else:
            z_new = z_bar
        participants = list(clients) if chosen is None else [clients[j] for j in chosen]
        step_counts = dict(zip(participants, np.asarray(steps, dtype=int).tolist()))
        round_steps = int(np.sum(steps, dtype=int))
        total_steps += round_steps
        if watch.check(k + 1, z=z_new):
            status = watch.report(info)
            break
        change = float(np.max(np.abs(z_new - z), initial=0.0))
        z = z_new
        elapsed += time.perf_counter() - start
        record = {"round": k + 1, "local_steps": round_steps, "client_steps": step_counts,
                  "participants": participants, "mean_beta": float(np.mean(b_cache)), "z_change": change,
                  "drift": drift, "time": elapsed}
        if ex.lost:
            record["lost"] = sorted(ex.lost)
        history.append(record)
        if report and (k + 1) % backend.report_every == 0:
            pending = record    # (the objective of the clients still in the run: `complete`)
            # asked now where there is no group request to ride on, or where a checkpoint follows
            # (round k's callback runs before checkpoint k is written: docs/checkpoints.md)
            if backend.participation < 1 or checkpointer is not NO_CHECKPOINT:
                complete()
        else:
            if report:
                record["objective"] = record["violation"] = math.nan
            if callback:
                callback(record)
            bar.update(record)
        if stop is not None:
            if stop(z, record, z_bar, (1 + memory) * s_beta, server_residual):
                status = Status.CONVERGED
                break
            continue
        if backend.tol is not None and max(change, drift) <= stop_level(backend.tol, z):
            status = Status.CONVERGED
            break
        checkpointer.save(ex, k + 1, {"z": z, "w_cache": w_cache, "b_cache": b_cache, "history": history,
                                      "total_steps": total_steps, "elapsed": elapsed,
                                      "rng": rng.bit_generator.state, "watch": dict(watch.smallest)})
    complete()                  # the last round's report: by itself
    if status == Status.MAX_ITERATIONS and stop is None and sustained_growth(history, watch):
        status = watch.report(info)
    return z, history, status, total_steps


def stop_level(tol: float, z: np.ndarray) -> float:
    """The level (change and drift, ∞-norm) of the `tol` stop: relative to the answer's size,
    tol·max(1, ‖z‖∞) (issue 25 item 1), so that an answer ~1e3 in the equilibrated units (or
    as written, `scaling=False`) asks for the same relative accuracy as one ~1, not 1e-11."""
    return tol * max(1.0, float(np.max(np.abs(z), initial=0.0)))


def _client_round(backend, ex, clients: tuple, z: np.ndarray, rng, size: int, w_cache: np.ndarray,
                  b_cache: np.ndarray, rider: Rider | None = None):
    """The clients' part of a round: (the participants' indices, None for every client; their
    local step counts; the largest drift ‖u_i − z‖∞; the caches of w_i and β_i with their
    replies). Every client: one group request; partial participation: the sample's per-node
    requests, where a sampled client that does not reply is dropped from the run (its cached
    w_i, β_i stay in (3.1a), as for any client not sampled). `rider`: carried by the group
    request (every client only)."""
    m = len(clients)
    if backend.participation >= 1 and not ex.lost:
        reply = ex.map_stacked("fedadmm_round", clients, common={"z": z}, rider=rider)
        return (None, reply["steps"], float(np.max(reply["drift"], initial=0.0)),
                np.asarray(reply["w"], float).reshape(m, -1), np.asarray(reply["beta"], float))
    chosen = _sample(rng, m, size, [j for j, c in enumerate(clients) if c not in ex.lost])
    replies = ex.map("fedadmm_round", {clients[j]: {"z": z} for j in chosen},
                     missing="drop" if backend.participation < 1 else "raise")
    chosen = [j for j in chosen if clients[j] in replies]
    for j in chosen:
        w_cache[j], b_cache[j] = replies[clients[j]]["w"], replies[clients[j]]["beta"]
    drift = max((float(replies[clients[j]]["drift"]) for j in chosen), default=0.0)
    return chosen, [replies[clients[j]]["steps"] for j in chosen], drift, w_cache, b_cache


def _report(ex, clients: tuple, z: np.ndarray, server_terms: bool,
            reports: dict | None = None) -> tuple[float, float]:
    """Objective and violation at z: the clients still in the run as one group request (or
    their `reports`, stacked, got as a rider), the server's when it holds terms (else its
    report is 0, 0)."""
    active = clients if not ex.lost else tuple(c for c in clients if c not in ex.lost)
    return stacked_report(ex, active, z, server_terms, reports)


def _sample(rng, m: int, size: int, available: list[int]) -> list[int]:
    """The round's clients: `size` of the m drawn without replacement (all when size = m);
    after clients were lost, drawn from the `available` ones only."""
    if len(available) == m:
        return sorted(rng.choice(m, size=size, replace=False)) if size < m else list(range(m))
    if not available:
        raise FedModelError("FedADMM: every client has been lost (none replied in time)")
    return sorted(rng.choice(available, size=min(size, len(available)), replace=False))


def _needs_server_solve(ex) -> bool:
    """Whether the z-step needs the server's own solve (3.2) — server terms, prox terms or
    projections — or is (3.1b) itself, as the server reports (local request "node_terms")."""
    held = ex.call("server", "node_terms")
    return bool(held["prox_terms"] or held["constraints"] or held["objective"])
