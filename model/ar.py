"""The autoregressive baseline reply engine: SmolLM2-135M-Instruct, greedy, streamed.

This is the engine the diffusion reply model must beat (DESIGN.md). It holds only
read-only state (weights, tokenizer, options); every call builds its own KV cache and
decoder, so concurrent calls from several worker threads never share mutable state.

:class:`ARGenerator` decodes on any :class:`model.backend.StepBackend`: the PyTorch
Llama here ("smollm2-ar"), or an exported model in ONNX Runtime ("smollm2-ar-onnx",
``export/engine.py``). This module imports torch only inside the loaders below, so the
ONNX engine reuses it without torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model.chat import SPOKEN_SYSTEM_PROMPT, build_prompt
from model.engine import ChatMessage, GenerationStats
from model.generate import greedy
from model.tokenizer import Tokenizer

if TYPE_CHECKING:
    from model.gguf import GGUFFile


@dataclass(frozen=True)
class AROptions:
    # fp32: bf16 decodes ~1.3x faster on this CPU (AMX) but its greedy replies drift
    # from fp32's on some prompts (tests/model/bench_ar.py); opt in where speed wins.
    dtype: str = "float32"  # a torch dtype name; the PyTorch engine only
    prompt_budget: int = 1024  # tokens of conversation kept (oldest turns dropped first)
    system_prompt: str = SPOKEN_SYSTEM_PROMPT


class ARGenerator:
    """A :class:`model.engine.TextGenerator` running greedy decoding on a Llama."""

    def __init__(
        self, model: Any, tokenizer: Tokenizer, options: AROptions, name: str = "smollm2-ar"
    ) -> None:
        self.model = model  # a StepBackend, or a PyTorch Llama (see model.generate.greedy)
        self.tokenizer = tokenizer
        self.options = options
        self.name = name

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
    ) -> Generator[str, None, GenerationStats]:
        tok = self.tokenizer
        prompt = build_prompt(
            tok, conversation, self.options.prompt_budget, self.options.system_prompt
        )
        decoder = tok.stream_decoder()
        tokens = greedy(self.model, prompt, max_tokens, tok.stop_ids, should_stop)
        stats = yield from decoded(tokens, decoder.push)
        if stats.stopped_by != "cancel" and (rest := decoder.flush()):
            yield rest
        return stats


def decoded(
    tokens: Generator[int, None, GenerationStats], push: Callable[[int], str]
) -> Generator[str, None, GenerationStats]:
    """Text pieces for token ids, skipping the empty ones (partial UTF-8, specials).

    Shared by every engine that decodes a token stream (AR here, diffusion in
    model/diffusion_engine.py); returns the token stream's stats.
    """
    while True:
        try:
            token = next(tokens)
        except StopIteration as done:
            stats: GenerationStats = done.value
            return stats
        if piece := push(token):
            yield piece


def load_ar_generator(
    source: GGUFFile | str | Path | None = None, options: AROptions | None = None
) -> ARGenerator:
    """Read the GGUF (default: the offline SmolLM2) once; build model + tokenizer."""
    import torch

    from model.gguf import GGUFFile, find_smollm2_gguf
    from model.llama import Llama

    options = options or AROptions()
    f = source if isinstance(source, GGUFFile) else GGUFFile(source or find_smollm2_gguf())
    config = f.llama_config()
    model = Llama.from_state_dict(config, f.state_dict(config), getattr(torch, options.dtype))
    return ARGenerator(model, Tokenizer(f.tokenizer_data()), options)


def _demo() -> None:  # python -m model.ar "question"
    import sys

    t0 = time.perf_counter()
    gen = load_ar_generator()
    print(f"loaded in {time.perf_counter() - t0:.1f} s")
    question = " ".join(sys.argv[1:]) or "What is the capital of France?"
    for piece in gen.generate([ChatMessage("user", question)], 64, lambda: False):
        print(piece, end="", flush=True)
    print()


if __name__ == "__main__":
    _demo()
