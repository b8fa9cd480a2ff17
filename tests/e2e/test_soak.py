"""A short soak (clients/soak.py) against the real server: ten open sessions, two of
them talking at a time for three minutes. Every turn must complete and no session may
be closed by the server; the resource growth is printed, not judged (three minutes
of RSS is noise; the long run's figures are in docs/robustness.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audio.speech import SpeechFactory, write_wav
from clients import soak
from tests.serverproc import ServerProcess


@pytest.mark.e2e
@pytest.mark.models
@pytest.mark.slow
async def test_a_short_soak_completes_every_turn(
    server: ServerProcess, speech: SpeechFactory, tmp_path: Path
) -> None:
    wavs = [
        write_wav(tmp_path / f"q{i}.wav", speech.piper(q, lead_s=0.3))
        for i, q in enumerate(soak.QUESTIONS[:2])
    ]
    opts = soak.Options(
        server.url, sessions=10, talking=2, minutes=3, pid=server.proc.pid, max_growth=None
    )
    report = await soak.run(opts, wavs)
    summary = report["summary"]
    assert isinstance(summary, dict)
    print(json.dumps(summary, indent=2))  # growth after warm-up, in the test's output
    assert summary["turns_started"] >= 2
    assert summary["turns_completed"] == summary["turns_started"], summary["turn_errors"]
    assert summary["closed_by_server"] == {}
    assert summary["ok"], summary["failures"]
    after = summary["after_close"]
    assert isinstance(after, dict) and after["sessions"] == 0


def test_growth_is_measured_from_the_end_of_the_warm_up() -> None:
    samples = [
        soak.Sample(t=float(t), turns_started=0, turns_completed=0, rss_kb=rss, fds=20)
        for t, rss in [(0, 500), (10, 900), (20, 1000), (30, 1010), (40, 1020), (50, 1030)]
    ]
    growth = soak.growth_after_warmup(samples, 0.2)
    # the run is 50 s: the first 10 s are warm-up, the sample at 10 s is the base
    assert growth["rss_kb"] == {"at_warmup": 900, "end": 1030, "growth": 0.1444}
    assert growth["fds"]["growth"] == 0.0
    assert "threads" not in growth  # never sampled


def test_only_loopback_targets_are_soaked() -> None:
    assert soak.main(["--url", "ws://192.168.1.1:8765/v1/voice"]) == 2
