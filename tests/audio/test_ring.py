from __future__ import annotations

import numpy as np
import pytest

from audio.ring import AudioRing


def ramp(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.float32)


def test_slices_by_absolute_index_across_wraparound() -> None:
    ring = AudioRing(capacity=10)
    for k in range(0, 37, 3):  # chunks of 3 samples whose values are their indices
        ring.append(ramp(k, 3))
    assert ring.total_written == 39
    assert ring.start == 29
    np.testing.assert_array_equal(ring.slice(30, 37), ramp(30, 7))
    np.testing.assert_array_equal(ring.slice(29, 39), ramp(29, 10))  # all held, wraps
    np.testing.assert_array_equal(ring.slice(0, 31), ramp(29, 2))  # clipped to held
    np.testing.assert_array_equal(ring.slice(35), ramp(35, 4))  # open end
    assert len(ring.slice(38, 100)) == 1
    assert len(ring.slice(50, 60)) == 0
    assert len(ring.slice(33, 33)) == 0


def test_append_longer_than_capacity_keeps_the_newest() -> None:
    ring = AudioRing(capacity=8)
    ring.append(ramp(0, 5))
    ring.append(ramp(5, 20))
    assert ring.total_written == 25
    np.testing.assert_array_equal(ring.slice(0, 100), ramp(17, 8))


def test_slice_is_a_copy() -> None:
    ring = AudioRing(capacity=4)
    ring.append(ramp(0, 4))
    s = ring.slice(0, 4)
    ring.append(ramp(4, 4))
    np.testing.assert_array_equal(s, ramp(0, 4))


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        AudioRing(capacity=0)
    with pytest.raises(ValueError):
        AudioRing(4).append(np.zeros((2, 2), np.float32))
