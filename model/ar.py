"""The autoregressive baseline reply engine: SmolLM2-135M-Instruct, greedy, streamed.

This is the engine the diffusion reply model must beat (docs/export.md, "Benchmark"). It holds only
read-only state (weights, tokenizer, options); every call builds its own KV cache and
decoder, so concurrent calls from several worker threads never share mutable state.

:class:`ARGenerator` decodes on any :class:`model.backend.StepBackend`: the PyTorch
Llama here ("smollm2-ar"), or an exported model in ONNX Runtime ("smollm2-ar-onnx",
``model/assemble.py``). This module imports torch only inside the loaders below, so the
ONNX engine reuses it without torch.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

from model.backend import StepBackend
from model.chat import SPOKEN_SYSTEM_PROMPT, build_prompt, first_message_length, system_head
from model.engine import ChatMessage, GenerationStats
from model.generate import greedy
from model.openings import reply_openings
from model.prefix import PrefixCache, warm
from model.tokenizer import Tokenizer, decoded
from model.tools import Tool, ToolCall


@dataclass(frozen=True)
class AROptions:
    # fp32: bf16 decodes faster on an AMX CPU but its greedy replies drift from fp32's on
    # some prompts (python -m bench.ar measures both); opt in where speed wins.
    dtype: str = "float32"  # a torch dtype name; the PyTorch engine only
    prompt_budget: int = 1024  # tokens of conversation kept (oldest turns dropped first)
    system_prompt: str = SPOKEN_SYSTEM_PROMPT
    # conversations whose KV cache is kept for their next turn (model/prefix.py)
    cache_sessions: int = 16
    # Earlier messages in the prompt (None: what the prompt budget holds; model/chat.py)
    # and the tokens of an earlier reply's opening (or the user's words) a reply may not
    # repeat (0: off; model/openings.py). Inside 20-turn sessions of their own replies
    # the two keep both engines from copying themselves (docs/training.md, "Conversations")
    history_window: int | None = 4
    opening_ban: int = 4


class ARGenerator:
    """A :class:`model.engine.TextGenerator` running greedy decoding on a Llama.

    It has no tools: it is SmolLM2 as published, and the tool calls are the diffusion
    adapter's training (docs/actions.md)."""

    supports_tools = False

    def __init__(
        self,
        backend: StepBackend,
        tokenizer: Tokenizer,
        options: AROptions,
        name: str = "smollm2-ar",
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.options = options
        self.name = name
        self.prefixes = PrefixCache(backend, options.cache_sessions)

    def prime_heads(self, tool_sets: Sequence[Sequence[Tool]] = ()) -> int:
        """Prefill the system prompt now and keep it as a head (no tools: this engine
        writes no calls); how many are kept."""
        return int(self.prefixes.prime(system_head(self.tokenizer, self.options.system_prompt)))

    def warm(
        self,
        conversation: Sequence[ChatMessage],
        tools: Sequence[Tool] = (),
        should_stop: Callable[[], bool] = lambda: False,
    ) -> int:
        """As :meth:`model.diffusion_engine.DiffusionGenerator.warm` (no tools: this
        engine's prompt never lists them)."""
        opts, be, tok = self.options, self.backend, self.tokenizer
        budget, system, window = opts.prompt_budget, opts.system_prompt, opts.history_window
        return warm(self.prefixes, be, tok, conversation, budget, system, window, should_stop)

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Tool] = (),
    ) -> Generator[str | ToolCall, None, GenerationStats]:
        tok, opts = self.tokenizer, self.options
        prompt = build_prompt(
            tok, conversation, opts.prompt_budget, opts.system_prompt, opts.history_window
        )
        avoid = reply_openings(tok, conversation, opts.opening_ban)
        decoder = tok.stream_decoder()
        max_tokens = min(max_tokens, self.backend.max_len - len(prompt))
        prefix = self.prefixes.take(prompt)
        said: list[int] = []

        def push(token: int) -> str:
            said.append(token)
            return decoder.push(token)

        tokens = greedy(self.backend, prompt, max_tokens, tok.stop_ids, should_stop, prefix, avoid)
        try:
            stats = yield from decoded(tokens, push)
        finally:  # the cache holds prompt + the reply tokens fed: the next turn's start
            self.prefixes.put([*prompt, *said], prefix.cache, first_message_length(tok, prompt))
        if stats.stopped_by != "cancel" and (rest := decoder.flush()):
            yield rest
        return stats
