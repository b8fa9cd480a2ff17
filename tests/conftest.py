"""Fixtures shared by every test suite: speech, the real audio models, a real server.

Real models are loaded once per test session; they are stateless between calls (the
VAD keeps its state in a per-stream object), so sharing them is safe. Every server a
test starts prepares its reply model in one temporary cache of the test session
(``model_cache``), never in ~/.cache/quicksilver: the first one builds it with
today's exporter, as a user's first ``quicksilver serve`` does, and the rest reuse it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from audio.speech import SpeechFactory
from tests.redis_server import RedisServer, redis_binary
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
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``--cache-dir`` of every test server: empty when the test session starts."""
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Iterator[ServerProcess]:
    """``python -m server.cli serve --port 0`` with the default models, one per test run
    (its adapter calls tools: sessions that name none get the default device tools)."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    srv = start_server(log, "--cache-dir", str(model_cache))
    assert list(model_cache.glob("models/*/manifest.json")), "no model built in --cache-dir"
    yield srv
    srv.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server of this test's own on a free loopback port, stopped after."""
    directory = tmp_path / "redis"
    directory.mkdir()
    server = RedisServer(redis_binary(), directory)
    server.start()
    try:
        yield server
    finally:
        server.kill()
