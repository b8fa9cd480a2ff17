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

import dataclasses
import functools
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from model.actions import (
    ActionSettings,
    CallOptions,
    ContentFree,
    call_starts,
    decode_call,
    said_shapes,
    shape_names,
)
from model.ask import named_tools
from model.backend import Prefix, StepBackend, last_row
from model.chat import SPOKEN_SYSTEM_PROMPT, build_prompt, first_message_length, system_head
from model.confirm import Confirmation, tool_named
from model.engine import ChatMessage, GenerationStats
from model.modeldir import adapter_calls_tools
from model.openings import Opening, reply_openings
from model.prefix import PrefixCache, warm
from model.router import ToolRouter, tool_of
from model.sampler import (
    SENTENCE_BREAK,
    DiffusionConfig,
    SamplerSettings,
    sample,
    sentence_end_ids,
    spaced_ids,
    word_keys,
)
from model.spans import (
    SpanPointer,
    UserTokens,
    boundary_rows,
    span_text,
    user_tokens,
    without_courtesy,
    words,
)
from model.tokenizer import StreamDecoder, Tokenizer, decoded
from model.tools import CALL_CLOSE, CALL_OPEN, Tool, ToolCall, tools_system_prompt

Text = Generator[str, None, GenerationStats]
# what _act leaves the sampler: head, forced ids, passes, last logits, the call made
_Acted = tuple[list[int], list[int], int, NDArray[np.float32], ToolCall | None]

# What a reply says when the model began a call it could not finish validly, or the
# router read a request for a tool the session has not.
CANNOT_ACT = "Sorry, I can't do that."


# A tool call is written in blocks of at least this many positions whatever the reply's
# schedule: its template's tokens are laid in without a pass, which blocks of one would
# spend one each on (a media.play call: 30 passes against 1)
CALL_BLOCK = 16


def call_block(block_size: int) -> int:
    """The block width a call is written in, for replies in blocks of ``block_size``."""
    return max(block_size, CALL_BLOCK)


def served_sampler() -> SamplerSettings:
    """The engine's decoding: the sampler's defaults, and a reply ends before a sentence
    that repeats it (stop_repeats: "You can avoid them by avoiding them." once, not to
    the budget; docs/diffusion.md)."""
    return SamplerSettings(stop_repeats=True)


@dataclass(frozen=True)
class DiffusionOptions:
    sampler: SamplerSettings = field(default_factory=served_sampler)
    prompt_budget: int = 1024  # tokens of conversation kept (oldest turns dropped first)
    # the reply positions each KV cache has beyond prompt_budget (a reply is cut to what
    # fits its cache: _room); the server's reply budget is its max_reply_tokens
    reply_cache_tokens: int = 256
    system_prompt: str = SPOKEN_SYSTEM_PROMPT
    cache_sessions: int = 32  # conversations whose KV cache is kept (LRU)
    seed: int = 0  # each reply's sampler generator starts from it
    dtype: str = "float32"  # torch dtype of the default (PyTorch) model
    actions: ActionSettings = field(default_factory=ActionSettings)
    # Earlier messages in the prompt (None: what the prompt budget holds; model/chat.py)
    # and the tokens of an earlier reply's opening (or the user's words) a reply may not
    # repeat (0: off; model/openings.py). Inside 20-turn sessions of their own replies
    # the two keep both engines from copying themselves (docs/training.md, "Conversations")
    history_window: int | None = 4
    opening_ban: int = 4
    # Where a reply ends only after a sentence's end (the sampler's ends_after_sentence):
    # in sessions with tools, or in every session ("always", which the loaders set for an
    # adapter trained on tool calls). That adapter, trained on short call confirmations,
    # ends factual answers before their last words ("The capital of Italy") under either
    # prompt. Held-out, tools prompt: whole sentences 0.825 -> 0.900 (docs/actions.md)
    end_after_sentence: Literal["never", "tools", "always"] = "tools"

    @property
    def cache_len(self) -> int:
        """Positions per KV cache: the prompt budget plus whole reply blocks."""
        blocks = self.sampler.blocks(self.reply_cache_tokens)
        return self.prompt_budget + (blocks[-1][1] if blocks else 0)


def served_options(adapter_manifest: Mapping[str, Any] | None) -> DiffusionOptions:
    """The engine's options for a model that merges the adapter of this manifest (a
    model directory's ``source.adapter``, or ``Adapter.manifest``): an adapter trained
    on tool calls ends every reply only after a sentence's end, in sessions without
    tools too (a Realtime session without functions got "The capital of Italy")."""
    rule: Literal["tools", "always"] = (
        "always" if adapter_calls_tools(adapter_manifest) else "tools"
    )
    return DiffusionOptions(end_after_sentence=rule)


def smollm2_diffusion_config(tokenizer: Tokenizer) -> DiffusionConfig:
    """SmolLM2 adapted to block diffusion (docs/diffusion.md): the mask is the extra
    embedding row (id = vocab size), a reply ends at <|im_end|> (or eos), block-causal
    attention, Dream's logit shift."""
    return DiffusionConfig(
        mask_id=tokenizer.vocab_size,
        end_ids=tokenizer.stop_ids,
        attention="block",
        shift=True,
        sentence_ends=sentence_end_ids(tokenizer),
        word_keys=word_keys(tokenizer),
        spaced=spaced_ids(tokenizer),
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
        # tool calls are written into the reply's blocks against the KV cache
        self.supports_tools = model.attention == "block"
        self._calibrations: dict[str, ContentFree] = {}  # by system prompt
        # names the tool of a call from the prefill (model/router.py); None: the model does
        self.router: ToolRouter | None = None
        # points at a routed call's string values in the user's words (model/spans.py)
        self.spans: SpanPointer | None = None

    def prime_heads(self, tool_sets: Sequence[Sequence[Tool]]) -> int:
        """Prefill the system prompt with each of ``tool_sets`` now and keep it as a
        head (:meth:`model.prefix.PrefixCache.prime`): how many are kept."""
        tool_sets = tool_sets if self.supports_tools else [()]
        systems = {tools_system_prompt(self.options.system_prompt, t) for t in tool_sets}
        return sum(self.prefixes.prime(system_head(self.tokenizer, s)) for s in systems)

    def warm(
        self,
        conversation: Sequence[ChatMessage],
        tools: Sequence[Tool] = (),
        should_stop: Callable[[], bool] = lambda: False,
    ) -> int:
        """Prefill what the prompt of ``conversation``'s next turn starts with, offered
        ``tools``, and keep it (:func:`model.prefix.warm`): called between turns, it
        takes the last reply and a moved history start off the next reply's path.
        Returns the tokens prefilled."""
        if self.model.attention != "block":  # generate keeps no cache either
            return 0
        opts = self.options
        system = tools_system_prompt(opts.system_prompt, tools if self.supports_tools else ())
        budget, window = opts.prompt_budget, opts.history_window
        be, tok = self.backend, self.tokenizer
        return warm(self.prefixes, be, tok, conversation, budget, system, window, should_stop)

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Tool] = (),
    ) -> Generator[str | ToolCall, None, GenerationStats]:
        opts, tok = self.options, self.tokenizer
        tools = tools if self.supports_tools else ()
        system = tools_system_prompt(opts.system_prompt, tools)
        prompt = build_prompt(tok, conversation, opts.prompt_budget, system, opts.history_window)
        avoid = reply_openings(tok, conversation, opts.opening_ban)
        room = self._room(len(prompt), max_tokens)
        rng = np.random.default_rng(opts.seed)
        cached = self.model.attention == "block"
        prefix = self.prefixes.take(prompt) if cached else None
        decoder = tok.stream_decoder()
        try:
            head, forced, passes, call = prompt, list[int](), 0, None
            if tools and prefix is not None:
                acted = yield from self._act(
                    prompt, prefix, tools, _user_text(conversation), should_stop, avoid
                )
                if acted is None:  # it meant to act and could not write a valid call
                    yield CANNOT_ACT
                    return GenerationStats(0, 1, "cancel" if should_stop() else "end")
                head, forced, passes, last, call = acted
                prefix = Prefix(prefix.cache, len(head), last)
            settings = opts.sampler
            rule = opts.end_after_sentence
            if rule == "always" or (rule == "tools" and tools):
                settings = dataclasses.replace(settings, ends_after_sentence=True)
            tokens = sample(
                self.backend,
                head,
                self.model,
                settings,
                rng,
                self._room(len(head), len(forced) + max_tokens) if forced else room,
                should_stop,
                prefix,
                forced,
                # a call's confirmation, after the call's tokens, may not open as an
                # earlier reply or the user's words did either ("Remind me to call my
                # mom at six." was confirmed with those words)
                avoid=avoid,
                # a spoken reply never writes a call's tags, tools offered or not
                never=() if forced else self._no_call,
                breaks=True,
            )
            text = _text(tokens, decoder)
            if call is not None:  # nothing the call's check has not read is spoken
                text = _checked(text, Confirmation(call, tool_named(tools, call.name)))
            stats = yield from text
        finally:
            if prefix is not None:
                self.prefixes.put(prompt, prefix.cache, first_message_length(tok, prompt))
        return dataclasses.replace(stats, forward_passes=stats.forward_passes + passes)

    def _act(
        self,
        prompt: list[int],
        prefix: Prefix,
        tools: Sequence[Tool],
        user_text: str,
        should_stop: Callable[[], bool],
        avoid: Sequence[Opening] = (),
    ) -> Generator[ToolCall, None, _Acted | None]:
        """Prefill the prompt and, when the model's first reply token opens a call,
        write the call (``model/actions.py``) and yield it. Returns what the sampler
        goes on from: the prompt with the call's committed blocks, the call's other
        tokens (forced into the reply's first block), the passes spent here, the
        logits of the last cached row (so the sampler prefills nothing again) and the
        call (None: it speaks); None when the call could not be written (cancelled, or
        nothing valid in its passes: the sampler would only write the call's text
        again), or the router reads a request for a tool it knows that the session has
        not (``ToolRouter.absent``)."""
        be, cache = self.backend, prefix.cache
        shapes = shape_names(tools) if self.router is not None else []
        router = self.router if self.router is not None and self.router.knows(shapes) else None
        where = None
        if router is not None and self.spans is not None:
            where = user_tokens(self.tokenizer, prompt, user_text)
        start = min(prefix.length, len(prompt) - 1)  # as the sampler: >= 1 new token
        if where is not None:  # the pointers read the user's rows: prefilled now
            start = min(start, int(where.rows[0]))
        be.truncate(cache, start)
        chunk = np.asarray(prompt[start:], np.int64)
        rows = last_row(chunk) if where is None else np.append(where.rows - start, len(chunk) - 1)
        logits = be.step(cache, chunk, "causal", commit=True, rows=rows)
        last = logits[-1]
        # act or speak: the router reads it whatever the tools, though it names only its own
        judge = router if router is not None else self.router
        acts = judge.acts(last, user_text) if judge is not None else None
        margin = judge.margin(last, user_text) if judge is not None else None
        if router is None and not acts:
            # tools of the session's own: only its sure "act" counts ("Open the garage
            # door.", which the model's token spoke to); where it reads speech or is
            # unsure, the token decides alone, with no margin: a question may call the
            # session's own lookup tool ("What's the weather in Paris?"), which the
            # default set it was fitted on never had
            acts = margin = None
        if acts is None:  # no router for these tools, or it is unsure: the model's token
            acts = call_starts(self.tokenizer, last, {o[0] for o in avoid})
        if not acts:
            return prompt, [], 1, last, None
        if router is not None and router.absent(last, shapes, user_text):
            return None  # a tool the session lacks: "Sorry, I can't do that.", not the nearest
        block = call_block(self.options.sampler.block_size)
        prior = self._content_free(tools) if self.options.actions.calibrate else None
        routed = None
        if router is not None:
            routed = router.choose(last, shapes, said_shapes(tools, user_text), user_text)
        pointed = None
        if routed is not None and where is not None:
            pointed = self._point(logits[:-1], where, user_text, tool_of(routed))
        options = CallOptions(block, self.options.actions, prior, routed, pointed)
        # no router names the tool: the model chooses among those the request names, if any
        among = (named_tools(tools, user_text) or tools) if routed is None else tools
        done = decode_call(
            be, self.tokenizer, cache, last, among, user_text, self.model, options, should_stop
        )
        if done is None:
            be.truncate(cache, len(prompt))
            return None
        yield dataclasses.replace(done.call, margin=margin)  # how sure it was to act
        head = [*prompt, *done.ids[: done.committed]]
        return head, done.ids[done.committed :], 1 + done.call.passes, done.last, done.call

    def _point(
        self, rows: NDArray[np.float32], where: UserTokens, text: str, tool: str
    ) -> dict[str, str]:
        """The string values of a call of ``tool``, spans of the user's words chosen by
        the span pointers (``model/spans.py``) from the user's prefill ``rows``. A span
        that cannot sit in a JSON string as is (a quote, a backslash) is left to the
        model's slot."""
        assert self.spans is not None
        spans = words(text)
        scores = self.spans.scores(rows, boundary_rows(where.offsets, spans))
        out = {}
        for name in self.spans.params:
            owner, param = name.rsplit(".", 1)
            if owner != tool:
                continue
            value = span_text(text, spans, *self.spans.best(scores, tool, param))
            value = without_courtesy(value)  # "call the dentist, please": the words asked
            if value and not {'"', "\\"} & set(value):
                out[param] = value
        return out

    def _content_free(self, tools: Sequence[Tool]) -> ContentFree:
        """The calibration of ``tools``' branches (kept for the last few tool sets)."""
        system = tools_system_prompt(self.options.system_prompt, tools)
        if (found := self._calibrations.pop(system, None)) is None:
            opts, tok = self.options, self.tokenizer
            prompts = [
                build_prompt(tok, [ChatMessage("user", t)], opts.prompt_budget, system)
                for t in CONTENT_FREE
            ]
            block = call_block(opts.sampler.block_size)
            found = ContentFree(self.backend, tok, prompts, self.model, block)
        self._calibrations[system] = found
        while len(self._calibrations) > 4:
            del self._calibrations[next(iter(self._calibrations))]
        return found

    @functools.cached_property
    def _no_call(self) -> tuple[int, ...]:
        """The tokens a call's tags start with ("<", "</", and the "tool" of
        "<tool_call>" that follows them), which no spoken reply writes: with tools, the
        decision was made (call_starts), and the sampler must not write a call as words,
        nor the tail of one it was not to make (after "Cancel the timer." a "goodbye" was
        answered "</tool_call>Cancelling the timer.", and with "</" barred,
        "Itool_call>..."); without, a model trained on calls still writes tags now and
        then (offered none for "My sister sent me a funny message this morning.", it
        answered "<name>My sister sent ...</name>"). Encoded once per generator."""
        ids = (self.tokenizer.encode_plain(tag)[:2] for tag in (CALL_OPEN, CALL_CLOSE))
        return tuple(sorted({i for pair in ids for i in pair}))

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


# Requests that ask for nothing: what the model leans to at a call's branches regardless
CONTENT_FREE = ("N/A", "", "Okay.")


def _text(tokens: Generator[int, None, GenerationStats], decoder: StreamDecoder) -> Text:
    """The reply's text pieces, with what the stream decoder still holds at its end
    (not after a cancel: the reply stopped there). A :data:`SENTENCE_BREAK` is the
    space the next sentence starts with, said before its words: the server's splitter
    ends a sentence at its mark and the space after it."""
    broke = False

    def push(token: int) -> str:
        nonlocal broke
        if token == SENTENCE_BREAK:
            broke = True
            return " "
        piece = decoder.push(token)
        if broke and piece:
            broke, piece = False, piece.removeprefix(" ")
        return piece

    stats = yield from decoded(tokens, push)
    if stats.stopped_by != "cancel" and (rest := decoder.flush()):
        yield rest
    return stats


def _checked(text: Text, check: Confirmation) -> Text:
    """A call's confirmation, a whole sentence at a time, each checked against the call
    (``model/confirm.py``); a cancelled reply keeps its unchecked tail to itself."""
    try:
        while True:
            yield from check.feed(next(text))
    except StopIteration as done:
        stats: GenerationStats = done.value
    if stats.stopped_by != "cancel":
        yield from check.flush()
    return stats


def _user_text(conversation: Sequence[ChatMessage]) -> str:
    """The latest user message: where a call's string arguments are copied from."""
    return next((m.content for m in reversed(conversation) if m.role == "user"), "")
