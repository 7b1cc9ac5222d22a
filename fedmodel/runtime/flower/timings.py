"""Where a Flower round trip goes: each reply's time stamps, the server's (sent, pulled) and
the client's (`client_app.serve_message`), and their medians per stage (docs/flower.md)."""
from __future__ import annotations

from typing import Any

import numpy as np


def stamps(kind: str, node: str, posted: float, pulled: float | None, client: Any) -> dict | None:
    """One reply's time stamps (numbers only; None for a client that sent none)."""
    if not isinstance(client, dict):
        return None
    found = {k: float(v) for k, v in client.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {"kind": kind, "node": node, "posted": posted, "pulled": pulled, **found}


def _median(values: list) -> float:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else float("nan")


def breakdown(timings: list[dict]) -> dict[str, float]:
    """Median seconds per reply of each stage of a round trip: to_process (server push → the
    ClientApp's process started: SuperLink, the SuperNode's pull, its SuperExec's poll, the
    process start), imports (process start → Flower and fedmodel imported), to_handler (→
    fedmodel's handler entered: Flower loads the app and the task's Context), lookup / program /
    serve / save (fedmodel: the request's procedure, the node program, the request, its state),
    to_server (reply ready → pulled by the server), total (push → pull), round_trip (push → the
    batch's last reply pulled); cpu_before / cpu_handler: CPU seconds of the client's process
    before fedmodel's handler and in it."""
    rows = [t for t in timings if t.get("pulled") is not None and "left" in t]
    if not rows:
        return {}
    with_start = [t for t in rows if t.get("started") is not None]
    batches: dict[float, float] = {}    # one round trip: push → its last reply pulled
    for t in rows:
        batches[t["posted"]] = max(batches.get(t["posted"], 0.0), t["pulled"] - t["posted"])
    return {
        "replies": float(len(rows)),
        "round_trip": _median(list(batches.values())),
        "to_process": _median([t["started"] - t["posted"] for t in with_start]),
        "imports": _median([t["imported"] - t["started"] for t in with_start]),
        "to_handler": _median([t["entered"] - t["imported"] for t in rows]),
        "lookup": _median([t.get("lookup", 0.0) for t in rows]),
        "program": _median([t["program"] for t in rows]),
        "serve": _median([t["served"] for t in rows]),
        "save": _median([t["saved"] for t in rows]),
        "to_server": _median([t["pulled"] - t["left"] for t in rows]),
        "cpu_before": _median([t.get("cpu_entered") for t in rows]),
        "cpu_handler": _median([t["cpu_left"] - t["cpu_entered"] for t in rows
                                if "cpu_left" in t and "cpu_entered" in t]),
        "total": _median([t["pulled"] - t["posted"] for t in rows]),
    }
