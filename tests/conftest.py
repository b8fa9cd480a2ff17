"""Fixtures shared by every test suite: speech, the real audio models, a real server.

Real models are loaded once per test session; they are stateless between calls (the
VAD keeps its state in a per-stream object), so sharing them is safe.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from audio.speech import SpeechFactory
from tests.serverproc import ServerProcess, start_server

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


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``python -m server.cli serve --port 0`` with the default models, one per test run."""
    srv = start_server(tmp_path_factory.mktemp("server") / "server.log")
    yield srv
    srv.stop()
