"""Many sessions on one process: every turn completes while others stream audio."""

from __future__ import annotations

from pathlib import Path

import pytest

from audio.speech import SpeechFactory, word_error_rate, write_wav
from clients import loadtest
from tests.serverproc import ServerProcess
from tests.speech import AUSTRALIA, SPIDER

pytestmark = [pytest.mark.e2e, pytest.mark.models, pytest.mark.slow]

# Turn 1, then turn 2 after it. Whisper sometimes hears "Pride in Prejudice", and so
# asked the model names Elizabeth Bennet: no Austen question here.
ASKED = (AUSTRALIA, SPIDER)
QUESTIONS = tuple(q.text for q in ASKED)


async def test_talkers_among_idle_sessions_all_get_answers(
    server: ServerProcess, speech: SpeechFactory, tmp_path: Path
) -> None:
    wavs = [
        write_wav(tmp_path / f"q{i}.wav", speech.piper(q, lead_s=0.3))
        for i, q in enumerate(QUESTIONS)
    ]
    report = await loadtest.run(server.url, wavs, sessions=10, talkers=3, turns=2, timeout_s=240)
    summary = report["summary"]
    assert isinstance(summary, dict)
    turns = report["turns"]
    assert isinstance(turns, list)
    assert summary["turns"] == 6
    assert summary["completed"] == 6, [t["error"] for t in turns]
    for t in turns:
        assert word_error_rate(QUESTIONS[t["turn"] - 1], t["transcript"]) <= 0.2, t
        ASKED[t["turn"] - 1].check(t["reply"])
    lag = summary["loop_lag"]
    assert isinstance(lag, dict) and lag["n"] > 0
