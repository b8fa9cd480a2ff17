"""KV caches of earlier turns, reused: a voice session's next prompt starts with its last
one, so a reply prefills only what was added since (the last reply and the new
question), never the earlier turns. Used by both reply engines."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from model.backend import Prefix, StepBackend
from model.chat import first_message_length, next_prompt_start
from model.engine import ChatMessage
from model.tokenizer import Tokenizer


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


# A shared prefix shorter than this is prefilled rather than copied (a copy moves every
# layer's keys and values; a short prefill costs about one pass)
MIN_COPIED = 32
# Shared prompt heads kept apart from the conversations (system prompts with and
# without tools, a client's own instructions)
HEADS = 4
SEEN = 64  # first messages remembered (as hashes) until they come again


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

    The prompt's first message (the system prompt and tools, which the engine names at
    :meth:`put`), once a second conversation has started with it, is also kept apart as
    a *head* (at most ``heads``, least recently used out) that no reply ever writes to:
    it outlives the conversations it came from, so a new session's first turn does not
    prefill it again when the conversations have been let go (many sessions starting at
    once, or memory wanted by live replies).
    """

    def __init__(self, backend: StepBackend, capacity: int, heads: int = HEADS) -> None:
        self.backend = backend
        self.capacity = capacity
        # a backend that copies a cache's first positions into a new one, or None
        self._copy: Callable[[Any, int], Any] | None = getattr(backend, "copy_prefix", None)
        self.max_heads = heads if self._copy is not None else 0
        self._entries: OrderedDict[int, tuple[np.ndarray, Any]] = OrderedDict()
        self._heads: OrderedDict[int, tuple[np.ndarray, Any]] = OrderedDict()
        self._seen: OrderedDict[int, None] = OrderedDict()  # first messages put once
        self._next_key = 0
        # re-entrant: a copy made under it may ask the pool for memory, and the pool
        # lets kept caches go (evict_oldest) in the same thread
        self._lock = threading.RLock()

    def __len__(self) -> int:
        """Conversations kept (heads not counted)."""
        return len(self._entries)

    @property
    def heads(self) -> int:
        return len(self._heads)

    def take(self, prompt: Sequence[int]) -> Prefix:
        ids = np.asarray(prompt, dtype=np.int64)
        copy = self._copy
        with self._lock:
            key, n = self._longest(self._entries, ids)
            head, h = self._longest(self._heads, ids)
            whole = key is not None and n == self._entries[key][0].size
            if whole and n >= h:  # this conversation's next turn: its own cache
                _, cache = self._entries.pop(key)  # type: ignore[arg-type]
                return Prefix(cache, n)
            if copy is not None and max(n, h) >= MIN_COPIED:
                if h >= n:  # a head: copied, kept
                    self._heads.move_to_end(head)  # type: ignore[arg-type]
                    return Prefix(copy(self._heads[head][1], h), h)  # type: ignore[index]
                # another conversation's (the system prompt every session starts with):
                # its first n positions copied, the conversation's cache left to it
                return Prefix(copy(self._entries[key][1], n), n)  # type: ignore[index]
            if key is not None and not self._shared(key, n):
                _, cache = self._entries.pop(key)
                return Prefix(cache, n)
        return Prefix(self.backend.new_cache(), 0)

    def put(self, prompt: Sequence[int], cache: Any, head: int = 0) -> None:
        """Keep ``cache`` for ``prompt``: truncated to what it holds of the prompt. Its
        first ``head`` positions (the prompt's first message: the system prompt and
        tools, :func:`model.chat.first_message_length`) are also kept as a head, unless
        a head holds them already or they are too short to copy."""
        n = min(len(prompt), self.backend.cache_length(cache))
        self.backend.truncate(cache, n)
        if n == 0 or self.capacity <= 0:
            return
        with self._lock:
            if MIN_COPIED <= head <= n:
                self._pin(np.asarray(prompt[:head], dtype=np.int64), cache)
            self._entries[self._next_key] = (np.asarray(prompt[:n], dtype=np.int64), cache)
            self._next_key += 1
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def prime(self, head: Sequence[int]) -> bool:
        """Prefill ``head`` (a prompt's first message) and keep it as a head now, not
        from its second conversation on: the sessions a server's first minute brings
        all at once (a restart, a fleet's failover) would each prefill it otherwise, ~140
        tokens of the default tools prompt in 128-token passes every other reply waits
        behind. False where heads are not kept (no copies), it is too short to copy or
        the cache pool has no room for it."""
        toks = np.asarray(head, dtype=np.int64)
        if self._copy is None or self.max_heads <= 0 or toks.size < MIN_COPIED:
            return False
        with self._lock:
            if self._held(toks):
                return True
        cache = self.backend.new_cache()
        try:
            self.backend.step(cache, toks, "causal", commit=True, rows=np.array([toks.size - 1]))
        except RuntimeError:  # no room in the cache pool (model.batch.PoolFullError)
            return False
        with self._lock:
            self._seen[hash(toks.tobytes())] = None
            self._keep_head(toks, cache)
        return True

    def evict_oldest(self) -> bool:
        """Forget the least recently kept cache (its memory is wanted by a live reply,
        ``model/batch.py``'s pool): a conversation's, then, when none is left, a head's;
        False when nothing is kept."""
        with self._lock:
            return _drop_oldest(self._entries) or _drop_oldest(self._heads)

    def forget_conversation(self) -> bool:
        """Forget the least recently kept conversation (heads stay); False when none
        is kept. ``quicksilver bench replies`` makes every reply a new session's so."""
        with self._lock:
            return _drop_oldest(self._entries)

    def _pin(self, toks: np.ndarray, source: Any) -> None:
        """Keep a copy of ``source``'s first ``len(toks)`` positions as a head (the
        most recently used when one holds them already)."""
        if self._copy is None or self.max_heads <= 0 or self._held(toks):
            return
        # kept from its second conversation on: a client's one-off instructions (a
        # Realtime session's own) never push the shared system prompts out
        seen = hash(toks.tobytes())
        if seen not in self._seen:
            self._seen[seen] = None
            while len(self._seen) > SEEN:
                self._seen.popitem(last=False)
            return
        try:
            copy = self._copy(source, toks.size)
        except RuntimeError:  # no room in the pool (model.batch.PoolFullError): not kept
            return
        self._keep_head(toks, copy)

    def _held(self, toks: np.ndarray) -> bool:
        """Whether a head holds ``toks`` (it is then the most recently used)."""
        for key, (held, _) in self._heads.items():
            if np.array_equal(held, toks):
                self._heads.move_to_end(key)
                return True
        return False

    def _keep_head(self, toks: np.ndarray, cache: Any) -> None:
        """Keep ``cache`` as the head of ``toks``, the least recently used out past
        ``max_heads``."""
        self._heads[self._next_key] = (toks, cache)
        self._next_key += 1
        while len(self._heads) > self.max_heads:
            self._heads.popitem(last=False)

    @staticmethod
    def _longest(
        kept: OrderedDict[int, tuple[np.ndarray, Any]], ids: np.ndarray
    ) -> tuple[int | None, int]:
        best, n = None, 0
        for key, (toks, _) in kept.items():  # oldest first: a tie goes to the newest
            if (m := common_prefix(toks, ids)) >= n and m:
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


# Tokens a pass while a conversation's next prompt is prefilled between turns: a reply
# that asks meanwhile waits for at most one such pass (model/batch.py runs them alone)
WARM_CHUNK = 32


def warm(
    prefixes: PrefixCache,
    backend: StepBackend,
    tok: Tokenizer,
    conversation: Sequence[ChatMessage],
    budget: int,
    system_prompt: str,
    window: int | None,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Prefill what the prompt of ``conversation``'s next turn starts with
    (:func:`model.chat.next_prompt_start`, with the engine's ``budget``,
    ``system_prompt`` and history ``window``) into the kept cache that holds most of it,
    and keep it: the next turn then prefills only its new words, where it would prefill
    the last reply too, or after the history's start moved, the whole history. Causal,
    in passes of :data:`WARM_CHUNK`: the cache holds what the next turn's own prefill
    would have written. Stops between passes once ``should_stop``, keeping what it
    wrote. Returns the tokens prefilled."""
    start = next_prompt_start(tok, conversation, budget, system_prompt, window)
    toks = np.asarray(start, dtype=np.int64)
    if toks.size == 0:
        return 0
    prefix = prefixes.take(start)
    cache, done = prefix.cache, min(prefix.length, toks.size)
    backend.truncate(cache, done)
    try:
        for lo in range(done, toks.size, WARM_CHUNK):
            if should_stop():
                break
            chunk = toks[lo : lo + WARM_CHUNK]
            backend.step(cache, chunk, "causal", commit=True, rows=np.array([chunk.size - 1]))
    finally:
        prefixes.put(start, cache, first_message_length(tok, start))
    return backend.cache_length(cache) - done


def _drop_oldest(kept: OrderedDict[int, Any]) -> bool:
    """Drop the least recently used of ``kept``; False when it is empty."""
    if not kept:
        return False
    kept.popitem(last=False)
    return True
