"""server.runtime.Worker: blocking jobs off the event loop, lower ranks first."""

from __future__ import annotations

import asyncio
import threading

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
