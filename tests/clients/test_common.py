"""Client building blocks without a server: ground truth, percentiles, backoff, playback,
the open microphone."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from audio.speech import write_wav
from clients import devices, harness
from clients.common import Microphone, Pcm, backoff, frames, speech_bounds
from clients.harness import Utterance, percentiles, playback_stall_ms
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


def test_playback_stalls_count_only_the_silence_a_player_waits_for() -> None:
    rate = 1000  # 100 samples: 0.1 s of audio
    ahead = [(0.0, 100), (0.05, 100), (0.1, 100), (0.12, 100)]  # faster than real time
    assert playback_stall_ms(ahead, rate) == 0.0
    # the third frame is due at 0.2 s and comes at 0.5 s; the fourth, there already,
    # is due when the third has played: one gap of 300 ms
    late = [(0.0, 100), (0.05, 100), (0.5, 100), (0.51, 100)]
    assert playback_stall_ms(late, rate) == pytest.approx(300.0)
    # two gaps add up; a player that caught up does not make up for one
    twice = [(0.0, 100), (0.3, 100), (0.35, 100), (1.0, 100)]
    assert playback_stall_ms(twice, rate) == pytest.approx(200.0 + 500.0)
    assert playback_stall_ms([], rate) == 0.0


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


async def test_the_microphone_sends_silence_then_the_utterance_paced_and_stamped() -> None:
    received: list[bytes] = []
    heard = asyncio.Event()

    async def record(ws: ServerConnection) -> None:
        async for frame in ws:
            assert isinstance(frame, bytes)
            received.append(frame)
            heard.set()

    speech = Pcm(np.arange(1, 8 * 320 + 1, dtype=np.int16), 16000)  # 8 frames, no zeros
    async with serve(record, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as ws:
            mic = Microphone(ws, 16000)
            await asyncio.wait_for(heard.wait(), 10)  # open: silence while nothing is said
            playback = mic.play(speech, marks=(0, 5))
            finished = await asyncio.wait_for(playback.finished, 10)
            await mic.close()
    started, sent = playback.started.result(), {i: f.result() for i, f in playback.sent.items()}
    # paced, never early: frame k goes out no sooner than 20 ms * k after the first was
    # due (the event loop's timers may fire within its clock resolution of that)
    assert started <= sent[0] and started + 5 * 0.02 - 0.001 <= sent[5] <= finished
    first = received.index(frames(speech)[0])
    assert first > 0 and not any(np.frombuffer(b"".join(received[:first]), np.int16))
    assert received[first : first + 8] == frames(speech)


def test_the_harness_refuses_plot_without_matplotlib_and_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without it sees
    wav = write_wav(tmp_path / "q.wav", np.zeros(1600, np.float32))
    report = tmp_path / "report.json"
    args = ["--url", "ws://127.0.0.1:9/v1/voice", "--wav", str(wav), "--json", str(report)]
    with pytest.raises(SystemExit) as exited:
        harness.main([*args, "--plot", str(tmp_path / "report.png")])
    assert exited.value.code == 2
    assert "--plot needs matplotlib: pip install -e '.[plot]'" in capsys.readouterr().err
    assert not report.exists()  # refused before the run, not after it
