"""Speech first: the reply model pauses while a reply's first sentence is synthesized."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from audio.tts import Synthesizer
from server.speech import SpeechFirst
from server.turn import synthesize


class HoldWatch:
    """The real Piper voice, noting whether the reply models were held at every chunk."""

    def __init__(self, tts: Synthesizer, speech_first: SpeechFirst) -> None:
        self.tts, self.speech_first = tts, speech_first
        self.sample_rate = tts.sample_rate
        self.held: list[bool] = []
        self.lean: list[bool] = []  # the session each sentence was asked on

    def synthesize(self, text: str, lean: bool = False) -> Iterator[np.ndarray]:
        self.lean.append(lean)
        for chunk in self.tts.synthesize(text, lean=lean):
            self.held.append(self.speech_first.holding)
            yield chunk


@pytest.fixture(scope="module")
def tts() -> Synthesizer:
    return Synthesizer(lean=True)  # as the server loads it on a CPU


def _runtime(tts: Synthesizer, lean: bool = False) -> Any:
    """What ``synthesize`` reads of a Runtime; its ``lean_speech`` answers ``lean`` and
    keeps what it was asked (the rule itself: test_runtime_threads.py)."""
    speech_first = SpeechFirst()
    asked: list[bool] = []

    def lean_speech(first: bool) -> bool:
        asked.append(first)
        return lean

    return SimpleNamespace(
        tts=HoldWatch(tts, speech_first),
        speech_first=speech_first,
        lean_speech=lean_speech,
        asked=asked,
    )


@pytest.mark.models
def test_the_first_sentence_is_synthesized_with_the_model_held(tts: Synthesizer) -> None:
    rt = _runtime(tts)
    pcm = synthesize(rt, "The capital of Italy is Rome.", 16_000, first=True)
    assert rt.tts.held == [True] and not rt.speech_first.holding  # held throughout, then let go
    assert 0.5 * 16_000 < len(pcm) // 2 < 4 * 16_000


@pytest.mark.models
def test_later_sentences_leave_the_model_running(tts: Synthesizer) -> None:
    rt = _runtime(tts)
    synthesize(rt, "It is also the largest city in Italy.", 16_000)
    assert rt.tts.held == [False]


@pytest.mark.models
@pytest.mark.parametrize("lean", [False, True])
def test_a_sentence_is_synthesized_on_the_session_the_runtime_names(
    tts: Synthesizer, lean: bool
) -> None:
    for first in (True, False):
        rt = _runtime(tts, lean)
        synthesize(rt, "The capital of Italy is Rome.", 16_000, first=first)
        assert rt.asked == [first] and rt.tts.lean == [lean]
