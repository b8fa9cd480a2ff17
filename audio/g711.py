"""G.711 companding (ITU-T Rec. G.711, 1988): mu-law and A-law, 8 bits a sample.

Telephony speaks 8 kHz G.711 (OpenAI Realtime's ``audio/pcmu`` and ``audio/pcma``).
Both laws code a sample as a sign, a 3-bit segment (the power of two its magnitude
falls in) and a 4-bit step within the segment, so the quantisation step grows with
the level: 14-bit (mu-law) or 13-bit (A-law) resolution near zero, 8 bits on the wire.

- mu-law (G.711 table 2a): the magnitude plus a bias of 33 (in 14-bit units; 132 in
  16-bit ones) picks the segment; every bit of the code is inverted on the wire.
- A-law (G.711 table 1a): the 13-bit magnitude's segment, with the first two segments
  sharing one step; the sign bit is 1 for positive samples and the even bits are
  inverted on the wire (xor 0x55).

Decoding gives each code's decision-interval midpoint, as the tables do (scaled to
16-bit PCM), so decoding then encoding gives back every code (but mu-law's negative
zero, 0x7F, which decodes to 0 like 0xFF).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Int16Array = NDArray[np.int16]

_MU_BIAS = 132  # 33 in G.711's 14-bit units, shifted to 16 bits
_MU_CLIP = 32635  # 32767 less the bias: the largest magnitude mu-law codes
_A_XOR = 0x55  # A-law inverts the even bits on the wire
_POWERS = np.array([1, 2, 4, 8, 16, 32, 64, 128])


def _segment(scaled: NDArray[np.int32]) -> NDArray[np.intp]:
    """The number of bits in ``scaled`` (0-127): 0 for 0, 1 for 1, 2 for 2-3, ..."""
    return np.searchsorted(_POWERS, scaled, side="right")


def ulaw_encode(pcm: NDArray[np.integer]) -> bytes:
    """PCM16 samples -> mu-law bytes."""
    x = pcm.astype(np.int32)
    sign = np.where(x < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(x), _MU_CLIP) + _MU_BIAS  # 132 .. 32767
    exponent = np.maximum(_segment(magnitude >> 7) - 1, 0)  # 0 .. 7
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    code = ~(sign | (exponent << 4) | mantissa) & 0xFF
    return bytes(code.astype(np.uint8))


def _ulaw_table() -> Int16Array:
    code = ~np.arange(256) & 0xFF
    exponent = (code >> 4) & 0x07
    magnitude = (((code & 0x0F) << 3) + _MU_BIAS << exponent) - _MU_BIAS
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> Int16Array:
    code = np.arange(256) ^ _A_XOR
    segment = (code >> 4) & 0x07
    step = ((code & 0x0F) << 4) + 8  # the midpoint of the step, in 16-bit units
    magnitude = np.where(segment == 0, step, (step + 0x100) << np.maximum(segment - 1, 0))
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)


_ULAW = _ulaw_table()
_ALAW = _alaw_table()


def ulaw_decode(data: bytes) -> Int16Array:
    """mu-law bytes -> PCM16 samples."""
    return _ULAW[np.frombuffer(data, np.uint8)]


def alaw_encode(pcm: NDArray[np.integer]) -> bytes:
    """PCM16 samples -> A-law bytes."""
    x = pcm.astype(np.int32)
    positive = x >= 0
    magnitude = np.where(positive, x, -x - 1) >> 3  # 13 bits: 0 .. 4095
    segment = np.maximum(_segment(magnitude >> 4), 1) - 1  # 0 .. 7
    step = np.where(segment == 0, magnitude >> 1, magnitude >> segment) & 0x0F
    code = np.where(positive, 0x80, 0) | (segment << 4) | step
    return bytes((code ^ _A_XOR).astype(np.uint8))


def alaw_decode(data: bytes) -> Int16Array:
    """A-law bytes -> PCM16 samples."""
    return _ALAW[np.frombuffer(data, np.uint8)]
