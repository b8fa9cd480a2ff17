"""The real server (in-process, tests/inproc.py) against inputs that once crashed a
session: each test failed before its fix (issue 17)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from websockets.asyncio.client import connect

from audio.speech import SpeechFactory
from tests.inproc import ScriptedAsr, ScriptedReplies, pcm16, serving, started, until

pytestmark = pytest.mark.models

FRAME = 512  # samples, 32 ms at 16 kHz


async def stream(ws, audio: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    """Like a microphone: one 32 ms frame every 32 ms."""
    for i in range(0, len(audio), FRAME):
        await ws.send(pcm16(audio[i : i + FRAME]))
        await asyncio.sleep(FRAME / 16_000)


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
