"""server.runtime.Worker: blocking jobs off the event loop, lower ranks first."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from server.runtime import Worker


async def test_a_first_sentence_jumps_the_queue_of_later_ones() -> None:
    """One thread busy; three later sentences and then a first one wait: the first one
    runs next, the later ones in the order they were asked."""
    worker = Worker("tts")
    busy, ran = threading.Event(), []

    def job(name: str) -> str:
        ran.append(name)
        return name

    try:
        blocking = asyncio.create_task(worker.ranked(1, lambda: busy.wait(30) and "busy"))
        while not worker.pending:  # noqa: ASYNC110 - the blocking job is in its thread
            await asyncio.sleep(0.01)
        later = [asyncio.create_task(worker.ranked(1, lambda n=n: job(n))) for n in "abc"]
        await asyncio.sleep(0.05)
        first = asyncio.create_task(worker.ranked(0, lambda: job("first")))
        await asyncio.sleep(0.05)
        busy.set()
        assert await blocking == "busy"
        assert [await t for t in later] == ["a", "b", "c"] and await first == "first"
        assert ran == ["first", "a", "b", "c"]
        assert worker.pending == 0
    finally:
        busy.set()
        worker.shutdown()


async def test_a_failing_job_raises_to_its_asker_and_the_worker_goes_on() -> None:
    worker = Worker("tts")

    def boom() -> None:
        raise ValueError("no voice")

    try:
        with pytest.raises(ValueError, match="no voice"):
            await worker.run(boom)
        assert await worker.run(lambda x: x + 1, 1) == 2
    finally:
        worker.shutdown()


async def test_a_job_whose_asker_gave_up_never_runs() -> None:
    worker = Worker("tts")
    busy, ran = threading.Event(), []
    try:
        blocking = asyncio.create_task(worker.ranked(1, lambda: busy.wait(30)))
        while not worker.pending:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        gone = asyncio.create_task(worker.ranked(1, lambda: ran.append("gone")))
        await asyncio.sleep(0.05)
        gone.cancel()
        await asyncio.sleep(0.05)  # the cancel reaches the job's future
        busy.set()
        await blocking
        assert await worker.run(lambda: "next") == "next" and ran == []
    finally:
        busy.set()
        worker.shutdown()


class _Asr:
    """Hears an audio (a string here) as its upper case; ``hold`` keeps a call waiting."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.hold.set()
        self.batches: list[list[str]] = []
        self.fail = False

    def transcribe(self, audio: str) -> str:
        return self.transcribe_batch([audio])[0]

    def transcribe_batch(self, audios: list[str]) -> list[str]:
        self.batches.append(list(audios))
        self.hold.wait(30)
        if self.fail:
            raise RuntimeError("the ASR failed")
        return [a.upper() for a in audios]


@contextlib.asynccontextmanager
async def _first_heard(most: int) -> AsyncIterator[tuple[Any, _Asr, asyncio.Task[Any]]]:
    """Hearings at most ``most`` a call, its first final ("a") started and held in the
    ASR call until the test lets ``asr.hold`` go."""
    from server.runtime import Hearings

    worker, asr = Worker("asr"), _Asr()
    finals = Hearings(worker, asr, most)
    try:
        asr.hold.clear()
        first = asyncio.create_task(finals.hear("a"))
        while not worker.pending:  # noqa: ASYNC110 - the job is in its thread
            await asyncio.sleep(0.01)
        yield finals, asr, first
    finally:
        asr.hold.set()
        worker.shutdown()


async def test_finals_that_wait_together_are_heard_in_one_call() -> None:
    """The first final is heard at once, alone; those asked while it runs wait and are
    heard together, each given its own words; a turn cancelled meanwhile is left out;
    at most ``most`` a call."""
    async with _first_heard(most=2) as (finals, asr, first):
        rest = [asyncio.create_task(finals.hear(x)) for x in "bcde"]
        await asyncio.sleep(0.01)
        rest[1].cancel()  # "c": its turn ended while it waited
        asr.hold.set()
        assert await first == "A"
        assert [await t for t in (rest[0], rest[2], rest[3])] == ["B", "D", "E"]
        assert asr.batches == [["a"], ["b", "d"], ["e"]] and finals.sizes == [1, 2, 1]


async def test_a_failed_call_fails_each_of_its_turns_and_the_next_is_heard() -> None:
    async with _first_heard(most=8) as (finals, asr, first):
        waiting = [asyncio.create_task(finals.hear(x)) for x in "bc"]
        await asyncio.sleep(0.01)
        asr.fail = True
        asr.hold.set()
        for t in (first, *waiting):
            with pytest.raises(RuntimeError, match="the ASR failed"):
                await t
        asr.fail = False
        assert await finals.hear("d") == "D"
