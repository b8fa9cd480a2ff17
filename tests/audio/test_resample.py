from __future__ import annotations

import numpy as np
import pytest

from audio.resample import (
    CLIENT_RATES,
    StreamResampler,
    float32_to_pcm16,
    pcm16_to_float32,
    resample,
)


def tone(freq: float, rate: int, seconds: float) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_pcm16_round_trip_is_little_endian_and_clipped() -> None:
    assert float32_to_pcm16(np.array([0.0, 1.0, -1.0, 2.0], np.float32)) == (
        b"\x00\x00\xff\x7f\x00\x80\xff\x7f"
    )
    x = pcm16_to_float32(b"\x00\x40\x00\xc0")
    np.testing.assert_array_equal(x, np.array([0.5, -0.5], np.float32))
    assert x.dtype == np.float32
    samples = np.linspace(-1, 1, 101, dtype=np.float32)
    back = pcm16_to_float32(float32_to_pcm16(samples))
    assert np.max(np.abs(back - samples)) < 1 / 32768 + 1e-7
    with pytest.raises(ValueError):
        pcm16_to_float32(b"\x00")


@pytest.mark.parametrize("rate", CLIENT_RATES)
def test_stream_to_16k_in_odd_chunks_matches_length_and_content(rate: int) -> None:
    x = tone(440.0, rate, 1.0)
    rs = StreamResampler(rate, 16_000)
    rng = np.random.default_rng(rate)
    pieces, pos = [], 0
    while pos < len(x):
        n = int(rng.integers(1, 997))
        pieces.append(rs.process(x[pos : pos + n]))
        pos += n
    pieces.append(rs.flush())
    y = np.concatenate(pieces)
    assert abs(len(y) - 16_000) <= 2
    ref = tone(440.0, 16_000, 1.0)
    n = min(len(y), len(ref)) - 200  # edges see the filter's start-up
    np.testing.assert_allclose(y[100:n], ref[100:n], atol=0.02)
    assert StreamResampler(rate, 16_000).passthrough is (rate == 16_000)


def test_piper_rate_to_client_rate_and_reuse_after_flush() -> None:
    rs = StreamResampler(22_050, 48_000)
    for _ in range(2):  # one reply, flush, then the next reply on the same object
        out = np.concatenate([rs.process(tone(300.0, 22_050, 0.5)), rs.flush()])
        assert abs(len(out) - 24_000) <= 2
        assert 0.45 < np.max(np.abs(out)) < 0.55


def test_whole_buffer_resample() -> None:
    assert len(resample(tone(200.0, 22_050, 1.0), 22_050, 16_000)) == 16_000
