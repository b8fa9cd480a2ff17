"""The endpointer with the real VAD on synthesized questions with silence around them."""

from __future__ import annotations

import numpy as np
import pytest

from audio.asr import Transcriber, load_transcriber
from audio.endpoint import (
    EndOfTurn,
    EndpointConfig,
    Endpointer,
    EndpointEvent,
    SpeechPaused,
    SpeechStarted,
    looks_incomplete,
)
from audio.ring import AudioRing
from audio.vad import SileroVad
from tests.speech import QUESTIONS, SpeechFactory, have_espeak, pad, word_error_rate

pytestmark = pytest.mark.models

RATE = 16_000
LEAD_S, TRAIL_S = 0.7, 1.5


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad()


@pytest.fixture(scope="module")
def tiny() -> Transcriber:
    return load_transcriber("tiny.en")


def speech_bounds(audio: np.ndarray, level: float = 0.01) -> tuple[int, int]:
    loud = np.flatnonzero(np.abs(audio) > level)
    return int(loud[0]), int(loud[-1]) + 1


def endpoint(vad: SileroVad, audio: np.ndarray, chunk: int = 320) -> list[EndpointEvent]:
    """Stream 20 ms chunks through VAD and endpointer, as the server does."""
    state, ep, events = vad.new_state(), Endpointer(), []
    for pos in range(0, len(audio), chunk):
        events += ep.feed(vad.process(state, audio[pos : pos + chunk]))
    return events


@pytest.mark.parametrize("voice", ["piper", "espeak"])
def test_each_question_is_one_turn_with_accurate_bounds(
    vad: SileroVad, speech: SpeechFactory, voice: str
) -> None:
    if voice == "espeak" and not have_espeak():
        pytest.skip("espeak-ng is not installed")
    for text in QUESTIONS:
        audio = getattr(speech, voice)(text, LEAD_S, TRAIL_S)
        start, end = speech_bounds(audio)
        events = endpoint(vad, audio)
        starts = [e for e in events if isinstance(e, SpeechStarted)]
        ends = [e for e in events if isinstance(e, EndOfTurn)]
        assert len(starts) == 1 and len(ends) == 1, (text, events)
        assert isinstance(events[-2], SpeechPaused)
        assert events[-2].end_sample == ends[0].end_sample
        assert abs(starts[0].start_sample - start) < 0.1 * RATE, text
        # the VAD stops within a few frames of the last audible sample
        assert -0.05 * RATE < ends[0].end_sample - end < 0.15 * RATE, text


def test_click_does_not_start_a_turn(vad: SileroVad) -> None:
    rng = np.random.default_rng(3)
    audio = np.zeros(RATE * 2, np.float32)
    audio[RATE : RATE + 480] = rng.standard_normal(480).astype(np.float32) * 0.5  # 30 ms
    assert endpoint(vad, audio) == []


def run_with_hints(
    vad: SileroVad, tiny: Transcriber, audio: np.ndarray, cfg: EndpointConfig, hint: bool
) -> tuple[list[EndpointEvent], list[str]]:
    """What the server does: speculative ASR on each pause, unfinished-words hint."""
    state, ep, ring = vad.new_state(), Endpointer(cfg), AudioRing()
    events: list[EndpointEvent] = []
    texts: list[str] = []
    turn_start = 0
    for pos in range(0, len(audio), 320):
        ring.append(audio[pos : pos + 320])
        for e in ep.feed(vad.process(state, audio[pos : pos + 320])):
            events.append(e)
            if isinstance(e, SpeechStarted):
                turn_start = e.start_sample
            elif isinstance(e, SpeechPaused):
                text = tiny.transcribe(ring.slice(cfg.asr_start(turn_start), e.end_sample)).text
                texts.append(text)
                if hint and looks_incomplete(text):
                    ep.mark_incomplete(e.end_sample)
    return events, texts


def test_unfinished_words_hold_the_turn_open(
    vad: SileroVad, tiny: Transcriber, speech: SpeechFactory
) -> None:
    first = speech.piper("Add milk, eggs, and")
    second = speech.piper("bread to my shopping list.")
    audio = pad(np.concatenate([first, np.zeros(int(0.7 * RATE), np.float32), second]), 0.5, 1.5)
    cfg = EndpointConfig()

    events, texts = run_with_hints(vad, tiny, audio, cfg, hint=False)
    assert sum(isinstance(e, EndOfTurn) for e in events) == 2  # half a question answered

    events, texts = run_with_hints(vad, tiny, audio, cfg, hint=True)
    assert sum(isinstance(e, EndOfTurn) for e in events) == 1, (events, texts)
    assert any(looks_incomplete(t) for t in texts[:-1]), texts
    final = texts[-1]
    assert word_error_rate("add milk eggs and bread to my shopping list", final) < 0.25, texts
