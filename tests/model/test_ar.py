"""The real SmolLM2 autoregressive engine (loaded once for the module)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from model.ar import ARGenerator
from model.engine import (
    ChatMessage,
    GenerationStats,
    ReplyEnd,
    TextGenerator,
    ThreadedReplyEngine,
    drain,
)
from model.nn.engines import load_ar_generator
from server.speech import Sentence, SpeechFirst, sentences
from tests.passes import Watched

pytestmark = pytest.mark.models

FRANCE = [ChatMessage("user", "What is the capital of France?")]
# Greedy SmolLM2 answers this in several sentences (about 80 tokens).
LONG = [ChatMessage("user", "Can you tell me a fun fact about octopuses?")]


@pytest.fixture(scope="module")
def ar(smollm2_gguf) -> ARGenerator:
    return load_ar_generator(smollm2_gguf)


class Recording:
    """Wraps a real generator and records its stop checks (one before each forward
    pass) and when and how its reply ended."""

    def __init__(self, inner: TextGenerator) -> None:
        self.inner, self.name = inner, inner.name
        self.supports_tools = False
        self.finished = threading.Event()
        self.stats: GenerationStats | None = None
        self.checks = 0

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Any] = (),
    ) -> Generator[str, None, GenerationStats]:
        def counted() -> bool:
            self.checks += 1
            return should_stop()

        try:
            self.stats = yield from self.inner.generate(conversation, max_tokens, counted)
            return self.stats
        finally:
            self.finished.set()


def test_capital_of_france(ar: ARGenerator) -> None:
    pieces, stats = drain(ar.generate(FRANCE, 32, lambda: False))
    reply = "".join(pieces)
    assert "Paris" in reply
    assert stats.stopped_by == "end"
    assert stats.tokens == len(ar.tokenizer.encode(reply))
    assert stats.forward_passes == stats.tokens + 1  # prefill + one per token after


def test_budget_and_stop_flag(ar: ARGenerator) -> None:
    _, stats = drain(ar.generate(LONG, 5, lambda: False))
    assert stats == GenerationStats(tokens=5, forward_passes=5, stopped_by="budget")
    _, stats = drain(ar.generate(LONG, 64, lambda: True))
    assert stats == GenerationStats(tokens=0, forward_passes=0, stopped_by="cancel")
    seen: list[str] = []
    gen = ar.generate(LONG, 64, lambda: bool(seen))
    seen.append(next(gen))
    _, stats = drain(gen)
    assert stats.stopped_by == "cancel" and stats.forward_passes == stats.tokens <= 2


def test_concurrent_calls_do_not_interfere(ar: ARGenerator) -> None:
    expected = "".join(drain(ar.generate(FRANCE, 16, lambda: False))[0])
    with ThreadPoolExecutor(2) as pool:
        reply = lambda: drain(ar.generate(FRANCE, 16, lambda: False))  # noqa: E731
        futures = [pool.submit(reply), pool.submit(reply)]
        replies = ["".join(f.result()[0]) for f in futures]
    assert replies == [expected, expected]


async def test_engine_streams_the_generators_pieces(ar: ARGenerator) -> None:
    pieces, stats = drain(ar.generate(FRANCE, 32, lambda: False))
    with ThreadPoolExecutor(1) as pool:
        engine = ThreadedReplyEngine(ar, pool)
        chunks = [c async for c in engine.stream(FRANCE, 32)]
    assert engine.name == "smollm2-ar"
    assert chunks == [*pieces, ReplyEnd(stats)]


async def test_sentences_of_a_real_reply(ar: ARGenerator) -> None:
    pieces, _ = drain(ar.generate(LONG, 80, lambda: False))
    with ThreadPoolExecutor(1) as pool:
        chunks = [c async for c in sentences(ThreadedReplyEngine(ar, pool).stream(LONG, 80))]
    *said, end = chunks
    assert isinstance(end, ReplyEnd) and len(said) >= 2  # the octopus fact is several
    assert all(isinstance(s, Sentence) for s in said)
    assert [s.index for s in said if isinstance(s, Sentence)] == list(range(len(said)))
    assert " ".join(s.text for s in said if isinstance(s, Sentence)) == " ".join(
        "".join(pieces).split()
    )


async def test_engine_cancelled_mid_reply_frees_the_worker(ar: ARGenerator) -> None:
    recording = Recording(ar)
    first = asyncio.Event()
    chunks: list[object] = []
    with ThreadPoolExecutor(1) as pool:
        engine = ThreadedReplyEngine(recording, pool)

        async def consume() -> None:
            async for chunk in engine.stream(LONG, 120):
                chunks.append(chunk)
                first.set()

        task = asyncio.create_task(consume())
        await first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # stream() waited for the worker: the generator has already returned
        assert recording.finished.is_set()
    assert recording.stats is not None and recording.stats.stopped_by == "cancel"
    assert recording.stats.tokens < 120
    assert chunks and all(isinstance(c, str) for c in chunks)  # no ReplyEnd after a cancel


async def test_engine_pauses_while_a_first_phrase_is_synthesized(ar: ARGenerator) -> None:
    expected = "".join(drain(ar.generate(FRANCE, 32, lambda: False))[0])
    recording, speech = Recording(ar), SpeechFirst()
    pauses = Watched(speech, lockstep=False)
    with ThreadPoolExecutor(1) as pool:
        engine = ThreadedReplyEngine(recording, pool)

        async def consume() -> list[object]:
            return [c async for c in engine.stream(FRANCE, 32, pauses=pauses)]

        with speech.synthesizing():
            pauses.expect_wait()
            task = asyncio.create_task(consume())
            assert await asyncio.to_thread(pauses.asleep)
            # held at its first check: not one forward pass, not one piece
            assert recording.checks == 1 and not task.done()
        chunks = await task
    *pieces, end = chunks
    assert isinstance(end, ReplyEnd) and end.stats.stopped_by == "end"
    assert "".join(p for p in pieces if isinstance(p, str)) == expected


async def test_engine_cancelled_while_paused_returns(ar: ARGenerator) -> None:
    recording, speech = Recording(ar), SpeechFirst()
    pauses = Watched(speech, lockstep=False)
    with ThreadPoolExecutor(1) as pool:
        engine = ThreadedReplyEngine(recording, pool)

        async def consume() -> None:
            async for _ in engine.stream(LONG, 64, pauses=pauses):
                pass

        with speech.synthesizing():
            pauses.expect_wait()
            task = asyncio.create_task(consume())
            assert await asyncio.to_thread(pauses.asleep)  # waiting before its first pass
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert recording.finished.is_set()  # without waiting for the first phrase
    assert recording.stats == GenerationStats(0, 0, "cancel")  # not one pass ran
