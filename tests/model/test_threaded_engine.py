"""ThreadedReplyEngine: cancellation across sessions sharing one reply thread, and the
model's pauses before its passes (speech first, ``server.speech.SpeechFirst``).

The generators here are scripted stand-ins for a model (the real engines run through
the same class in tests/model/test_ar.py and the end-to-end tests): one blocks until
the test lets it go, so the order of events is fixed and no assertion depends on time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from model.engine import ChatMessage, GenerationStats, ReplyEnd, ThreadedReplyEngine
from server.speech import SpeechFirst
from tests.passes import Watched

ASK = [ChatMessage("user", "hello")]


class Blocking:
    """Yields one piece, then holds the thread until ``release`` is set."""

    name = "blocking"
    supports_tools = False

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Any] = (),
    ) -> Generator[str, None, GenerationStats]:
        self.started.set()
        yield "A long reply"
        self.release.wait(30)
        return GenerationStats(1, 1, "end")


class Counting:
    """Records whether it ever ran."""

    name = "counting"
    supports_tools = False

    def __init__(self) -> None:
        self.ran = False

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Any] = (),
    ) -> Generator[str, None, GenerationStats]:
        self.ran = True
        yield "Hi."
        return GenerationStats(1, 1, "end")


async def test_cancelling_a_reply_queued_behind_another_does_not_wait_for_it() -> None:
    """Session B's reply waits for the one reply thread while session A's is written;
    B's user barges in. B's cancel must return at once (before A's reply ends) and B's
    reply must never run: before the fix it waited for all of A's reply (issue 17)."""
    a, b = Blocking(), Counting()
    with ThreadPoolExecutor(1) as pool:  # one reply thread, as the server has
        first = ThreadedReplyEngine(a, pool).stream(ASK, 8)
        assert await anext(first) == "A long reply"
        assert a.started.is_set()
        queued_started = asyncio.Event()

        async def session_b() -> None:
            queued_started.set()
            async for _ in ThreadedReplyEngine(b, pool).stream(ASK, 8):
                pass

        task = asyncio.create_task(session_b())
        await queued_started.wait()
        await asyncio.sleep(0)  # let it submit its job behind A's
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=20)
        assert task in done and task.cancelled()
        assert not a.release.is_set()  # A's reply is still being written
        a.release.set()
        rest = [chunk async for chunk in first]
        assert rest == [ReplyEnd(GenerationStats(1, 1, "end"))]
    assert not b.ran


class Unstartable:
    """A generator whose generate() fails before it yields (as a wrong signature does)."""

    name = "unstartable"
    supports_tools = False

    def generate(self, conversation: Sequence[ChatMessage], max_tokens: int) -> Any:
        raise AssertionError("not reached: the call itself fails on the extra arguments")


async def test_a_generator_that_cannot_start_ends_the_stream_with_its_error() -> None:
    """Before, the worker raised outside its try and never said it was done: the reply
    stream waited forever (a test fake with an old signature hung CI for 15 minutes)."""
    with ThreadPoolExecutor(1) as pool:
        stream = ThreadedReplyEngine(Unstartable(), pool).stream(ASK, 8)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            async with asyncio.timeout(20):
                await anext(stream)


class Passes:
    """Three passes of one piece each; notes, before each pass, how many pieces the
    consumer had taken by then (read from the test's own counter), and says when it has
    written them all."""

    name = "passes"
    supports_tools = False

    def __init__(self, taken: list[int]) -> None:
        self.taken = taken
        self.seen: list[int] = []
        self.finished = threading.Event()

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Any] = (),
    ) -> Generator[str, None, GenerationStats]:
        try:
            for word in ("One", " two", " three."):
                if should_stop():
                    return GenerationStats(len(self.seen), len(self.seen), "cancel")
                self.seen.append(self.taken[0])
                yield word
            return GenerationStats(3, 3, "end")
        finally:
            self.finished.set()


async def _written(gen: Passes) -> None:
    """Wait until the model has finished (a model held in lockstep never does)."""
    assert await asyncio.to_thread(gen.finished.wait, 30)


async def test_in_lockstep_each_pass_waits_until_the_consumer_took_what_was_written() -> None:
    """The consumer may have found the first phrase in the last piece and want the CPU
    for its speech: the model starts no pass before it is back for more."""
    taken = [0]
    gen = Passes(taken)
    with ThreadPoolExecutor(1) as pool:
        pauses = SpeechFirst().reply(speaks=True)
        pieces = []
        async for item in ThreadedReplyEngine(gen, pool).stream(ASK, 8, pauses=pauses):
            pieces.append(item)
            taken[0] += 1
    assert pieces[:3] == ["One", " two", " three."]
    assert gen.seen == [0, 1, 2]  # every pass waited for the piece before it


@pytest.mark.parametrize("speaks", [True, False])
async def test_released_or_unspoken_the_model_runs_ahead_of_its_consumer(speaks: bool) -> None:
    """The consumer holds the first piece until the model has written them all: that
    only happens if nothing holds the model back."""
    taken = [0]
    gen = Passes(taken)
    with ThreadPoolExecutor(1) as pool:
        pauses = SpeechFirst().reply(speaks)
        async for _ in ThreadedReplyEngine(gen, pool).stream(ASK, 8, pauses=pauses):
            pauses.release()  # the first phrase is synthesized
            await _written(gen)
            taken[0] += 1
    assert gen.seen == [0, 0, 0]


async def test_without_pauses_the_model_runs_ahead_of_its_consumer() -> None:
    taken = [0]
    gen = Passes(taken)
    with ThreadPoolExecutor(1) as pool:
        async for _ in ThreadedReplyEngine(gen, pool).stream(ASK, 8):
            await _written(gen)
            taken[0] += 1
    assert gen.seen == [0, 0, 0]


async def test_a_reply_dropped_in_lockstep_stops_without_another_pass() -> None:
    """The consumer leaves after the first piece: the model, waiting for it to come back,
    is woken by the stream's close and stops instead of waiting forever."""
    taken = [0]
    gen = Passes(taken)
    with ThreadPoolExecutor(1) as pool:
        stream = ThreadedReplyEngine(gen, pool).stream(
            ASK, 8, pauses=SpeechFirst().reply(speaks=True)
        )
        assert await anext(stream) == "One"
        async with asyncio.timeout(30):
            await stream.aclose()
    assert gen.finished.is_set() and gen.seen == [0]


async def test_while_a_first_phrase_is_synthesized_no_reply_starts_a_pass() -> None:
    """Another turn's first phrase holds this reply before its first pass; the hold let
    go, it runs to its end."""
    taken = [0]
    gen = Passes(taken)
    speech = SpeechFirst()
    pauses = Watched(speech, lockstep=False)
    with ThreadPoolExecutor(1) as pool:
        stream = ThreadedReplyEngine(gen, pool).stream(ASK, 8, pauses=pauses)
        with speech.synthesizing():
            pauses.expect_wait()
            first = asyncio.ensure_future(anext(stream))
            assert await asyncio.to_thread(pauses.asleep)  # held at its first pass
            assert gen.seen == [] and not first.done()
        assert await first == "One"
        rest = [item async for item in stream]
    assert rest[:2] == [" two", " three."] and gen.seen == [0, 0, 0]
