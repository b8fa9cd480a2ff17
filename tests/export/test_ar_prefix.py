"""The AR engine reuses the KV cache of a conversation's earlier turns (model/prefix.py):
a later turn prefills only what was added, and says exactly what a fresh engine says.
On the tiny exported model in ONNX Runtime (the served path) and its PyTorch twin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model.ar import ARGenerator, AROptions
from model.backend import StepBackend
from model.chat import build_prompt
from model.engine import ChatMessage, drain
from model.runtime import OrtBackend, RuntimeConfig
from tests.export.conftest import torch_backend
from tests.model.conftest import tiny_tokenizer


class Counting:
    """A StepBackend that counts the tokens each step feeds."""

    def __init__(self, inner: StepBackend) -> None:
        self.inner = inner
        self.name, self.vocab_size, self.max_len = inner.name, inner.vocab_size, inner.max_len
        self.fed: list[int] = []

    def new_cache(self) -> Any:
        return self.inner.new_cache()

    def cache_length(self, cache: Any) -> int:
        return self.inner.cache_length(cache)

    def truncate(self, cache: Any, length: int) -> None:
        self.inner.truncate(cache, length)

    def step(self, cache: Any, ids: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        self.fed.append(len(ids))
        return self.inner.step(cache, ids, *args, **kwargs)


def conversation(turns: int) -> list[list[ChatMessage]]:
    """The prompts of a growing conversation, as a session sends them."""
    history: list[ChatMessage] = []
    out = []
    for i in range(turns):
        history.append(ChatMessage("user", f"question {i}?"))
        out.append(list(history))
        history.append(ChatMessage("assistant", f"answer {i}."))
    return out


@pytest.mark.parametrize("runtime", ["onnx", "torch"])
def test_later_turns_prefill_only_what_was_added(runtime: str, tiny_dir: Path, tiny_ref) -> None:  # type: ignore[no-untyped-def]
    def backend() -> StepBackend:
        if runtime == "onnx":
            return OrtBackend(tiny_dir / "model.onnx", RuntimeConfig(device="cpu", max_len=512))
        return torch_backend(tiny_ref, max_len=512)

    tok = tiny_tokenizer()
    cached = Counting(backend())
    warm = ARGenerator(cached, tok, AROptions(prompt_budget=400, history_window=None))
    previous: list[int] = []
    for prompt in conversation(4):
        opts = AROptions(prompt_budget=400, cache_sessions=0, history_window=None)
        fresh = ARGenerator(backend(), tok, opts)
        first = len(cached.fed)
        pieces, stats = drain(warm.generate(prompt, 6, lambda: False))
        assert (pieces, stats) == drain(fresh.generate(prompt, 6, lambda: False))  # exact
        ids = build_prompt(tok, prompt, 400)
        # the prefill feeds at most what the prompt added since the last turn's prompt
        assert 1 <= cached.fed[first] <= len(ids) - len(previous)
        assert ids[: len(previous)] == previous
        previous = ids
