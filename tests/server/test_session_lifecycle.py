"""The lifecycle events the session emits for both wires (server/lifecycle.py): what a
voice turn, a text turn, a barged-in turn, a requested reply and an action tell them,
and that the Realtime codec keeps no turn or response state of its own."""

from __future__ import annotations

import base64
import dataclasses
import json

import numpy as np

from model.engine import ChatMessage
from model.tools import ToolCall
from server import protocol as p
from server.lifecycle import (
    AudioLedger,
    CallAdded,
    HeardAudio,
    Lifecycle,
    ReplyEnded,
    ReplyStarted,
    SentenceAdded,
    TranscriptGrew,
    TurnClosed,
    TurnOpened,
    TurnWithdrawn,
    UserHeard,
    reply_item,
    user_item,
)
from server.realtime import Realtime
from server.session import (
    Amend,
    AudioWritten,
    FinalTranscript,
    PartialTranscript,
    ReplyAction,
    ReplyAudio,
    ReplyFinished,
    ReplySentence,
    Respond,
    SendAudio,
    Session,
    UserText,
)

from .test_realtime import answer
from .test_realtime import make as realtime
from .test_realtime import spoken_turn as realtime_turn
from .test_session import Driver, make, of, released_turn, settings, spoken_turn

AUDIO = b"\x00\x00" * 100  # 100 samples


def events(effects: list[object]) -> list[Lifecycle]:
    return [e for e in effects if isinstance(e, Lifecycle)]


def kinds(effects: list[object]) -> list[type]:
    return [type(e) for e in events(effects)]


def test_a_voice_turn_opens_is_heard_answered_and_closed() -> None:
    d = make()
    out = d.speak()
    (opened,) = of(out, TurnOpened)
    assert opened == TurnOpened(1, "speech", user_item(1))
    grew = d.send(PartialTranscript(1, "What is"))
    grew += d.send(PartialTranscript(1, "What is the capital"))
    grew += d.send(PartialTranscript(1, "Where is"))  # changed earlier words: adds nothing
    assert [e.delta for e in of(grew, TranscriptGrew)] == ["What is", " the capital"]
    turn = released_turn(d)
    out = d.send(ReplySentence(turn, 0, "Paris.", 40.0))
    assert events(out) == []  # a spoken reply's text waits for its first audio
    out = d.send(ReplyAudio(turn, 0, AUDIO, 100, 20.0))
    (audio,) = of(out, SendAudio)
    assert isinstance(audio, SendAudio) and audio.item_id == reply_item(turn)
    assert of(out, SentenceAdded) == [SentenceAdded(turn, reply_item(turn), 0, "Paris.", True)]
    out = d.send(ReplyFinished(turn, None, 90.0))
    assert kinds(out) == [ReplyEnded, TurnClosed]
    ended, closed = events(out)
    assert isinstance(ended, ReplyEnded) and isinstance(closed, TurnClosed)
    assert (ended.status, ended.reason, ended.text, ended.speak) == (
        "completed",
        None,
        "Paris.",
        True,
    )
    assert ended.audio == HeardAudio(22050, ("Paris.",), {0: 100}, {0: 100})  # the output rate
    assert closed.user_item == user_item(turn) and closed.replied
    assert closed.metrics.turn_id == turn


def test_the_release_tells_the_words_then_starts_the_reply() -> None:
    d = make()
    turn = spoken_turn(d, "What is the capital of France?")
    out = d.silence(12)
    heard, started = events(out)
    assert heard == UserHeard(turn, user_item(turn), "What is the capital of France?", 640, False)
    assert isinstance(started, ReplyStarted)
    assert (started.item_id, started.speak, started.keep) == (reply_item(turn), True, True)
    assert d.s.message(user_item(turn)) == ChatMessage("user", "What is the capital of France?")


def test_noise_is_heard_and_never_answered() -> None:
    d = make()
    turn = spoken_turn(d, "")
    out = d.silence(12)
    assert kinds(out) == [UserHeard]  # no reply starts for it
    out = d.send(ReplySentence(turn, 0, "Stray.", 10.0))  # the pipeline is not trusted
    out += d.send(ReplyAudio(turn, 0, AUDIO, 100, 20.0))
    assert of(out, SentenceAdded) == []  # it would name a reply that never started
    out = d.send(ReplyFinished(turn, None, None))
    (closed,) = of(out, TurnClosed)
    assert isinstance(closed, TurnClosed) and not closed.replied


def test_a_text_turn_is_answered_at_once_in_text() -> None:
    d = make()
    out = d.send(p.Text("Hello"))
    assert kinds(out) == [TurnOpened, UserHeard, ReplyStarted]
    opened, heard, _ = events(out)
    assert opened == TurnOpened(1, "text", user_item(1))
    assert heard == UserHeard(1, user_item(1), "Hello", 0, False)
    out = d.send(ReplySentence(1, 0, "Hi.", 10.0))  # shown with its audio
    out += d.send(ReplyFinished(1, None, 20.0))
    assert kinds(out) == [SentenceAdded, ReplyEnded, TurnClosed]
    (ended,) = of(out, ReplyEnded)
    assert isinstance(ended, ReplyEnded) and ended.audio is None  # it spoke none


def test_a_barge_in_ends_the_reply_with_what_was_heard() -> None:
    d = make()
    turn = released_turn(d)
    d.send(ReplySentence(turn, 0, "Paris is the capital of France.", 40.0))
    d.send(ReplyAudio(turn, 0, AUDIO, 200, 20.0))  # half the sentence written
    d.now += 1.0  # the user heard it and speaks again
    out = d.speak(3)
    assert kinds(out)[:3] == [ReplyEnded, TurnClosed, TurnOpened]
    (ended,) = of(out, ReplyEnded)
    assert isinstance(ended, ReplyEnded)
    assert (ended.status, ended.reason, ended.text) == ("cancelled", "barge_in", "Paris is the")
    assert ended.audio is not None and ended.audio.ms == 100 * 1000 // 22050
    assert d.s.message(reply_item(turn)) == ChatMessage("assistant", "Paris is the")


def test_speech_that_goes_on_withdraws_the_answered_turn() -> None:
    d = make()
    turn = released_turn(d)
    out = d.speak(3)  # before any reply audio: the same utterance goes on
    assert kinds(out) == [ReplyEnded, TurnWithdrawn, TurnClosed, TurnOpened]
    (gone,) = of(out, TurnWithdrawn)
    assert gone == TurnWithdrawn(turn, (user_item(turn), reply_item(turn)))
    assert d.s.message(user_item(turn)) is None


def test_an_action_is_told_with_the_first_audio_and_named_in_the_end() -> None:
    d = Driver(Session("test", settings(), "tiny.en", "fake", can_act=True))
    d.send(p.Start(sample_rate=16000))
    turn = released_turn(d)
    timer = ToolCall("timer.set", {"seconds": 300}, passes=4)
    assert d.send(ReplyAction(turn, timer)) == []  # not before the reply is heard
    d.send(ReplySentence(turn, 0, "Timer set.", 40.0))
    out = d.send(ReplyAudio(turn, 0, AUDIO, 100, 20.0))
    (call,) = of(out, CallAdded)
    assert call == CallAdded(
        turn, f"item_c{turn}", f"call_{turn}", "timer.set", {"seconds": 300}, True
    )
    (ended,) = of(d.send(ReplyFinished(turn, None, 50.0)), ReplyEnded)
    assert isinstance(ended, ReplyEnded) and ended.call == call


def test_a_requested_reply_names_its_committed_audio_and_labels() -> None:
    d = make()
    audio = np.zeros(16000, np.float32)
    out = d.send(Respond(audio=audio, user_item="item_x", metadata={"k": "v"}, max_tokens=9))
    assert kinds(out) == [TurnOpened, ReplyStarted]
    (started,) = of(out, ReplyStarted)
    assert isinstance(started, ReplyStarted)
    assert (started.metadata, started.max_tokens) == ({"k": "v"}, 9)
    assert d.s.in_progress("item_x") and d.s.in_progress(started.item_id)
    assert d.s.replying() == started.turn_id
    (heard,) = of(d.send(FinalTranscript(started.turn_id, "Hi", 50.0)), UserHeard)
    assert heard == UserHeard(started.turn_id, "item_x", "Hi", 1000, True)
    assert d.s.message("item_x") == ChatMessage("user", "Hi")


def test_if_idle_asks_for_nothing_while_a_reply_is_under_way() -> None:
    d = make()
    released_turn(d)
    assert d.send(Respond(unprompted=True, if_idle=True)) == []


def test_messages_are_named_and_amended_by_id() -> None:
    d = make()
    d.send(UserText("one", "item_a"))
    d.send(UserText("two"))
    assert d.s.message("item_a") == ChatMessage("user", "one")
    d.send(Amend("item_a", ChatMessage("user", "uno")))
    d.send(Amend("nothing", None))  # an unknown id changes nothing
    assert [m.content for m in d.s.conversation] == ["uno", "two"]
    d.send(Amend("item_a", None))
    assert [m.content for m in d.s.conversation] == ["two"]


def test_the_audio_ledger_counts_queued_and_written_samples() -> None:
    ledger = AudioLedger(24000)
    assert [ledger.queue(0, 100, 300), ledger.queue(0, 100, 300)] == [0, 1]
    ledger.write(0, 100)
    assert (ledger.queued, ledger.written_samples, ledger.unwritten) == (200, 100, 100)
    assert ledger.spoken(["one two three"]) == "one"


def test_the_realtime_codec_keeps_no_turn_or_response_state() -> None:
    """What the codec keeps is its settings, its input buffer and the conversation's
    items; nothing of a turn or a response, mid-reply or after it."""
    d, _ = realtime()
    allowed = {
        "session", "asr", "preset", "max_reply_tokens", "_base", "_base_eagerness",
        "settings", "_n", "_items", "_store", "_heard_audio", "_buffer", "_pending",
        "_input_ms", "_idle_from",
    }  # fmt: skip
    _, turn = realtime_turn(d)
    assert set(vars(d.codec)) == allowed
    assert all(isinstance(k, str) for k in d.codec._store)  # items by id, no turn keys
    answer(d, turn)
    assert set(vars(d.codec)) == allowed
    assert isinstance(d.codec, Realtime)
    for value in vars(d.codec).values():  # no response objects anywhere
        assert not (dataclasses.is_dataclass(value) and "Response" in type(value).__name__)


def test_reply_audio_is_named_by_its_frame_even_with_no_response_open() -> None:
    d, _ = realtime()
    frame = SendAudio(99, 0, AUDIO, 0, 100, reply_item(99), "audio/pcmu")
    delta = json.loads(d.codec.audio(frame))
    assert (delta["response_id"], delta["item_id"]) == ("resp_t99", "item_r99")
    assert len(base64.b64decode(delta["delta"])) == 100  # mu-law: a byte a sample


def test_the_session_says_what_of_a_turns_audio_is_unwritten_and_whether_it_plays() -> None:
    """The connection paces and drops frames by the session's ledger, not a count of
    its own."""
    d = make()
    d.write_audio = False  # the client reads nothing yet
    turn = released_turn(d)
    d.send(ReplySentence(turn, 0, "Paris is the capital.", 40.0))
    (frame,) = of(d.send(ReplyAudio(turn, 0, b"\x00\x00" * 2205, 4410, 20.0)), SendAudio)
    assert d.s.plays(turn) and d.s.unwritten_s(turn) == 0.1  # 2205 samples at 22.05 kHz
    d.send(AudioWritten(turn, 0, 2205))
    assert d.s.unwritten_s(turn) == 0.0
    d.send(ReplyAudio(turn, 0, b"\x00\x00" * 2205, 4410, None))
    d.now += 1.0
    d.speak(3)  # a barge-in: what is still queued never plays
    assert not d.s.plays(turn) and d.s.unwritten_s(turn) == 0.0
    assert d.s.message(reply_item(turn)) == ChatMessage("assistant", "Paris is")
    assert isinstance(frame, SendAudio) and frame.seq == 0
