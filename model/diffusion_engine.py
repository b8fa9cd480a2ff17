"""The diffusion reply engine ("diffusion"): conversation -> spoken reply, block by block.

A :class:`DiffusionGenerator` runs :func:`model.sampler.sample` on any StepBackend
(ONNX Runtime when serving, :mod:`model.assemble`; PyTorch in :mod:`model.nn.engines`).
It keeps the KV cache of recent conversations in a :class:`PrefixCache`, so the next
turn of a voice session prefills only what was added since (the last reply and the new
question), never the earlier turns. Only the causally prefilled prompt is kept: the
reply blocks in the cache were computed with block attention, while the next prompt
reads the reply causally, so a warm turn computes exactly what a cold one would.

This module imports no torch: :mod:`model.nn.engines` builds it on the PyTorch model.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model.backend import StepBackend
from model.chat import SPOKEN_SYSTEM_PROMPT, build_prompt
from model.engine import ChatMessage, GenerationStats
from model.sampler import DiffusionConfig, Prefix, SamplerSettings, sample
from model.tokenizer import Tokenizer, decoded


@dataclass(frozen=True)
class DiffusionOptions:
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    prompt_budget: int = 1024  # tokens of conversation kept (oldest turns dropped first)
    max_reply_tokens: int = 256  # with prompt_budget, sizes each KV cache
    system_prompt: str = SPOKEN_SYSTEM_PROMPT
    cache_sessions: int = 32  # conversations whose KV cache is kept (LRU)
    seed: int = 0  # each reply's sampler generator starts from it
    dtype: str = "float32"  # torch dtype of the default (PyTorch) model

    @property
    def cache_len(self) -> int:
        """Positions per KV cache: the prompt budget plus whole reply blocks."""
        blocks = self.sampler.blocks(self.max_reply_tokens)
        return self.prompt_budget + (blocks[-1][1] if blocks else 0)


def smollm2_diffusion_config(tokenizer: Tokenizer) -> DiffusionConfig:
    """SmolLM2 adapted to block diffusion (docs/diffusion.md): the mask is the extra
    embedding row (id = vocab size), a reply ends at <|im_end|> (or eos), block-causal
    attention, Dream's logit shift."""
    return DiffusionConfig(
        mask_id=tokenizer.vocab_size, end_ids=tokenizer.stop_ids, attention="block", shift=True
    )


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixCache:
    """KV caches of recent prompts, keyed by their token ids, least recently used out.

    :meth:`take` hands out the cache sharing the longest prefix with a new prompt (the
    same session's previous turn; after a barge-in or a revised transcript, the part
    before the change) and removes it, so no two replies ever share one. A prefix that
    several cached prompts share (the system prompt every session starts with) is not
    worth taking a session's cache for: that prompt starts from a fresh cache instead.
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
        with self._lock:
            key, n = self._longest(ids)
            if key is not None and not self._shared(key, n):
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


class DiffusionGenerator:
    """A :class:`model.engine.TextGenerator` running a diffusion sampler on a StepBackend."""

    def __init__(
        self,
        backend: StepBackend,
        tokenizer: Tokenizer,
        model: DiffusionConfig,
        options: DiffusionOptions,
        name: str = "diffusion",
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.model = model
        self.options = options
        self.name = name
        self.prefixes = PrefixCache(backend, options.cache_sessions)

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
    ) -> Generator[str, None, GenerationStats]:
        opts, tok = self.options, self.tokenizer
        prompt = build_prompt(tok, conversation, opts.prompt_budget, opts.system_prompt)
        max_tokens = self._room(len(prompt), max_tokens)
        rng = np.random.default_rng(opts.seed)
        cached = self.model.attention == "block"
        prefix = self.prefixes.take(prompt) if cached else None
        decoder = tok.stream_decoder()
        try:
            tokens = sample(
                self.backend, prompt, self.model, opts.sampler, rng, max_tokens, should_stop, prefix
            )
            stats = yield from decoded(tokens, decoder.push)
        finally:
            if prefix is not None:
                self.prefixes.put(prompt, prefix.cache)
        if stats.stopped_by != "cancel" and (rest := decoder.flush()):
            yield rest
        return stats

    def _room(self, prompt_len: int, max_tokens: int) -> int:
        """``max_tokens``, cut so that the prompt and the reply blocks fit in a cache."""
        room = self.backend.max_len - prompt_len
        fits = [hi for _, hi in self.options.sampler.blocks(max(max_tokens, 1)) if hi <= room]
        if not fits:
            first = self.options.sampler.blocks(1)[0][1]
            raise ValueError(
                f"prompt of {prompt_len} tokens leaves no room for a {first}-token block in a "
                f"{self.backend.max_len}-position cache"
            )
        return min(max_tokens, fits[-1])
