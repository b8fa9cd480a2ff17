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
# text is the spoken confirmation. The turn pipeline cuts the pieces into sentences.
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
        lockstep: threading.Event | None = None,
    ) -> AsyncIterator[ReplyChunk]:
        """The reply piece by piece. Until ``lockstep`` is set, the model starts no
        forward pass before the consumer has taken everything it wrote: a consumer that
        finds the reply's first phrase in a piece gets the CPU for its speech before
        the model goes on (docs/latency.md, "Speech first")."""
        ...


_DONE = object()


class Gate(Protocol):
    """Something a reply model waits at before each forward pass (the server's
    ``server.speech.PassGate`` lets Piper have the CPU for a reply's first sentence)."""

    def wait(self, stop: Callable[[], bool]) -> None:
        """Return when the next pass may run, or as soon as ``stop()`` is true."""
        ...


class ThreadedReplyEngine:
    """Runs a blocking :class:`TextGenerator` off the event loop, piece by piece.

    Cancellation (the consuming task cancelled, or the iterator closed early) sets the
    generator's stop flag and waits for the worker thread to return, so a cancelled
    turn never keeps the model busy behind the next one; a reply still queued behind
    another session's is taken off the queue at once instead of waited for. The
    generator also waits at ``gate`` before each forward pass, and in ``lockstep``
    for the consumer to take what it wrote.
    """

    def __init__(
        self, generator: TextGenerator, executor: Executor, gate: Gate | None = None
    ) -> None:
        self._generator = generator
        self._executor = executor
        self.gate = gate
        self.name = generator.name
        self.supports_tools = generator.supports_tools

    async def stream(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        tools: Sequence[Tool] = (),
        lockstep: threading.Event | None = None,
    ) -> AsyncIterator[ReplyChunk]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        stop = threading.Event()
        taken = threading.Condition()
        counts = [0, 0]  # pieces written, pieces the consumer has taken

        def put(item: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def caught_up() -> bool:
            return counts[1] >= counts[0] or stop.is_set() or lockstep is None or lockstep.is_set()

        def should_stop() -> bool:  # called before every forward pass
            if lockstep is not None:
                with taken:
                    while not taken.wait_for(caught_up, timeout=0.01):  # lockstep.set() is polled
                        pass
            if self.gate is not None:
                self.gate.wait(stop.is_set)
            return stop.is_set()

        def written(piece: object) -> None:
            with taken:
                counts[0] += 1
            put(piece)

        def work() -> None:
            try:  # a generator that cannot even start still ends the stream, with its error
                it = self._generator.generate(conversation, max_tokens, should_stop, tools)
                while True:
                    try:
                        written(next(it))
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
                with taken:  # the consumer is back for more: it has dealt with this one
                    counts[1] += 1
                    taken.notify_all()
        finally:
            stop.set()
            with taken:
                taken.notify_all()
            # Not started yet (queued behind another reply): it never runs. Running: wait
            # for it to notice the flag, within one forward pass, even when we are being
            # cancelled, so the model is free before the next turn starts.
            if not job.cancel():
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.wrap_future(job))
