"""Property-based tests of the session state machine (hypothesis): any sequence of
client messages and pipeline events, in any order, with any turn ids.

The driver plays the connection's part: it queues the audio frames the session sends
and writes them one at a time when the sequence says so (dropping those of cancelled
turns, as the writer does). Properties, for every sequence:

* ``receive`` never raises (which includes the session's own check of every state
  change against TRANSITIONS);
* no audio of a turn is sent after that turn was cancelled;
* the conversation never keeps words of a reply whose audio the client was not
  written: a kept reply is a word prefix of what the turn said, and a turn that had
  audio but none of it written keeps nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from audio.endpoint import EndpointConfig
from model.engine import ChatMessage, GenerationStats
from server import protocol as p
from server.lifecycle import CallAdded, ReplyEnded, ReplyStarted, SentenceAdded
from server.resume import ResumeStore
from server.session import (
    AudioBytes,
    AudioWritten,
    CancelTurn,
    Configure,
    Disconnected,
    Expired,
    FinalTranscript,
    PartialTranscript,
    ReplyAudio,
    ReplyFinished,
    ReplySentence,
    Respond,
    Send,
    SendAudio,
    Session,
    SessionConfig,
    State,
    TurnEndScored,
    TurnFailed,
    VadResult,
)


@dataclass(frozen=True)
class WriteFrame:
    """The connection's writer takes the next queued frame."""


CURRENT = -1  # stands for the turn in flight, so that most events reach a live turn
TURNS = st.sampled_from([CURRENT] * 6 + [0, 1, 2, 3])
WORDS = st.lists(st.sampled_from(["Paris", "is", "the", "capital.", "It", "rains."]), max_size=5)
TEXT = WORDS.map(" ".join)
STATS = st.none() | st.builds(
    GenerationStats, st.integers(0, 9), st.integers(0, 9), st.sampled_from(["end", "budget"])
)
ENDPOINT = EndpointConfig(min_speech_ms=64, pause_ms=128, end_of_turn_ms=256)
PROBS = st.lists(st.sampled_from([0.02, 0.3, 0.6, 0.95]), min_size=1, max_size=12)
CLIENT = st.one_of(
    st.builds(p.Start, st.sampled_from([16000, 8000, 44100])),
    st.builds(p.Text, TEXT.filter(str.strip)),
    st.just(p.Cancel()),
    st.just(p.EndOfInput()),
    st.binary(max_size=700).map(AudioBytes),
    PROBS.map(lambda ps: VadResult(np.zeros(512 * len(ps), np.float32), np.array(ps, np.float32))),
    st.builds(Expired, st.sampled_from([4004, 4005, 1001]), st.just("limit")),
    st.just(Disconnected()),
    # the Realtime codec's requests: transcribe-only turns, replies speech never cuts,
    # out-of-band and unprompted replies (not text-only replies: the pipeline never
    # gives them audio, which the events here would)
    st.builds(Configure, st.just(ENDPOINT), respond=st.booleans(), interrupt=st.booleans()),
    st.builds(Respond, keep=st.booleans(), unprompted=st.booleans()),
)
# What a turn's pipeline reports, weighted up: most sequences should carry replies far
# enough (sentences, audio, writes, the end) for the history property to bite.
PIPELINE = st.one_of(
    st.builds(PartialTranscript, TURNS, st.none() | TEXT),
    st.builds(FinalTranscript, TURNS, TEXT, st.just(10.0)),
    st.builds(TurnEndScored, TURNS, st.floats(0.0, 1.0)),
    st.builds(ReplySentence, TURNS, st.integers(0, 3), TEXT, st.just(5.0)),
    st.builds(
        ReplyAudio,
        TURNS,
        st.integers(0, 3),
        st.integers(0, 40).map(lambda n: b"\x01\x00" * n),
        st.integers(1, 80),
        st.none() | st.just(3.0),
    ),
    st.just(WriteFrame()),
    st.builds(ReplyFinished, TURNS, STATS, st.none() | st.just(9.0)),
    st.builds(TurnFailed, TURNS, st.just("boom")),
)
EVENTS = st.one_of(CLIENT, PIPELINE, PIPELINE, PIPELINE)
CONFIG = SessionConfig(
    endpoint=ENDPOINT,
    max_history_messages=12,
)


@dataclass
class Run:
    session: Session
    now: float = 0.0
    queued: deque[SendAudio] = field(default_factory=deque)
    cancelled: set[int] = field(default_factory=set)
    said: dict[int, list[str]] = field(default_factory=dict)  # turn -> sentences sent
    had_audio: set[int] = field(default_factory=set)
    written: set[int] = field(default_factory=set)
    appended: list[ChatMessage] = field(default_factory=list)  # in this step
    replies: dict[int, bool] = field(default_factory=dict)  # turn -> its reply ended

    def __post_init__(self) -> None:
        remember = self.session._remember  # every message the conversation gains

        def recorded(message: ChatMessage, item_id: str | None = None) -> None:
            self.appended.append(message)
            remember(message, item_id)

        self.session._remember = recorded  # type: ignore[method-assign]

    def step(self, event: Any) -> None:
        self.now += 0.05
        if getattr(event, "turn_id", None) == CURRENT:
            turn = self.session._turn  # the pipeline speaks of the turn it runs
            event = replace(event, turn_id=turn.id if turn is not None else 1)
        if isinstance(event, WriteFrame):
            if not self.queued:
                return
            frame = self.queued.popleft()
            if frame.turn_id in self.cancelled:
                return  # the writer drops it
            self.written.add(frame.turn_id)
            event = AudioWritten(frame.turn_id, frame.sentence, len(frame.pcm) // 2)
        self.appended.clear()
        # Session._to asserts every state change against TRANSITIONS, so an illegal
        # one raises here like any other bug.
        effects = self.session.receive(event, self.now)
        self.check(effects)

    def check(self, effects: list[Any]) -> None:
        ended: list[int] = []
        for e in effects:
            match e:
                case CancelTurn(turn_id=t):
                    self.cancelled.add(t)
                    ended.append(t)
                case SendAudio(turn_id=t):
                    assert t not in self.cancelled, "audio of a cancelled turn"
                    self.queued.append(e)
                    self.had_audio.add(t)
                case Send(message=p.ReplyText(turn_id=t, text=text)):
                    self.said.setdefault(t, []).append(text)
                case Send(message=p.ReplyDone(turn_id=t)):
                    ended.append(t)
                case ReplyStarted(turn_id=t):
                    assert t not in self.replies, "a reply started twice"
                    self.replies[t] = False
                case SentenceAdded(turn_id=t) | CallAdded(turn_id=t):
                    assert self.replies.get(t) is False, "reply text outside its reply"
                case ReplyEnded(turn_id=t):
                    assert self.replies.get(t) is False, "a reply ended that was not under way"
                    self.replies[t] = True
        conversation = self.session.conversation
        assert len(self.session._ids) == len(conversation), "a message without its id"
        for message in (m for m in self.appended if m.role == "assistant"):
            assert ended, "an assistant message appeared without its turn ending"
            turn = ended[0]
            full = " ".join(self.said.get(turn, [])).split()
            words = message.content.split()
            assert words == full[: len(words)], "kept words the turn never said"
            if turn in self.had_audio:
                assert turn in self.written, "kept a reply none of whose audio was written"


REPLY_NEVER_WRITTEN = [
    p.Text("hi"),
    ReplySentence(CURRENT, 0, "Paris is", 5.0),
    ReplyAudio(CURRENT, 0, b"\x01\x00" * 10, 20, None),
    ReplyFinished(CURRENT, None, 9.0),
]


@settings(max_examples=1000, deadline=None)
@example(REPLY_NEVER_WRITTEN, True)  # the history property's plainest case, every run
@given(st.lists(EVENTS, max_size=60), st.booleans())
def test_any_event_sequence_keeps_the_invariants(events: list[Any], start_first: bool) -> None:
    run = Run(Session("fuzz", CONFIG, "asr", "engine", ResumeStore(60), "token"))
    if start_first:
        run.step(p.Start(16000))
    for event in events:
        run.step(event)
    assert run.session.state in State
