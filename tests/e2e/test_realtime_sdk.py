"""The official ``openai`` SDK holds a voice conversation with the real server over
``/v1/realtime``, unchanged: ``AsyncOpenAI(base_url=..., websocket_base_url=...)`` and
``client.realtime.connect()``, the default models, Piper speech at 24 kHz."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import pytest

from audio.asr import Transcriber
from audio.resample import float32_to_pcm16, int16_to_float32, resample
from audio.speech import SpeechFactory, word_error_rate
from tests.serverproc import ServerProcess
from tests.speech import ITALY, JAPAN, missing

pytestmark = [pytest.mark.e2e, pytest.mark.models]

RATE = 24_000
CHUNK = RATE // 10  # 100 ms per append, as a microphone would send them


@pytest.fixture
def client(server: ServerProcess) -> Any:
    try:
        from openai import AsyncOpenAI
    except ImportError:
        missing("the openai SDK is not installed (pip install -e '.[test]')")
    ws = server.url.removesuffix("/voice")
    return AsyncOpenAI(
        api_key="not-needed-on-loopback", base_url=f"{server.http}/v1", websocket_base_url=ws
    )


async def events_until(conn: Any, kind: str, timeout_s: float = 180) -> list[Any]:
    """Every event up to and including the first of ``kind``."""
    seen: list[Any] = []
    async with asyncio.timeout(timeout_s):
        while (event := await conn.recv()).type != kind:
            seen.append(event)
    return [*seen, event]


def of(events: list[Any], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]


def reply_audio(events: list[Any]) -> np.ndarray:
    pcm = b"".join(base64.b64decode(e.delta) for e in of(events, "response.output_audio.delta"))
    return resample(int16_to_float32(np.frombuffer(pcm, "<i2")), RATE, 16_000)


async def test_a_text_turn_gets_a_spoken_answer(client: Any, tiny: Transcriber) -> None:
    async with client.realtime.connect(model="quicksilver") as conn:
        (created,) = await events_until(conn, "session.created")
        assert created.session.type == "realtime" and created.session.model == "quicksilver"
        content = [{"type": "input_text", "text": ITALY.text}]
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": content}
        )
        await conn.response.create()
        events = await events_until(conn, "response.done")
        metrics = (await events_until(conn, "quicksilver.metrics"))[-1]

    kinds = [e.type for e in events]
    assert kinds.index("response.created") < kinds.index("response.output_audio.delta")
    transcript = "".join(e.delta for e in of(events, "response.output_audio_transcript.delta"))
    ITALY.check(transcript)
    done = events[-1].response
    assert done.status == "completed"
    assert done.output[0].content[0].transcript == transcript
    heard = tiny.transcribe(reply_audio(events)).text  # the speech says the transcript
    assert word_error_rate(transcript, heard) <= 0.35, (transcript, heard)
    assert metrics.response_id == done.id  # the extension event reaches the SDK unharmed


async def stream(conn: Any, pcm: bytes) -> None:
    """The question at real time, then silence until cancelled (a live microphone)."""
    silence = bytes(2 * CHUNK)
    for i in range(0, len(pcm), 2 * CHUNK):
        await conn.input_audio_buffer.append(
            audio=base64.b64encode(pcm[i : i + 2 * CHUNK]).decode()
        )
        await asyncio.sleep(0.1)
    while True:
        await conn.input_audio_buffer.append(audio=base64.b64encode(silence).decode())
        await asyncio.sleep(0.1)


async def test_a_spoken_turn_is_transcribed_and_answered(
    client: Any, speech: SpeechFactory
) -> None:
    question = speech.piper(JAPAN.text, lead_s=0.3)
    pcm = float32_to_pcm16(resample(question, 16_000, RATE))
    async with client.realtime.connect(model="quicksilver") as conn:
        await events_until(conn, "session.created")
        detection = {"type": "server_vad", "silence_duration_ms": 500}
        await conn.session.update(
            session={"type": "realtime", "audio": {"input": {"turn_detection": detection}}}
        )
        (updated,) = await events_until(conn, "session.updated")
        assert updated.session.audio.input.turn_detection.silence_duration_ms == 500
        microphone = asyncio.create_task(stream(conn, pcm))
        try:
            events = await events_until(conn, "response.done")
        finally:
            microphone.cancel()

    kinds = [e.type for e in events]
    for kind in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.output_audio.delta",
    ):
        assert kind in kinds, kinds
    (heard,) = of(events, "conversation.item.input_audio_transcription.completed")
    assert word_error_rate(JAPAN.text, heard.transcript) <= 0.2, heard.transcript
    assert heard.item_id == of(events, "input_audio_buffer.committed")[0].item_id
    JAPAN.check("".join(e.delta for e in of(events, "response.output_audio_transcript.delta")))
    assert events[-1].response.status == "completed"
    assert len(reply_audio(events)) > 16_000 // 2


BAD_EVENTS: list[tuple[dict[str, Any], str]] = [
    ({"type": "session.update", "session": {"instructions": "beta shape"}}, "beta_protocol"),
    (
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}}}},
        },
        "not_supported",
    ),
    (
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}},
            },
        },
        "not_supported",
    ),
    (
        {
            "type": "conversation.item.truncate",
            "item_id": "x",
            "content_index": 0,
            "audio_end_ms": 0,
        },
        "not_supported",
    ),
    ({"type": "input_audio_buffer.append", "audio": "%%%"}, "invalid_audio"),
    ({"type": "response.cancel"}, "response_cancel_not_active"),
    ({"type": "no.such.event"}, "unknown_event"),
]


async def test_bad_events_get_documented_error_codes(client: Any) -> None:
    async with client.realtime.connect(model="quicksilver") as conn:
        await events_until(conn, "session.created")
        for i, (event, code) in enumerate(BAD_EVENTS):
            await conn.send({**event, "event_id": f"bad_{i}"})
            (*_, error) = await events_until(conn, "error", timeout_s=30)
            assert (error.error.code, error.error.event_id) == (code, f"bad_{i}"), error
        await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
        (updated,) = await events_until(conn, "session.updated", timeout_s=30)
        assert updated.session.instructions == "Be brief."  # and the session lives on
