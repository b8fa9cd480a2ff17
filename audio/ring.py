"""A fixed-capacity ring of the session's 16 kHz samples, addressed by absolute index.

Sample ``k`` is the k-th sample received since the session started, the same numbering
the VAD frames and endpoint events use. Only the last ``capacity`` samples are held.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

SAMPLE_RATE = 16_000

Float32Array = NDArray[np.float32]


class AudioRing:
    def __init__(self, capacity: int = 40 * SAMPLE_RATE):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._buf = np.zeros(capacity, dtype=np.float32)
        self.total_written = 0  # absolute index of the next sample

    @property
    def start(self) -> int:
        """Absolute index of the oldest sample still held."""
        return max(0, self.total_written - self.capacity)

    def append(self, samples: NDArray[np.floating]) -> None:
        x = np.asarray(samples, dtype=np.float32)
        if x.ndim != 1:
            raise ValueError(f"expected mono 1-D samples, got shape {x.shape}")
        if len(x) >= self.capacity:  # only the newest `capacity` samples survive
            self.total_written += len(x) - self.capacity
            x = x[-self.capacity :]
        pos = self.total_written % self.capacity
        first = min(len(x), self.capacity - pos)
        self._buf[pos : pos + first] = x[:first]
        self._buf[: len(x) - first] = x[first:]
        self.total_written += len(x)

    def slice(self, start_abs: int, end_abs: int | None = None) -> Float32Array:
        """Copy of samples [start_abs, end_abs), clipped to what is still held."""
        end = self.total_written if end_abs is None else min(end_abs, self.total_written)
        start = max(start_abs, self.start)
        if end <= start:
            return np.zeros(0, dtype=np.float32)
        n, a = end - start, start % self.capacity
        if a + n <= self.capacity:
            return self._buf[a : a + n].copy()
        return np.concatenate([self._buf[a:], self._buf[: a + n - self.capacity]])
