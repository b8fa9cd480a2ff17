"""Limits, backpressure, shutdown and metrics of the real server, in-process
(tests/inproc.py: real websockets, session, turn pipeline, VAD and Piper; scripted ASR
and reply generator). No assertion depends on how fast this machine is: slow clients
are made slow by their socket, and every wait is on a message or a close."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from server import protocol as p
from server.app import Limits, ServerConfig, run_until
from tests.inproc import ScriptedAsr, ScriptedReplies, runtime, serving, started, until

pytestmark = pytest.mark.models

LONG = " ".join(f"Sentence number {i} of a long answer that goes on." for i in range(12))


def config(**limits: Any) -> ServerConfig:
    return ServerConfig(limits=replace(Limits(), **limits))


async def closed(ws: ClientConnection) -> tuple[int | None, str | None]:
    """Read until the server closes; its close code and reason."""
    with pytest.raises(ConnectionClosed):
        while True:
            await asyncio.wait_for(ws.recv(), 60)
    return ws.close_code, ws.close_reason


async def test_a_full_server_closes_with_1013_and_a_retry_hint() -> None:
    async with serving(config=config(max_sessions=2)) as (url, app):
        a, _ = await started(url)
        b, _ = await started(url)
        c = await connect(url)
        code, reason = await closed(c)
        assert code == p.CloseCode.TRY_AGAIN_LATER and "retry in" in (reason or "")
        closing = asyncio.create_task(any_closed(app))
        await asyncio.sleep(0)  # it watches both sessions before one ends
        await a.close()
        await asyncio.wait_for(closing, 30)
        d, _ = await started(url)  # room again
        await b.close()
        await d.close()


async def any_closed(app: Any) -> None:
    """Until one of the server's open sessions has ended."""
    waits = [asyncio.create_task(c.closed.wait()) for c in app.sessions]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()


async def test_connections_per_address_are_limited() -> None:
    async with serving(config=config(max_sessions_per_address=1)) as (url, _):
        a, _ = await started(url)
        code, reason = await closed(await connect(url))
        assert code == p.CloseCode.POLICY_VIOLATION and "your address" in (reason or "")
        await a.close()


async def test_a_connection_that_never_starts_is_closed() -> None:
    async with serving(config=config(start_timeout_s=0.2)) as (url, _):
        code, _ = await closed(await connect(url))
        assert code == p.CloseCode.START_TIMEOUT


async def test_the_session_length_limit_parks_the_conversation_for_resumption() -> None:
    async with serving(config=config(max_session_s=2.0)) as (url, _):
        ws, ready = await started(url)
        await ws.send(json.dumps({"type": "text", "text": "My name is Ada."}))
        code, _ = await closed(ws)  # with or without the whole reply, on a slow machine
        assert code == p.CloseCode.SESSION_TOO_LONG
        again, resumed = await started(url, resume_token=ready["resume_token"])
        assert resumed["resumed"] and resumed["history"] >= 1  # at least what the user said
        await again.close()


def slow_socket(url: str) -> socket.socket:
    """A client socket with a tiny receive window: the server's writes back up after a
    few kilobytes when the client does not read."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    return sock


async def test_a_client_that_stops_reading_is_closed_without_slowing_others() -> None:
    replies = ScriptedReplies(reply=LONG)
    cfg = config(max_audio_backlog_s=1.0)
    async with serving(replies=replies, config=cfg) as (url, app):
        slow = await connect(url, sock=slow_socket(url), max_queue=1)
        start = {"type": "start", "sample_rate": 16000, "output_sample_rate": 48000}
        await slow.send(json.dumps(start))
        await slow.send(json.dumps({"type": "text", "text": "Tell me everything."}))
        await asyncio.to_thread(replies.started.wait, 30)
        (stalled,) = app.sessions
        # meanwhile another client gets its answers as usual
        other, _ = await started(url)
        await other.send(json.dumps({"type": "text", "text": "Hello?"}))
        answer = asyncio.create_task(until(other, "reply_done"))  # reading all along
        # the slow one is closed for not keeping up, its backlog dropped
        await asyncio.wait_for(stalled.closed.wait(), 120)
        assert app.metrics.closes.labels(str(int(p.CloseCode.SLOW_CONSUMER)))._value.get() == 1
        done = await asyncio.wait_for(answer, 120)
        assert done["text"] == LONG
        await other.close()
        # A client that reads again in time sees 4003; one that never reads cannot get
        # the close frame past its full socket, and the server drops the TCP connection.
        code, _ = await closed(slow)
        assert code in (p.CloseCode.SLOW_CONSUMER, 1006)


async def test_no_audio_of_a_cancelled_turn_follows_reply_cancelled_for_a_slow_reader() -> None:
    replies = ScriptedReplies(reply=LONG)
    async with serving(replies=replies, config=config(max_audio_backlog_s=60.0)) as (url, app):
        ws = await connect(url, sock=slow_socket(url), max_queue=1)
        await ws.send(
            json.dumps({"type": "start", "sample_rate": 16000, "output_sample_rate": 48000})
        )
        await ws.send(json.dumps({"type": "text", "text": "Tell me everything."}))
        await asyncio.to_thread(replies.started.wait, 30)
        await asyncio.sleep(1.0)  # audio backs up in the socket meanwhile
        (conn,) = app.sessions
        async with asyncio.timeout(60):  # a loaded machine synthesizes slowly: wait for it
            while conn.ws.transport.get_write_buffer_size() == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        await ws.send(json.dumps({"type": "cancel"}))
        turn = None
        after_cancel = 0
        while True:
            frame = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(frame, bytes):
                turn_id, _, _ = p.unpack_audio(frame)
                after_cancel += turn_id == turn
                continue
            message = json.loads(frame)
            if message["type"] == "reply_cancelled":
                turn = message["turn_id"]
                spoken = message["spoken_text"]
            if message["type"] == "metrics" and turn is not None:
                break
        assert turn is not None and after_cancel == 0
        assert spoken and LONG.startswith(spoken.rsplit(" ", 1)[0])
        await ws.close()


async def test_sigterm_drains_turns_then_closes_with_1001_and_saves_resumable(
    tmp_path: Path,
) -> None:
    replies = ScriptedReplies(hold=True)
    cfg = ServerConfig(resume_file=tmp_path / "resumable.json")
    rt = runtime(ScriptedAsr(), replies)
    stop = asyncio.Event()
    urls: list[str] = []
    ready_ev = asyncio.Event()

    def on_ready(url: str) -> None:
        urls.append(url)
        ready_ev.set()

    server = asyncio.create_task(run_until(rt, "127.0.0.1", 0, stop, on_ready, cfg))
    await asyncio.wait_for(ready_ev.wait(), 30)
    ws, ready = await started(urls[0])
    await ws.send(json.dumps({"type": "text", "text": "Tell me a story."}))
    await asyncio.to_thread(replies.started.wait, 30)
    stop.set()  # what SIGTERM does (cli/main.py)
    await asyncio.sleep(0.2)
    # still listening while draining: not ready for a balancer, new sessions go away
    base = urls[0].replace("ws://", "http://").removesuffix(p.PATH)
    with pytest.raises(urllib.error.HTTPError) as unready:
        await asyncio.to_thread(urllib.request.urlopen, base + "/readyz", timeout=10)
    assert json.loads(unready.value.read())["reason"] == "draining"
    late = await connect(urls[0], open_timeout=5)
    assert (await closed(late))[0] == p.CloseCode.GOING_AWAY
    replies.go.set()  # the turn in flight finishes within the grace period
    done = await asyncio.wait_for(until(ws, "reply_done"), 30)
    assert done["text"] == replies.reply
    code, _ = await closed(ws)
    assert code == p.CloseCode.GOING_AWAY
    await asyncio.wait_for(server, 30)
    rt.close()
    saved = json.loads((tmp_path / "resumable.json").read_text())
    assert list(saved["parked"]) == [ready["resume_token"]]
    # a new process restores it
    async with serving(config=cfg) as (url, _):
        again, resumed = await started(url, resume_token=ready["resume_token"])
        assert resumed["resumed"] and resumed["history"] == 2
        await again.close()


async def test_metrics_endpoint_counts_sessions_turns_and_stages() -> None:
    async with serving() as (url, _):
        ws, _ = await started(url)
        await ws.send(json.dumps({"type": "text", "text": "Hello?"}))
        await until(ws, "metrics")
        base = url.replace("ws://", "http://").rsplit("/v1/", 1)[0]
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        )
        assert "quicksilver_sessions 1.0" in body
        assert 'quicksilver_turns_total{outcome="done"} 1.0' in body
        assert 'quicksilver_stage_seconds_count{stage="first_audio"} 1.0' in body
        await ws.close()
