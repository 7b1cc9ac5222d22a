"""Which Flower node serves which client in a deployment (`FlowerExecutor` with a `grid`):
`identify` asks the nodes their client's name (the SuperNode's `fedmodel-client` node
config); `rejoin` waits for a client whose SuperNode died to come back, rebuilds its program there
and replays its requests since the build (`replay.ReplayLog`), so it holds the state it had."""
from __future__ import annotations

import time
from typing import Any

from .codec import BUILD, HELLO, NODE_NAME_KEY, REPLAY, NodeTimeout, decode, encode, send_and_receive

try:
    from flwr.app import Message
except ImportError:     # optional extra: make_executor("flower") then says how to install it
    Message = None


def identify(ex: Any, names: list[str], wait: float) -> dict[str, int]:
    """Deployment: the Flower node of each client in `names`, by asking every node not yet
    known which client it is (its `fedmodel-client` node config), until all have answered
    or `wait` seconds have passed."""
    deadline = time.monotonic() + wait
    found: dict[str, int] = {}
    asked: set[int] = set(ex.node_ids.values())
    while True:
        fresh = [i for i in ex._ask(lambda grid: list(grid.get_node_ids()), wait) if i not in asked]
        if fresh:
            hello = [Message(encode(HELLO, {}, {}), dst_node_id=i, message_type="query")
                     for i in fresh]
            answers = ex._ask(lambda grid: send_and_receive(
                grid, hello, max(1.0, min(ex.timeout, deadline - time.monotonic()))), wait)
            for answer in answers:
                if answer.has_error():
                    continue
                name = decode(answer.content)[1].get("name")
                if name in names and name not in found:
                    found[name] = answer.metadata.src_node_id
            asked.update(a.metadata.src_node_id for a in answers)
        missing = [n for n in names if n not in found]
        if not missing:
            return found
        if time.monotonic() > deadline:
            raise NodeTimeout(
                f"no SuperNode for client(s) {missing} answered within {wait:g} s (start each "
                f"with --node-config '{NODE_NAME_KEY}=\"NAME\"'; see docs/flower.md)")
        time.sleep(0.5)


def rejoin(ex: Any, node: str, kind: str, restart: int) -> None:
    """Deployment: wait for `node`'s SuperNode to come back (a new Flower node naming the
    same client), rebuild its program there and replay its requests since the build (one
    message), so it holds the state it had before the failed request."""
    record = ex.replay.fault(node, kind, old_node_id=ex.node_ids[node], restart=restart)
    if restart > ex.max_restarts:
        record["fatal"] = True
        raise NodeTimeout(f"client {node!r} did not reply to {kind!r} within {ex.timeout:g} s "
                          f"{restart} times; max_restarts={ex.max_restarts}")
    try:
        ex.node_ids[node] = identify(ex, [node], ex.rejoin_timeout)[node]
    except NodeTimeout:
        record["fatal"] = True
        raise NodeTimeout(f"client {node!r} did not reply to {kind!r} within {ex.timeout:g} s "
                          f"and did not rejoin within {ex.rejoin_timeout:g} s "
                          "(rejoin_timeout)") from None
    record["new_node_id"] = ex.node_ids[node]
    for step, payload, fields in ((BUILD, ex._specs[node], {}),
                                  (REPLAY, {"steps": ex.replay.steps(node)}, {})):
        _, missing = ex._send(step, {node: payload}, fields, ex.start_timeout)
        if missing:
            raise NodeTimeout(f"client {node!r} rejoined but did not answer {step!r} within "
                              f"{ex.start_timeout:g} s")
    record["recovered"] = True
