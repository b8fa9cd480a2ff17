"""Sample-rate conversion for streams, and PCM16 <-> float32 helpers.

Inside the server all audio is float32 mono at 16 kHz. Clients send PCM16 at their own
rate (8/16/24/48 kHz, also 22050/44100); Piper produces 22050 Hz and the client wants
its own rate back. :class:`StreamResampler` wraps ``soxr.ResampleStream`` so that a
stream can be converted chunk by chunk with filter state carried across chunks.

Quality: soxr's "HQ" holds back up to ~96 ms at 8 -> 16 kHz (long filter); "LQ" is
still 16-bit precision, linear phase, and holds back 1-25 ms (see docs/audio.md), which
is the latency that matters in a turn budget of 500 ms.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import soxr
from numpy.typing import NDArray

SAMPLE_RATE = 16_000  # the server's internal rate
CLIENT_RATES = (8_000, 16_000, 22_050, 24_000, 44_100, 48_000)

Quality = Literal["QQ", "LQ", "MQ", "HQ", "VHQ"]
Float32Array = NDArray[np.float32]
Int16Array = NDArray[np.int16]

_PCM16 = np.dtype("<i2")  # little-endian on the wire, whatever the host is
_SCALE = 32768.0


def pcm16_to_float32(data: bytes) -> Float32Array:
    """Little-endian signed 16-bit PCM bytes -> float32 in [-1, 1)."""
    if len(data) % 2:
        raise ValueError(f"PCM16 data must have an even number of bytes, got {len(data)}")
    return int16_to_float32(np.frombuffer(data, dtype=_PCM16))


def float32_to_pcm16(samples: NDArray[np.floating]) -> bytes:
    """float32 in [-1, 1] -> little-endian PCM16 bytes (clipped)."""
    return float32_to_int16(samples).astype(_PCM16, copy=False).tobytes()


def int16_to_float32(samples: NDArray[np.integer]) -> Float32Array:
    return (samples.astype(np.float32) / _SCALE).astype(np.float32, copy=False)


def float32_to_int16(samples: NDArray[np.floating]) -> Int16Array:
    scaled = np.clip(np.asarray(samples, dtype=np.float32) * _SCALE, -32768.0, 32767.0)
    out: Int16Array = np.round(scaled).astype(np.int16)
    return out


class StreamResampler:
    """Chunk-by-chunk resampler of one mono float32 stream (one per stream, not shared).

    ``process`` returns whatever output is ready (possibly empty: the filter holds back
    ``delay_samples`` of output); ``flush`` returns the held-back tail at the end of the
    stream and makes the resampler ready for a new stream.
    """

    def __init__(self, in_rate: int, out_rate: int = SAMPLE_RATE, quality: Quality = "LQ"):
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self.quality: Quality = quality
        self._stream: soxr.ResampleStream | None = None
        if in_rate != out_rate:
            self._stream = soxr.ResampleStream(
                in_rate, out_rate, 1, dtype="float32", quality=quality
            )

    @property
    def passthrough(self) -> bool:
        return self._stream is None

    def process(self, samples: NDArray[np.floating]) -> Float32Array:
        x = np.ascontiguousarray(samples, dtype=np.float32)
        if x.ndim != 1:
            raise ValueError(f"expected mono 1-D samples, got shape {x.shape}")
        if self._stream is None:
            return x
        out: Float32Array = self._stream.resample_chunk(x)
        return out

    def flush(self) -> Float32Array:
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        out: Float32Array = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self._stream.clear()
        return out

    def delay_samples(self) -> float:
        """Output samples currently held back by the filter."""
        return 0.0 if self._stream is None else float(self._stream.delay())


def resample(samples: NDArray[np.floating], in_rate: int, out_rate: int) -> Float32Array:
    """Whole-buffer conversion (tests, offline use): best quality, no streaming."""
    x = np.ascontiguousarray(samples, dtype=np.float32)
    if in_rate == out_rate:
        return x
    out: Float32Array = soxr.resample(x, in_rate, out_rate, quality="HQ").astype(np.float32)
    return out
