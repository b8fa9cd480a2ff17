"""The session with the real VAD and real Whisper on synthesized speech.

The asyncio layer is replaced by a synchronous loop that runs each effect at once
(VAD, speculative ASR), so the turn logic is exercised on real audio without a socket.
"""

from __future__ import annotations

import numpy as np
import pytest

from audio.asr import Transcriber
from audio.endpoint import EndpointConfig
from audio.resample import float32_to_pcm16
from audio.speech import SpeechFactory, pad, word_error_rate
from audio.vad import SileroVad
from server import protocol as p
from server.session import (
    AudioBytes,
    Effect,
    FinalTranscript,
    ReleaseTurn,
    RunVad,
    Send,
    Session,
    SessionConfig,
    StartTurn,
    VadResult,
)
from server.turn_end import TurnEndPolicy

pytestmark = pytest.mark.models

RATE = 16_000


def converse(
    vad: SileroVad, asr: Transcriber, audio: np.ndarray, config: SessionConfig
) -> tuple[list[str], list[str]]:
    """Stream audio in 20 ms frames; returns (final transcripts, speculative ones)."""
    session = Session("s", config, "tiny.en", "none")
    session.receive(p.Start(sample_rate=RATE), 0.0)
    state = vad.new_state()
    finals: list[str] = []
    speculative: list[str] = []
    now = 0.0

    def run(effects: list[Effect]) -> None:
        for e in effects:
            match e:
                case RunVad(samples=x):
                    run(session.receive(VadResult(x, vad.process(state, x)), now))
                case StartTurn(turn_id=t, audio=a) if a is not None:
                    text = asr.transcribe(a).text  # instant, as on a fast GPU
                    speculative.append(text)
                    run(session.receive(FinalTranscript(t, text, 1.0), now))
                case Send(message=p.TranscriptFinal(text=text)):
                    finals.append(text)
                case ReleaseTurn():
                    pass

    for pos in range(0, len(audio), 320):
        now = pos / RATE
        run(session.receive(AudioBytes(float32_to_pcm16(audio[pos : pos + 320])), now))
    return finals, speculative


def test_unfinished_words_hold_the_turn_open(
    vad: SileroVad, tiny: Transcriber, speech: SpeechFactory
) -> None:
    """'Add milk, eggs, and ... bread': a 0.7 s pause mid-list is not the end."""
    first = speech.piper("Add milk, eggs, and")
    second = speech.piper("bread to my shopping list.")
    gap = np.zeros(int(0.7 * RATE), np.float32)
    audio = pad(np.concatenate([first, gap, second]), 0.5, 1.5)

    ms = EndpointConfig().end_of_turn_ms
    without_hold = SessionConfig(turn_end=TurnEndPolicy(hold_ms=ms, default_ms=ms))
    finals, _ = converse(vad, tiny, audio, without_hold)
    assert len(finals) == 2, finals  # half a question answered

    finals, speculative = converse(vad, tiny, audio, SessionConfig())
    assert len(finals) == 1, (finals, speculative)
    assert len(speculative) >= 2  # the first pause was speculated on, then dropped
    assert word_error_rate("add milk eggs and bread to my shopping list", finals[0]) < 0.25


def test_a_finished_question_is_one_turn(
    vad: SileroVad, tiny: Transcriber, speech: SpeechFactory
) -> None:
    audio = speech.piper("What is the capital of Australia?", lead_s=0.5, trail_s=1.5)
    finals, _ = converse(vad, tiny, audio, SessionConfig())
    assert len(finals) == 1
    assert word_error_rate("what is the capital of australia", finals[0]) <= 0.2
