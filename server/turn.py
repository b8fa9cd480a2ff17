"""The pipeline of one turn: final ASR -> reply model -> TTS -> paced audio.

A turn runs as one asyncio task. It reports everything it produces to the session as
events (through ``deliver``); the session decides what is sent. Audio waits for the
turn to be released (speculative turns are produced during the user's trailing silence
and may be thrown away) and is then paced at real time plus a small lead, so that a
barge-in stops the sound within that lead and the conversation can keep exactly the
part that was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from audio.asr import Transcript
from audio.resample import float32_to_pcm16, int16_to_float32, resample
from audio.speech import normalize_words
from model.ask import (
    CANT,
    DECLINED,
    NOT_CAUGHT,
    answer,
    asked,
    claims,
    earlier_calls,
    heard_alike,
    missing,
    named,
    offered,
    outside,
    resolve,
    unheard,
    unplaced,
    unsaid,
    untied,
)
from model.confirm import question, template, tool_named
from model.engine import ChatMessage, GenerationStats, ReplyChunk, ReplyEnd
from model.live import unavailable
from model.tools import Tool, ToolCall

from .runtime import Runtime, WorkerKind
from .session import (
    Event,
    FinalTranscript,
    ReplyAction,
    ReplyAudio,
    ReplyFinished,
    ReplySentence,
    StartTurn,
    TurnEndScored,
    TurnFailed,
)
from .speech import Sentence, sentences

log = logging.getLogger("quicksilver")

Deliver = Callable[[Event], Awaitable[None]]
T = TypeVar("T")


@dataclass(frozen=True)
class Pacing:
    frame_ms: int = 100  # size of one audio frame on the wire
    lead_ms: int = 500  # how far sending may run ahead of real time


@dataclass(frozen=True)
class _Chunk:
    sentence: int
    pcm: bytes  # PCM16 at the output rate
    tts_ms: float


def synthesize(rt: Runtime, text: str, out_rate: int, first: bool = False) -> bytes:
    """Blocking: one sentence to PCM16 at the client's rate. A reply's ``first``
    sentence is what the user is waiting for: the reply model pauses between its
    passes while it is synthesized (``rt.speech_first``, docs/latency.md "Speech first")."""
    with rt.speech_first.synthesizing() if first else contextlib.nullcontext():
        parts = [int16_to_float32(c) for c in rt.tts.synthesize(text, lean=rt.lean_speech(first))]
    audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return float32_to_pcm16(resample(audio, rt.tts.sample_rate, out_rate))


async def run_turn(
    rt: Runtime, start: StartTurn, released: asyncio.Event, deliver: Deliver, pacing: Pacing
) -> None:
    try:
        await _run(rt, start, released, deliver, pacing)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("turn %d failed", start.turn_id)
        await deliver(TurnFailed(start.turn_id, _describe(exc)))


def _describe(exc: BaseException) -> str:
    """What failed, for the client: the error itself, not the TaskGroup that carried it."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


async def _run(
    rt: Runtime, start: StartTurn, released: asyncio.Event, deliver: Deliver, pacing: Pacing
) -> None:
    loop = asyncio.get_running_loop()
    text, trusted, sure, twice = start.text or "", True, start.sure, False
    second = False  # the words are the second model's alone: a call on them is asked about
    if start.audio is not None:
        t0 = loop.time()
        with rt.producing():
            transcript = await rt.hear(start.audio)
            text = transcript.text
            asr_ms = _ms(t0, loop.time())
            sure = not unheard(transcript.avg_logprob, transcript.no_speech_prob)
            acts = bool(start.tools) or start.pending is not None  # what being sure decides
            if (not sure or not text.strip()) and acts and rt.asr_check and transcript.trusted:
                surer, twice = await _surer(rt, start.audio, transcript)
                second = surer is not transcript
                transcript, text = surer, surer.text
                sure = twice or not unheard(transcript.avg_logprob, transcript.no_speech_prob)
        await deliver(
            FinalTranscript(
                start.turn_id,
                text,
                asr_ms,
                transcript.avg_logprob,
                transcript.trusted,
                transcript.no_speech_prob,
                twice,
            )
        )
        if not transcript.trusted:  # a looped decode, de-duplicated: answered, not acted on
            start, trusted = replace(start, tools=()), False
        if not start.reply:  # heard, not answered (the client asks for a reply itself)
            await deliver(ReplyFinished(start.turn_id, None, None))
            return
    if start.audio is None and start.text is None:  # answer the history as it stands
        conversation = start.history
    elif text.strip():
        conversation = (*start.history, ChatMessage("user", text))
    else:
        await deliver(ReplyFinished(start.turn_id, None, None))
        return
    # the words that may answer a question: a requested reply's are the last user message
    last = conversation[-1] if conversation else None
    if start.audio is None and start.text is None and last is not None and last.role == "user":
        text = last.content
    check = None
    # no third hearing of words the second model heard already
    if start.audio is not None and rt.asr_check is not None and not (twice or second):
        check = functools.partial(_heard_again, rt, start.audio)
    heard = _Heard(text, _answer_said(start, text, trusted, sure), sure, check, second)
    if heard.said is None:  # words that tell rather than ask get a chat reply, no call
        start = replace(start, tools=offered(start.tools, text))
    chunks: asyncio.Queue[_Chunk | None] = asyncio.Queue()
    async with asyncio.TaskGroup() as tg:
        if start.audio is not None and not released.is_set():
            tg.create_task(_held(rt, _score_turn_end(rt, start.turn_id, text, deliver)))
        produced = tg.create_task(
            _held(rt, _produce(rt, start, conversation, heard, chunks, deliver))
        )
        tg.create_task(_send(start, released, chunks, deliver, pacing))
    stats, reply_ms = produced.result()
    await deliver(ReplyFinished(start.turn_id, stats, reply_ms))


async def _held(rt: Runtime, work: Awaitable[T]) -> T:
    """``work``, counted as a turn being produced (Runtime.producing: partial
    transcripts yield to it on a CPU host)."""
    with rt.producing():
        return await work


@dataclass(frozen=True)
class _Heard:
    """What the user's words decide of the reply before the reply model runs."""

    text: str  # the user's words the reply answers
    said: str | None  # what answers a question, said without the model
    sure: bool  # the ASR was sure enough of the words to act on them (model.ask.unheard)
    # the turn's words as a second model hears them (None: typed words, no second
    # hearing served, or the words already heard twice)
    check: Callable[[], Awaitable[str | None]] | None = None
    # the words are the second model's, which heard other words than the first: one
    # hearing, as a call heard two ways, so a call on them is asked about
    second_only: bool = False


async def _heard_again(rt: Runtime, audio: np.ndarray) -> str | None:
    """The turn's words as the second Whisper model (``rt.asr_check``) hears them; None
    when its decode looped. Two models rarely mishear a turn the same way, so a call is
    made on words both heard alike (model.ask.heard_alike), and asked about otherwise
    (docs/actions.md, "Heard twice")."""
    again = await _second_hearing(rt, audio)
    return again.text if again.trusted else None


async def _second_hearing(rt: Runtime, audio: np.ndarray) -> Transcript:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    again = await rt.hear_again(audio)
    log.info("heard again in %.0f ms: %r", _ms(t0, loop.time()), again.text)
    return again


async def _surer(rt: Runtime, audio: np.ndarray, first: Transcript) -> tuple[Transcript, bool]:
    """A turn that may act, whose words (or silence) the serving model was unsure of,
    heard again by the second model (``rt.asr_check``): the words both heard alike
    were said (returned with True: heard twice, acted on as sure ones are); where the
    second heard other words and is sure of them by the same bars (model.ask.unheard),
    its words are the turn's (the second model is the one that hears better: base beside
    tiny.en on a CPU): answered as heard, and a call on them asked about, as one heard
    two ways; else the first hearing stands, unsure ("Sorry, I didn't catch that.") or
    empty (no reply). docs/actions.md, "Heard twice"."""
    again = await _second_hearing(rt, audio)
    if not again.trusted or not again.text.strip():
        return first, False
    if first.text.strip() and normalize_words(again.text) == normalize_words(first.text):
        return first, True
    if unheard(again.avg_logprob, again.no_speech_prob):
        return first, False
    return again, False


def _answer_said(start: StartTurn, text: str, trusted: bool, sure: bool) -> str | None:
    """What is said to words that answer a question (the session reads them alike and
    makes the call on a yes): its template, or "Okay, I won't."; to a name answering
    "Who should I call?", the completed call's question (or template, for a tool not
    asked about); to words the ASR was unsure of, "Sorry, I didn't catch that." (the
    question stands); None for anything else, a turn the reply model answers."""
    pending = start.pending
    tool = tool_named(start.tools, pending.name) if pending is not None else None
    if pending is None or tool is None or not trusted:
        return None
    if not sure:
        return NOT_CAUGHT
    if missing(pending, tool) is not None:
        call = named(pending, tool, text)
        if call is None:
            return None
        return question(call) if asked(call, tool) else template(call)
    verdict = answer(text)
    if verdict == "yes":
        return template(pending)
    return DECLINED if verdict == "no" else None


async def _score_turn_end(rt: Runtime, turn_id: int, text: str, deliver: Deliver) -> None:
    """Score a paused turn's transcript beside its reply; a turn whose score fails (or
    never comes) waits the endpointer's silence as it would without a scorer."""
    if rt.turn_end is None:
        return
    try:
        probability = await rt.worker(WorkerKind.TURN_END).run(rt.turn_end.probability, text)
    except Exception:
        log.exception("end-of-turn score of turn %d failed", turn_id)
        return
    await deliver(TurnEndScored(turn_id, probability))


async def _produce(
    rt: Runtime,
    start: StartTurn,
    conversation: tuple[ChatMessage, ...],
    heard: _Heard,
    chunks: asyncio.Queue[_Chunk | None],
    deliver: Deliver,
) -> tuple[GenerationStats | None, float]:
    """Reply sentences -> TTS, first sentence first; the model keeps writing meanwhile.

    Until the first phrase is synthesized the model runs in lockstep with this loop:
    it starts no pass before the splitter has seen what it wrote, so the phrase's
    synthesis never shares the CPU with a pass already in flight (``rt.speech_first``)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    stats: GenerationStats | None = None
    pauses = rt.speech_first.reply(start.speak)
    playback = _Playback()
    try:
        budget = min(rt.max_reply_tokens, start.max_tokens or rt.max_reply_tokens)
        # No name holds the engine's stream: cancelled here (say, while Piper works), this
        # frame's traceback must not keep it alive, so that it is closed and the model
        # stops writing.
        # An answer to a question is said without asking the reply model.
        earlier = earlier_calls(start.history) + ([start.pending] if start.pending else [])
        async for chunk in sentences(
            _saying(heard.said)
            if heard.said is not None
            else _asking(
                rt.reply.stream(conversation, budget, start.tools, pauses),
                start.tools,
                earlier,
                heard,
            )
        ):
            match chunk:
                case ToolCall():
                    await deliver(ReplyAction(start.turn_id, chunk))
                case Sentence(text=text, index=index):
                    await deliver(ReplySentence(start.turn_id, index, text, _ms(t0, loop.time())))
                    if not start.speak:
                        continue
                    t1 = loop.time()
                    pcm = await _speak(rt, text, start.output_rate, playback.due())
                    playback.queued(pcm, start.output_rate, loop.time())
                    chunks.put_nowait(_Chunk(index, pcm, _ms(t1, loop.time())))
                    pauses.release()
                case ReplyEnd(stats=s):
                    stats = s
    finally:
        pauses.release()
        chunks.put_nowait(None)
    return stats, _ms(t0, loop.time())


@dataclass
class _Playback:
    """When a reply's audio so far runs out at the listener: from when its first
    sentence was ready (playback starts about then; a turn not yet released starts
    later, so this errs early), as long as the audio queued."""

    started: float | None = None
    audio_s: float = 0.0

    def queued(self, pcm: bytes, rate: int, now: float) -> None:
        if self.started is None:
            self.started = now
        self.audio_s += len(pcm) / 2 / rate

    def due(self) -> float | None:
        """When the next sentence must be playing; None for the first (no audio yet)."""
        return None if self.started is None else self.started + self.audio_s


async def _speak(rt: Runtime, text: str, out_rate: int, due: float | None) -> bytes:
    """One sentence through Piper. A reply's first (``due`` None) goes to the TTS
    thread, where a listener waits for it and nothing else is; a later one to the
    later-sentence thread, the one whose reply runs out of audio first going first: 8
    sessions answering at once queued up to 1.2 s of other replies' sentences ahead of
    one that was due (docs/latency.md, "Many replies at once")."""
    if due is None:
        return await rt.worker(WorkerKind.TTS).run(synthesize, rt, text, out_rate, True)
    call = functools.partial(synthesize, rt, text, out_rate)
    return await rt.worker(WorkerKind.TTS_LATER).ranked(due, call)


_CUT = GenerationStats(0, 0, "cancel")  # a reply the pipeline ended for the model


async def _saying(text: str) -> AsyncIterator[ReplyChunk]:
    yield text
    yield ReplyEnd(GenerationStats(0, 0, "end"))


async def _asking(
    reply: AsyncIterator[ReplyChunk],
    tools: Sequence[Tool],
    earlier: Sequence[ToolCall],
    heard: _Heard,
) -> AsyncIterator[ReplyChunk]:
    """The model's reply, with its call's references resolved against the earlier
    calls ("her" -> "my sister", model/ask.py). A call on words the ASR was not
    sure of is not made ("Sorry, I didn't catch that."), nor one that is the
    nearest tool to a request no tool does ("Sorry, I can't do that."); a call asked
    about (a tool marked ``confirm``, a router unsure to act, a reference no earlier
    call resolves, a session's own tool nothing in the words names: model.ask.untied)
    goes to the session to keep, and its question is said instead of
    the confirmation ("Call your sister?", "Who should I call?"). Each ends the
    model's reply: what it would have said confirms a call not made. A reply that
    calls nothing where tools were offered is held for its first words, and one that
    claims to do something (model.ask.claims) is "Sorry, I can't do that." instead, and
    one to a request for live information no tool gives (model.live: "What's the
    temperature outside?") says so ("Sorry, I can't check the weather from here.")."""
    held: str | None = "" if tools else None  # the opening, until it shows what it says
    first = True
    async for chunk in reply:
        calls_nothing = first and not isinstance(chunk, ToolCall)
        if calls_nothing and (cannot := unavailable(heard.text, tools)) is not None:
            yield cannot
            yield ReplyEnd(_CUT)
            return
        first = False
        if held is not None and isinstance(chunk, str):
            held += chunk
            if claims(held) is None:  # not enough words yet to tell
                continue
        if held is not None:  # the opening told, the reply's end, or a call
            if not isinstance(chunk, ToolCall) and claims(held):
                yield CANT
                yield ReplyEnd(_CUT)
                return
            opening, held = held, None
            if opening:
                yield opening
            if isinstance(chunk, str):
                continue
        tool = tool_named(tools, chunk.name) if isinstance(chunk, ToolCall) else None
        if not isinstance(chunk, ToolCall) or tool is None:
            yield chunk
            continue
        call = unsaid(resolve(chunk, tool, earlier), tool, heard.text)
        if not heard.sure or outside(call, tool, heard.text):
            yield NOT_CAUGHT if not heard.sure else CANT
            yield ReplyEnd(_CUT)
            return
        if heard.second_only or untied(call, tool, heard.text) or unplaced(call, tool):
            # heard two ways, nothing said names the session's own tool, or a place
            # that is a person: asked about
            call = replace(call, doubted=True)
        elif heard.check is not None and not asked(call, tool):
            again = await heard.check()
            if again is None or not heard_alike(call, tool, heard.text, again):
                call = replace(call, doubted=True)
        yield call
        if asked(call, tool):
            yield missing(call, tool) or question(call)
            yield ReplyEnd(_CUT)
            return


async def _send(
    start: StartTurn,
    released: asyncio.Event,
    chunks: asyncio.Queue[_Chunk | None],
    deliver: Deliver,
    pacing: Pacing,
) -> None:
    await released.wait()
    loop = asyncio.get_running_loop()
    frame_bytes = start.output_rate * pacing.frame_ms // 1000 * 2
    t_start: float | None = None
    sent_s = 0.0
    while (chunk := await chunks.get()) is not None:
        for i, off in enumerate(range(0, len(chunk.pcm), frame_bytes)):
            if t_start is None:
                t_start = loop.time()
            ahead = sent_s - (loop.time() - t_start) - pacing.lead_ms / 1000
            if ahead > 0:
                await asyncio.sleep(ahead)
            frame = chunk.pcm[off : off + frame_bytes]
            tts_ms = chunk.tts_ms if i == 0 else None
            await deliver(
                ReplyAudio(start.turn_id, chunk.sentence, frame, len(chunk.pcm) // 2, tts_ms)
            )
            sent_s += len(frame) / 2 / start.output_rate


def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1000, 1)
