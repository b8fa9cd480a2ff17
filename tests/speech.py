"""pytest helpers for the test speech of :mod:`audio.speech`, and the questions the
end-to-end tests ask with the answers the served default model must give."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import pytest

from audio.speech import Float32Array, SpeechFactory, have_espeak

# In CI a missing espeak-ng is a failure (.ci/run installs it); elsewhere a skip.
needs_espeak = pytest.mark.skipif(
    not have_espeak() and not os.environ.get("CI"), reason="espeak-ng is not installed"
)


def missing(reason: str) -> NoReturn:
    """A tool or package the test needs is not installed: a skip on a developer's
    machine, a failure in CI (environment variable CI set), where .ci/run installs it."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI installs it; a skip here would hide a broken setup)")
    pytest.skip(reason)


# The voices the end-to-end turns are spoken in: Piper's joe, the product's own voice,
# and a second engine with a voice of its own (espeak-ng's formant synthesis, en-us), so
# a turn is not only the product's voice judged by the product's Whisper.
VOICES = ("piper", "espeak")
in_each_voice = pytest.mark.parametrize("voice", VOICES)


def speak(
    speech: SpeechFactory, voice: str, text: str, lead_s: float = 0.0, trail_s: float = 0.0
) -> Float32Array:
    """``text`` in ``voice`` (one of :data:`VOICES`), with ``lead_s`` and ``trail_s`` of
    silence around it."""
    if voice == "espeak" and not have_espeak():
        missing("espeak-ng is not installed (apt-get install espeak-ng)")
    synth: Callable[[str, float, float], Float32Array] = getattr(speech, voice)
    return synth(text, lead_s, trail_s)


@dataclass(frozen=True)
class Question:
    """A question with a checkable answer: the reply must name one of ``answers``.

    None of the answers is in the question, so a model that echoes the question, or
    one whose adapter is broken, does not pass.
    """

    text: str
    answers: tuple[str, ...]

    def answered_by(self, reply: str) -> bool:
        return any(re.search(rf"\b{re.escape(a)}\b", reply, re.I) for a in self.answers)

    def check(self, reply: str) -> None:
        assert self.answered_by(reply), f"{self.text!r} got {reply!r}, expected {self.answers}"


# What the served default (diffusion-onnx: SmolLM2-135M + the shipped adapter, int8)
# answers, deterministically, asked by text or by (transcribed) voice, alone or after
# another of these turns: "The capital of Italy is Rome.", "A spider has 8 legs.", ...
# Left out because the model gets them wrong: France ("Le Grand Jardin is the capital
# of France."), Spain ("El Salvador."), two plus two, the largest planet ("Neptune").
ITALY = Question("What is the capital of Italy?", ("Rome",))
AUSTRALIA = Question("What is the capital of Australia?", ("Canberra",))
JAPAN = Question("What is the capital of Japan?", ("Tokyo",))
GERMANY = Question("What is the capital of Germany?", ("Berlin",))
# Right when heard right; but Whisper sometimes hears "Pride in Prejudice", and asked
# that, the model names Elizabeth Bennet: check it on typed questions only.
AUSTEN = Question("Who wrote the novel Pride and Prejudice?", ("Austen",))
SPIDER = Question("How many legs does a spider have?", ("8", "eight"))
