"""``/v1/realtime`` at the real server (in-process, tests/inproc.py: real websockets,
VAD, Piper and pacing; scripted ASR and reply model). The official SDK against the real
models is tests/e2e/test_realtime_sdk.py."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from audio.resample import float32_to_pcm16, resample
from audio.speech import SpeechFactory
from server.app import ServerConfig
from server.auth import AuthConfig, derive_secret, mint_client_token
from tests.inproc import ScriptedReplies, serving

pytestmark = pytest.mark.models

KEY = "test-key-0123456789abcdef"


def realtime(url: str) -> str:
    return url.replace("/v1/voice", "/v1/realtime?model=gpt-realtime")


async def until(
    ws: ClientConnection, kind: str, seen: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Events up to the next of ``kind``; every one read goes to ``seen``."""
    async with asyncio.timeout(30):
        while True:
            event: dict[str, Any] = json.loads(await ws.recv())
            if seen is not None:
                seen.append(event)
            if event["type"] == kind:
                return event


def text_item(text: str) -> str:
    content = [{"type": "input_text", "text": text}]
    item = {"type": "message", "role": "user", "content": content}
    return json.dumps({"type": "conversation.item.create", "item": item})


async def test_a_text_turn_over_the_wire() -> None:
    replies = ScriptedReplies("The capital of Italy is Rome.")
    async with serving(replies=replies) as (url, _), connect(realtime(url)) as ws:
        created = await until(ws, "session.created")
        assert created["session"]["model"] == "gpt-realtime"
        await ws.send(text_item("What is the capital of Italy?"))
        await ws.send(json.dumps({"type": "response.create"}))
        seen: list[dict[str, Any]] = []
        done = await until(ws, "response.done", seen)
        assert done["response"]["status"] == "completed"
        audio = b"".join(
            base64.b64decode(e["delta"]) for e in seen if e["type"] == "response.output_audio.delta"
        )
        assert len(audio) // 2 > 24_000 * 0.5  # over half a second of 24 kHz speech
        words = "".join(
            e["delta"] for e in seen if e["type"] == "response.output_audio_transcript.delta"
        )
        assert words == "The capital of Italy is Rome."
        metrics = await until(ws, "quicksilver.metrics")
        assert metrics["response_id"] == done["response"]["id"]
        assert metrics["metrics"]["first_audio_ms"] is not None


BAD_FRAMES: list[str | bytes] = [
    "{not json",
    "[]",
    '{"type": 7}',
    json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 200_001}),  # not base64
    json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01" * 3).decode()}
    ),
    json.dumps({"type": "session.update", "session": {"modalities": ["text"]}}),
    json.dumps({"type": "response.create", "response": {"instructions": ["a list"]}}),
    json.dumps(
        {
            "type": "conversation.item.truncate",
            "item_id": "x",
            "content_index": 0,
            "audio_end_ms": 5,
        }
    ),
    "x" * 100_000,
    b"\x00\x01",
]


async def test_bad_frames_get_errors_and_the_connection_lives_on() -> None:
    async with serving() as (url, _), connect(realtime(url)) as ws:
        await until(ws, "session.created")
        for frame in BAD_FRAMES:
            await ws.send(frame)
            error = await until(ws, "error")
            assert error["error"]["type"] == "invalid_request_error", error
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        assert (await until(ws, "session.updated"))["type"] == "session.updated"
        # a large valid append (4 s of audio, one frame) is taken a second at a time
        four_s = base64.b64encode(bytes(4 * 24_000 * 2)).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": four_s}))
        await ws.send(text_item("Still there?"))
        await ws.send(json.dumps({"type": "response.create"}))
        assert (await until(ws, "response.done"))["response"]["status"] == "completed"


async def test_speech_at_24khz_is_heard_and_answered(speech: SpeechFactory) -> None:
    async with serving() as (url, _), connect(realtime(url)) as ws:
        await until(ws, "session.created")
        question = speech.piper("What is the capital of France?", lead_s=0.3, trail_s=1.5)
        pcm = float32_to_pcm16(resample(question, 16_000, 24_000))
        step = 2 * 2400  # 100 ms
        for i in range(0, len(pcm), step):
            chunk = base64.b64encode(pcm[i : i + step]).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            await asyncio.sleep(0.1)
        seen: list[dict[str, Any]] = []
        done = await until(ws, "response.done", seen)
    first: dict[str, dict[str, Any]] = {}  # the first event of each kind, in the order they came
    for e in seen:
        first.setdefault(e["type"], e)
    heard = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
    ]
    assert [k for k in first if k in heard] == heard  # in this order
    started, stopped, committed, transcribed = (first[k] for k in heard)
    item = started["item_id"]
    assert stopped["item_id"] == committed["item_id"] == transcribed["item_id"] == item
    # the speech starts after the 0.3 s lead and lasts as long as Piper's words do
    spoken_ms = 1000 * (len(question) / 16_000 - 0.3 - 1.5)
    start, end = started["audio_start_ms"], stopped["audio_end_ms"]
    assert 0 < start < 600 and abs(end - start - spoken_ms) < 600, (start, end, spoken_ms)
    assert transcribed["transcript"] == "What is the capital of France?"  # ScriptedAsr's
    assert transcribed["usage"] == {"type": "duration", "seconds": (end - start) / 1000}
    reply = "Paris is the capital of France."  # ScriptedReplies'
    words = "".join(
        e["delta"] for e in seen if e["type"] == "response.output_audio_transcript.delta"
    )
    assert words == reply
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in seen if e["type"] == "response.output_audio.delta"
    )
    assert len(audio) // 2 > 24_000  # over a second of 24 kHz speech for six words
    assert done["response"]["status"] == "completed"
    (message,) = done["response"]["output"]
    assert message["content"][0]["transcript"] == reply


async def test_the_realtime_endpoint_takes_the_same_keys_and_realtime_tokens() -> None:
    config = ServerConfig(auth=AuthConfig(api_keys=frozenset({KEY})))
    async with serving(config=config) as (url, _):
        with pytest.raises(InvalidStatus) as err:
            await connect(realtime(url))
        assert err.value.response.status_code == 401
        bearer = {"Authorization": f"Bearer {KEY}"}
        async with connect(realtime(url), additional_headers=bearer) as ws:
            assert (await until(ws, "session.created"))["type"] == "session.created"
        voice_token, _ = mint_client_token(derive_secret(KEY), time.time(), scope="voice")
        with pytest.raises(InvalidStatus) as err:
            await connect(
                realtime(url), additional_headers={"Authorization": f"Bearer {voice_token}"}
            )
        assert err.value.response.status_code == 401  # wrong scope
        token, _ = mint_client_token(derive_secret(KEY), time.time(), scope="realtime")
        async with connect(
            realtime(url), additional_headers={"Authorization": f"Bearer {token}"}
        ) as ws:
            assert (await until(ws, "session.created"))["type"] == "session.created"


def post(url: str, body: dict[str, Any], key: str = KEY) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Authorization", f"Bearer {key}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_a_browser_connects_with_a_client_secret_and_gets_its_session() -> None:
    """OpenAI's browser flow: the backend POSTs the session config to client_secrets
    (a JSON body), the page offers ["realtime", "openai-insecure-api-key.SECRET"]."""
    config = ServerConfig(auth=AuthConfig(api_keys=frozenset({KEY})))
    async with serving(config=config) as (url, _):
        base = url.replace("ws://", "http://").replace("/v1/voice", "")
        session = {"type": "realtime", "instructions": "Be terse.", "output_modalities": ["text"]}
        secrets = f"{base}/v1/realtime/client_secrets"
        status, minted = await asyncio.to_thread(
            post, secrets, {"session": session, "expires_after": {"seconds": 60}}
        )
        assert status == 200 and minted["session"] == session
        offered = ["realtime", f"openai-insecure-api-key.{minted['value']}"]
        async with connect(realtime(url), subprotocols=offered) as ws:  # type: ignore[list-item]
            assert ws.subprotocol == "realtime"
            created = await until(ws, "session.created")
            assert created["session"]["instructions"] == "Be terse."
            assert created["session"]["output_modalities"] == ["text"]
        bad = {"session": {"type": "realtime", "audio": {"output": {"voice": "alloy"}}}}
        status, refused = await asyncio.to_thread(post, secrets, bad)
        assert (status, refused["error"]) == (400, "invalid_session")
        assert "voice" in refused["message"]
        # a body on /v1/token is read too; a key in OpenAI's subprotocol opens a session
        status, minted = await asyncio.to_thread(post, f"{base}/v1/token", {"ttl_s": 30})
        assert status == 200 and minted["expires_at"] - time.time() < 31
        offered = ["realtime", f"openai-insecure-api-key.{KEY}"]
        async with connect(realtime(url), subprotocols=offered) as ws:  # type: ignore[list-item]
            assert (await until(ws, "session.created"))["session"]["instructions"] != "Be terse."
