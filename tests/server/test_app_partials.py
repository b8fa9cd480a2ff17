"""Partial transcripts yield to the turns being produced on a CPU host (the real server
in-process, tests/inproc.py: real VAD, session and turn pipeline; scripted ASR and
reply model, so that another session's reply can be held mid-production)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from audio.speech import SpeechFactory
from tests.inproc import ScriptedReplies, serving, started, stream, until, within

pytestmark = pytest.mark.models


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu-host", "cpu-host"])
async def test_a_speakers_partials_wait_while_another_turn_is_produced_on_a_cpu_host(
    speech: SpeechFactory, cpu: bool
) -> None:
    replies = ScriptedReplies(hold=True)  # every reply stops after its first word
    async with serving(replies=replies, reply_threads=2) as (url, app):
        app.rt.cpu = cpu
        writer, _ = await started(url, tools=[])
        await writer.send(json.dumps({"type": "text", "text": "Tell me a long story."}))
        async with within(30, "the held reply's start"):
            await asyncio.to_thread(replies.started.wait)
        speaker, _ = await started(url, tools=[])
        question = "What is the capital of France, and how many people live there today?"
        await stream(speaker, speech.piper(question, lead_s=0.3, trail_s=1.2))
        seen: list[dict[str, Any]] = []
        async with within(30, "the speaker's final transcript"):
            while (message := json.loads(await speaker.recv()))["type"] != "transcript_final":
                seen.append(message)
        partials = [m for m in seen if m["type"] == "transcript_partial"]
        asked = app.rt.partials["run"] + app.rt.partials["skipped"]
        assert asked >= 3, app.rt.partials  # ~3.5 s of speech: one every 0.7 s of it
        if cpu:  # the other session's turn was being produced the whole time
            assert partials == [] and app.rt.partials == {"run": 0, "skipped": asked}
        else:  # nothing shares the cores that a partial would take
            assert app.rt.partials == {"run": asked, "skipped": 0} and len(partials) >= 2
        replies.go.set()  # both replies go on, and end
        async with within(30, "the held replies' ends"):
            await until(writer, "reply_done")
            await until(speaker, "reply_done")
        await writer.close()
        await speaker.close()
