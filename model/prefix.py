"""KV caches of earlier turns, reused: a voice session's next prompt starts with its last
one, so a reply prefills only what was added since (the last reply and the new
question), never the earlier turns. Used by both reply engines."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from model.backend import Prefix, StepBackend


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


# A shared prefix shorter than this is prefilled rather than copied (a copy moves every
# layer's keys and values; a short prefill costs about one pass)
MIN_COPIED = 32


class PrefixCache:
    """KV caches of recent prompts, keyed by their token ids, least recently used out.

    :meth:`take` hands out the cache sharing the longest prefix with a new prompt (the
    same session's previous turn) and removes it, so no two replies ever share one. Where
    the prompt shares only a prefix with the cache it matches best (the system prompt
    and tools every session starts with, or the part before a barge-in's change), a
    backend that can copies that prefix into a new cache (``copy_prefix``) and leaves the
    cache to its conversation: a session's first turn prefills only its own words.
    Without copies, a prefix that several cached prompts share is not worth taking a
    session's cache for: that prompt starts from a fresh cache instead.
    """

    def __init__(self, backend: StepBackend, capacity: int) -> None:
        self.backend = backend
        self.capacity = capacity
        self._entries: OrderedDict[int, tuple[np.ndarray, Any]] = OrderedDict()
        self._next_key = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, prompt: Sequence[int]) -> Prefix:
        ids = np.asarray(prompt, dtype=np.int64)
        copy = getattr(self.backend, "copy_prefix", None)
        with self._lock:
            key, n = self._longest(ids)
            if key is None:
                return Prefix(self.backend.new_cache(), 0)
            toks, cache = self._entries[key]
            if copy is not None and n < toks.size and n >= MIN_COPIED:
                # another conversation's (the system prompt every session starts with):
                # its first n positions copied, the conversation's cache left to it
                return Prefix(copy(cache, n), n)
            if not self._shared(key, n):
                _, cache = self._entries.pop(key)
                return Prefix(cache, n)
        return Prefix(self.backend.new_cache(), 0)

    def put(self, prompt: Sequence[int], cache: Any) -> None:
        """Keep ``cache`` for ``prompt``: truncated to what it holds of the prompt."""
        n = min(len(prompt), self.backend.cache_length(cache))
        self.backend.truncate(cache, n)
        if n == 0 or self.capacity <= 0:
            return
        with self._lock:
            self._entries[self._next_key] = (np.asarray(prompt[:n], dtype=np.int64), cache)
            self._next_key += 1
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def evict_oldest(self) -> bool:
        """Forget the least recently kept cache (its memory is wanted by a live reply,
        ``model/batch.py``'s pool); False when none is kept."""
        with self._lock:
            if not self._entries:
                return False
            self._entries.popitem(last=False)
            return True

    def _longest(self, ids: np.ndarray) -> tuple[int | None, int]:
        best, n = None, 0
        for key, (toks, _) in self._entries.items():
            if (m := common_prefix(toks, ids)) > n:
                best, n = key, m
        return best, n

    def _shared(self, key: int, n: int) -> bool:
        """True when the first ``n`` tokens of entry ``key`` also start another entry,
        unless entry ``key`` is wholly a prefix of the new prompt (its own next turn)."""
        toks = self._entries[key][0]
        if n == toks.size:
            return False
        return any(
            common_prefix(other, toks) >= n for k, (other, _) in self._entries.items() if k != key
        )
