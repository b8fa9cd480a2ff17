"""The whole voice loop against a real server: speech in, transcript, reply, speech out."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio.client import connect

from audio.asr import Transcriber, load_transcriber
from audio.resample import float32_to_int16, int16_to_float32
from audio.speech import SpeechFactory, word_error_rate, write_wav
from clients.common import Pcm, TurnAudio, read_wav
from clients.glasses import first_turn, start_session, stream_audio
from server import protocol as p
from tests.serverproc import ROOT, ServerProcess
from tests.speech import ITALY, JAPAN, in_each_voice, speak

pytestmark = [pytest.mark.e2e, pytest.mark.models]

# The reply must be right and one Whisper can spell back. Asked about France, the served
# int8 diffusion model writes "Le Grand Jardin is the capital of France." (fp32: "... is
# Paris."): a made-up name, from a near-tie that weight quantisation flips. Italy gets
# "The capital of Italy is Rome." from PyTorch, fp32 and int8 alike (docs/training.md).
QUESTION = ITALY.text


def pcm(audio: np.ndarray) -> Pcm:
    return Pcm(float32_to_int16(audio), 16000)


@in_each_voice
async def test_spoken_question_gets_an_intelligible_spoken_answer(
    server: ServerProcess, speech: SpeechFactory, tiny: Transcriber, voice: str
) -> None:
    question = speak(speech, voice, QUESTION, lead_s=0.5)
    async with connect(server.url) as ws:
        ready = await start_session(ws, 16000, "test")
        assert ready.output_sample_rate == 16000 and ready.audio_header_bytes == 8
        sender = asyncio.create_task(stream_audio(ws, pcm(question)))
        async with asyncio.timeout(120):
            result = await first_turn(ws, ready, printer=False)
        sender.cancel()

    kinds = [type(m) for m in result.events]
    for kind in (p.SpeechStarted, p.SpeechStopped, p.TranscriptFinal, p.ReplyText, p.Metrics):
        assert kind in kinds, f"no {kind.type} event"
    assert word_error_rate(QUESTION, result.transcript) <= 0.2, result.transcript
    ITALY.check(result.reply)

    audio = int16_to_float32(np.frombuffer(result.audio, "<i2"))
    heard = tiny.transcribe(audio).text  # a second Whisper, in the test process
    assert word_error_rate(result.reply, heard) <= 0.35, (result.reply, heard)
    if not ITALY.answered_by(heard):
        # Piper's speech varies from call to call (its noise is not seeded), and on about
        # 1 in 20 takes tiny.en hears "... is wrong." (so does base, on other takes):
        # a third listener, Whisper base, settles it.
        heard = load_transcriber("base").transcribe(audio).text
    ITALY.check(heard)  # the answer is in the speech, not only in the text

    metrics = next(m for m in result.events if isinstance(m, p.Metrics))
    assert metrics.turn_id == result.turn_id
    for name in ("endpointing_ms", "asr_ms", "reply_ms", "tts_first_chunk_ms", "first_audio_ms"):
        value = getattr(metrics, name)
        assert value is not None and value > 0, name
    assert metrics.reply_tokens > 0


STORY = "Tell me a short story about a brave little dragon."
INTERRUPTION = "Stop. What time is it?"


async def test_barge_in_cancels_the_reply_and_stops_its_audio(
    server: ServerProcess, speech: SpeechFactory
) -> None:
    """Talk over the reply as soon as its audio starts: the rest of it never comes."""
    question = speech.piper(STORY, lead_s=0.3)
    interruption = speech.piper(INTERRUPTION, lead_s=0.1)
    log: list[tuple[str, int]] = []  # (event type or "audio", turn id), in arrival order
    cancelled: p.ReplyCancelled | None = None
    heard = ""  # the interruption's transcript
    replies: dict[int, str] = {}
    audio = TurnAudio()
    async with connect(server.url) as ws:
        ready = await start_session(ws, 16000, "test")
        tasks = [asyncio.create_task(stream_audio(ws, pcm(question)))]
        async with asyncio.timeout(180):
            async for frame in ws:
                if isinstance(frame, bytes):
                    turn_id = audio.add(frame)
                    log.append(("audio", turn_id))
                    if len(tasks) == 1:  # first reply audio: interrupt now
                        # One microphone: the question's trailing silence stops here, or
                        # its frames would interleave with the interruption's.
                        tasks[0].cancel()
                        tasks.append(asyncio.create_task(stream_audio(ws, pcm(interruption))))
                    continue
                message = p.decode_server(frame)
                log.append((message.type, getattr(message, "turn_id", 0)))
                match message:
                    case p.ReplyText(turn_id=t, text=text):
                        replies[t] = f"{replies.get(t, '')} {text}".strip()
                    case p.ReplyCancelled():
                        cancelled = message
                    case p.TranscriptFinal(turn_id=t) if cancelled and t > cancelled.turn_id:
                        heard = message.text
                        break
        for task in tasks:
            task.cancel()
    assert ready.session_id
    assert cancelled is not None, log
    assert cancelled.reason == "barge_in"
    first = cancelled.turn_id
    at = log.index(("reply_cancelled", first))
    assert ("audio", first) in log[:at]
    assert ("audio", first) not in log[at:], "audio of the cancelled turn after reply_cancelled"
    assert ("reply_done", first) not in log
    assert "dragon" in replies[first].lower(), replies[first]  # the story had begun
    assert word_error_rate(INTERRUPTION, heard) <= 0.34, heard  # the next turn heard it
    # The conversation keeps only what was sent: a word prefix of the reply.
    spoken = cancelled.spoken_text.split()
    assert spoken == replies[first].split()[: len(spoken)]


def test_glasses_client_cli(server: ServerProcess, speech: SpeechFactory, tmp_path: Path) -> None:
    wav = write_wav(tmp_path / "q.wav", speech.piper(JAPAN.text, lead_s=0.3))
    out = tmp_path / "reply.wav"
    cmd = [sys.executable, "-m", "clients.glasses", "--url", server.url, "--wav", str(wav)]
    run = subprocess.run(
        [*cmd, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr
    events = [p.decode_server(line) for line in run.stdout.splitlines() if '"audio"' not in line]
    assert isinstance(events[0], p.Ready)
    [done] = [e for e in events if isinstance(e, p.ReplyDone)]
    JAPAN.check(done.text)
    reply = read_wav(out)
    assert reply.rate == 16000 and reply.seconds > 0.3


def test_glasses_client_reports_an_unreachable_server(tmp_path: Path) -> None:
    wav = tmp_path / "q.wav"
    write_wav(wav, np.zeros(1600, np.float32))
    cmd = [sys.executable, "-m", "clients.glasses", "--url", "ws://127.0.0.1:9/v1/voice"]
    run = subprocess.run(
        [*cmd, "--wav", str(wav)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1
    assert "cannot reach the server" in run.stderr
