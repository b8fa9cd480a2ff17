"""G.711 mu-law and A-law against the values of the standard's tables, and round trips."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

from audio import g711

ALL_PCM = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = bytes(range(256))


def test_mu_law_known_values() -> None:
    # G.711 table 2a: code 0xFF (all bits inverted: 0x00) is zero; 0x80 / 0x00 the
    # largest positive / negative level, 8031 in 14-bit units (32124 in 16-bit ones).
    assert g711.ulaw_encode(np.array([0, 32767, -32768])) == bytes([0xFF, 0x80, 0x00])
    np.testing.assert_array_equal(
        g711.ulaw_decode(bytes([0xFF, 0x7F, 0x80, 0x00])), [0, 0, 32124, -32124]
    )
    # the first step of the first segment: 1 in 14 bits, 4 in 16
    np.testing.assert_array_equal(g711.ulaw_decode(bytes([0xFE, 0x7E])), [8, -8])


def test_a_law_known_values() -> None:
    # G.711 table 1a: 0xD5 / 0x55 are the smallest positive / negative levels (1 in
    # 13-bit units: 8 in 16-bit ones), 0xAA / 0x2A the largest (4032: 32256).
    assert g711.alaw_encode(np.array([0, -1, 32767, -32768])) == bytes([0xD5, 0x55, 0xAA, 0x2A])
    np.testing.assert_array_equal(
        g711.alaw_decode(bytes([0xD5, 0x55, 0xAA, 0x2A])), [8, -8, 32256, -32256]
    )


@pytest.mark.parametrize(
    ("encode", "decode"),
    [(g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)],
)
def test_every_code_survives_a_round_trip(encode, decode) -> None:  # type: ignore[no-untyped-def]
    levels = decode(ALL_CODES)
    again = encode(levels)
    if encode is g711.ulaw_encode:  # negative zero (0x7F) decodes to 0, which is 0xFF
        assert again == ALL_CODES.replace(b"\x7f", b"\xff")
    else:
        assert again == ALL_CODES
    np.testing.assert_array_equal(decode(again), levels)


@pytest.mark.parametrize(
    ("encode", "decode"),
    [(g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)],
)
def test_error_is_half_a_step_of_the_segment(encode, decode) -> None:  # type: ignore[no-untyped-def]
    back = decode(encode(ALL_PCM)).astype(np.int64)
    x = ALL_PCM.astype(np.int64)
    error = np.abs(back - x)
    # The step doubles with each segment, each segment twice as wide: half a step is at
    # most 1/32 of the level (plus the first segment's fixed step), ~30 dB SNR.
    assert np.all(error <= np.abs(x) / 32 + 16)
    # and the codes are monotonic: a louder sample never decodes quieter
    assert np.all(np.diff(back) >= 0)


def test_agrees_with_cpythons_audioop_where_it_exists() -> None:
    """CPython's audioop (removed in 3.13) is an independent implementation: A-law and
    both decoders agree exactly; mu-law encoding of negative samples differs at a few
    decision levels (audioop shifts to 14 bits before taking the magnitude, rounding
    negative samples towards larger magnitudes), so only non-negative ones compare."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            audioop = importlib.import_module("audioop")
        except ImportError:
            pytest.skip("audioop is gone from this Python (3.13+)")
    pcm = ALL_PCM.tobytes()
    assert g711.alaw_encode(ALL_PCM) == audioop.lin2alaw(pcm, 2)
    assert g711.alaw_decode(ALL_CODES).tobytes() == audioop.alaw2lin(ALL_CODES, 2)
    assert g711.ulaw_decode(ALL_CODES).tobytes() == audioop.ulaw2lin(ALL_CODES, 2)
    positive = ALL_PCM[ALL_PCM >= 0]
    assert g711.ulaw_encode(positive) == audioop.lin2ulaw(positive.tobytes(), 2)
