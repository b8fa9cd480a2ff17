"""The reply-engine interface the voice loop talks to.

A reply engine turns the conversation so far into the assistant's reply, streamed as
sentences so that speech synthesis can start on the first one. Engines are loaded once
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
import re
import threading
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

Role = Literal["system", "user", "assistant"]
T = TypeVar("T")


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str


@dataclass(frozen=True)
class Sentence:
    """One sentence of the reply (or the whole reply, for block engines)."""

    text: str
    index: int  # sentence number within the reply, from 0


@dataclass(frozen=True)
class GenerationStats:
    """What one reply cost: reported in the turn's metrics."""

    tokens: int
    forward_passes: int
    stopped_by: Literal["end", "budget", "cancel"]


@dataclass(frozen=True)
class ReplyEnd:
    """Last item of every completed reply stream."""

    stats: GenerationStats


ReplyChunk = Sentence | ReplyEnd


class TextGenerator(Protocol):
    """Blocking generator run in a worker thread.

    ``generate`` yields decoded text pieces in order; it checks ``should_stop`` at least
    once per forward pass and returns promptly when it is true. It returns the stats
    of the reply as the iterator's return value (``StopIteration.value``).
    """

    name: str

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
    ) -> Generator[str, None, GenerationStats]: ...


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

    def stream(
        self, conversation: Sequence[ChatMessage], max_tokens: int
    ) -> AsyncIterator[ReplyChunk]: ...


# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) and then
# whitespace. Abbreviations such as "Dr. Smith" split early; that only costs a slightly
# shorter first TTS chunk, never lost text.
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s+")


class SentenceSplitter:
    """Accumulates streamed text and releases complete sentences."""

    def __init__(self) -> None:
        self._buffer = ""

    def feed(self, piece: str) -> list[str]:
        self._buffer += piece
        out: list[str] = []
        while (m := _SENTENCE_END.search(self._buffer)) is not None:
            sentence = self._buffer[: m.end()].strip()
            self._buffer = self._buffer[m.end() :]
            if sentence:
                out.append(sentence)
        return out

    def flush(self) -> list[str]:
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []


_DONE = object()


class PassGate:
    """Holds the reply model between forward passes while urgent work has the CPU.

    On a CPU host the reply model and Piper each spread over every core; run at the
    same time, each goes at less than half its speed (docs/latency.md, "Speech first"),
    so the first sentence's audio would wait on the model writing the later ones. While
    :meth:`hold` is held the model finishes its current pass and waits before the next.
    A disabled gate (a GPU host: the model does not need the cores) never waits.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._holders = 0
        self._open = threading.Event()
        self._open.set()

    @property
    def held(self) -> bool:
        return not self._open.is_set()

    @contextlib.contextmanager
    def hold(self) -> Generator[None, None, None]:
        if not self.enabled:
            yield
            return
        with self._lock:
            self._holders += 1
            self._open.clear()
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if not self._holders:
                    self._open.set()

    def wait(self, stop: Callable[[], bool], poll_s: float = 0.02) -> None:
        """Return once nothing holds the gate, or as soon as ``stop()`` is true (a
        cancelled reply must not wait for someone else's speech)."""
        while not self._open.wait(poll_s):
            if stop():
                return


class ThreadedReplyEngine:
    """Runs a blocking :class:`TextGenerator` off the event loop, sentence by sentence.

    Cancellation (the consuming task cancelled, or the iterator closed early) sets the
    generator's stop flag and waits for the worker thread to return, so a cancelled
    turn never keeps the model busy behind the next one. The generator also waits at
    ``gate`` before each forward pass (:class:`PassGate`).
    """

    def __init__(
        self, generator: TextGenerator, executor: Executor, gate: PassGate | None = None
    ) -> None:
        self._generator = generator
        self._executor = executor
        self.gate = gate or PassGate(enabled=False)
        self.name = generator.name

    async def stream(
        self, conversation: Sequence[ChatMessage], max_tokens: int
    ) -> AsyncIterator[ReplyChunk]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        stop = threading.Event()

        def put(item: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def should_stop() -> bool:  # called before every forward pass
            self.gate.wait(stop.is_set)
            return stop.is_set()

        def work() -> None:
            splitter = SentenceSplitter()
            it = self._generator.generate(conversation, max_tokens, should_stop)
            try:
                while True:
                    try:
                        piece = next(it)
                    except StopIteration as done:
                        stats: GenerationStats = done.value
                        break
                    for sentence in splitter.feed(piece):
                        put(sentence)
                if not stop.is_set():
                    for sentence in splitter.flush():
                        put(sentence)
                put(ReplyEnd(stats))
            except Exception as exc:  # re-raised on the event loop side
                put(exc)
            finally:
                put(_DONE)

        future = loop.run_in_executor(self._executor, work)
        index = 0
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, Exception):
                    raise item
                if isinstance(item, ReplyEnd):
                    yield item
                else:
                    assert isinstance(item, str)
                    yield Sentence(text=item, index=index)
                    index += 1
        finally:
            stop.set()
            # Wait for the worker to notice the flag even when we are being
            # cancelled, so the model is free before the next turn starts.
            with contextlib.suppress(Exception):
                await asyncio.shield(future)
