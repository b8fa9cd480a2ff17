"""One turn's pipeline (server/turn.py) on a fake runtime: event order, the release,
pacing, cancellation, failures and speech first, with no model loaded.

The fakes implement the interfaces of their real twins: ``FakeAsr.transcribe`` returns
an ``audio.asr.Transcript``, ``FakeEngine`` is a ``model.engine.ReplyEngine`` (text
pieces, then a ReplyEnd), ``FakeTts`` has Piper's ``sample_rate`` and
``synthesize(text)`` yielding int16 chunks; the worker threads (``server.runtime.Worker``)
and speech first (``server.speech.SpeechFirst``) are the real ones. The same path runs on the
real models in tests/e2e/test_voice_loop.py (a spoken question through Whisper, the
served reply engine and Piper: transcript, reply text, audio and metrics; a barge-in
cancels the turn and none of its audio follows ``reply_cancelled``),
tests/e2e/test_concurrency.py (many sessions' turns at once), tests/server/test_turn.py
(``synthesize`` with the real Piper: the models held for the first sentence only) and
tests/model/test_ar.py (the real ThreadedReplyEngine streamed, cancelled, paused).

Pacing is checked on a frozen event-loop clock that the test moves by hand, so the
number of frames sent at each instant is exact and nothing depends on how fast this
machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest

from audio.asr import Transcript
from model.ask import CANT, NOT_CAUGHT, asked
from model.backend import BACKGROUND, reply_rank
from model.engine import ChatMessage, GenerationStats, ReplyChunk, ReplyEnd
from model.tools import DEFAULT_TOOLS, Tool, ToolCall, kept_reply, render_call
from server.runtime import Runtime, Worker, WorkerKind
from server.session import (
    Event,
    FinalTranscript,
    ReplyAction,
    ReplyAudio,
    ReplyFinished,
    ReplySentence,
    StartTurn,
    TurnFailed,
)
from server.speech import ReplyPasses, SpeechFirst
from server.turn import Pacing, run_turn

RATE = 16_000  # the fake voice's rate and the client's, unless a test says otherwise
TURN = 7
STATS = GenerationStats(tokens=12, forward_passes=5, stopped_by="end")
NO_PACING = Pacing(frame_ms=100, lead_ms=600_000)  # every frame may go at once
SETTLE = 50  # event-loop iterations given to anything that could still happen


# --- fakes -----------------------------------------------------------------------


class FakeAsr:
    """Answers ``text``; ``busy`` runs inside each call (a test moves its clock there)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.trusted = True  # False: as Transcriber says of a decode that looped
        self.avg_logprob, self.no_speech_prob = -0.2, 0.01  # Whisper's confidence
        self.calls: list[np.ndarray] = []
        self.busy: Callable[[], None] = lambda: None

    def transcribe(self, audio: np.ndarray) -> Transcript:
        self.calls.append(audio)
        self.busy()
        duration = len(audio) / RATE
        return Transcript(
            self.text, "en", duration, self.no_speech_prob, self.avg_logprob, self.trusted
        )


class FakeEngine:
    """A ReplyEngine that streams the given pieces, then ReplyEnd(STATS).

    ``block_after``: after that many pieces it waits (for ``unblock``) before the rest;
    ``fail``: raised after the pieces instead of the ReplyEnd. It records what it was
    asked and how its stream ended: ``"end"`` (ran out), or the exception that closed
    it (``GeneratorExit`` when the consumer dropped it, ``CancelledError`` when the
    consumer was cancelled while it waited).
    """

    name = "fake"

    def __init__(
        self,
        pieces: Sequence[str | ToolCall],
        block_after: int | None = None,
        fail: Exception | None = None,
    ) -> None:
        self.pieces, self.block_after, self.fail = list(pieces), block_after, fail
        self.unblock = asyncio.Event()
        self.blocked = asyncio.Event()
        self.closed = asyncio.Event()
        self.ended_by: str | None = None
        self.calls: list[tuple[tuple[ChatMessage, ...], int]] = []
        self.tools: list[tuple[Tool, ...]] = []  # the tools each call was offered
        # whether the model could have run ahead when each piece was written (before the
        # consumer took it: False in lockstep)
        self.free: list[bool] = []

    async def stream(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        tools: Sequence[Tool] = (),
        pauses: ReplyPasses | None = None,
    ) -> AsyncIterator[ReplyChunk]:
        self.calls.append((tuple(conversation), max_tokens))
        self.tools.append(tuple(tools))
        try:
            for i, piece in enumerate(self.pieces):
                if i == self.block_after:
                    self.blocked.set()
                    await self.unblock.wait()
                if pauses is not None:
                    pauses.wrote()
                self.free.append(pauses is None or pauses.ready())
                yield piece
                if pauses is not None:
                    pauses.took()
            if self.fail is not None:
                raise self.fail
            yield ReplyEnd(STATS)
            self.ended_by = "end"
        except BaseException as exc:
            self.ended_by = type(exc).__name__
            raise
        finally:
            if pauses is not None:
                pauses.close()
            self.closed.set()


class FakeTts:
    """Piper's interface: ``ms`` of audio per sentence, in two int16 chunks. It notes
    whether the reply models were held while each sentence was synthesized, and
    can be made to wait (``go``) inside ``synthesize`` (it runs in the TTS thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, speech: SpeechFirst, ms: int) -> None:
        self.loop, self.speech, self.ms = loop, speech, ms
        self.sample_rate = RATE
        self.texts: list[str] = []
        self.held: list[bool] = []
        self.go = threading.Event()
        self.go.set()
        self.started = asyncio.Event()  # set from the TTS thread when it is in synthesize
        self.busy: Callable[[], None] = lambda: None  # runs in each call, as FakeAsr's
        self.lean: list[bool] = []  # on which session each sentence was asked for
        # the first sentence with this text waits inside synthesize, holding its thread,
        # until ``hold_until`` is set (``holding`` is set once it waits)
        self.hold_text: str | None = None
        self.holding, self.hold_until = threading.Event(), threading.Event()
        self.ms_of: Callable[[str], int] = lambda text: self.ms  # audio a sentence makes

    def synthesize(self, text: str, lean: bool = False) -> Iterator[np.ndarray]:
        self.texts.append(text)
        self.lean.append(lean)
        self.held.append(self.speech.holding)
        self.loop.call_soon_threadsafe(self.started.set)
        self.go.wait()
        if text == self.hold_text and not self.holding.is_set():
            self.holding.set()
            self.hold_until.wait(10)
        self.busy()
        n = self.sample_rate * self.ms_of(text) // 1000
        yield np.full(n // 2, 1000, np.int16)
        yield np.full(n - n // 2, -1000, np.int16)


@dataclass
class Turn:
    """One turn on a fake runtime, with everything it delivered, in order."""

    rt: Runtime
    engine: FakeEngine
    asr: FakeAsr
    tts: FakeTts
    released: asyncio.Event = field(default_factory=asyncio.Event)
    events: list[Event] = field(default_factory=list)
    new_frame: asyncio.Event = field(default_factory=asyncio.Event)

    async def deliver(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, ReplyAudio):
            self.new_frame.set()

    def start(
        self,
        audio: np.ndarray | None = None,
        text: str | None = None,
        history: tuple[ChatMessage, ...] = (),
        output_rate: int = RATE,
        pacing: Pacing = NO_PACING,
        speak: bool = True,
        max_tokens: int | None = None,
        reply: bool = True,
        tools: tuple[Tool, ...] = (),
        pending: ToolCall | None = None,
        sure: bool = True,
    ) -> asyncio.Task[None]:
        start = StartTurn(
            TURN, audio, text, history, output_rate, speak, tools, max_tokens, reply, pending, sure
        )
        return asyncio.create_task(run_turn(self.rt, start, self.released, self.deliver, pacing))

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def frames(self) -> list[ReplyAudio]:
        return self.of(ReplyAudio)

    async def frame_count(self, n: int) -> None:
        """Wait until at least ``n`` audio frames have been delivered."""
        while len(self.frames) < n:
            self.new_frame.clear()
            await self.new_frame.wait()


@pytest.fixture
async def make_turn() -> AsyncIterator[Any]:
    runtimes: list[tuple[Runtime, FakeTts]] = []

    def make(
        engine: FakeEngine, transcript: str = "What is the capital of Italy?", tts_ms: int = 250
    ) -> Turn:
        speech = SpeechFirst(enabled=True)
        asr, tts = FakeAsr(transcript), FakeTts(asyncio.get_running_loop(), speech, tts_ms)
        workers = {kind: Worker(kind.value) for kind in WorkerKind}
        rt = Runtime(
            vad=cast(Any, None),
            asr=cast(Any, asr),
            tts=cast(Any, tts),
            reply=engine,
            asr_name="fake",
            max_reply_tokens=33,
            workers=workers,
            speech_first=speech,
        )
        runtimes.append((rt, tts))
        return Turn(rt, engine, asr, tts)

    yield make
    for rt, tts in runtimes:
        tts.go.set()  # a TTS thread left waiting by a cancelled turn
        rt.close()


async def settle() -> None:
    """Let every task that can run, run (a fixed number of loop iterations; no clock)."""
    for _ in range(SETTLE):
        await asyncio.sleep(0)


@contextlib.contextmanager
def frozen_clock(loop: asyncio.AbstractEventLoop) -> Iterator[list[float]]:
    """The loop's clock stands still until the test moves ``clock[0]``: sleeps end only
    then. (Whole seconds, so the frame durations used below add up exactly.)"""
    clock = [float(math.floor(loop.time()))]
    loop.time = lambda: clock[0]  # type: ignore[method-assign]
    try:
        yield clock
    finally:
        del loop.time


QUESTION_AUDIO = np.zeros(RATE, np.float32)
REPLY = ["The capital", " of Italy is Rome.", " It is", " also its largest city.", " Ciao"]
# The first sentence's first phrase goes to Piper on its own (server.speech).
SENTENCES = ["The capital of Italy", "is Rome.", "It is also its largest city.", "Ciao"]


# --- the events of one turn --------------------------------------------------------


async def test_a_spoken_turn_delivers_transcript_sentences_audio_then_finished(
    make_turn: Any,
) -> None:
    turn = make_turn(FakeEngine(REPLY), tts_ms=250)
    turn.released.set()
    with frozen_clock(asyncio.get_running_loop()) as clock:
        # the clock moves only while ASR (0.3 s) and TTS (0.25 s a sentence) work
        turn.asr.busy = lambda: clock.__setitem__(0, clock[0] + 0.3)
        turn.tts.busy = lambda: clock.__setitem__(0, clock[0] + 0.25)
        await turn.start(audio=QUESTION_AUDIO)

    first, *middle, last = turn.events
    assert isinstance(first, FinalTranscript)
    assert (first.turn_id, first.text) == (TURN, "What is the capital of Italy?")
    assert first.asr_ms == 300 and len(turn.asr.calls) == 1
    assert turn.asr.calls[0] is QUESTION_AUDIO
    # the reply's time is its four sentences' synthesis, on the loop's clock
    assert last == ReplyFinished(TURN, STATS, 4 * 250)
    assert {type(e) for e in middle} == {ReplySentence, ReplyAudio}

    said = turn.of(ReplySentence)
    assert [(s.turn_id, s.index, s.text) for s in said] == [
        (TURN, i, text) for i, text in enumerate(SENTENCES)
    ]
    assert turn.tts.texts == SENTENCES
    # Each sentence's audio comes after its text, sentence by sentence, in frames of
    # frame_ms (the last of a sentence shorter); 250 ms at 16 kHz = 4000 samples.
    frames = turn.frames
    assert all(f.turn_id == TURN for f in frames)
    assert [f.sentence for f in frames] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [len(f.pcm) for f in frames] == [3200, 3200, 1600] * 4
    assert all(f.sentence_samples == 4000 for f in frames)
    assert [f.tts_ms is not None for f in frames] == [True, False, False] * 4
    for s in said:
        assert middle.index(s) < middle.index(next(f for f in frames if f.sentence == s.index))
    audio = np.frombuffer(b"".join(f.pcm for f in frames[:3]), "<i2")
    assert audio.tolist() == [1000] * 2000 + [-1000] * 2000  # the voice's own samples


async def test_frames_are_sized_at_the_clients_rate(make_turn: Any) -> None:
    turn = make_turn(FakeEngine(["Hello there."]), tts_ms=250)
    turn.released.set()
    await turn.start(text="Hi", output_rate=8000, pacing=Pacing(frame_ms=40, lead_ms=600_000))
    # 250 ms at 8 kHz: 2000 samples, in 40 ms frames of 320 samples (640 bytes)
    assert [len(f.pcm) for f in turn.frames] == [640] * 6 + [160]
    assert {f.sentence_samples for f in turn.frames} == {2000}


async def test_only_a_lone_turns_first_sentence_is_synthesized_on_all_cores(
    make_turn: Any,
) -> None:
    """Piper's one-thread twin writes the later sentences, and the first one too while
    another turn is being produced (``Runtime.lean_speech``)."""
    alone = make_turn(FakeEngine(["Hello there.", " How are you?"]))
    alone.released.set()
    await alone.start(text="Hi")
    assert alone.tts.lean == [False, True]
    beside = make_turn(FakeEngine(["Hello there.", " How are you?"]))
    beside.released.set()
    with beside.rt.producing():  # another session's turn
        await beside.start(text="Hi")
    assert beside.tts.lean == [True, True]


async def test_a_first_sentence_never_waits_for_another_replys_later_one(
    make_turn: Any,
) -> None:
    """Later sentences have a TTS thread of their own: while Piper is still on one
    reply's second sentence, another reply's first sentence is synthesized and sent."""
    one = make_turn(FakeEngine(["Hello there.", " How are you today?"]))
    one.tts.hold_text = "How are you today?"
    other = Turn(one.rt, one.engine, one.asr, one.tts)
    one.released.set()
    other.released.set()
    first = one.start(text="Hi")
    try:
        await asyncio.wait_for(asyncio.to_thread(one.tts.holding.wait, 5), 6)
        second = other.start(text="Hi")
        await asyncio.wait_for(other.frame_count(1), 5)  # while the later one is held
        assert [s.text for s in other.of(ReplySentence)][:1] == ["Hello there."]
    finally:
        one.tts.hold_until.set()
    await first
    await second
    assert sorted(one.tts.texts) == sorted(["Hello there.", "How are you today?"] * 2)


class ByQuestion:
    """A reply engine per question (the user's last message)."""

    name = "fake"

    def __init__(self, engines: dict[str, FakeEngine]) -> None:
        self.engines = engines

    def stream(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        tools: Sequence[Tool] = (),
        pauses: ReplyPasses | None = None,
    ) -> AsyncIterator[ReplyChunk]:
        engine = self.engines[conversation[-1].content]
        return engine.stream(conversation, max_tokens, tools, pauses)


async def test_later_sentences_go_first_whose_reply_runs_out_of_audio_first(
    make_turn: Any,
) -> None:
    """The later-sentence thread takes the sentence due soonest, not the one asked for
    first: a reply that opened with seven words of audio can wait for one that opened
    with one word."""
    engines = {
        "Hold": FakeEngine(["Wait.", " Held here."]),
        "Long": FakeEngine(["Seven long words make up this opening.", " Long next."]),
        "Short": FakeEngine(["Hi.", " Short next."]),
    }
    held = make_turn(cast(Any, ByQuestion(engines)))
    held.tts.hold_text = "Held here."
    held.tts.ms_of = lambda text: 50 * len(text)  # "Hi." 150 ms, the seven words 1.9 s
    turns = [Turn(held.rt, held.engine, held.asr, held.tts) for _ in range(2)]
    later = held.rt.worker(WorkerKind.TTS_LATER)
    tasks = []
    for turn in (held, *turns):
        turn.released.set()
    try:
        tasks.append(held.start(text="Hold"))
        await asyncio.wait_for(asyncio.to_thread(held.tts.holding.wait, 5), 6)
        for turn, question in zip(turns, ("Long", "Short"), strict=True):
            waiting = later.pending + 1
            tasks.append(turn.start(text=question))
            # its second sentence waits behind the held one (the worker has no event
            # for a job queued: polled)
            async with asyncio.timeout(5):
                while later.pending < waiting:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
    finally:
        held.tts.hold_until.set()
    await asyncio.gather(*tasks)
    spoken = [t for t in held.tts.texts if t.endswith("next.")]
    assert spoken == ["Short next.", "Long next."]  # asked for second, due first


async def test_a_typed_turn_has_no_transcript_and_the_engine_gets_the_history(
    make_turn: Any,
) -> None:
    history = (
        ChatMessage("user", "My name is Ada."),
        ChatMessage("assistant", "Nice to meet you, Ada."),
    )
    turn = make_turn(FakeEngine(["You are Ada."]))
    turn.released.set()
    await turn.start(text="What is my name?", history=history)
    assert turn.engine.calls == [((*history, ChatMessage("user", "What is my name?")), 33)]
    assert turn.asr.calls == [] and turn.of(FinalTranscript) == []
    assert [s.text for s in turn.of(ReplySentence)] == ["You are Ada."]


async def test_a_spoken_turn_sends_the_transcript_to_the_engine_after_the_history(
    make_turn: Any,
) -> None:
    history = (ChatMessage("user", "Hi."), ChatMessage("assistant", "Hello!"))
    turn = make_turn(FakeEngine(["Rome."]), transcript="And Italy?")
    turn.released.set()
    await turn.start(audio=QUESTION_AUDIO, history=history)
    assert turn.engine.calls == [((*history, ChatMessage("user", "And Italy?")), 33)]


async def test_a_turn_without_input_answers_the_history_as_it_stands(make_turn: Any) -> None:
    history = (ChatMessage("system", "Be brief."), ChatMessage("user", "Capital of Italy?"))
    turn = make_turn(FakeEngine(["Rome."]))
    turn.released.set()
    await turn.start(history=history)
    assert turn.engine.calls == [(history, 33)]
    assert [s.text for s in turn.of(ReplySentence)] == ["Rome."]


async def test_a_text_only_turn_writes_sentences_and_synthesizes_nothing(make_turn: Any) -> None:
    turn = make_turn(FakeEngine(REPLY))
    turn.released.set()
    await turn.start(text="Capital of Italy?", speak=False)
    assert [s.text for s in turn.of(ReplySentence)] == SENTENCES
    assert turn.tts.texts == [] and turn.frames == []
    assert isinstance(turn.events[-1], ReplyFinished)


@pytest.mark.parametrize("transcript", ["", "   "])
async def test_an_empty_transcript_finishes_without_calling_the_engine(
    make_turn: Any, transcript: str
) -> None:
    turn = make_turn(FakeEngine(["Never said."]), transcript=transcript)
    turn.released.set()
    await turn.start(audio=QUESTION_AUDIO)
    assert [type(e) for e in turn.events] == [FinalTranscript, ReplyFinished]
    assert turn.events[0].text == transcript
    assert turn.events[1] == ReplyFinished(TURN, None, None)
    assert turn.engine.calls == [] and turn.tts.texts == []


async def test_a_transcribe_only_turn_hears_and_answers_nothing(make_turn: Any) -> None:
    turn = make_turn(FakeEngine(["Never said."]))
    turn.released.set()
    await turn.start(audio=QUESTION_AUDIO, reply=False)
    assert [type(e) for e in turn.events] == [FinalTranscript, ReplyFinished]
    assert turn.events[0].text == "What is the capital of Italy?"
    assert turn.engine.calls == [] and turn.tts.texts == []


async def test_an_untrusted_transcript_is_answered_without_tools(make_turn: Any) -> None:
    """A transcript whose decode looped (Transcript.trusted False) reaches the session
    as such, and its reply is offered no tools: it can answer, never act."""
    for trusted in (True, False):
        turn = make_turn(FakeEngine(["Okay."]), transcript="Set a timer for five minutes.")
        turn.asr.trusted = trusted
        turn.released.set()
        await turn.start(audio=QUESTION_AUDIO, tools=DEFAULT_TOOLS)
        assert turn.of(FinalTranscript)[0].trusted is trusted
        assert turn.engine.tools == [DEFAULT_TOOLS if trusted else ()]
        assert [s.text for s in turn.of(ReplySentence)] == ["Okay."]


async def test_words_that_tell_rather_than_ask_are_offered_no_default_tool(
    make_turn: Any,
) -> None:
    """A report or an opinion ("The lights in this city are beautiful.") gets a chat
    reply: the default tools are not offered, so nothing can act (model.ask.statement);
    a request is offered them as before."""
    for text, offered in (
        ("The lights in this city are beautiful.", ()),
        ("Turn on the lights.", DEFAULT_TOOLS),
    ):
        turn = make_turn(FakeEngine(["They are."]))
        turn.released.set()
        await turn.start(text=text, tools=DEFAULT_TOOLS)
        assert turn.engine.tools == [offered]
        assert [s.text for s in turn.of(ReplySentence)] == ["They are."]


MESSAGE = ToolCall("message.send", {"to": "my sister", "text": "I'm running late"}, passes=3)
SISTER = ToolCall("call.start", {"contact": "my sister"})


async def test_a_call_that_needs_confirmation_is_asked_about_instead(make_turn: Any) -> None:
    """The call goes to the session (which keeps it to ask about); the question is
    said in place of the model's confirmation, whose stream is closed."""
    engine = FakeEngine([MESSAGE, "Sending it now. ", "Done."])
    turn = make_turn(engine)
    turn.released.set()
    await turn.start(text="Text my sister that I'm running late.", tools=DEFAULT_TOOLS)
    question = "Send 'I'm running late' to your sister?"
    assert turn.of(ReplyAction) == [ReplyAction(TURN, MESSAGE)]
    # said in phrases, as any first sentence is (server/speech.py)
    assert " ".join(s.text for s in turn.of(ReplySentence)) == question
    assert " ".join(turn.tts.texts) == question and turn.frames
    assert engine.ended_by == "GeneratorExit"
    assert turn.of(ReplyFinished)[0].stats.stopped_by == "cancel"


async def test_her_after_call_my_sister_is_the_sister(make_turn: Any) -> None:
    """A reference resolves against the calls the conversation kept, and against the
    call asked about that the user's words did not answer."""
    her = ToolCall("message.send", {"to": "her instead", "text": "I'm running late"}, passes=3)
    made = kept_reply(render_call(DEFAULT_TOOLS[7], SISTER.arguments), "Calling your sister.")
    history = (ChatMessage("user", "Call my sister."), ChatMessage("assistant", made))
    text = "Actually, text her instead that I'm running late."
    for earlier in ({"history": history}, {"pending": SISTER}):
        turn = make_turn(FakeEngine([her, "Texting her instead."]))
        turn.released.set()
        await turn.start(text=text, tools=DEFAULT_TOOLS, **earlier)
        assert turn.of(ReplyAction) == [ReplyAction(TURN, MESSAGE)], earlier
        said = " ".join(s.text for s in turn.of(ReplySentence))
        assert said == "Send 'I'm running late' to your sister?"


async def test_a_reference_nothing_resolves_is_asked_about_and_not_made(make_turn: Any) -> None:
    her = ToolCall("message.send", {"to": "her", "text": "I'm running late"})
    turn = make_turn(FakeEngine([her, "Texting her."]))
    turn.released.set()
    await turn.start(text="Text her that I'm running late.", tools=DEFAULT_TOOLS)
    # the session keeps the call without whom it is for, to ask about
    incomplete = ToolCall("message.send", {"text": "I'm running late"})
    assert turn.of(ReplyAction) == [ReplyAction(TURN, incomplete)]
    assert [s.text for s in turn.of(ReplySentence)] == ["Who should I send it to?"]


@pytest.mark.parametrize(
    ("said", "answer"),
    [
        ("Yes, please.", "Sending your sister your message: I'm running late."),
        ("No.", "Okay, I won't."),
    ],
)
async def test_a_yes_or_no_is_answered_without_the_reply_model(
    make_turn: Any, said: str, answer: str
) -> None:
    """The session makes the call on a yes; the pipeline says its template (or drops
    it on a no) and delivers no call of its own."""
    turn = make_turn(FakeEngine(["Never said."]), transcript=said)
    turn.released.set()
    await turn.start(audio=QUESTION_AUDIO, tools=DEFAULT_TOOLS, pending=MESSAGE)
    assert turn.engine.calls == [] and turn.of(ReplyAction) == []
    assert " ".join(s.text for s in turn.of(ReplySentence)) == answer
    assert " ".join(turn.tts.texts) == answer


async def test_a_requested_reply_reads_the_last_user_words_as_the_answer(make_turn: Any) -> None:
    turn = make_turn(FakeEngine(["Never said."]))
    turn.released.set()
    history = (ChatMessage("assistant", "Call your sister?"), ChatMessage("user", "Yes."))
    await turn.start(history=history, tools=DEFAULT_TOOLS, pending=SISTER)
    assert turn.engine.calls == []
    assert " ".join(s.text for s in turn.of(ReplySentence)) == "Calling your sister."


async def test_other_words_or_an_untrusted_yes_go_to_the_reply_model(make_turn: Any) -> None:
    for said, trusted in (("How many legs does a spider have?", True), ("Yes.", False)):
        turn = make_turn(FakeEngine(["Eight."]), transcript=said)
        turn.asr.trusted = trusted
        turn.released.set()
        await turn.start(audio=QUESTION_AUDIO, tools=DEFAULT_TOOLS, pending=MESSAGE)
        assert len(turn.engine.calls) == 1, said
        assert [s.text for s in turn.of(ReplySentence)] == ["Eight."]


@pytest.mark.parametrize(("asked", "budget"), [(None, 33), (7, 7), (500, 33)])
async def test_a_reply_budget_is_at_most_the_servers(
    make_turn: Any, asked: int | None, budget: int
) -> None:
    turn = make_turn(FakeEngine(["Rome."]))
    turn.released.set()
    await turn.start(text="Capital of Italy?", max_tokens=asked)
    assert [n for _, n in turn.engine.calls] == [budget]


# --- the release ---------------------------------------------------------------------


async def test_no_audio_is_delivered_before_the_turn_is_released(make_turn: Any) -> None:
    turn = make_turn(FakeEngine(REPLY))
    task = turn.start(audio=QUESTION_AUDIO)
    await turn.engine.closed.wait()  # the whole reply written and synthesized
    await settle()
    assert turn.engine.ended_by == "end" and turn.tts.texts == SENTENCES
    assert [type(e) for e in turn.events] == [FinalTranscript] + [ReplySentence] * 4
    assert not task.done()  # its audio waits for the release

    turn.released.set()
    await task
    assert [f.sentence for f in turn.frames] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert isinstance(turn.events[-1], ReplyFinished)


async def test_an_unreleased_turn_cancelled_never_sends_audio(make_turn: Any) -> None:
    turn = make_turn(FakeEngine(REPLY))
    task = turn.start(text="Hi")
    await turn.engine.closed.wait()
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    turn.released.set()
    await settle()
    assert turn.frames == [] and turn.of(ReplyFinished) == []


# --- pacing --------------------------------------------------------------------------


async def test_audio_runs_ahead_of_real_time_by_at_most_the_lead(make_turn: Any) -> None:
    """With the clock stopped, sending stops once it is lead_ms ahead; each frame_ms
    the clock then moves lets exactly one more frame go."""
    pacing = Pacing(frame_ms=125, lead_ms=250)  # 1/8 s frames: the sums stay exact
    turn = make_turn(FakeEngine(["Once upon a time."]), tts_ms=1000)  # 8 frames
    turn.released.set()
    with frozen_clock(asyncio.get_running_loop()) as clock:
        task = turn.start(text="A story, please.", pacing=pacing)
        await turn.frame_count(1)
        t0 = clock[0]
        await settle()
        # frames 0, 1, 2: 0 ms, 125 ms and 250 ms of audio already sent, none more
        # than the 250 ms lead ahead of the clock; frame 3 waits
        assert len(turn.frames) == 3

        sent_at = [t0] * 3
        for n in range(4, 9):
            clock[0] += 0.0625  # half a frame: not yet
            await settle()
            assert len(turn.frames) == n - 1
            clock[0] += 0.0625
            await turn.frame_count(n)
            await settle()
            assert len(turn.frames) == n
            sent_at.append(clock[0])
        await task
    assert [t - t0 for t in sent_at] == [0, 0, 0, 0.125, 0.25, 0.375, 0.5, 0.625]
    assert [len(f.pcm) for f in turn.frames] == [4000] * 8
    assert isinstance(turn.events[-1], ReplyFinished)


async def test_the_pacing_clock_starts_at_the_first_frame(make_turn: Any) -> None:
    """Time spent before the first frame (synthesizing the first sentence, waiting for
    the release) is not credit: the first frame starts the lead from zero."""
    pacing = Pacing(frame_ms=125, lead_ms=250)
    turn = make_turn(FakeEngine(["Once upon a time."]), tts_ms=1000)
    turn.tts.go.clear()
    with frozen_clock(asyncio.get_running_loop()) as clock:
        task = turn.start(text="A story, please.", pacing=pacing)
        await turn.tts.started.wait()
        clock[0] += 5.0  # unreleased, the voice at work
        turn.released.set()
        await settle()
        clock[0] += 5.0  # released, the voice still at work
        turn.tts.go.set()
        await turn.frame_count(1)
        await settle()
        assert len(turn.frames) == 3
        clock[0] += 10.0
        await task
    assert len(turn.frames) == 8


# --- cancellation and failure ------------------------------------------------------------


async def test_cancelling_while_the_model_writes_closes_its_stream_and_stops_audio(
    make_turn: Any,
) -> None:
    engine = FakeEngine(["First sentence here. ", "And then", " more."], block_after=1)
    turn = make_turn(engine, tts_ms=1000)
    turn.released.set()
    with frozen_clock(asyncio.get_running_loop()) as clock:
        task = turn.start(text="Go on.", pacing=Pacing(frame_ms=100, lead_ms=200))
        await engine.blocked.wait()
        await turn.frame_count(1)
        await settle()
        assert len(turn.frames) == 3  # the lead's worth; the clock is stopped
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.closed.is_set() and engine.ended_by == "CancelledError"
        clock[0] += 60.0  # the audio's pace would allow all of it now
        engine.unblock.set()
        await settle()
    assert len(turn.frames) == 3
    assert [type(e) for e in turn.events] == [ReplySentence] + [ReplyAudio] * 3


async def test_cancelling_during_speech_synthesis_closes_the_reply_stream(
    make_turn: Any,
) -> None:
    """Cancelled while Piper works on a sentence, the turn is not inside the engine's
    stream; the stream must still be closed so the model stops writing."""
    engine = FakeEngine(["One. ", "Two. ", "Three."])
    turn = make_turn(engine)
    turn.tts.go.clear()
    turn.released.set()
    task = turn.start(text="Count.")
    await turn.tts.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(engine.closed.wait(), 10)
    assert engine.ended_by == "GeneratorExit"
    turn.tts.go.set()
    await settle()
    assert turn.frames == [] and turn.tts.texts == ["One."]
    assert [type(e) for e in turn.events] == [ReplySentence]


async def test_a_failing_engine_delivers_turn_failed_and_ends_the_turn(make_turn: Any) -> None:
    engine = FakeEngine(["Half a sentence. ", "and then"], fail=RuntimeError("model broke"))
    turn = make_turn(engine)
    turn.released.set()
    await turn.start(text="Hi")  # returns: the failure is reported, not raised
    # the error itself, not the TaskGroup's ExceptionGroup around it
    assert turn.events[-1] == TurnFailed(TURN, "RuntimeError: model broke")
    assert turn.of(ReplyFinished) == [] and len(turn.of(TurnFailed)) == 1
    assert [s.text for s in turn.of(ReplySentence)] == ["Half a sentence."]
    assert engine.ended_by == "RuntimeError"


async def test_a_failing_voice_delivers_turn_failed(make_turn: Any) -> None:
    turn = make_turn(FakeEngine(["Hello."]))

    def broken(text: str, lean: bool = False) -> Iterator[np.ndarray]:
        raise OSError("no voice")
        yield np.zeros(0, np.int16)

    turn.tts.synthesize = broken
    turn.released.set()
    await turn.start(text="Hi")
    assert turn.events[-1] == TurnFailed(TURN, "OSError: no voice")
    assert turn.frames == [] and turn.of(ReplyFinished) == []


# --- speech first ----------------------------------------------------------------------


async def test_only_the_first_sentence_is_synthesized_with_the_model_held(
    make_turn: Any,
) -> None:
    turn = make_turn(FakeEngine(REPLY))
    turn.released.set()
    await turn.start(text="Tell me about Rome.")
    assert turn.tts.texts == SENTENCES
    assert turn.tts.held == [True, False, False, False]
    assert not turn.rt.speech_first.holding


async def test_the_model_runs_in_lockstep_until_the_first_phrase_is_synthesized(
    make_turn: Any,
) -> None:
    """Piper's first phrase must not share the CPU with a pass already in flight: the
    engine writes in lockstep (no pass before the consumer took the last piece) until
    the first phrase's audio is made, then runs ahead."""
    turn = make_turn(FakeEngine(REPLY))
    turn.released.set()
    await turn.start(text="Tell me about Rome.")
    # "The capital" and " of Italy is Rome." are written before the first phrase exists
    assert turn.engine.free == [False, False, True, True, True]


async def test_a_text_only_turn_never_holds_the_model_in_lockstep(make_turn: Any) -> None:
    turn = make_turn(FakeEngine(REPLY))
    turn.released.set()
    await turn.start(text="Tell me about Rome.", speak=False)
    assert turn.engine.free == [True] * len(REPLY)


TIMER = ToolCall("timer.set", {"seconds": 600}, passes=3, margin=12.0)


@pytest.mark.parametrize(
    ("avg_logprob", "no_speech_prob", "acts"),
    [(-0.2, 0.01, True), (-1.3, 0.01, False), (-0.2, 0.75, False)],
)
async def test_a_low_confidence_transcript_does_not_act(
    make_turn: Any, avg_logprob: float, no_speech_prob: float, acts: bool
) -> None:
    """Whisper's figures go to the session with the words; below the bars (a decode
    faster-whisper deems failed, or likely no speech) the call is not made and the
    user hears that they were not caught, not the model's confirmation."""
    turn = make_turn(
        FakeEngine([TIMER, "Timer set for ten minutes."]), "Set a timer for ten minutes."
    )
    turn.asr.avg_logprob, turn.asr.no_speech_prob = avg_logprob, no_speech_prob
    turn.released.set()
    await turn.start(audio=QUESTION_AUDIO, tools=DEFAULT_TOOLS)
    (final,) = turn.of(FinalTranscript)
    assert (final.avg_logprob, final.no_speech_prob) == (avg_logprob, no_speech_prob)
    assert turn.of(ReplyAction) == ([ReplyAction(TURN, TIMER)] if acts else [])
    said = " ".join(s.text for s in turn.of(ReplySentence))
    assert said == ("Timer set for ten minutes." if acts else NOT_CAUGHT)


@pytest.mark.parametrize(
    ("heard_again", "acts"),
    [
        ("Set a timer for 10 minutes!", True),  # the same words ("10" is "ten")
        ("Uh, set the timer for ten minutes.", True),  # alike: the same number
        ("Set a timer for two minutes.", False),
        ("", False),
    ],
)
async def test_a_call_is_made_on_words_a_second_hearing_hears_too(
    make_turn: Any, heard_again: str, acts: bool
) -> None:
    """A call that would be made without asking waits for a second Whisper model to
    hear the turn (--asr-check): words alike (model.ask.heard_alike), and it is made;
    others, and it is asked about, as the router's doubt is (the session keeps it for
    a yes). The second hearing goes through the runtime's batcher of second hearings
    (counted for /stats), behind the waiting finals."""
    engine = FakeEngine([TIMER, "Timer set for ten minutes."])
    turn = make_turn(engine, "Set a timer for ten minutes.")
    again = FakeAsr(heard_again)
    turn.rt.asr_check = cast(Any, again)
    turn.released.set()
    await turn.start(audio=QUESTION_AUDIO, tools=DEFAULT_TOOLS)
    assert len(again.calls) == 1 and again.calls[0] is turn.asr.calls[0]  # the same audio
    assert turn.rt.finals(again=True) == {"calls": 1, "turns": 1, "batched_calls": 0, "largest": 1}
    (action,) = turn.of(ReplyAction)
    assert action.call == TIMER and action.call.doubted is not acts
    said = " ".join(s.text for s in turn.of(ReplySentence))
    assert said == ("Timer set for ten minutes." if acts else "Set a timer for ten minutes?")
    assert asked(action.call, DEFAULT_TOOLS[0]) is not acts


@pytest.mark.parametrize(
    ("first", "heard_again", "again_logprob", "words"),
    [
        # heard word for word: the first hearing's words were said
        ("Set a timer for ten minutes.", "Set a timer for ten minutes.", -1.3, "first"),
        # other words the second model is sure of: its words are the turn's
        ("Set a time for tea.", "Set a timer for ten minutes.", -0.2, "again"),
        ("", "Set a timer for ten minutes.", -0.2, "again"),  # the first heard nothing
        # other words the second is unsure of too: nothing was caught
        ("Set a time for tea.", "Set a timer for ten minutes.", -1.3, None),
        ("Set a time for tea.", "", -0.2, None),
    ],
)
async def test_unsure_words_are_heard_again_and_the_surer_hearing_is_the_turns(
    make_turn: Any, first: str, heard_again: str, again_logprob: float, words: str | None
) -> None:
    """Words Whisper was unsure of (under the log-probability bar), or none, where a
    call could follow, are heard by the second model: words it hears alike were said
    (``heard_twice``) and are acted on; other words it is sure of replace them (the
    better model's hearing: the reply reads them, the session is told them with its
    figures), and a call on them is asked about, as one heard two ways (no third
    hearing); else the user is asked to say it again, or an empty turn stays
    unanswered."""
    engine = FakeEngine([TIMER, "Timer set for ten minutes."])
    turn = make_turn(engine, first)
    turn.asr.avg_logprob = -1.3
    again = FakeAsr(heard_again)
    again.avg_logprob = again_logprob
    turn.rt.asr_check = cast(Any, again)
    turn.released.set()
    await turn.start(audio=QUESTION_AUDIO, tools=DEFAULT_TOOLS)
    (final,) = turn.of(FinalTranscript)
    assert len(again.calls) == 1  # not heard a third time
    assert final.heard_twice is (words == "first")
    assert final.text == (heard_again if words == "again" else first)
    assert final.avg_logprob == (again_logprob if words == "again" else -1.3)
    calls = [a.call for a in turn.of(ReplyAction)]
    said = " ".join(s.text for s in turn.of(ReplySentence))
    if words == "first":  # made
        assert calls == [TIMER] and not calls[0].doubted
        assert said == "Timer set for ten minutes."
    elif words == "again":  # asked about: the session keeps it for a yes
        assert calls == [TIMER] and calls[0].doubted
        assert said == "Set a timer for ten minutes?"
    else:
        assert calls == [] and said == (NOT_CAUGHT if first else "")
    if words is not None:
        assert engine.calls[0][0][-1].content == final.text  # the reply reads the turn's words


async def test_unsure_words_nothing_could_act_on_are_not_heard_again(make_turn: Any) -> None:
    """With no tools offered and no question pending, being sure decides nothing: the
    turn is answered without waiting for a second hearing."""
    turn = make_turn(FakeEngine(["Paris."]), "What is the capital of France?")
    turn.asr.avg_logprob = -1.3
    again = FakeAsr("What is the capital of France?")
    turn.rt.asr_check = cast(Any, again)
    turn.released.set()
    await turn.start(audio=QUESTION_AUDIO)
    assert again.calls == [] and not turn.of(FinalTranscript)[0].heard_twice
    assert " ".join(s.text for s in turn.of(ReplySentence)) == "Paris."


async def test_typed_words_and_calls_asked_about_anyway_are_not_heard_again(
    make_turn: Any,
) -> None:
    """Only a call about to be made on heard words waits for the second hearing: typed
    words were not heard, and a message is asked about whatever was heard."""
    for start in ({"text": "Set a timer for ten minutes."}, {"audio": QUESTION_AUDIO}):
        call = TIMER if "text" in start else ToolCall("message.send", {"to": "Sam", "text": "hi"})
        turn = make_turn(FakeEngine([call, "Okay."]), "Text Sam hi.")
        again = FakeAsr("something else")
        turn.rt.asr_check = cast(Any, again)
        turn.released.set()
        await turn.start(tools=DEFAULT_TOOLS, **start)
        assert again.calls == []
        assert [a.call.doubted for a in turn.of(ReplyAction)] == [False]


async def test_a_call_the_router_was_unsure_of_is_asked_about(make_turn: Any) -> None:
    """Typed words have no ASR figures: the router's margin alone decides."""
    unsure = ToolCall("timer.set", {"seconds": 600}, margin=1.2)
    engine = FakeEngine([unsure, "Timer set for ten minutes."])
    turn = make_turn(engine)
    turn.released.set()
    await turn.start(text="Ten minutes.", tools=DEFAULT_TOOLS)
    assert turn.of(ReplyAction) == [ReplyAction(TURN, unsure)]  # the session keeps it
    assert " ".join(s.text for s in turn.of(ReplySentence)) == "Set a timer for ten minutes?"
    assert engine.ended_by == "GeneratorExit"


async def test_a_ty_the_range_refuses_is_asked_about_as_its_teen(make_turn: Any) -> None:
    """ "bring the cabin to sixteen degrees" heard "... to 60 degrees" (model.ask.teen_twin):
    the decoder clamped 60 to the cabin's 32."""
    engine = FakeEngine([ToolCall("climate.set", {"temperature_c": 32}), "Okay."])
    turn = make_turn(engine)
    turn.released.set()
    await turn.start(text="Bring the cabinet to 60 degrees now.", tools=DEFAULT_TOOLS)
    (action,) = turn.of(ReplyAction)
    assert action.call.arguments == {"temperature_c": 16} and action.call.doubted
    said = " ".join(s.text for s in turn.of(ReplySentence))
    assert said == "Set the temperature to sixteen degrees?"


@pytest.mark.parametrize(("place", "made"), [("my boss", False), ("the dentist", True)])
async def test_directions_to_a_person_are_asked_about(
    make_turn: Any, place: str, made: bool
) -> None:
    """ "place a call to my boss" heard "place a portal to my boss" was
    ``navigation.start {destination: "my boss"}`` (model.ask.unplaced)."""
    call = ToolCall("navigation.start", {"destination": place}, margin=30.0)
    engine = FakeEngine([call, f"Starting directions to {place}."])
    turn = make_turn(engine)
    turn.released.set()
    await turn.start(text=f"I want you to place a portal to {place} now.", tools=DEFAULT_TOOLS)
    (action,) = turn.of(ReplyAction)
    assert action.call.doubted is not made
    said = " ".join(s.text for s in turn.of(ReplySentence))
    assert said == (
        f"Starting directions to {place}." if made else "Start directions to your boss?"
    )


@pytest.mark.parametrize(
    ("text", "call"),
    [
        ("Read me my last message.", {"to": "me", "text": "my last message"}),
        ("Translate thank you into Spanish.", {"to": "you", "text": "thank you into Spanish"}),
        ("Read my messages.", {"to": "my messages", "text": "Read my messages"}),
        ("Okay, that's all for now.", None),  # media.next: nothing in it says so
    ],
)
async def test_a_request_no_tool_does_is_refused_not_sent_to_the_nearest_tool(
    make_turn: Any, text: str, call: dict[str, str] | None
) -> None:
    """What the served engine made of these lines (model.ask.outside)."""
    nearest = ToolCall("media.next") if call is None else ToolCall("message.send", call)
    engine = FakeEngine([nearest, "Sending it."])
    turn = make_turn(engine)
    turn.released.set()
    await turn.start(text=text, tools=DEFAULT_TOOLS)
    assert turn.of(ReplyAction) == []
    assert " ".join(s.text for s in turn.of(ReplySentence)) == CANT
    assert " ".join(turn.tts.texts) == CANT


@pytest.mark.parametrize(
    ("said", "answer"),
    [("My sister.", "Call your sister?"), ("How many legs does a spider have?", "Eight.")],
)
async def test_a_name_answered_to_who_should_i_call_is_the_call_s_contact(
    make_turn: Any, said: str, answer: str
) -> None:
    """Its tool is asked about, so the completed call is asked about in turn (the
    session keeps it); words that are no name go to the reply model."""
    engine = FakeEngine(["Eight."])
    turn = make_turn(engine, transcript=said)
    turn.released.set()
    await turn.start(audio=QUESTION_AUDIO, tools=DEFAULT_TOOLS, pending=ToolCall("call.start"))
    assert " ".join(s.text for s in turn.of(ReplySentence)) == answer
    assert (engine.calls == []) is (said == "My sister.")


async def test_a_low_confidence_answer_leaves_the_question_standing(make_turn: Any) -> None:
    turn = make_turn(FakeEngine(["Never said."]), transcript="Yes.")
    turn.asr.avg_logprob = -1.4
    turn.released.set()
    await turn.start(audio=QUESTION_AUDIO, tools=DEFAULT_TOOLS, pending=MESSAGE)
    assert turn.engine.calls == [] and turn.of(ReplyAction) == []
    assert " ".join(s.text for s in turn.of(ReplySentence)) == NOT_CAUGHT


async def test_a_requested_reply_the_session_says_was_heard_unsurely_does_not_act(
    make_turn: Any,
) -> None:
    engine = FakeEngine([TIMER, "Timer set for ten minutes."])
    turn = make_turn(engine)
    turn.released.set()
    history = (ChatMessage("user", "Set a timer for ten minutes."),)
    await turn.start(history=history, tools=DEFAULT_TOOLS, sure=False)
    assert turn.of(ReplyAction) == []
    assert " ".join(s.text for s in turn.of(ReplySentence)) == NOT_CAUGHT


@pytest.mark.parametrize(
    ("pieces", "tools", "said"),
    [
        (["I'll add milk ", "to my shopping ", "list."], DEFAULT_TOOLS, CANT),
        (["I'll add milk ", "to my shopping ", "list."], (), "I'll add milk to my shopping list."),
        (["The capital ", "of Italy is Rome."], DEFAULT_TOOLS, "The capital of Italy is Rome."),
        (["Okay."], DEFAULT_TOOLS, "Okay."),
    ],
)
async def test_a_reply_that_claims_what_no_call_did_is_a_refusal(
    make_turn: Any, pieces: list[str], tools: tuple[Tool, ...], said: str
) -> None:
    """Where tools were offered and none was called (model.ask.claims)."""
    turn = make_turn(FakeEngine(pieces))
    turn.released.set()
    await turn.start(text="Add milk to my shopping list.", tools=tools)
    assert turn.of(ReplyAction) == []
    assert " ".join(s.text for s in turn.of(ReplySentence)) == said


WEATHER_TOOL = Tool("weather.get", "Get the weather forecast for a place.")
REMIND = ToolCall("reminder.create", {"text": "check the weather", "when": "tomorrow"})


@pytest.mark.parametrize(
    ("text", "pieces", "tools", "said"),
    [
        (
            "What's the temperature outside?",
            ["The temperature outside ", "is 100 degrees."],
            DEFAULT_TOOLS,
            "Sorry, I can't check the weather from here.",
        ),
        ("What time is it?", ["It's 2:30 AM."], (), "Sorry, I can't check the time from here."),
        (
            "What's the weather like tomorrow?",
            ["Let me check."],
            (*DEFAULT_TOOLS, WEATHER_TOOL),
            "Let me check.",
        ),
        ("Why does it rain?", ["Clouds get heavy."], DEFAULT_TOOLS, "Clouds get heavy."),
    ],
)
async def test_live_information_no_tool_gives_is_not_made_up(
    make_turn: Any, text: str, pieces: list[str], tools: tuple[Tool, ...], said: str
) -> None:
    """A reply that calls nothing to a request for live information (model.live) is
    replaced by what cannot be checked, unless a tool offered gives it."""
    turn = make_turn(FakeEngine(pieces))
    turn.released.set()
    await turn.start(text=text, tools=tools)
    assert turn.of(ReplyAction) == []
    assert " ".join(s.text for s in turn.of(ReplySentence)) == said


async def test_a_call_on_words_about_live_information_is_still_made(make_turn: Any) -> None:
    """model.live replaces a reply that calls nothing, never a call."""
    turn = make_turn(FakeEngine([REMIND, "Okay, I'll remind you."]))
    turn.released.set()
    await turn.start(text="Remind me to check the weather tomorrow.", tools=DEFAULT_TOOLS)
    assert [a.call.name for a in turn.of(ReplyAction)] == ["reminder.create"]


def test_the_second_hearing_is_the_other_offline_model() -> None:
    """--asr-check auto: base beside tiny.en (the CPU), tiny.en beside base (a GPU);
    none beside a model directory of the user's, or when asked for none."""
    from server.runtime import check_model

    assert check_model("auto", "tiny.en") == "base"
    assert check_model("auto", "base") == "tiny.en"
    assert check_model("auto", "/models/whisper-small") is None
    assert check_model("none", "tiny.en") is None
    assert check_model("/models/whisper-small", "tiny.en") == "/models/whisper-small"


async def test_a_spoken_turn_s_final_is_heard_through_the_batcher(make_turn: Any) -> None:
    """The final transcript goes through the runtime's Hearings (counted for /stats);
    a typed turn hears nothing."""
    turn = make_turn(FakeEngine(REPLY))
    turn.released.set()
    await turn.start(text="Hello.")
    assert turn.rt.finals()["calls"] == 0
    await turn.start(audio=QUESTION_AUDIO)
    assert turn.rt.finals() == {"calls": 1, "turns": 1, "batched_calls": 0, "largest": 1}


async def test_the_next_turns_prompt_is_prefilled_in_the_background_until_stopped(
    make_turn: Any,
) -> None:
    """Runtime.warm_next runs the engine's warm in the warm worker's thread, its steps
    marked as nobody's to wait on (model.backend.in_background: a shared pass runs them
    alone, behind every reply), and hands it the stop flag the next turn sets."""
    turn = make_turn(FakeEngine(REPLY))
    seen: list[tuple[tuple[ChatMessage, ...], tuple[Tool, ...], bool, bool]] = []

    def warm(history: Any, tools: Any, should_stop: Callable[[], bool]) -> int:
        seen.append((tuple(history), tuple(tools), reply_rank() == BACKGROUND, should_stop()))
        return 7

    history = (ChatMessage("user", "Hi."), ChatMessage("assistant", "Hello."))
    stop = threading.Event()
    assert await turn.rt.warm_next(history, DEFAULT_TOOLS, stop) == 0  # no warm served
    turn.rt.warm = warm
    assert await turn.rt.warm_next(history, DEFAULT_TOOLS, stop) == 7
    stop.set()
    await turn.rt.warm_next(history, (), stop)
    assert seen == [(history, tuple(DEFAULT_TOOLS), True, False), (history, (), True, True)]
