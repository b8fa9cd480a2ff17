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

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import numpy as np

from model.backend import StepBackend
from model.chat import SPOKEN_SYSTEM_PROMPT, build_prompt
from model.engine import ChatMessage, GenerationStats
from model.openings import reply_openings
from model.prefix import PrefixCache
from model.sampler import DiffusionConfig, SamplerSettings, sample
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
    # Earlier messages in the prompt (None: what the prompt budget holds; model/chat.py)
    # and the tokens of an earlier reply's opening (or the user's words) a reply may not
    # repeat (0: off; model/openings.py). Inside 20-turn sessions of their own replies
    # the two keep both engines from copying themselves (docs/training.md, "Conversations")
    history_window: int | None = 4
    opening_ban: int = 4

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
        prompt = build_prompt(
            tok, conversation, opts.prompt_budget, opts.system_prompt, opts.history_window
        )
        avoid = reply_openings(tok, conversation, opts.opening_ban)
        max_tokens = self._room(len(prompt), max_tokens)
        rng = np.random.default_rng(opts.seed)
        cached = self.model.attention == "block"
        prefix = self.prefixes.take(prompt) if cached else None
        decoder = tok.stream_decoder()
        try:
            args = (prompt, self.model, opts.sampler, rng, max_tokens, should_stop, prefix)
            tokens = sample(self.backend, *args, avoid=avoid)
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
