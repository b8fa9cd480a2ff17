"""Client building blocks without a server: ground truth, percentiles, backoff, playback."""

from __future__ import annotations

import itertools
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from audio.speech import write_wav
from clients import devices
from clients.common import Pcm, backoff, speech_bounds
from clients.harness import Utterance, percentiles
from tests.serverproc import ROOT


def test_speech_bounds_finds_the_first_and_last_loud_sample() -> None:
    samples = np.zeros(16000, np.int16)
    samples[4000:12000] = 8000
    samples[6000] = 0
    onset, end = speech_bounds(Pcm(samples, 16000))
    assert (onset, end) == (0.25, 0.75)
    with pytest.raises(ValueError):
        speech_bounds(Pcm(np.full(100, 10, np.int16), 16000))


def test_utterance_marks_the_frames_holding_speech(tmp_path: Path) -> None:
    audio = np.zeros(16000, np.float32)
    audio[3210:8000] = 0.5  # onset in frame 10 (20 ms = 320 samples), last sample in 24
    path = write_wav(tmp_path / "u.wav", audio)
    u = Utterance.load(path)
    assert (u.onset_frame, u.end_frame) == (10, 24)


def test_percentiles_name_their_keys_and_tolerate_no_data() -> None:
    out = percentiles([float(v) for v in range(1, 101)], "x_ms")
    assert out["x_ms_n"] == 100 and out["x_ms_p50"] == 50.5
    assert out["x_ms_p95"] == pytest.approx(95.05, abs=0.06) and out["x_ms_p99"] == 99.0
    assert percentiles([], "y")["y_p95"] is None


def test_backoff_grows_to_a_cap() -> None:
    delays = list(itertools.islice(backoff(0.25, 2.0, 2.0, jitter=0.0), 5))
    assert delays == [0.25, 0.5, 1.0, 2.0, 2.0]
    jittered = list(itertools.islice(backoff(1.0, 1.0, 1.0, jitter=0.2), 50))
    assert all(0.8 <= d <= 1.2 for d in jittered) and len(set(jittered)) > 1


class FakeStream:
    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...


def test_speaker_flush_drops_a_cancelled_turn_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sound-card callback never plays a frame of a turn after it was flushed."""
    fake = types.SimpleNamespace(RawOutputStream=FakeStream)
    monkeypatch.setattr(devices, "sounddevice_module", lambda: fake)
    speaker = devices.DeviceSpeaker(16000)
    speaker.play(1, b"\x01\x00" * 400)
    speaker.play(2, b"\x02\x00" * 200)
    block = bytearray(640)
    speaker._fill(memoryview(block), 320, None, None)
    assert bytes(block) == b"\x01\x00" * 320
    speaker.flush(1)  # barge-in: 80 samples of turn 1 were still queued
    speaker.play(1, b"\x01\x00" * 100)  # late audio of the cancelled turn
    speaker._fill(memoryview(block), 320, None, None)
    assert bytes(block) == b"\x02\x00" * 200 + bytes(240)


def test_a_device_sound_survives_the_flush_of_a_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timer's chime queued behind a reply still plays when that reply is cut."""
    fake = types.SimpleNamespace(RawOutputStream=FakeStream)
    monkeypatch.setattr(devices, "sounddevice_module", lambda: fake)
    speaker = devices.DeviceSpeaker(16000)
    speaker.play(1, b"\x01\x00" * 400)
    speaker.sound(b"\x03\x00" * 100)
    speaker.flush(1)
    block = bytearray(640)
    speaker._fill(memoryview(block), 320, None, None)
    assert bytes(block) == b"\x03\x00" * 100 + bytes(440)


def test_wav_speaker_keeps_only_completed_turns(tmp_path: Path) -> None:
    path = tmp_path / "out.wav"
    speaker = devices.WavSpeaker(16000, path)
    speaker.play(1, b"\x01\x00" * 10)
    speaker.flush(1)
    speaker.play(1, b"\x01\x00" * 10)
    speaker.play(2, b"\x02\x00" * 10)
    speaker.keep(2)
    speaker.sound(b"\x03\x00" * 5)  # a timer rang after turn 2
    speaker.close()
    from clients.common import read_wav

    assert read_wav(path).samples.tolist() == [2] * 10 + [3] * 5


def run_client(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_car_cli_reports_an_unreachable_server(tmp_path: Path) -> None:
    wav = write_wav(tmp_path / "q.wav", np.zeros(1600, np.float32))
    run = run_client("clients.car", "--url", "ws://127.0.0.1:9/v1/voice", "--wav", str(wav))
    assert run.returncode == 1
    assert "cannot reach the server at ws://127.0.0.1:9/v1/voice" in run.stderr


def test_live_glasses_without_portaudio_say_what_to_install() -> None:
    if devices.sounddevice_module() is not None:
        pytest.skip("sounddevice and PortAudio are installed here")
    run = run_client("clients.glasses", "--url", "ws://127.0.0.1:9/v1/voice")
    assert run.returncode == 2
    assert "quicksilver[audio]" in run.stderr
