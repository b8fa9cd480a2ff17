"""pytest helpers for the test speech of :mod:`audio.speech`."""

from __future__ import annotations

import os

import pytest

from audio.speech import have_espeak

# In CI a missing espeak-ng is a failure (.ci/run installs it); elsewhere a skip.
needs_espeak = pytest.mark.skipif(
    not have_espeak() and not os.environ.get("CI"), reason="espeak-ng is not installed"
)
