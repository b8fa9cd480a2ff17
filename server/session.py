"""One voice session as a plain state machine: events in, effects out.

``Session.receive(event, now)`` takes a client message or an internal event (VAD
results, transcripts, reply sentences, audio chunks of a turn) with the current time,
and returns the effects to carry out: messages to send, jobs to start or cancel. It
does no I/O, starts no task and reads no clock, so every behaviour of the voice loop
is testable synchronously (see tests/server/test_session.py). The asyncio layer in
server/app.py only moves bytes and runs effects.

Turns. Every user turn has an id. When the user pauses, the final ASR and the reply
start *speculatively*; their messages are held back until the turn is final and thrown
away if the user goes on speaking. A turn is final once the endpointer's silence has
passed *and* its transcript is known: nothing could be sent before the transcript
anyway. How much silence it takes depends on what was said (server/turn_end.py,
docs/turn_end.md): a transcript the end-of-turn model scores complete is final after
200 ms, one that stops mid-sentence ("Add milk, eggs, and") is held open longer so half
a question is not answered, anything else waits the endpointer's end of turn. Once
released, a turn's audio is sent as it is produced; barge-in cancels it, and the
conversation keeps only the part sent as audio.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from typing import Literal

import numpy as np

from audio.endpoint import (
    EndOfTurn,
    EndpointConfig,
    Endpointer,
    EndpointEvent,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
)
from audio.resample import Quality, StreamResampler, pcm16_to_float32
from audio.ring import AudioRing
from model.ask import answer, missing, named, outside, unheard
from model.ask import asked as asked_about
from model.engine import ChatMessage, GenerationStats
from model.tools import (
    DEFAULT_TOOLS,
    Tool,
    ToolCall,
    ToolError,
    kept_reply,
    parse_tools,
    render_call,
)

from . import protocol as p
from .lifecycle import (
    AudioLedger,
    CallAdded,
    Lifecycle,
    ReplyEnded,
    ReplyStarted,
    SentenceAdded,
    TranscriptGrew,
    TurnClosed,
    TurnOpened,
    TurnWithdrawn,
    UserHeard,
    call_item,
    reply_item,
    user_item,
)
from .resume import ResumeStore
from .turn_end import Eagerness, TurnEndPolicy

SAMPLE_RATE = 16_000  # everything inside the session runs at 16 kHz
MAX_OPEN_CALLS = 16  # actions whose results are still taken (oldest forgotten first)
# An answered turn and speech that goes on with it are heard as one utterance when they
# span at most this (a long one would crowd Whisper's 30 s window).
MAX_CONTINUED_SPAN_S = 15.0


class State(Enum):
    IDLE = "idle"  # connected, waiting for the start message
    LISTENING = "listening"  # no released reply in flight
    THINKING = "thinking"  # turn final, reply released, no audio sent yet
    SPEAKING = "speaking"  # reply audio being sent
    CLOSED = "closed"


TRANSITIONS: dict[State, frozenset[State]] = {
    State.IDLE: frozenset({State.LISTENING, State.CLOSED}),
    State.LISTENING: frozenset({State.THINKING, State.CLOSED}),
    State.THINKING: frozenset({State.SPEAKING, State.LISTENING, State.CLOSED}),
    State.SPEAKING: frozenset({State.LISTENING, State.CLOSED}),
    State.CLOSED: frozenset(),
}


@dataclass(frozen=True)
class SessionConfig:
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    # Silence a paused turn needs, from its transcript and end-of-turn score
    # (docs/turn_end.md): the eagerness's policy around endpoint.end_of_turn_ms, unless
    # turn_end gives one outright.
    eagerness: Eagerness = "medium"
    turn_end: TurnEndPolicy | None = None
    partial_interval_ms: int = 700  # new speech between partial transcripts
    min_partial_speech_ms: int = 500
    ring_seconds: float = 40.0
    max_errors: int = 20  # protocol errors before the connection is closed
    # Conversation kept (user and assistant messages, oldest dropped first): the reply
    # model reads only its prompt budget of it, and a long session must not grow
    # without bound (docs/security.md, "Limits").
    max_history_messages: int = 40
    # `text` messages: a burst of text_burst, then one per 60 / text_per_minute s.
    text_per_minute: float = 20.0
    text_burst: int = 5
    # The tools of a session whose start names none (docs/protocol.md, "Actions"), when
    # its reply engine can call tools (Session's can_act)
    tools: tuple[Tool, ...] = DEFAULT_TOOLS

    @cached_property
    def end_of_turn(self) -> TurnEndPolicy:
        if self.turn_end is not None:
            return self.turn_end
        return TurnEndPolicy.from_eagerness(self.eagerness, self.endpoint.end_of_turn_ms)


# --- internal events (inputs besides client messages) ----------------------------


@dataclass(frozen=True)
class AudioBytes:
    """A binary frame from the client: PCM16 LE at the declared rate."""

    data: bytes


@dataclass(frozen=True)
class VadResult:
    """16 kHz audio after the VAD, with one probability per 512-sample frame."""

    samples: np.ndarray
    probs: np.ndarray


@dataclass(frozen=True)
class PartialTranscript:
    turn_id: int
    text: str | None  # None: the job was skipped (ASR busy)


@dataclass(frozen=True)
class FinalTranscript:
    turn_id: int
    text: str
    asr_ms: float
    avg_logprob: float | None = None  # the ASR's confidence in the words (audio turns)
    trusted: bool = True  # False: the ASR's decode looped (audio.asr.looks_looped)
    no_speech_prob: float | None = None  # the ASR's "this was not speech" (audio turns)
    # a second Whisper model heard the same words (server/turn.py, --asr-check): they
    # were said, however unsure the first was of them
    heard_twice: bool = False


@dataclass(frozen=True)
class TurnEndScored:
    """P(the user's turn is complete | its final transcript), server/turn_end.py."""

    turn_id: int
    probability: float


@dataclass(frozen=True)
class ReplySentence:
    turn_id: int
    index: int
    text: str
    elapsed_ms: float  # since the reply model started


@dataclass(frozen=True)
class ReplyAction:
    """The reply calls a tool (before its spoken confirmation)."""

    turn_id: int
    call: ToolCall


@dataclass(frozen=True)
class ReplyAudio:
    """A paced frame of reply audio at the output rate, ready to send."""

    turn_id: int
    sentence: int
    pcm: bytes
    sentence_samples: int  # whole sentence length, for barge-in truncation
    tts_ms: float | None  # synthesis time of this sentence (first frame only)


@dataclass(frozen=True)
class AudioWritten:
    """A frame of reply audio left for the client (the socket took it): what the
    conversation keeps of a cut-off reply counts only these."""

    turn_id: int
    sentence: int
    samples: int


@dataclass(frozen=True)
class Expired:
    """A server limit ended the session (idle before start, session length)."""

    code: int
    reason: str


@dataclass(frozen=True)
class ReplyFinished:
    turn_id: int
    stats: GenerationStats | None
    reply_ms: float | None


@dataclass(frozen=True)
class TurnFailed:
    turn_id: int
    message: str


@dataclass(frozen=True)
class Disconnected:
    pass


# --- requests a wire may make beside protocol v1's messages (Realtime makes them) ----
# Messages of the conversation are named by ids the session owns (server/lifecycle.py).


@dataclass(frozen=True)
class Configure:
    """How the session listens and answers from now on (Realtime's session.update)."""

    endpoint: EndpointConfig
    instructions: str | None = None  # the system prompt; None: the reply model's own
    speak: bool = True  # False: replies are text only, never synthesized
    eagerness: Eagerness | None = None  # the end-of-turn policy's; None: as configured
    input_rate: int | None = None  # audio from now on is at this rate (G.711: 8 kHz)
    output_rate: int | None = None  # replies from now on are synthesized at this rate
    respond: bool = True  # False: a spoken turn is transcribed, not answered
    max_tokens: int | None = None  # the reply token budget (at most the server's)
    interrupt: bool = True  # False: speech never cuts a reply; its turn waits for it
    tools: tuple[Tool, ...] | None = None  # what replies may call; None: as they are
    output_format: str | None = None  # the wire's label of its reply audio's format


@dataclass(frozen=True)
class UserText:
    """A user message that joins the conversation unanswered (conversation.item.create)."""

    text: str
    item_id: str | None = None  # its id in the conversation (None: the session names it)


@dataclass(frozen=True)
class Respond:
    """Answer now (response.create): the conversation as it stands, or after ``audio``,
    committed speech at 16 kHz to transcribe first."""

    audio: np.ndarray | None = None
    instructions: str | None = None  # this reply's system prompt instead of the session's
    speak: bool | None = None  # None: as the session is configured
    max_tokens: int | None = None  # None: the session's
    keep: bool = True  # False: out of band, the conversation keeps nothing of it
    history: tuple[ChatMessage, ...] | None = None  # answer these instead of the conversation
    unprompted: bool = False  # answer even with no user message waiting (an idle timeout)
    user_item: str | None = None  # the id ``audio``'s words get (the wire added the item)
    metadata: dict[str, str] | None = None  # the wire's labels, given back with the reply
    if_idle: bool = False  # only if nothing is heard or answered now (else: nothing happens)


@dataclass(frozen=True)
class ClearInput:
    """Forget the speech being heard and any turn started on it (input_audio_buffer.clear)."""


@dataclass(frozen=True)
class Amend:
    """Replace a message of the conversation, named by its id, or drop it (``new``
    None): conversation.item.truncate and .delete. An unknown id changes nothing."""

    item_id: str
    new: ChatMessage | None


Event = (
    p.ClientMessage
    | AudioBytes
    | VadResult
    | PartialTranscript
    | FinalTranscript
    | TurnEndScored
    | ReplySentence
    | ReplyAction
    | ReplyAudio
    | AudioWritten
    | ReplyFinished
    | TurnFailed
    | Expired
    | Disconnected
    | Configure
    | UserText
    | Respond
    | ClearInput
    | Amend
)


# --- effects ---------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    message: p.ServerMessage


@dataclass(frozen=True)
class SendAudio:
    turn_id: int
    seq: int
    pcm: bytes
    sentence: int = 0  # reported back with AudioWritten once the frame is written
    sentence_samples: int = 0  # the whole sentence's length at the output rate
    item_id: str = ""  # the assistant message the reply becomes
    output_format: str | None = None  # Configure's label of the audio's format


@dataclass(frozen=True)
class RunVad:
    """Run the VAD on these 16 kHz samples, then deliver a VadResult (in order)."""

    samples: np.ndarray


@dataclass(frozen=True)
class StartPartial:
    turn_id: int
    audio: np.ndarray


@dataclass(frozen=True)
class StartTurn:
    """Start a turn's pipeline: ASR (if audio), reply model, TTS, paced audio."""

    turn_id: int
    audio: np.ndarray | None
    text: str | None  # neither text nor audio: answer the history as it stands
    history: tuple[ChatMessage, ...]
    output_rate: int
    speak: bool = True  # False: the reply is text only
    tools: tuple[Tool, ...] = ()  # what the reply may call
    max_tokens: int | None = None  # None: the server's reply budget
    reply: bool = True  # False: transcribe the audio, answer nothing
    # A call the session asked about ("Send 'I'm running late' to your sister?") that
    # the user's words now answer: a yes makes it, a no drops it (model/ask.py)
    pending: ToolCall | None = None
    # False: a requested reply to words the ASR was unsure of (model.ask.unheard); an
    # audio turn's own words are weighed by the pipeline from its transcript
    sure: bool = True


@dataclass(frozen=True)
class WarmNext:
    """A reply is over and no turn runs: the conversation's next turn will start with
    this history and these tools, and its prompt may be prefilled while the user
    listens (``Runtime.warm_next``); the next StartTurn stops what is left of it."""

    history: tuple[ChatMessage, ...]
    tools: tuple[Tool, ...] = ()


@dataclass(frozen=True)
class ReleaseTurn:
    """The turn is final: its audio may be sent."""

    turn_id: int


@dataclass(frozen=True)
class CancelTurn:
    turn_id: int


@dataclass(frozen=True)
class Close:
    code: int
    reason: str


Effect = (
    Send
    | SendAudio
    | RunVad
    | StartPartial
    | StartTurn
    | WarmNext
    | ReleaseTurn
    | CancelTurn
    | Close
    | Lifecycle
)


# --- session state ---------------------------------------------------------------


@dataclass
class _Utterance:
    """The user speech being heard now."""

    turn_id: int
    start: int  # sample index in the 16 kHz input stream
    end: int | None = None  # set while paused
    end_time: float | None = None  # wall time of `end`
    ended: bool = False  # the endpointer's silence has passed; waiting to be final
    partial_in_flight: bool = False
    last_partial_at: int = 0
    partial: str = ""  # the partial transcript as far as it only grew


@dataclass
class _Shape:
    """How a turn is answered: as the session was configured when it began, or as the
    Respond that asked for it says."""

    speak: bool = True  # False: a text-only reply, complete once its text is sent
    instructions: str | None = None  # the system prompt of this reply
    max_tokens: int | None = None
    reply: bool = True  # False: transcribe only (Realtime's create_response false)
    keep: bool = True  # False: out of band, its reply is not remembered
    history: tuple[ChatMessage, ...] | None = None  # instead of the conversation
    output_format: str | None = None  # Configure's label of the reply audio's format
    metadata: dict[str, str] | None = None  # Respond's, for the wire
    requested: bool = False  # a Respond asked for it: its reply starts when released


@dataclass
class _Turn:
    """A reply in flight: speculative until released."""

    id: int
    speech_end_time: float  # end of user speech, or arrival of a text message
    utterance_start: int | None = None  # first sample of the user speech it answers
    released: bool = False
    speculative: bool = False  # started during the trailing silence
    shape: _Shape = field(default_factory=_Shape)
    transcript: str | None = None
    complete_p: float | None = None  # the end-of-turn score, once it is in
    asr_logprob: float | None = None  # how sure the ASR was of the transcript's words
    asr_trusted: bool = True  # False: the transcript looped; its reply acts on nothing
    asr_sure: bool = True  # False: too unsure of the words to act on (model.ask.unheard)
    end_of_turn: str | None = None  # the policy's tier when the turn was released
    user_committed: bool = False
    call: CallAdded | None = None  # the tool call the reply made
    asking: ToolCall | None = None  # the call its reply asks about instead of making it
    answers: ToolCall | None = None  # the call asked about that its words answer
    answer_words: str | None = None  # those words, for a requested reply (no transcript)
    action_text: str = ""  # that call as the conversation keeps it
    action_passes: int = 0
    results: list[ChatMessage] = field(default_factory=list)  # action_results meanwhile
    user_item: str | None = None  # the id its user words have in the conversation
    announced: bool = False  # the wire added the user item itself (Respond.user_item)
    speech_ms: int = 0  # how long its speech was
    started: bool = False  # its reply began (ReplyStarted was emitted)
    held: list[Effect] = field(default_factory=list)
    # Until the first audio frame goes out, the reply is not heard: its text waits for
    # that frame (nothing of an answer withdrawn before it is shown either), and its
    # first frames wait while the VAD hears what may be the user going on.
    unheard_text: list[Effect] = field(default_factory=list)
    waiting_audio: list[ReplyAudio] = field(default_factory=list)
    sentences: list[str] = field(default_factory=list)
    audio: AudioLedger = field(default_factory=lambda: AudioLedger(0))
    finished: ReplyFinished | None = None
    final_time: float | None = None
    asr_ms: float | None = None
    first_sentence_ms: float | None = None
    tts_first_ms: float | None = None
    first_audio_time: float | None = None


def _action(call: CallAdded) -> p.Action:
    """The v1 message of a tool call."""
    return p.Action(call.turn_id, call.call_id, call.name, call.arguments)


def _instructed(
    history: tuple[ChatMessage, ...], instructions: str | None
) -> tuple[ChatMessage, ...]:
    """A turn's history as the reply engines take it: the system prompt given (None: the
    engine's own) as a leading system message."""
    if instructions is None:
        return history
    return (ChatMessage("system", instructions), *history)


class Session:
    def __init__(
        self,
        session_id: str,
        config: SessionConfig,
        asr: str,
        engine: str,
        resume: ResumeStore | None = None,
        resume_token: str = "",
        can_act: bool = False,
        scored: bool = False,
    ) -> None:
        """``can_act``: the reply engine writes tool calls (its ``supports_tools``).
        ``scored``: paused turns get an end-of-turn score (``TurnEndScored``); until
        it is in, a turn the words do not hold waits as an unsure one."""
        self.id = session_id
        self.config = config
        self.state = State.IDLE
        self.conversation: list[ChatMessage] = []
        self._ids: list[str] = []  # the id of each message of the conversation
        self._next_item = 1
        self.output_format: str | None = None  # Configure's label of the reply audio
        self.resume_token = resume_token
        self._resume = resume
        self._now = 0.0
        self._names = (asr, engine)
        self._ring = AudioRing(int(config.ring_seconds * SAMPLE_RATE))
        self._endpointer = Endpointer(config.endpoint)
        self._resampler: StreamResampler | None = None
        self._input_rate = 0
        self._output_rate = 0
        self._next_turn = 1
        self._utterance: _Utterance | None = None
        self._turn: _Turn | None = None
        self._errors = 0
        self._text_tokens = float(config.text_burst)
        self._text_at = 0.0
        self.instructions: str | None = None  # Configure's system prompt
        self.speak = True
        self.tools: tuple[Tool, ...] = ()
        # the latest user item whose words the ASR did not trust: a requested reply
        # (response.create) right after it acts on nothing either
        self._untrusted_item: str | None = None
        # the latest user item whose words the ASR was unsure of: a requested reply
        # right after it acts on nothing either ("Sorry, I didn't catch that.")
        self._unsure_item: str | None = None
        self.can_act = can_act  # the reply engine writes tool calls
        self.scored = scored  # a paused turn's end-of-turn score is on its way
        self._calls: dict[str, str] = {}  # recent call ids -> tool names
        # The call the last reply asked about ("Call your sister?"): the next turn's
        # words make it (a yes) or drop it (anything else); docs/actions.md, "Asking first"
        self._pending: ToolCall | None = None
        self.respond = True  # Configure's: spoken turns are answered
        self.interrupt = True  # Configure's: speech barges in on a reply
        self.max_tokens: int | None = None

    @property
    def pending(self) -> ToolCall | None:
        """The call the last reply asked about, which the user's next words answer:
        parked with the conversation (server/resume.py, server/store.py)."""
        return self._pending

    @property
    def output_rate(self) -> int:
        """Sample rate of the reply audio (0 before start)."""
        return self._output_rate

    def message(self, item_id: str) -> ChatMessage | None:
        """The conversation's message of this id (None: there is none)."""
        for i, message_id in enumerate(self._ids):
            if message_id == item_id:
                return self.conversation[i]
        return None

    def in_progress(self, item_id: str) -> bool:
        """The item is part of the turn being answered: the reply being written, or the
        committed user words it answers."""
        turn = self._turn
        if turn is None or not turn.released:
            return False
        return (turn.started and item_id == reply_item(turn.id)) or (
            turn.announced and item_id == turn.user_item
        )

    def replying(self) -> int | None:
        """The turn whose reply is under way (ReplyStarted emitted, ReplyEnded not yet)."""
        turn = self._turn
        return turn.id if turn is not None and turn.released and turn.started else None

    def plays(self, turn_id: int) -> bool:
        """The turn's audio still goes to the client: it is released and not cancelled."""
        turn = self._current(turn_id)
        return turn is not None and turn.released

    def unwritten_s(self, turn_id: int) -> float:
        """Seconds of the turn's reply audio handed out and not written to the client yet
        (its ledger's; 0 for a turn that no longer plays)."""
        turn = self._current(turn_id)
        if turn is None or not turn.audio.rate:
            return 0.0
        return turn.audio.unwritten / turn.audio.rate

    def text_allowance(self, now: float | None = None) -> tuple[float, float]:
        """The text bucket at ``now`` (None: the last event's time), untouched: replies
        that may still be asked for (text messages, requested replies), and seconds
        until it is full again."""
        cfg = self.config
        now = self._now if now is None else now
        refill = max(0.0, now - self._text_at) * cfg.text_per_minute / 60
        left = min(float(cfg.text_burst), self._text_tokens + refill)
        return left, (cfg.text_burst - left) * 60 / cfg.text_per_minute

    # -- entry point --

    def receive(self, event: Event, now: float) -> list[Effect]:
        if self.state is State.CLOSED:
            return []
        self._now = now
        match event:
            case p.Start():
                return self._on_start(event)
            case Disconnected():
                return self._on_disconnect()
            case Expired(code=code, reason=reason):
                return self._close(code, reason)
            case _ if self.state is State.IDLE:
                return self._error("not_started", "send a start message first")
            case AudioBytes(data=data):
                return self._on_audio_bytes(data)
            case VadResult():
                return self._on_vad(event, now)
            case p.Text(text=text):
                return self._on_text(text, now)
            case p.Cancel():
                return self._cancel_turn("client_cancel")
            case p.EndOfInput():
                return self._on_end_of_input(now)
            case PartialTranscript():
                return self._on_partial(event)
            case FinalTranscript():
                return self._on_final_transcript(event, now)
            case TurnEndScored():
                return self._on_turn_end_scored(event, now)
            case ReplySentence():
                return self._on_sentence(event)
            case ReplyAction():
                return self._on_action(event)
            case p.ActionResult():
                return self._on_action_result(event)
            case ReplyAudio():
                return self._on_reply_audio(event, now)
            case AudioWritten():
                return self._on_audio_written(event)
            case ReplyFinished():
                return self._on_finished(event)
            case TurnFailed():
                return self._on_failed(event)
            case Configure():
                return self._on_configure(event)
            case UserText(text=text, item_id=item_id):
                self._remember(ChatMessage("user", text), item_id)
                return []
            case Respond():
                return self._on_respond(event, now)
            case ClearInput():
                self._endpointer.reset()
                self._utterance = None
                return self._drop_speculation()
            case Amend():
                self._amend(event)
                return []
        raise AssertionError(f"unhandled event {event!r}")

    def _to(self, state: State) -> None:
        if state is self.state:
            return
        if state not in TRANSITIONS[self.state]:
            raise AssertionError(f"illegal transition {self.state.value} -> {state.value}")
        self.state = state

    def _error(self, code: str, message: str) -> list[Effect]:
        self._errors += 1
        out: list[Effect] = [Send(p.Error(code=code, message=message))]
        if self._errors >= self.config.max_errors:
            out += self._close(p.CloseCode.TOO_MANY_ERRORS, "too many invalid messages")
        return out

    def protocol_error(self, error: p.ProtocolError) -> list[Effect]:
        """A frame the codec rejected: report it, keep the session."""
        if self.state is State.CLOSED:
            return []
        return self._error(error.code, error.message)

    def rejected(self) -> list[Effect]:
        """A frame a codec rejected and answered itself: it counts towards max_errors."""
        if self.state is State.CLOSED:
            return []
        self._errors += 1
        if self._errors >= self.config.max_errors:
            return self._close(p.CloseCode.TOO_MANY_ERRORS, "too many invalid messages")
        return []

    def _close(self, code: int, reason: str) -> list[Effect]:
        out = self._cancel_turn("closed") + self._drop_speculation()
        self._park()
        self._to(State.CLOSED)
        return [*out, Close(code, reason)]

    def _park(self) -> None:
        """Keep the conversation for a while, so the client can resume it."""
        if self._resume is not None and self.state is not State.IDLE and self.resume_token:
            self._resume.park(self.resume_token, self.conversation, self._now, self._pending)

    # -- client messages --

    def _on_start(self, start: p.Start) -> list[Effect]:
        if self.state is not State.IDLE:
            return self._error("already_started", "the session has already started")
        if start.protocol != p.PROTOCOL_VERSION:
            return self._error(
                "unsupported_protocol", f"this server speaks protocol 1, not {start.protocol}"
            )
        if start.sample_rate not in p.INPUT_SAMPLE_RATES:
            rates = ", ".join(map(str, p.INPUT_SAMPLE_RATES))
            return self._error("unsupported_sample_rate", f"sample_rate must be one of {rates}")
        out_rate = start.output_sample_rate or 22_050
        if out_rate not in p.OUTPUT_SAMPLE_RATES:
            rates = ", ".join(map(str, p.OUTPUT_SAMPLE_RATES))
            return self._error(
                "unsupported_sample_rate", f"output_sample_rate must be one of {rates}"
            )
        try:
            tools = self.config.tools if start.tools is None else parse_tools(start.tools)
        except ToolError as err:
            return self._error("bad_tools", str(err))
        resumed = start.resume_token is not None
        if start.resume_token is not None:
            if self._resume is None:
                return self._error("bad_resume_token", "this server does not resume sessions")
            try:
                parked = self._resume.take(start.resume_token, self._now)
                self.conversation, self._pending = parked.conversation, parked.pending
                self._ids = [self._new_item_id() for _ in self.conversation]
            except p.ProtocolError as err:
                return self._error(err.code, err.message)
        self._input_rate = start.sample_rate
        # Upsampling 8 kHz with soxr's low quality filter holds back 60 ms of audio,
        # a delay added to every end of turn; cubic interpolation holds back none.
        quality: Quality = "QQ" if start.sample_rate < SAMPLE_RATE else "LQ"
        self._resampler = StreamResampler(start.sample_rate, SAMPLE_RATE, quality)
        self._output_rate = out_rate
        self.tools = tools if self.can_act else ()
        self._to(State.LISTENING)
        asr, engine = self._names
        token = self.resume_token if self._resume is not None else ""
        ready = p.Ready(
            self.id,
            start.sample_rate,
            out_rate,
            asr=asr,
            reply_engine=engine,
            resume_token=token,
            resumed=resumed,
            history=len(self.conversation),
            tools=[t.name for t in self.tools],
        )
        out: list[Effect] = [Send(ready)]
        if start.tools and not self.can_act:
            message = f"the reply engine {engine!r} cannot call tools; replies only speak"
            out.append(Send(p.Error("tools_unsupported", message)))
        return out

    def _on_audio_bytes(self, data: bytes) -> list[Effect]:
        assert self._resampler is not None
        if len(data) % 2:
            return self._error("bad_audio", "audio frames hold whole PCM16 samples (even length)")
        limit = int(self._input_rate * p.MAX_AUDIO_FRAME_SECONDS) * 2
        if len(data) > limit:
            return self._error("frame_too_large", f"an audio frame may hold at most {limit} bytes")
        samples = self._resampler.process(pcm16_to_float32(data))
        return [RunVad(samples)] if samples.size else []

    def _on_text(self, text: str, now: float) -> list[Effect]:
        if not self._take_text_token(now):
            per = self.config.text_per_minute
            return self._error("rate_limited", f"text: at most {per:g} messages a minute")
        out = self._cancel_turn("new_input")
        out += self._drop_speculation()
        self._utterance = None
        turn = self._new_turn(self._new_turn_id(), now, transcript=text)
        turn.final_time = now
        out.append(TurnOpened(turn.id, "text", turn.user_item))
        return out + self._begin_turn(turn, audio=None, text=text, release=True)

    def _on_configure(self, event: Configure) -> list[Effect]:
        self.instructions, self.speak = event.instructions, event.speak
        self.respond, self.max_tokens = event.respond, event.max_tokens
        self.interrupt = event.interrupt
        if event.endpoint != self.config.endpoint:  # the end-of-turn policy follows it
            self.config = replace(self.config, endpoint=event.endpoint)
            self._endpointer.reconfigure(event.endpoint)
        if event.eagerness is not None and event.eagerness != self.config.eagerness:
            self.config = replace(self.config, eagerness=event.eagerness)
        if event.input_rate is not None and event.input_rate != self._input_rate:
            self._input_rate = event.input_rate
            quality: Quality = "QQ" if event.input_rate < SAMPLE_RATE else "LQ"
            self._resampler = StreamResampler(event.input_rate, SAMPLE_RATE, quality)
        if event.output_rate is not None:  # a turn in flight keeps the rate it started at
            self._output_rate = event.output_rate
        if event.tools is not None and self.can_act:  # the codec refuses them otherwise
            self.tools = event.tools
        if event.output_format is not None:
            self.output_format = event.output_format
        return []

    def _amend(self, event: Amend) -> None:
        for i, message_id in enumerate(self._ids):
            if message_id == event.item_id:
                if event.new is None:
                    del self.conversation[i], self._ids[i]
                else:
                    self.conversation[i] = event.new
                return

    def _on_respond(self, event: Respond, now: float) -> list[Effect]:
        if event.if_idle and (self.state is not State.LISTENING or self._utterance is not None):
            return []
        if self._turn is not None and self._turn.released:
            return self._error("response_in_progress", "a reply is in progress: cancel it first")
        waiting = self.conversation and self.conversation[-1].role == "user"
        if event.audio is None and event.history is None and not (waiting or event.unprompted):
            return self._error("nothing_to_answer", "no user message or audio waits for an answer")
        if not self._take_text_token(now):
            per = self.config.text_per_minute
            return self._error("rate_limited", f"at most {per:g} requested replies a minute")
        out = self._drop_speculation()
        self._utterance = None
        turn = self._new_turn(self._new_turn_id(), now)
        shape = turn.shape
        if event.instructions is not None:
            shape.instructions = event.instructions
        if event.speak is not None:
            shape.speak = event.speak
        if event.max_tokens is not None:
            shape.max_tokens = event.max_tokens
        shape.keep, shape.history, shape.reply = event.keep, event.history, True
        shape.requested, shape.metadata = True, event.metadata
        if event.audio is not None:
            turn.user_item, turn.announced = event.user_item, event.user_item is not None
            turn.speech_ms = len(event.audio) * 1000 // SAMPLE_RATE
        turn.final_time = now
        out.append(TurnOpened(turn.id, "request", turn.user_item))
        return out + self._begin_turn(turn, audio=event.audio, text=None, release=True)

    def _take_text_token(self, now: float) -> bool:
        """Token bucket (burst text_burst, refilled at text_per_minute)."""
        cfg = self.config
        refill = max(0.0, now - self._text_at) * cfg.text_per_minute / 60
        self._text_tokens = min(float(cfg.text_burst), self._text_tokens + refill)
        self._text_at = now
        if self._text_tokens < 1:
            return False
        self._text_tokens -= 1
        return True

    def _on_end_of_input(self, now: float) -> list[Effect]:
        events = self._endpointer.end_input(self._ring.total_written)
        if not events:
            return [Send(p.Error("no_speech", "end_of_input: no speech was heard"))]
        return self._handle_endpoint(events, now)

    # -- audio --

    def _on_vad(self, result: VadResult, now: float) -> list[Effect]:
        self._ring.append(result.samples)
        out = self._handle_endpoint(self._endpointer.feed(result.probs), now)
        out += self._audio_after_doubt(now)
        return out + self._maybe_final(now) + self._maybe_partial()

    def _sample_time(self, sample: int, now: float) -> float:
        """Wall time of an input sample: the newest sample arrived at `now`."""
        return now - (self._ring.total_written - sample) / SAMPLE_RATE

    def _handle_endpoint(self, events: list[EndpointEvent], now: float) -> list[Effect]:
        out: list[Effect] = []
        for ev in events:
            match ev:
                case SpeechStarted(start_sample=start):
                    out += self._on_speech_start(start, now)
                case SpeechResumed(sample=sample):
                    out += self._on_speech_resumed(sample, now)
                case SpeechPaused(end_sample=end):
                    out += self._on_speech_paused(end, now)
                case EndOfTurn(end_sample=end, reason=reason):
                    out += self._on_end_of_turn(end, reason == "silence", now)
        return out

    def _on_speech_start(self, start: int, now: float) -> list[Effect]:
        u = self._utterance
        if u is not None and u.ended:  # the turn was held open, and the user went on
            return self._continue_utterance(u, start)
        if not self.interrupt and self._turn is not None and self._turn.released:
            return self._hear_beside(start)
        if self._goes_on(start, now):
            return self._continue_answered(start)
        out = self._cancel_turn("barge_in")
        out += self._drop_speculation()
        u = _Utterance(turn_id=self._new_turn_id(), start=start, last_partial_at=start)
        self._utterance = u
        opened = TurnOpened(u.turn_id, "speech", user_item(u.turn_id))
        return [*out, opened, Send(p.SpeechStarted(u.turn_id, start * 1000 // SAMPLE_RATE))]

    def _on_speech_resumed(self, sample: int, now: float) -> list[Effect]:
        u = self._utterance
        if u is None:  # we had already answered this speech: a new turn, or more of it
            return self._on_speech_start(sample, now)
        return self._continue_utterance(u, sample)

    def _goes_on(self, start: int, now: float) -> bool:
        """Speech that began before any of the answered turn's audio was sent goes on
        with that turn: the user did not hear a reply and stop to let it speak, they
        paused and went on ("Remind me to call my mother" 0.7 s "at seven tonight")."""
        turn = self._turn
        if turn is None or not turn.released or turn.utterance_start is None:
            return False
        if not turn.shape.speak and turn.sentences:  # a text reply is seen as it is sent
            return False
        if turn.first_audio_time is not None and turn.first_audio_time <= self._sample_time(
            start, now
        ):
            return False
        span_s = (start - turn.utterance_start) / SAMPLE_RATE
        first = self.config.endpoint.asr_start(turn.utterance_start)
        return span_s <= MAX_CONTINUED_SPAN_S and first >= self._ring.start

    def _continue_answered(self, start: int) -> list[Effect]:
        """Withdraw the answered turn and hear its speech and the new as one utterance.
        Its words leave the conversation: they are in the new turn's transcript."""
        turn = self._turn
        assert turn is not None and turn.utterance_start is not None
        out = self._cancel_turn("continued")
        u = _Utterance(self._new_turn_id(), turn.utterance_start, last_partial_at=start)
        self._utterance = u
        opened = TurnOpened(u.turn_id, "speech", user_item(u.turn_id))
        return [*out, opened, Send(p.SpeechStarted(u.turn_id, u.start * 1000 // SAMPLE_RATE))]

    def _continue_utterance(self, u: _Utterance, sample: int) -> list[Effect]:
        out = self._drop_speculation()
        u.end = u.end_time = None
        u.ended = False
        return [*out, Send(p.SpeechStarted(u.turn_id, sample * 1000 // SAMPLE_RATE))]

    def _hear_beside(self, start: int) -> list[Effect]:
        """Speech while a reply plays and may not be interrupted: heard as a new
        utterance; its turn starts once the reply ends (:meth:`_after_reply`)."""
        u = _Utterance(turn_id=self._new_turn_id(), start=start, last_partial_at=start)
        self._utterance = u
        opened = TurnOpened(u.turn_id, "speech", user_item(u.turn_id))
        return [opened, Send(p.SpeechStarted(u.turn_id, start * 1000 // SAMPLE_RATE))]

    def _after_reply(self) -> list[Effect]:
        """A reply that could not be interrupted has ended: the turn of the speech heard
        meanwhile starts, if it has paused (speech still going on starts it at its
        pause, as ever); its release comes with its transcript (_maybe_final)."""
        u = self._utterance
        if self.interrupt or u is None or self._turn is not None or u.end_time is None:
            return []
        turn = self._new_turn(u.turn_id, u.end_time, u)
        turn.speculative = not u.ended
        return self._begin_turn(turn, audio=self._utterance_audio(u), text=None, release=False)

    def _warm_next(self, turn: _Turn) -> list[Effect]:
        """The next turn's prompt, to prefill now (WarmNext): after a reply the
        conversation kept, while no turn runs. A barge-in's too: the user's next words
        are still coming."""
        if self._turn is not None or not turn.shape.keep or not self.conversation:
            return []
        history = _instructed(tuple(self.conversation), self.instructions)
        return [WarmNext(history, self.tools)]

    def _on_speech_paused(self, end: int, now: float) -> list[Effect]:
        u = self._utterance
        if u is None:
            return []
        u.end, u.end_time = end, self._sample_time(end, now)
        out: list[Effect] = [Send(p.SpeechStopped(u.turn_id, end * 1000 // SAMPLE_RATE))]
        if self._turn is None:  # speculative final ASR + reply during the silence
            turn = self._new_turn(u.turn_id, u.end_time, u, speculative=True)
            out += self._begin_turn(turn, audio=self._utterance_audio(u), text=None, release=False)
        return out

    def _on_end_of_turn(self, end: int, by_silence: bool, now: float) -> list[Effect]:
        u = self._utterance
        if u is None:
            return []
        out: list[Effect] = []
        if u.end is None:  # push-to-talk or max turn length: no pause was seen
            u.end, u.end_time = end, self._sample_time(end, now)
            out.append(Send(p.SpeechStopped(u.turn_id, end * 1000 // SAMPLE_RATE)))
        u.ended = True
        turn = self._turn
        if not self.interrupt and turn is not None and turn.released and turn.id != u.turn_id:
            return out  # a reply plays on: this turn starts when it ends (_after_reply)
        if turn is None or turn.id != u.turn_id:  # no speculation running: start now
            assert u.end_time is not None
            turn = self._new_turn(u.turn_id, u.end_time, u)
            out += self._begin_turn(turn, audio=self._utterance_audio(u), text=None, release=False)
        if not by_silence:  # the client (or the length limit) says the turn is over
            self._utterance = None
            return out + self._release(turn, now)
        return out + self._maybe_final(now)

    def _maybe_final(self, now: float) -> list[Effect]:
        """Release the paused turn once its transcript is known and the silence since
        is what the policy asks for it: from the pause on, so a turn scored complete
        need not wait for the endpointer's end of turn (which then finds no utterance,
        and speech after it is a barge-in)."""
        u, turn = self._utterance, self._turn
        if u is None or u.end is None or turn is None or turn.released or turn.id != u.turn_id:
            return []
        if turn.transcript is None or self._endpointer.hearing_speech:
            return []
        silence_ms = (self._ring.total_written - u.end) * 1000 / SAMPLE_RATE
        pending = self.scored and turn.complete_p is None
        policy = self.config.end_of_turn
        decision = policy.decide(
            turn.transcript, turn.complete_p, silence_ms, pending, turn.asr_logprob
        )
        # The endpointer's end of turn ends every turn the policy does not hold open.
        if not (decision.final or (u.ended and not decision.holds)):
            return []
        turn.end_of_turn = decision.tier
        self._utterance = None
        return self._release(turn, now)

    def _maybe_partial(self) -> list[Effect]:
        u = self._utterance
        if u is None or u.end is not None or u.partial_in_flight:
            return []
        # Not in the silence before a pause either: a partial started there would hold
        # the final ASR behind it on the one ASR thread, on the critical path.
        if not self._endpointer.hearing_speech:
            return []
        cfg = self.config
        heard = self._ring.total_written - u.start
        due = self._ring.total_written - u.last_partial_at
        if heard < cfg.min_partial_speech_ms * 16 or due < cfg.partial_interval_ms * 16:
            return []
        u.partial_in_flight = True
        u.last_partial_at = self._ring.total_written
        return [StartPartial(u.turn_id, self._utterance_audio(u))]

    def _on_partial(self, event: PartialTranscript) -> list[Effect]:
        u = self._utterance
        if u is None or u.turn_id != event.turn_id:
            return []
        u.partial_in_flight = False
        if not event.text:
            return []
        out: list[Effect] = [Send(p.TranscriptPartial(u.turn_id, event.text))]
        if event.text.startswith(u.partial) and len(event.text) > len(u.partial):
            delta = event.text[len(u.partial) :]
            out.append(TranscriptGrew(u.turn_id, user_item(u.turn_id), delta))
            u.partial = event.text
        return out

    def _utterance_audio(self, u: _Utterance) -> np.ndarray:
        end = u.end if u.end is not None else self._ring.total_written
        return self._ring.slice(self.config.endpoint.asr_start(u.start), end)

    # -- turns --

    def _new_turn_id(self) -> int:
        turn_id, self._next_turn = self._next_turn, self._next_turn + 1
        return turn_id

    def _new_turn(
        self,
        turn_id: int,
        speech_end_time: float,
        speech: _Utterance | None = None,
        speculative: bool = False,
        transcript: str | None = None,
    ) -> _Turn:
        """A turn answered as the session is configured now: of ``speech`` (paused or
        ended), of a text (``transcript``), or of neither (a requested reply)."""
        turn = _Turn(
            turn_id,
            speech_end_time,
            None if speech is None else speech.start,
            speculative=speculative,
            transcript=transcript,
            shape=_Shape(self.speak, self.instructions, self.max_tokens, self.respond),
        )
        if speech is not None or transcript is not None:
            turn.user_item = user_item(turn_id)
        if speech is not None and speech.end is not None:  # as its speech events said
            turn.speech_ms = speech.end * 1000 // SAMPLE_RATE - speech.start * 1000 // SAMPLE_RATE
        return turn

    def _begin_turn(
        self, turn: _Turn, audio: np.ndarray | None, text: str | None, release: bool
    ) -> list[Effect]:
        self._turn = turn
        turn.audio = AudioLedger(self._output_rate)
        turn.shape.output_format = self.output_format
        shape = turn.shape
        if audio is None and text is None and shape.history is None and self._ids:
            turn.asr_trusted = self._ids[-1] != self._untrusted_item  # answers those words
            turn.asr_sure = self._ids[-1] != self._unsure_item
        if audio is None and text is None and shape.keep:  # of the user's last words
            last = self.conversation[-1] if self.conversation else None
            if last is not None and last.role == "user" and shape.history is None:
                turn.answer_words = last.content if turn.asr_trusted else None
            if turn.answer_words is None:  # no new words (or untrusted ones) answer it
                self._pending = None
        turn.answers = self._pending if shape.keep else None  # out of band: not its answer
        history = tuple(self.conversation) if shape.history is None else shape.history
        history = _instructed(history, shape.instructions)
        start = StartTurn(
            turn.id,
            audio,
            text,
            history,
            self._output_rate,
            turn.shape.speak,
            self.tools if turn.asr_trusted else (),
            max_tokens=turn.shape.max_tokens,
            reply=turn.shape.reply,
            pending=turn.answers,
            sure=turn.asr_sure,
        )
        out: list[Effect] = [start]
        if release:
            out += self._release(turn, turn.final_time if turn.final_time is not None else 0.0)
        return out

    def _release(self, turn: _Turn, now: float) -> list[Effect]:
        turn.released = True
        turn.final_time = turn.final_time or now
        self._to(State.THINKING)
        out: list[Effect] = [ReleaseTurn(turn.id)]
        self._commit_user(turn)
        if turn.transcript is not None:
            out.append(Send(p.TranscriptFinal(turn.id, turn.transcript)))
            out += self._heard(turn)
        if turn.shape.requested:
            out += self._start_reply(turn)
            if turn.transcript is None:  # the words it answers are the conversation's
                out += self._answered(turn)
        out += self._shown(turn, turn.held)
        turn.held.clear()
        if turn.finished is not None:
            out += self._complete(turn, turn.finished)
        return out

    def _heard(self, turn: _Turn) -> list[Effect]:
        """The released turn's user words are known: the wires are told, and a turn
        that is answered (words, not noise) starts its reply."""
        assert turn.transcript is not None
        out: list[Effect] = []
        if turn.user_item is not None:
            heard = UserHeard(
                turn.id, turn.user_item, turn.transcript, turn.speech_ms, turn.announced
            )
            out.append(heard)
        if turn.shape.reply and turn.transcript.strip():
            out += self._start_reply(turn)
        return out + self._answered(turn)

    def _answered(self, turn: _Turn) -> list[Effect]:
        """The words of a turn that answers a question (the call asked about went to its
        StartTurn as ``pending``): a yes makes the call, now, with no reply model asked
        (the turn pipeline speaks its template); a name completes a call that lacked
        whom it is for (made, or asked about if its tool is); any other words drop it.
        Words the ASR did not trust are never a yes; words it was unsure of leave the
        question standing."""
        asked, transcript = turn.answers, turn.transcript or turn.answer_words
        if asked is None or not transcript or not transcript.strip() or not turn.shape.reply:
            return []  # no words (noise), or words a requested reply answers: it waits
        if self._pending is asked:
            self._pending = None
        tool = next((t for t in self.tools if t.name == asked.name), None)
        if tool is None or not turn.asr_trusted or not turn.started:
            return []
        if not turn.asr_sure:  # "Sorry, I didn't catch that."
            turn.asking = asked  # the question stands
            return []
        if missing(asked, tool) is not None:  # "Who should I call?" "My sister."
            call = named(asked, tool, transcript)
            if call is None:  # no name: the question is dropped, the words answered
                return []
            if asked_about(call, tool):  # "Call your sister?"
                turn.asking = call
                return []
            return self._act(turn, tool, call)
        return self._act(turn, tool, asked) if answer(transcript) == "yes" else []

    def _start_reply(self, turn: _Turn) -> list[Effect]:
        if turn.started:
            return []
        turn.started = True
        left, reset_s = self.text_allowance()
        requests = (self.config.text_burst, int(left), reset_s)
        started = ReplyStarted(
            turn.id,
            reply_item(turn.id),
            turn.shape.speak,
            turn.shape.keep,
            turn.shape.output_format,
            turn.shape.max_tokens,
            turn.shape.metadata,
            requests,
        )
        return [started]

    def _end_reply(
        self,
        turn: _Turn,
        status: Literal["completed", "cancelled", "failed"],
        reason: p.CancelReason | None,
        text: str,
    ) -> list[Effect]:
        """The wires' word that the reply ended (when it had started)."""
        if not turn.started:
            return []
        audio = (
            turn.audio.heard(turn.sentences) if turn.shape.speak and turn.audio.written else None
        )
        call = turn.call if self._acted(turn) else None
        ended = ReplyEnded(
            turn.id,
            reply_item(turn.id),
            status,
            reason,
            text,
            turn.shape.speak,
            turn.shape.keep,
            turn.shape.output_format,
            turn.shape.max_tokens,
            turn.shape.metadata,
            call,
            audio,
        )
        return [ended]

    def _closed(self, turn: _Turn, metrics: p.Metrics) -> list[Effect]:
        return [TurnClosed(turn.id, turn.user_item, turn.started, metrics), Send(metrics)]

    def _commit_user(self, turn: _Turn) -> None:
        if turn.released and turn.transcript and not turn.user_committed:
            self._remember(ChatMessage("user", turn.transcript), turn.user_item)
            turn.user_committed = True
            if not turn.asr_trusted:
                self._untrusted_item = self._ids[-1]
            if not turn.asr_sure:
                self._unsure_item = self._ids[-1]

    def _new_item_id(self) -> str:
        item_id, self._next_item = f"item_m{self._next_item}", self._next_item + 1
        return item_id

    def _remember(self, message: ChatMessage, item_id: str | None = None) -> None:
        self.conversation.append(message)
        self._ids.append(item_id or self._new_item_id())
        limit = self.config.max_history_messages
        if len(self.conversation) <= limit:
            return
        # Drop a quarter at once, from the oldest, on to a user message: the reply
        # engines keep the KV cache of the conversation's start, and every drop moves it.
        drop = len(self.conversation) - limit + limit // 4
        while drop < len(self.conversation) - 1 and self.conversation[drop].role != "user":
            drop += 1
        del self.conversation[:drop], self._ids[:drop]

    @staticmethod
    def _spoken(turn: _Turn) -> str:
        if not turn.shape.speak:  # a text reply: its sentences were sent as they came
            return " ".join(turn.sentences)
        return turn.audio.spoken(turn.sentences)

    def _current(self, turn_id: int) -> _Turn | None:
        turn = self._turn
        return turn if turn is not None and turn.id == turn_id else None

    def _emit(self, turn: _Turn, *effects: Effect) -> list[Effect]:
        if turn.released:
            return self._shown(turn, effects)
        turn.held += effects
        return []

    def _on_final_transcript(self, event: FinalTranscript, now: float) -> list[Effect]:
        turn = self._current(event.turn_id)
        if turn is None:
            return []
        turn.transcript, turn.asr_ms = event.text, event.asr_ms
        turn.asr_logprob, turn.asr_trusted = event.avg_logprob, event.trusted
        turn.asr_sure = event.heard_twice or not unheard(event.avg_logprob, event.no_speech_prob)
        if not turn.released:
            return self._maybe_final(now)
        self._commit_user(turn)
        return [Send(p.TranscriptFinal(turn.id, event.text)), *self._heard(turn)]

    def _on_turn_end_scored(self, event: TurnEndScored, now: float) -> list[Effect]:
        turn = self._current(event.turn_id)
        if turn is None or turn.released:
            return []
        turn.complete_p = event.probability
        return self._maybe_final(now)

    def _on_sentence(self, event: ReplySentence) -> list[Effect]:
        turn = self._current(event.turn_id)
        if turn is None:
            return []
        turn.sentences.append(event.text)
        if turn.first_sentence_ms is None:
            turn.first_sentence_ms = event.elapsed_ms
        text = p.ReplyText(turn.id, event.index, event.text)
        added = SentenceAdded(
            turn.id, reply_item(turn.id), event.index, event.text, turn.shape.speak
        )
        if turn.first_audio_time is None and turn.shape.speak:
            turn.unheard_text += [Send(text), added]
            return []
        return self._emit(turn, Send(text), added)

    def _on_action(self, event: ReplyAction) -> list[Effect]:
        """Tell the client to act, or, for a tool marked ``confirm``, keep the call to
        ask about (:meth:`_answered` makes it after a yes)."""
        turn = self._current(event.turn_id)
        tool = next((t for t in self.tools if t.name == event.call.name), None)
        if turn is None or tool is None or turn.call is not None or not turn.asr_trusted:
            return []  # an untrusted transcript's words were not surely said: no action
        words = turn.transcript or turn.answer_words
        if not turn.asr_sure or outside(event.call, tool, words):
            return []  # the pipeline said it did not catch that, or cannot do it
        if asked_about(event.call, tool):  # the pipeline speaks the question
            turn.asking = event.call
            return []
        return self._act(turn, tool, event.call)

    def _act(self, turn: _Turn, tool: Tool, call: ToolCall) -> list[Effect]:
        """The client is told to make ``call``: with the reply's first audio, as its
        text goes (an answer withdrawn before it is heard must not have acted either)."""
        call_id = f"call_{turn.id}"
        args = dict(call.arguments)
        turn.call = CallAdded(
            turn.id, call_item(turn.id), call_id, tool.name, args, turn.shape.keep
        )
        turn.action_text, turn.action_passes = render_call(tool, args), call.passes
        self._calls[call_id] = tool.name
        while len(self._calls) > MAX_OPEN_CALLS:
            del self._calls[next(iter(self._calls))]
        told: list[Effect] = [Send(_action(turn.call)), turn.call]
        if turn.first_audio_time is None and turn.shape.speak:
            turn.unheard_text += told
            return []
        return self._emit(turn, *told)

    def _on_action_result(self, event: p.ActionResult) -> list[Effect]:
        """What came of an action joins the conversation after the reply that made it."""
        name = self._calls.pop(event.call_id, None)
        if name is None:
            return self._error("unknown_call_id", f"no action {event.call_id!r} awaits a result")
        body = json.dumps({"name": name, "output": event.output}, ensure_ascii=False)
        turn = self._turn
        if turn is not None and turn.call is not None and turn.call.call_id == event.call_id:
            turn.results.append(ChatMessage("tool", body))  # after the reply, once it ends
        else:
            self._remember(ChatMessage("tool", body))
        return []

    @staticmethod
    def _shown(turn: _Turn, effects: Iterable[Effect]) -> list[Effect]:
        """What goes out of a reply's text and call: the wires hear of them only within
        the reply (ReplyStarted); a turn that is not answered has none, but a stray
        sentence must not name a reply that never started."""
        return [e for e in effects if turn.started or not isinstance(e, SentenceAdded | CallAdded)]

    @staticmethod
    def _acted(turn: _Turn) -> bool:
        """The turn's action went out to the client."""
        c = turn.call
        return c is not None and c not in turn.unheard_text and c not in turn.held

    def _remember_reply(self, turn: _Turn, spoken: str) -> None:
        """What the conversation keeps of a reply: the call it made (if the client got
        it), the words the user heard, then the results that came back meanwhile."""
        said = kept_reply(turn.action_text if self._acted(turn) else "", spoken)
        if said:
            self._remember(ChatMessage("assistant", said), reply_item(turn.id))
        for result in turn.results:
            self._remember(result)

    def _on_reply_audio(self, event: ReplyAudio, now: float) -> list[Effect]:
        turn = self._current(event.turn_id)
        if turn is None or not turn.released:  # audio of a cancelled turn is never sent
            return []
        if turn.first_audio_time is None and self._endpointer.hearing_speech and self.interrupt:
            turn.waiting_audio.append(event)  # the user may be going on: see first
            return []
        return self._send_audio(turn, event, now)

    def _audio_after_doubt(self, now: float) -> list[Effect]:
        """Send the first frames held while the VAD heard something, now that it was
        not speech (had it been, the turn was withdrawn with them)."""
        turn = self._turn
        if turn is None or not turn.waiting_audio or self._endpointer.hearing_speech:
            return []
        return self._flush_audio(turn, now)

    def _flush_audio(self, turn: _Turn, now: float) -> list[Effect]:
        waiting, turn.waiting_audio = turn.waiting_audio, []
        return [e for event in waiting for e in self._send_audio(turn, event, now)]

    def _send_audio(self, turn: _Turn, event: ReplyAudio, now: float) -> list[Effect]:
        out: list[Effect] = []
        if turn.first_audio_time is None:
            turn.first_audio_time = now
            turn.tts_first_ms = event.tts_ms
            self._to(State.SPEAKING)
            out += self._shown(turn, turn.unheard_text)
            turn.unheard_text.clear()
        seq = turn.audio.queue(event.sentence, len(event.pcm) // 2, event.sentence_samples)
        audio = SendAudio(
            turn.id,
            seq,
            event.pcm,
            event.sentence,
            event.sentence_samples,
            reply_item(turn.id),
            turn.shape.output_format,
        )
        return [*out, audio]

    def _on_audio_written(self, event: AudioWritten) -> list[Effect]:
        turn = self._current(event.turn_id)
        if turn is None:  # cancelled: its spoken part is already in the conversation
            return []
        turn.audio.write(event.sentence, event.samples)
        return []

    def _on_finished(self, event: ReplyFinished) -> list[Effect]:
        turn = self._current(event.turn_id)
        if turn is None:
            return []
        if not turn.released:
            turn.finished = event
            return []
        return self._complete(turn, event)

    def _complete(self, turn: _Turn, event: ReplyFinished) -> list[Effect]:
        out = self._flush_audio(turn, self._now)  # the reply is done: nothing to doubt
        out += self._shown(turn, turn.unheard_text)  # a reply with no audio at all
        turn.unheard_text.clear()
        text = " ".join(turn.sentences)
        kept = text if turn.audio.unwritten <= 0 else self._spoken(turn)
        if turn.shape.keep:  # an out-of-band reply joins no conversation
            self._remember_reply(turn, kept)
            self._pending = turn.asking or self._pending
        self._turn = None
        self._to(State.LISTENING)
        out += self._end_reply(turn, "completed", None, text)
        out += [Send(p.ReplyDone(turn.id, text)), *self._closed(turn, self._metrics(turn, event))]
        return [*out, *self._after_reply(), *self._warm_next(turn)]

    def _metrics(self, turn: _Turn, done: ReplyFinished | None) -> p.Metrics:
        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round((b - a) * 1000, 1)

        stats = done.stats if done is not None else None
        return p.Metrics(
            turn_id=turn.id,
            endpointing_ms=ms(turn.speech_end_time, turn.final_time),
            asr_ms=turn.asr_ms,
            reply_first_sentence_ms=turn.first_sentence_ms,
            reply_ms=done.reply_ms if done is not None else None,
            tts_first_chunk_ms=turn.tts_first_ms,
            first_audio_ms=ms(turn.speech_end_time, turn.first_audio_time),
            speculative=turn.speculative,
            reply_tokens=stats.tokens if stats else 0,
            forward_passes=stats.forward_passes if stats else 0,
            end_of_turn=turn.end_of_turn,
            action=turn.call.name if turn.call is not None else None,
            action_passes=turn.action_passes,
        )

    def _on_failed(self, event: TurnFailed) -> list[Effect]:
        turn = self._current(event.turn_id)
        if turn is None:
            return []
        if not turn.released:  # a failed speculation: the final turn starts afresh
            self._turn = None
            return []
        out = self._cancel_turn("error")
        return [*out, Send(p.Error("turn_failed", event.message))]

    def _drop_speculation(self) -> list[Effect]:
        """The user went on talking: forget the unreleased turn, nothing was sent."""
        turn = self._turn
        if turn is None or turn.released:
            return []
        self._turn = None
        return [CancelTurn(turn.id)]

    def _cancel_turn(self, reason: p.CancelReason) -> list[Effect]:
        turn = self._turn
        if turn is None or not turn.released:
            return []
        self._turn = None
        spoken = self._spoken(turn)
        if reason == "continued":  # its words come back in the next turn; it was not heard
            said = ChatMessage("user", turn.transcript or "")
            if turn.user_committed and self.conversation and self.conversation[-1] == said:
                self.conversation.pop()
                self._ids.pop()
        elif turn.shape.keep:
            self._remember_reply(turn, spoken)
            # cut off, or the connection dropped once some of the question was heard
            # (parked with the conversation): asked still
            cut = reason in ("barge_in", "new_input", "client_cancel")
            if cut or (reason == "closed" and spoken):
                self._pending = turn.asking or self._pending
        self._to(State.LISTENING)
        out: list[Effect] = [CancelTurn(turn.id)]
        if reason == "closed":  # nobody is told
            return out
        out += self._end_reply(turn, "failed" if reason == "error" else "cancelled", reason, spoken)
        if reason == "continued":
            items = (turn.user_item, reply_item(turn.id) if turn.started else None)
            out.append(TurnWithdrawn(turn.id, tuple(i for i in items if i is not None)))
        cancelled = p.ReplyCancelled(turn.id, reason, spoken)
        out += [Send(cancelled), *self._closed(turn, self._metrics(turn, None))]
        return [*out, *self._after_reply(), *self._warm_next(turn)]

    def _on_disconnect(self) -> list[Effect]:
        out = self._cancel_turn("closed") + self._drop_speculation()
        self._park()
        self._to(State.CLOSED)
        return out
