"""The endpointer with the real VAD on synthesized questions with silence around them."""

from __future__ import annotations

import numpy as np
import pytest

from audio.endpoint import (
    EndOfTurn,
    Endpointer,
    EndpointEvent,
    SpeechPaused,
    SpeechStarted,
)
from audio.speech import QUESTIONS, SpeechFactory, have_espeak
from audio.vad import SileroVad
from tests.speech import missing

pytestmark = pytest.mark.models

RATE = 16_000
LEAD_S, TRAIL_S = 0.7, 1.5


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
        missing("espeak-ng is not installed")
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
