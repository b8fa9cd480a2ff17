"""Two ``quicksilver serve --store redis://...`` processes and one real redis-server:
a node killed with SIGKILL mid-reply loses no completed turn, its client resumes on
the other node, and a token taken once is refused fleet-wide (docs/security.md,
"Several nodes"). The balancer in front is tested in the fleet's own tests."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from server import protocol as p
from tests.e2e.test_resume import FACT, RECALL, reply_to, start
from tests.redis_server import RedisServer
from tests.serverproc import next_event, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.models]


async def test_a_node_killed_mid_reply_resumes_on_the_other(
    tmp_path: Path, model_cache: Path, redis_server: RedisServer
) -> None:
    nodes = []
    for name in ("a", "b"):  # one after the other: the first may build the reply model
        args = ["--cache-dir", str(model_cache), "--store", redis_server.url, "--node-id", name]
        nodes.append(start_server(tmp_path / f"{name}.log", *args))
    a, b = nodes
    try:
        async with connect(a.url) as ws:
            first = await start(ws)
            assert isinstance(first, p.Ready) and first.resume_token
            await reply_to(ws, FACT)
            await ws.send(p.encode(p.Text("Tell me a long story about the sea.")))
            await next_event(ws, 120)  # the turn is under way ...
            a.stop(signal.SIGKILL)  # ... when its node is lost
        async with connect(b.url) as ws:
            resumed = await start(ws, first.resume_token)
            assert isinstance(resumed, p.Ready), resumed
            assert resumed.resumed and resumed.history == 2  # the completed turn, no more
            RECALL.check(await reply_to(ws, RECALL.text))
        async with connect(b.url) as ws:
            refused = await start(ws, first.resume_token)
            assert isinstance(refused, p.Error) and refused.code == "bad_resume_token"
    finally:
        for node in nodes:
            node.stop()
