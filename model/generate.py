"""Greedy autoregressive decoding with a KV cache, on any :class:`StepBackend`.

The prompt is prefilled in one causal step; each further step feeds one token. The
same code drives the PyTorch model (:class:`model.nn.backend.TorchBackend`) and exported
models in ONNX Runtime (``model.runtime.OrtBackend``), so the two are compared on
exactly the same decoding loop. The stop flag is checked before every pass, so a
cancelled reply costs at most the pass already running.

This module imports no torch: the serving path uses it with ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Sequence

import numpy as np

from model.backend import Prefix, StepBackend, last_row
from model.engine import GenerationStats
from model.openings import Opening, completed_opening


def _never() -> bool:
    return False


def greedy(
    backend: StepBackend,
    prompt: Sequence[int],
    max_new_tokens: int,
    stop_ids: Collection[int],
    should_stop: Callable[[], bool] = _never,
    prefix: Prefix | None = None,
    avoid: Sequence[Opening] = (),
) -> Generator[int, None, GenerationStats]:
    """Yield reply token ids (stop tokens excluded); return what the reply cost.

    The reply needs ``len(prompt) + max_new_tokens`` positions of ``backend``'s cache.
    ``prefix``: a cache that already holds the first ``prefix.length`` prompt tokens
    (an earlier turn's, :class:`model.prefix.PrefixCache`): only the rest is prefilled,
    and the cache is left holding the prompt and the reply tokens fed, for the next turn.
    ``stopped_by`` is "end" on a stop token,
    "budget" after ``max_new_tokens`` tokens, "cancel" when ``should_stop()`` turned
    true. ``avoid``: token sequences the reply may not start with (:mod:`model.openings`).
    """
    n_tokens = passes = 0
    longest = max(map(len, avoid), default=0)
    said = np.zeros(0, dtype=np.int64)  # the reply's first tokens, while it may open badly
    if max_new_tokens <= 0:
        return GenerationStats(0, 0, "budget")
    cache = prefix.cache if prefix is not None else backend.new_cache()
    start = 0 if prefix is None else min(prefix.length, len(prompt) - 1)  # >= 1 new token
    backend.truncate(cache, start)
    x = np.asarray(prompt[start:], dtype=np.int64)  # (T,)
    while True:
        if should_stop():
            return GenerationStats(n_tokens, passes, "cancel")
        logits = backend.step(cache, x, "causal", commit=True, rows=last_row(x))  # (1, V)
        passes += 1
        if n_tokens < longest:  # the reply may still open as an earlier one did
            token = _choose(logits[-1], said, avoid)
            said = np.append(said, token)
        else:
            token = int(logits[-1].argmax())
        if token in stop_ids:
            return GenerationStats(n_tokens, passes, "end")
        n_tokens += 1
        yield token
        if n_tokens >= max_new_tokens:
            return GenerationStats(n_tokens, passes, "budget")
        x = np.array([token], dtype=np.int64)  # (1,)


def _choose(logits: np.ndarray, said: np.ndarray, avoid: Sequence[Opening]) -> int:
    """The greedy token, unless it would make the reply start with one of ``avoid``."""
    token, at = int(logits.argmax()), np.array([said.size])
    while completed_opening(np.append(said, 0), at, np.array([token]), avoid):
        logits = logits.copy()
        logits[token] = -np.inf
        token = int(logits.argmax())
    return token
