"""The real server (in-process, tests/inproc.py) against inputs that once crashed a
session: each test failed before its fix (issue 17)."""

from __future__ import annotations

import asyncio
import json
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect

import server.app
from audio.speech import SpeechFactory
from server.app import Limits, ServerConfig, _BodyReader
from server.auth import AuthConfig
from tests.inproc import ScriptedAsr, ScriptedReplies, serving, started, stream, until

pytestmark = pytest.mark.models


async def test_an_empty_speculative_transcript_ends_the_turn_quietly(
    speech: SpeechFactory,
) -> None:
    """A cough: the speculative final ASR (started at the pause) comes back empty and
    its turn ends before the turn is final; releasing it then raised KeyError in the
    server and closed the session with 1011."""
    asr = ScriptedAsr(text="")
    async with serving(asr=asr) as (url, _):
        ws, _ = await started(url)
        await stream(ws, speech.piper("Hello there.", lead_s=0.3, trail_s=1.2))
        done = await asyncio.wait_for(until(ws, "reply_done"), 30)
        assert done["text"] == "" and asr.calls >= 1
        # the session is alive and answers the next input
        await ws.send(json.dumps({"type": "text", "text": "And now?"}))
        reply = await asyncio.wait_for(until(ws, "reply_done"), 30)
        assert reply["text"] == ScriptedReplies().reply
        await ws.close()
        assert ws.close_code == 1000


async def test_deep_nesting_gets_an_error_and_the_session_survives() -> None:
    async with serving() as (url, _):
        ws, _ = await started(url)
        await ws.send("[" * 100_000)
        error = await asyncio.wait_for(until(ws, "error"), 30)
        assert error["code"] == "bad_json"
        await ws.send(json.dumps({"type": "text", "text": "Still there?"}))
        reply = await asyncio.wait_for(until(ws, "reply_done"), 30)
        assert reply["text"] == ScriptedReplies().reply
        await ws.close()


async def test_a_cancel_queued_behind_another_sessions_reply_keeps_the_session_listening() -> None:
    """Session A's reply holds the one reply thread; B's reply waits behind it and B
    cancels. B's cancel once waited for all of A's reply, and B read no audio
    meanwhile; now B's next message is answered while A's reply is still held."""
    replies = ScriptedReplies(hold=True)
    async with serving(replies=replies) as (url, _):
        a, _ = await started(url)
        b, _ = await started(url)
        await a.send(json.dumps({"type": "text", "text": "Tell me a long story."}))
        await asyncio.to_thread(replies.started.wait, 30)
        await b.send(json.dumps({"type": "text", "text": "Quick question."}))
        await b.send(json.dumps({"type": "cancel"}))
        await b.send("not json")  # B's receive loop must get to this at once
        error = await asyncio.wait_for(until(b, "error"), 30)
        assert error["code"] == "bad_json"
        assert not replies.go.is_set()  # A's reply is still being written
        replies.go.set()
        assert (await asyncio.wait_for(until(a, "reply_done"), 30))["text"] == replies.reply
        await a.close()
        await b.close()


async def test_a_turn_that_goes_on_after_a_pause_is_answered_aloud(speech: SpeechFactory) -> None:
    """The user pauses (a speculative reply starts), then goes on talking: the turn
    continues under the same id, and its reply audio must reach the client. The id of
    the dropped speculation once stayed on the connection's cancelled list, and every
    frame of the real reply was dropped."""
    half = speech.piper("Add milk, eggs,", lead_s=0.3, trail_s=0.6)
    rest = speech.piper("and bread to my list.", trail_s=2.0)
    # a transcript that reads unfinished: the session holds the turn open at the pause
    async with serving(asr=ScriptedAsr(text="Add milk, eggs, and")) as (url, _):
        ws, _ = await started(url)
        await stream(ws, np.concatenate([half, rest]))
        audio: list[bytes] = []
        done = await asyncio.wait_for(until(ws, "reply_done", audio), 30)
        assert done["text"] == ScriptedReplies().reply
        assert audio and {p_unpack(frame) for frame in audio} == {done["turn_id"]}
        await ws.close()


def p_unpack(frame: bytes) -> int:
    from server import protocol as p

    return p.unpack_audio(frame)[0]


async def test_a_closed_session_does_not_hold_its_slot_for_unread_frames() -> None:
    """A client that sent 30 bad frames without reading is closed with 4002; its
    unread frames once kept the connection (and its per-address slot) open until
    websockets' 10 s close timeout."""
    async with serving() as (url, app):
        # the client reads whatever arrives (no queue limit), so the close gets through
        ws = await connect(url, max_queue=None)
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000}))
        for _ in range(30):
            await ws.send("not json")
        (connection,) = app.sessions
        await asyncio.wait_for(connection.closed.wait(), 8)  # well inside the 10 s
        await ws.wait_closed()
        assert ws.close_code == 4002


# --- before the handshake (issue 40) ------------------------------------------------

KEY = "test-key-0123456789abcdef"
KEYED = AuthConfig(api_keys=frozenset({KEY}))


def address(url: str) -> tuple[str, int]:
    host, port = url.split("//")[1].split("/")[0].split(":")
    return host, int(port)


Client = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def stalled(url: str, source: str, headers: int = 20) -> Client:
    """A client that sends a request's line and ``headers`` 8,000-byte headers, and
    never ends it."""
    reader, writer = await asyncio.open_connection(*address(url), local_addr=(source, 0))
    writer.write(b"GET /v1/voice HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    for i in range(headers):
        writer.write(f"X-Pad-{i}: {'a' * 8000}\r\n".encode())
    await writer.drain()
    return reader, writer


async def answer(client: Client) -> bytes:
    """Everything the server sends until it closes the connection."""
    reader, writer = client
    try:
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def test_handshakes_in_flight_are_capped_at_accept_and_time_out() -> None:
    """Stalled requests with large headers are what held 50 MB of a server's memory:
    beyond 2 from one address and 3 in all, a connection gets a 503 before anything
    of it is read, and the ones let in are dropped at the handshake timeout."""
    limits = replace(
        Limits(), max_handshakes=3, max_sessions_per_address=2, handshake_timeout_s=4.0
    )
    async with serving(config=ServerConfig(limits=limits)) as (url, app):
        held = [await stalled(url, "127.0.0.1"), await stalled(url, "127.0.0.1")]
        over_address = await answer(await stalled(url, "127.0.0.1"))
        held.append(await stalled(url, "127.0.0.2"))
        over_all = await answer(await stalled(url, "127.0.0.3"))
        for refused in (over_address, over_all):
            assert refused.startswith(b"HTTP/1.1 503 ") and b'"busy"' in refused
        assert app.handshakes.in_flight == 3 and app.handshakes.refused == 2
        assert app.metrics.rejected.labels("handshakes_per_address")._value.get() == 1
        assert app.metrics.rejected.labels("handshakes")._value.get() == 1
        for client in held:  # the handshake timeout closes them, unanswered
            assert await answer(client) == b""
        assert app.handshakes.in_flight == 0
        assert app.stats()["handshakes"] == {"in_flight": 0, "refused": 2}
        ws, _ = await started(url)  # nothing of them is left in the way
        await ws.close()


async def test_a_request_with_too_many_or_too_long_headers_is_refused() -> None:
    async with serving() as (url, _):
        many = await answer(await stalled(url, "127.0.0.1", headers=40))
        assert many.startswith(b"HTTP/1.1 431 ")
        client = await asyncio.open_connection(*address(url))
        client[1].write(b"GET /v1/voice HTTP/1.1\r\nX-Long: " + b"a" * 9000 + b"\r\n")
        assert (await answer(client)).startswith(b"HTTP/1.1 431 ")


async def post(url: str, head: str, body: bytes = b"") -> bytes:
    client = await asyncio.open_connection(*address(url))
    client[1].write(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
    return await answer(client)


async def test_conflicting_content_lengths_on_the_mint_path_are_a_400() -> None:
    async with serving(config=ServerConfig(auth=KEYED)) as (url, _):
        head = (
            f"POST /v1/token HTTP/1.1\nHost: 127.0.0.1\nAuthorization: Bearer {KEY}\n"
            "Content-Length: 0\nContent-Length: 14\n"
        )
        reply = await post(url, head, b'{"ttl_s": 30}\n')
        assert reply.startswith(b"HTTP/1.1 400 ") and b"conflicting Content-Length" in reply
        one = f"POST /v1/token HTTP/1.1\nHost: 127.0.0.1\nAuthorization: Bearer {KEY}\n"
        ok = await post(url, one + "Content-Length: 14\n", b'{"ttl_s": 30}\n')
        assert ok.startswith(b"HTTP/1.1 200 ") and b'"token"' in ok


async def test_a_mint_body_is_read_only_with_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body without a valid key is dropped as it arrives, never held; the request
    still gets its 401."""
    body = b'{"ttl_s": 30, "label": "' + b"x" * 60_000 + b'"}'
    readers: list[_BodyReader] = []

    class Watched(_BodyReader):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            readers.append(self)

    monkeypatch.setattr(server.app, "_BodyReader", Watched)
    async with serving(config=ServerConfig(auth=KEYED)) as (url, _):
        head = (
            "POST /v1/token HTTP/1.1\nHost: 127.0.0.1\n"
            f"Authorization: Bearer wrong-{KEY}\nContent-Length: {len(body)}\n"
        )
        reply = await post(url, head, body)
    assert reply.startswith(b"HTTP/1.1 401 ") and b"invalid_api_key" in reply
    (reader,) = readers
    assert reader.body == b"" and len(reader.buffer) == 0


async def test_the_resume_file_is_private(tmp_path: Path) -> None:
    file = tmp_path / "resume" / "resumable-sessions.json"
    async with serving(config=ServerConfig(resume_file=file)) as (url, app):
        ws, _ = await started(url)
        await ws.send(json.dumps({"type": "text", "text": "My PIN is 4321."}))
        await asyncio.wait_for(until(ws, "reply_done"), 30)
        (session,) = app.sessions
        await ws.close()
        await asyncio.wait_for(session.closed.wait(), 30)
        app.save_resumable(asyncio.get_running_loop().time())
    assert "4321" in file.read_text()
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert stat.S_IMODE(file.parent.stat().st_mode) == 0o700
