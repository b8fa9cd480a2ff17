"""The reply-engine interface the voice loop talks to.

A reply engine turns the conversation so far into the assistant's reply, streamed as
text pieces so that speech synthesis can start on the first sentence. Engines are loaded once
per process and shared by every session; each call is cancellable, and cancelling it
stops the model within one forward pass.

Blocking model code implements the small synchronous :class:`TextGenerator` protocol
(an iterator of text pieces plus a stop flag); :class:`ThreadedReplyEngine` runs it in
a worker thread and adapts it to the async :class:`ReplyEngine` interface. This module
imports neither torch nor onnxruntime.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from model.backend import begin_reply, spoke
from model.tools import Tool, ToolCall

# "tool": what came of a tool call (the client's action_result), after the reply that
# made the call
Role = Literal["system", "user", "assistant", "tool"]
T = TypeVar("T")


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str


@dataclass(frozen=True)
class GenerationStats:
    """What one reply cost: reported in the turn's metrics."""

    tokens: int
    forward_passes: int
    stopped_by: Literal["end", "budget", "cancel"]
    # the reply began a sentence that repeats its earlier ones and was ended before it
    # (the diffusion sampler's stop_repeats; stopped_by is then "end")
    repeat_cut: bool = False


@dataclass(frozen=True)
class ReplyEnd:
    """Last item of every completed reply stream."""

    stats: GenerationStats


# A reply streams as text pieces in order (a token or a few), then one ReplyEnd; a
# cancelled reply ends without it. A reply that acts starts with its ToolCall, and its
# text is the spoken confirmation (the openai-chat engine's call comes once the server's
# stream is whole, after any text the remote model wrote before it). The turn pipeline
# cuts the pieces into sentences.
ReplyChunk = str | ToolCall | ReplyEnd


class TextGenerator(Protocol):
    """Blocking generator run in a worker thread.

    ``generate`` yields decoded text pieces in order, after a :class:`ToolCall` when
    the reply acts (only a generator that ``supports_tools``, and only one of
    ``tools``); it checks ``should_stop`` at least once per forward pass and returns
    promptly when it is true. It returns the stats of the reply as the iterator's
    return value (``StopIteration.value``).
    """

    name: str
    supports_tools: bool

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Tool] = (),
    ) -> Generator[str | ToolCall, None, GenerationStats]: ...


def drain(gen: Generator[T, None, GenerationStats]) -> tuple[list[T], GenerationStats]:
    """Run a token or text generator to its end: its items and the stats it returned."""
    items: list[T] = []
    while True:
        try:
            items.append(next(gen))
        except StopIteration as done:
            stats: GenerationStats = done.value
            return items, stats


class ReplyEngine(Protocol):
    """What the server needs from a reply model."""

    name: str
    supports_tools: bool

    def stream(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        tools: Sequence[Tool] = (),
        pauses: PassPauses | None = None,
    ) -> AsyncIterator[ReplyChunk]:
        """The reply piece by piece; the model waits at ``pauses`` before each forward
        pass (the server's speech first: docs/latency.md, "Speech first")."""
        ...


_DONE = object()


class PassPauses(Protocol):
    """When a reply's model may start its next forward pass (the server's
    ``server.speech.ReplyPasses``: a reply's first phrase is synthesized with the CPU to
    itself). The engine reports every piece the model writes and every piece the
    consumer takes, and closes it when the reply ends or is cancelled."""

    def wrote(self) -> None: ...

    def took(self) -> None: ...

    def close(self) -> None:
        """A model waiting in :meth:`wait` returns at once."""
        ...

    def wait(self) -> None:
        """Block the model's thread until the next pass may run, or until closed."""
        ...


class ThreadedReplyEngine:
    """Runs a blocking :class:`TextGenerator` off the event loop, piece by piece.

    Cancellation (the consuming task cancelled, or the iterator closed early) sets the
    generator's stop flag and waits for the worker thread to return, so a cancelled
    turn never keeps the model busy behind the next one; a reply still queued behind
    another session's is taken off the queue at once instead of waited for. Before each
    forward pass the generator waits at the stream's ``pauses``.
    """

    def __init__(self, generator: TextGenerator, executor: Executor) -> None:
        self._generator = generator
        self._executor = executor
        self.name = generator.name
        self.supports_tools = generator.supports_tools

    async def stream(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        tools: Sequence[Tool] = (),
        pauses: PassPauses | None = None,
    ) -> AsyncIterator[ReplyChunk]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        stop = threading.Event()

        def put(item: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def should_stop() -> bool:  # called before every forward pass
            if pauses is not None:
                pauses.wait()
            return stop.is_set()

        def written(piece: object) -> None:
            if pauses is not None:
                pauses.wrote()
            put(piece)

        def work() -> None:
            begin_reply()  # its steps go first in a shared pass until it has spoken
            try:  # a generator that cannot even start still ends the stream, with its error
                it = self._generator.generate(conversation, max_tokens, should_stop, tools)
                while True:
                    try:
                        written(next(it))
                        spoke()
                    except StopIteration as done:
                        stats: GenerationStats = done.value
                        break
                put(ReplyEnd(stats))
            except Exception as exc:  # re-raised on the event loop side
                put(exc)
            finally:
                put(_DONE)

        job = self._executor.submit(work)
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, Exception):
                    raise item
                assert isinstance(item, str | ToolCall | ReplyEnd)
                yield item
                if pauses is not None:  # the consumer is back for more: it dealt with this one
                    pauses.took()
        finally:
            stop.set()
            if pauses is not None:
                pauses.close()
            # Not started yet (queued behind another reply): it never runs. Running: wait
            # for it to notice the flag, within one forward pass, even when we are being
            # cancelled, so the model is free before the next turn starts.
            if not job.cancel():
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.wrap_future(job))
