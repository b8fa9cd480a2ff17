from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cache directory for the joined Whisper base model (joined once per session)."""
    return tmp_path_factory.mktemp("model-cache")
