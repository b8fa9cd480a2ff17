"""ThreadedReplyEngine's cancellation across sessions sharing one reply thread.

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
    consumer had taken by then (read from the test's own counter)."""

    name = "passes"
    supports_tools = False

    def __init__(self, taken: list[int]) -> None:
        self.taken = taken
        self.seen: list[int] = []

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Any] = (),
    ) -> Generator[str, None, GenerationStats]:
        for word in ("One", " two", " three."):
            if should_stop():
                break
            self.seen.append(self.taken[0])
            yield word
        return GenerationStats(3, 3, "end")


@pytest.mark.parametrize("free_after", [None, 1])
async def test_lockstep_holds_each_pass_until_the_consumer_took_what_was_written(
    free_after: int | None,
) -> None:
    """In lockstep the model starts a pass only once the consumer is back for more (it
    may have found the first phrase and want the CPU for its speech); once the event is
    set it runs ahead. The consumer is slow here, so without lockstep the model would
    have written every pass before the consumer took its first piece."""
    taken, free = [0], threading.Event()
    gen = Passes(taken)
    with ThreadPoolExecutor(1) as pool:
        pieces = []
        async for item in ThreadedReplyEngine(gen, pool).stream(ASK, 8, lockstep=free):
            await asyncio.sleep(0.05)  # the consumer works on the piece (Piper, say)
            pieces.append(item)
            if len(pieces) == free_after:
                free.set()
            taken[0] += 1
    assert pieces[:3] == ["One", " two", " three."]
    if free_after is None:
        assert gen.seen == [0, 1, 2]  # every pass waited for the piece before it
    else:
        assert gen.seen[0] == 0 and gen.seen[2] <= 1  # ran ahead of the slow consumer once set


async def test_without_lockstep_the_model_runs_ahead_of_a_slow_consumer() -> None:
    taken = [0]
    gen = Passes(taken)
    with ThreadPoolExecutor(1) as pool:
        async for _ in ThreadedReplyEngine(gen, pool).stream(ASK, 8):
            await asyncio.sleep(0.05)
            taken[0] += 1
    assert gen.seen == [0, 0, 0]
