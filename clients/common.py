"""Pieces every Python client shares: WAV files, paced streaming, event collection."""

from __future__ import annotations

import asyncio
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from server import protocol as p

FRAME_MS = 20  # client capture frame, as a microphone driver would deliver it


@dataclass(frozen=True)
class Pcm:
    """Mono PCM16 audio."""

    samples: NDArray[np.int16]
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


def read_wav(path: Path) -> Pcm:
    """A 16-bit WAV as mono; other rates are resampled to 16 kHz."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: need 16-bit PCM, got {8 * w.getsampwidth()}-bit")
        rate, channels = w.getframerate(), w.getnchannels()
        data = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    if channels > 1:
        data = data.reshape(-1, channels).mean(axis=1).astype(np.int16)
    if rate not in p.INPUT_SAMPLE_RATES:
        from audio.resample import float32_to_int16, int16_to_float32, resample

        data, rate = float32_to_int16(resample(int16_to_float32(data), rate, 16000)), 16000
    return Pcm(data.astype(np.int16), rate)


def write_wav(path: Path, pcm: bytes, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)


def frames(pcm: Pcm, frame_ms: int = FRAME_MS) -> list[bytes]:
    step = pcm.rate * frame_ms // 1000
    data = pcm.samples.astype("<i2")
    return [data[i : i + step].tobytes() for i in range(0, len(data), step)]


def silence(rate: int, seconds: float) -> Pcm:
    return Pcm(np.zeros(int(rate * seconds), np.int16), rate)


class Pacer:
    """Sends at real time: frame k goes out at t0 + k * frame duration."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.sent_s = 0.0

    async def wait(self, seconds: float) -> None:
        delay = self.t0 + self.sent_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        self.sent_s += seconds


@dataclass
class TurnAudio:
    """Reply audio received per turn; cancelled turns' audio is dropped."""

    chunks: dict[int, list[bytes]] = field(default_factory=dict)
    cancelled: set[int] = field(default_factory=set)
    first_audio_at: dict[int, float] = field(default_factory=dict)

    def add(self, frame: bytes) -> int:
        turn_id, _seq, pcm = p.unpack_audio(frame)
        if turn_id not in self.cancelled:
            self.chunks.setdefault(turn_id, []).append(pcm)
            self.first_audio_at.setdefault(turn_id, time.monotonic())
        return turn_id

    def cancel(self, turn_id: int) -> None:
        self.cancelled.add(turn_id)
        self.chunks.pop(turn_id, None)

    def pcm(self, turn_id: int) -> bytes:
        return b"".join(self.chunks.get(turn_id, []))
