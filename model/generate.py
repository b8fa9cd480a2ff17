"""Greedy autoregressive decoding with a KV cache.

The prompt is prefilled in one forward pass; each further pass feeds one token. The
stop flag is checked before every pass, so a cancelled reply costs at most the pass
already running.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Sequence

import torch

from model.engine import GenerationStats
from model.llama import Llama


def _never() -> bool:
    return False


def greedy(
    model: Llama,
    prompt: Sequence[int],
    max_new_tokens: int,
    stop_ids: Collection[int],
    should_stop: Callable[[], bool] = _never,
) -> Generator[int, None, GenerationStats]:
    """Yield reply token ids (stop tokens excluded); return what the reply cost.

    ``stopped_by`` is "end" on a stop token, "budget" after ``max_new_tokens`` tokens,
    "cancel" when ``should_stop()`` turned true.
    """
    n_tokens = passes = 0
    if max_new_tokens <= 0:
        return GenerationStats(0, 0, "budget")
    with torch.inference_mode():
        cache = model.new_cache(1, len(prompt) + max_new_tokens)
    x = torch.tensor([list(prompt)], dtype=torch.long)  # (1, T)
    while True:
        if should_stop():
            return GenerationStats(n_tokens, passes, "cancel")
        # Scoped per pass, not across the yield: inference mode is thread-local state
        # and must not leak into the consumer's code between tokens.
        with torch.inference_mode():
            logits = model(x, cache=cache, last_only=True)  # (1, 1, V)
        passes += 1
        token = int(logits[0, -1].argmax())
        if token in stop_ids:
            return GenerationStats(n_tokens, passes, "end")
        n_tokens += 1
        yield token
        if n_tokens >= max_new_tokens:
            return GenerationStats(n_tokens, passes, "budget")
        x = torch.tensor([[token]], dtype=torch.long)  # (1, 1)
