"""Fixtures shared by every test suite: synthesized speech and the real audio models.

Real models are loaded once per test session; they are stateless between calls (the
VAD keeps its state in a per-stream object), so sharing them is safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.speech import SpeechFactory

if TYPE_CHECKING:
    from audio.asr import Transcriber
    from audio.vad import SileroVad


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> SpeechFactory:
    """Synthesized test speech (Piper, espeak-ng), cached for the whole test session."""
    return SpeechFactory(tmp_path_factory.mktemp("speech"))


@pytest.fixture(scope="session")
def vad() -> SileroVad:
    from audio.vad import SileroVad

    return SileroVad()


@pytest.fixture(scope="session")
def tiny() -> Transcriber:
    """Whisper tiny.en, the default ASR."""
    from audio.asr import load_transcriber

    return load_transcriber("tiny.en")
