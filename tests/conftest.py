"""Fixtures shared by every test suite."""

from __future__ import annotations

import pytest

from tests.speech import SpeechFactory


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> SpeechFactory:
    """Synthesized test speech (Piper, espeak-ng), cached for the whole test session."""
    return SpeechFactory(tmp_path_factory.mktemp("speech"))
