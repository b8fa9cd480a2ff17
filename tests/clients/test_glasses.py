"""The smart-glasses client against the real server, through a network that drops, and
acting on what the reply calls."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from audio.resample import float32_to_int16
from audio.speech import SpeechFactory, word_error_rate
from clients.actions import Actions
from clients.common import FRAME_MS, ClientError, Pacer, Pcm, frames, read_wav
from clients.devices import WavMicrophone, WavSpeaker
from clients.glasses import Glasses, GlassesOptions
from model.engine import ChatMessage, GenerationStats
from model.tools import DEFAULT_TOOLS, ToolCall
from server import protocol as p
from tests.inproc import ScriptedAsr, ScriptedReplies, serving
from tests.speech import JAPAN

from .conftest import Proxy

pytestmark = [pytest.mark.e2e, pytest.mark.models]

QUESTION = JAPAN.text


async def test_glasses_reconnect_after_a_drop_and_finish_the_turn(
    proxy: Proxy, speech: SpeechFactory, tmp_path: Path
) -> None:
    """The connection is cut while the user speaks: reconnect, resume, ask again."""
    question = Pcm(float32_to_int16(speech.piper(QUESTION, lead_s=0.3)), 16000)
    events: list[p.ServerMessage] = []

    def on_frame(message: p.ServerMessage | None, _raw: str | bytes) -> None:
        if message is None:
            return
        events.append(message)
        if isinstance(message, p.SpeechStarted) and proxy.drops == 0:
            proxy.drop()

    out = tmp_path / "reply.wav"
    speaker = WavSpeaker(16000, out)
    glasses = Glasses(GlassesOptions(proxy.url, timeout_s=180), WavMicrophone(question), speaker)
    glasses.on_frame = on_frame
    results = await glasses.run()
    speaker.close()

    assert proxy.drops == 1 and proxy.accepted == 2 and glasses.connections == 2
    readies = [e for e in events if isinstance(e, p.Ready)]
    assert [r.resumed for r in readies] == [False, True]
    assert readies[0].resume_token != readies[1].resume_token  # tokens are single use
    [result] = results
    assert word_error_rate(QUESTION, result.transcript) <= 0.2, result.transcript
    JAPAN.check(result.reply)
    reply = read_wav(out)
    assert reply.rate == 16000 and reply.seconds > 0.3
    assert np.abs(reply.samples).max() > 1000


async def test_glasses_give_up_when_the_server_stays_away(proxy: Proxy) -> None:
    """After a drop the client retries with backoff, then says plainly what happened."""
    quiet = Pcm(np.zeros(16000 * 30, np.int16), 16000)
    events: list[p.ServerMessage] = []

    def on_frame(message: p.ServerMessage | None, _raw: str | bytes) -> None:
        if isinstance(message, p.Ready):
            events.append(message)
            proxy.refuse = True  # the server becomes unreachable ...
            proxy.drop()  # ... and the live connection goes

    options = GlassesOptions(proxy.url, timeout_s=60, retries=2)
    glasses = Glasses(options, WavMicrophone(quiet), WavSpeaker(16000), on_frame)
    with pytest.raises(ClientError, match="gave up after 2 reconnections"):
        await glasses.run()
    assert len(events) == 1


@dataclass
class ActingReplies(ScriptedReplies):
    """Replies to the first question call ``call`` before they speak, as a reply model
    that acts does (the trained model's own calls are the end-to-end tests' part)."""

    supports_tools: bool = True
    call: ToolCall | None = None

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Any] = (),
    ) -> Generator[str | ToolCall, None, GenerationStats]:
        if self.call is not None and [m.role for m in conversation].count("user") == 1:
            yield self.call
        return (yield from super().generate(conversation, max_tokens, should_stop, tools))


class AskTwice:
    """A microphone that asks ``question``, then, once ``then`` is set, asks it again;
    silence in between and after, at real-time pace."""

    def __init__(self, question: Pcm, then: asyncio.Event) -> None:
        self.question, self.then, self.rate = question, then, question.rate

    async def stream(self) -> AsyncIterator[bytes]:
        pacer, quiet, asked = Pacer(), bytes(2 * self.rate * FRAME_MS // 1000), 0
        while True:
            if asked == 0 or (asked == 1 and self.then.is_set()):
                asked += 1
                for chunk in frames(self.question):
                    await pacer.wait(len(chunk) / 2 / self.rate)
                    yield chunk
            await pacer.wait(FRAME_MS / 1000)
            yield quiet


async def test_glasses_declare_their_tools_and_act_on_the_call(speech: SpeechFactory) -> None:
    """The real server (scripted ASR and replies) takes the glasses' tools, calls one;
    the glasses start the timer and answer, and the next reply sees what they said."""
    tools = [t.schema() for t in DEFAULT_TOOLS if t.name in ("timer.set", "timer.cancel")]
    said = float32_to_int16(speech.piper("Set a timer for five minutes.", lead_s=0.3))
    first_done = asyncio.Event()  # the next question waits for the first turn's end
    mic = AskTwice(Pcm(said, 16000), first_done)
    replies = ActingReplies(
        "Timer set for five minutes.", call=ToolCall("timer.set", {"seconds": 300})
    )
    events: list[p.ServerMessage] = []
    lines: list[dict[str, Any]] = []

    def on_frame(message: p.ServerMessage | None, _raw: str | bytes) -> None:
        if message is not None:
            events.append(message)
        if isinstance(message, p.Metrics) and message.turn_id == 1:
            first_done.set()

    async with serving(ScriptedAsr("Set a timer for five minutes."), replies) as (url, _):
        options = GlassesOptions(url, turns=2, timeout_s=120, tools=tools)
        actions = Actions(tools, emit=lines.append)
        glasses = Glasses(options, mic, WavSpeaker(16000), on_frame, actions)
        results = await glasses.run()
    left = await actions.close()

    [ready] = [e for e in events if isinstance(e, p.Ready)]
    assert ready.tools == ["timer.set", "timer.cancel"]  # the session took the glasses' tools
    assert not [e for e in events if isinstance(e, p.Error)], events
    [action] = [e for e in events if isinstance(e, p.Action)]
    assert (action.turn_id, action.name, action.arguments) == (1, "timer.set", {"seconds": 300})
    first_text = next(e for e in events if isinstance(e, p.ReplyText))
    assert events.index(action) < events.index(first_text)  # before the confirmation
    assert left is not None and 0 < left <= 300  # a countdown was running
    answer = {"name": "timer.set", "output": "Timer set for 5 minutes."}
    assert lines == [{"type": "action_result", "call_id": action.call_id, **answer}]
    assert ChatMessage("tool", json.dumps(answer)) in replies.seen[-1]  # the next reply sees it
    assert [r.reply for r in results] == ["Timer set for five minutes."] * 2
