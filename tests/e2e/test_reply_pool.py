"""The reply model's KV cache budget (``--kv-cache-mb``, model/batch.py's pool) on a
real server: a reply that does not fit is refused with a turn error, and the session
and the server go on."""

from __future__ import annotations

from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from server import protocol as p
from tests.e2e.test_resume import start
from tests.serverproc import next_event, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.models]


async def test_a_reply_past_the_kv_cache_budget_is_a_turn_error(
    tmp_path: Path, model_cache: Path
) -> None:
    # 4 MB holds less than one cache's first 256 positions (46 KB each)
    args = ["--cache-dir", str(model_cache), "--kv-cache-mb", "4", "--reply-batch", "8"]
    server = start_server(tmp_path / "server.log", *args)
    try:
        async with connect(server.url) as ws:
            assert isinstance(await start(ws), p.Ready)
            for _ in range(2):  # refused twice over one connection: nothing else broke
                await ws.send(p.encode(p.Text("Where is Paris?")))
                while not isinstance(event := await next_event(ws, 120), p.Error):
                    assert not isinstance(event, p.ReplyDone), event
                assert event.code == "turn_failed"
                assert "KV cache pool is full" in event.message, event
        assert server.proc.poll() is None
        stats = server.stats()
        assert stats["sessions"] == 0 and stats["reply_passes"]["rows"] == 8, stats
        assert stats["reply_passes"]["kv_budget"] == 4 * 2**20 // 46_080
    finally:
        server.stop()
