from __future__ import annotations

from pathlib import Path

import pytest

from tests.speech import SpeechFactory


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> SpeechFactory:
    """Synthesized test speech, cached for the whole test session."""
    return SpeechFactory(tmp_path_factory.mktemp("speech"))


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cache directory for the joined Whisper base model (joined once per session)."""
    return tmp_path_factory.mktemp("model-cache")
