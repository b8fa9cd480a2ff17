"""Bad input against the real server: a clear error or close code, and nothing breaks."""

from __future__ import annotations

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from server import protocol as p
from tests.serverproc import ServerProcess, next_event
from tests.speech import GERMANY

pytestmark = [pytest.mark.e2e, pytest.mark.models]


async def expect_error(ws: ClientConnection, code: str) -> None:
    event = await next_event(ws)
    assert isinstance(event, p.Error), event
    assert event.code == code, event
    assert event.message


async def still_works(ws: ClientConnection) -> None:
    await ws.send(p.encode(p.Start(sample_rate=16000)))
    assert isinstance(await next_event(ws), p.Ready)


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{oops", "bad_json"),
        ('{"type": "sing"}', "unknown_type"),
        ('{"type": "start", "sample_rate": "fast"}', "bad_message"),
        ('{"type": "start", "sample_rate": 44100}', "unsupported_sample_rate"),
        ('{"type": "text", "text": "hello"}', "not_started"),
        (b"\x00\x00" * 160, "not_started"),
    ],
    ids=[
        "malformed-json",
        "unknown-type",
        "wrong-field-type",
        "bad-rate",
        "text-early",
        "audio-early",
    ],
)
async def test_invalid_message_gets_an_error_and_the_session_survives(
    server: ServerProcess, frame: str | bytes, code: str
) -> None:
    async with connect(server.url) as ws:
        await ws.send(frame)
        await expect_error(ws, code)
        await still_works(ws)


async def test_bad_audio_frames_after_start(server: ServerProcess) -> None:
    async with connect(server.url) as ws:
        await still_works(ws)
        await ws.send(b"\x01\x02\x03")
        await expect_error(ws, "bad_audio")
        await ws.send(bytes(2 * 16000 + 2))  # just over one second at 16 kHz
        await expect_error(ws, "frame_too_large")
        await ws.send(p.encode(p.Start(sample_rate=16000)))
        await expect_error(ws, "already_started")


async def test_oversize_frame_closes_with_1009_and_server_lives_on(server: ServerProcess) -> None:
    async with connect(server.url, max_size=None) as ws:
        await still_works(ws)
        await ws.send(bytes(1024 * 1024))
        with pytest.raises(ConnectionClosed) as closed:
            await next_event(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == p.CloseCode.MESSAGE_TOO_BIG
    async with connect(server.url) as ws:
        await still_works(ws)


async def test_too_many_errors_close_with_4002(server: ServerProcess) -> None:
    async with connect(server.url) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            for _ in range(100):
                await ws.send("not json")
                await next_event(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == p.CloseCode.TOO_MANY_ERRORS


async def test_unknown_path_is_404(server: ServerProcess) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(server.url.replace("/v1/voice", "/v0/chat")):
            pass
    assert refused.value.response.status_code == 404


async def test_client_vanishing_mid_turn_leaves_the_server_healthy(server: ServerProcess) -> None:
    async with connect(server.url) as ws:
        await still_works(ws)
        await ws.send(p.encode(p.Text("Tell me about the history of the Roman Empire.")))
        while not isinstance(await next_event(ws), p.ReplyText):
            pass
        ws.transport.abort()  # no close frame: the network just went away
    async with connect(server.url) as ws:
        await still_works(ws)
        await ws.send(p.encode(p.Text(GERMANY.text)))
        while not isinstance(event := await next_event(ws), p.ReplyDone):
            pass
        GERMANY.check(event.text)  # the reply model still answers, and answers right
    stats = await server.idle_stats()  # both connections are gone, the vanished one too
    assert stats["loop_lag"]["n"] > 0
