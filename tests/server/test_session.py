"""The session state machine, driven synchronously: no socket, no loop, no clock.

VAD results are fed as probability sequences (one per 32 ms frame); the endpoint
settings used here are min speech 3 frames, pause 7 frames, end of turn 19 frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from audio.endpoint import EndpointConfig
from model.engine import ChatMessage, GenerationStats
from server import protocol as p
from server.lifecycle import Lifecycle, truncate_to_sent
from server.resume import ResumeStore
from server.session import (
    TRANSITIONS,
    AudioBytes,
    AudioWritten,
    CancelTurn,
    ClearInput,
    Close,
    Configure,
    Disconnected,
    Effect,
    FinalTranscript,
    PartialTranscript,
    ReleaseTurn,
    ReplyAudio,
    ReplyFinished,
    ReplySentence,
    Respond,
    RunVad,
    Send,
    SendAudio,
    Session,
    SessionConfig,
    StartPartial,
    StartTurn,
    State,
    TurnEndScored,
    TurnFailed,
    UserText,
    VadResult,
    WarmNext,
)
from server.turn_end import TurnEndPolicy

FRAME = 512
SPEECH, SILENCE = 0.9, 0.05
ENDPOINT = EndpointConfig(min_speech_ms=96, pause_ms=224, end_of_turn_ms=608)
HOLD_30_FRAMES = TurnEndPolicy(hold_ms=960, default_ms=608)  # held turns: 960 ms
UNSURE_24_FRAMES = TurnEndPolicy(hold_ms=960, default_ms=608, unsure_ms=768)


def settings(**kwargs: object) -> SessionConfig:
    return SessionConfig(endpoint=ENDPOINT, **kwargs)  # type: ignore[arg-type]


@dataclass
class Driver:
    """Feeds a session and keeps the clock (audio time == wall time here). Like the
    connection's writer, it reports each audio frame written at once (``write_audio``
    False: the client reads nothing, every frame stays unwritten)."""

    s: Session
    now: float = 0.0
    write_audio: bool = True

    def send(self, event: object) -> list[Effect]:
        out = self.s.receive(event, self.now)  # type: ignore[arg-type]
        for e in out if self.write_audio else []:
            if isinstance(e, SendAudio):
                out += self.s.receive(
                    AudioWritten(e.turn_id, e.sentence, len(e.pcm) // 2), self.now
                )
        return out

    def frames(self, prob: float, n: int) -> list[Effect]:
        out: list[Effect] = []
        for _ in range(n):
            self.now += FRAME / 16000
            samples = np.zeros(FRAME, np.float32)
            out += self.s.receive(VadResult(samples, np.array([prob], np.float32)), self.now)
        return out

    def speak(self, frames: int = 20) -> list[Effect]:
        return self.frames(SPEECH, frames)

    def silence(self, frames: int) -> list[Effect]:
        return self.frames(SILENCE, frames)


def sent(effects: list[Effect], kind: type | None = None) -> list[p.ServerMessage]:
    return [
        e.message
        for e in effects
        if isinstance(e, Send) and (kind is None or isinstance(e.message, kind))
    ]


def of(effects: list[Effect], kind: type) -> list[Effect]:
    return [e for e in effects if isinstance(e, kind)]


def make(config: SessionConfig | None = None) -> Driver:
    d = Driver(Session("test", config or settings(), "tiny.en", "fake"))
    out = d.send(p.Start(sample_rate=16000))
    assert isinstance(sent(out)[0], p.Ready)
    return d


def spoken_turn(d: Driver, transcript: str = "What is the capital of France?") -> int:
    """Speak, pause (speculative turn starts), and answer the speculative ASR."""
    d.speak()
    out = d.silence(7)
    (start,) = of(out, StartTurn)
    assert isinstance(start, StartTurn)
    assert start.audio is not None and start.text is None
    d.send(FinalTranscript(start.turn_id, transcript, 100.0))
    return start.turn_id


def released_turn(d: Driver) -> int:
    turn = spoken_turn(d)
    out = d.silence(12)  # 19 silent frames: the end of turn
    assert of(out, ReleaseTurn)
    return turn


# --- start and errors ------------------------------------------------------------


def test_start_sends_ready_and_listens() -> None:
    d = Driver(Session("abc", settings(), "tiny.en", "fake"))
    assert d.s.state is State.IDLE
    (ready,) = sent(d.send(p.Start(sample_rate=48000, output_sample_rate=24000)))
    assert ready == p.Ready("abc", 48000, 24000, asr="tiny.en", reply_engine="fake")
    assert d.s.state is State.LISTENING
    (err,) = sent(d.send(p.Start(sample_rate=16000)))
    assert isinstance(err, p.Error) and err.code == "already_started"


@pytest.mark.parametrize(
    "start",
    [p.Start(sample_rate=11025), p.Start(sample_rate=16000, output_sample_rate=44100)],
)
def test_unsupported_rate_is_an_error_and_session_stays_idle(start: p.Start) -> None:
    d = Driver(Session("x", settings(), "a", "b"))
    (err,) = sent(d.send(start))
    assert isinstance(err, p.Error) and err.code == "unsupported_sample_rate"
    assert d.s.state is State.IDLE
    assert isinstance(sent(d.send(p.Start(sample_rate=8000)))[0], p.Ready)


def test_wrong_protocol_version() -> None:
    d = Driver(Session("x", settings(), "a", "b"))
    (err,) = sent(d.send(p.Start(sample_rate=16000, protocol=2)))
    assert isinstance(err, p.Error) and err.code == "unsupported_protocol"


@pytest.mark.parametrize(
    "event", [AudioBytes(b"\x00\x00"), p.Text("hi"), p.Cancel(), p.EndOfInput()]
)
def test_anything_before_start_is_not_started(event: object) -> None:
    d = Driver(Session("x", settings(), "a", "b"))
    out = d.send(event)
    (err,) = sent(out)
    assert isinstance(err, p.Error) and err.code == "not_started"
    assert len(out) == 1 and d.s.state is State.IDLE


def test_audio_bytes_are_validated_and_resampled() -> None:
    d = make()
    (err,) = sent(d.send(AudioBytes(b"\x00\x01\x02")))
    assert isinstance(err, p.Error) and err.code == "bad_audio"
    (err,) = sent(d.send(AudioBytes(bytes(2 * 16000 + 2))))
    assert isinstance(err, p.Error) and err.code == "frame_too_large"
    out = d.send(AudioBytes(bytes(2 * 1600)))  # 100 ms
    (vad,) = of(out, RunVad)
    assert isinstance(vad, RunVad) and vad.samples.dtype == np.float32
    assert d.s.state is State.LISTENING


def test_audio_at_8khz_is_resampled_to_16khz() -> None:
    d = Driver(Session("x", settings(), "a", "b"))
    d.send(p.Start(sample_rate=8000))
    total = 0
    for _ in range(10):
        tone = (np.sin(np.arange(800) / 5) * 8000).astype("<i2").tobytes()
        total += sum(e.samples.size for e in of(d.send(AudioBytes(tone)), RunVad))  # type: ignore[attr-defined]
    assert abs(total - 16000) < 100  # 1 s in, 1 s out: no audio held back


def test_too_many_errors_closes_the_connection() -> None:
    d = make(settings(max_errors=3))
    d.send(AudioBytes(b"\x00"))
    d.send(AudioBytes(b"\x00"))
    out = d.s.protocol_error(p.ProtocolError("bad_json", "x"))
    (close,) = of(out, Close)
    assert isinstance(close, Close) and close.code == p.CloseCode.TOO_MANY_ERRORS
    assert d.s.state is State.CLOSED
    assert d.send(p.Text("hello")) == []


# --- speech turns ----------------------------------------------------------------


def test_speech_start_and_pause_start_a_speculative_turn_that_sends_nothing() -> None:
    d = make()
    out = d.speak(5)
    (started,) = sent(out, p.SpeechStarted)
    assert isinstance(started, p.SpeechStarted) and started.turn_id == 1
    out = d.speak(15) + d.silence(7)
    assert [type(m) for m in sent(out)] == [p.SpeechStopped]
    (start,) = of(out, StartTurn)
    assert isinstance(start, StartTurn) and start.turn_id == 1 and start.history == ()
    # Everything the speculative turn produces is held back.
    assert d.send(FinalTranscript(1, "What is the capital of", 90.0)) == []
    assert d.send(ReplySentence(1, 0, "Paris.", 50.0)) == []
    assert d.send(ReplyAudio(1, 0, b"\x00\x00" * 10, 10, 5.0)) == []
    assert d.s.state is State.LISTENING and d.s.conversation == []


def test_speaking_again_throws_the_speculative_turn_away() -> None:
    d = make()
    turn = spoken_turn(d, "What is the capital of")
    d.send(ReplySentence(turn, 0, "Paris.", 50.0))
    out = d.speak(5)
    assert of(out, CancelTurn) == [CancelTurn(turn)]
    assert [type(m) for m in sent(out)] == [p.SpeechStarted]  # same turn continues
    assert sent(out)[0].turn_id == turn  # type: ignore[union-attr]
    # Late results of the dropped speculation are ignored.
    assert d.send(ReplySentence(turn, 1, "Stale.", 60.0)) == []
    out = d.silence(7)
    (again,) = of(out, StartTurn)
    assert isinstance(again, StartTurn) and again.turn_id == turn


def test_end_of_turn_releases_everything_held_in_order() -> None:
    d = make()
    turn = spoken_turn(d)
    d.send(ReplySentence(turn, 0, "Paris is the capital.", 50.0))
    assert not of(d.silence(11), ReleaseTurn)
    out = d.silence(1)  # 19 frames of silence in all
    assert of(out, ReleaseTurn) == [ReleaseTurn(turn)]
    assert [type(m) for m in sent(out)] == [p.TranscriptFinal]  # the text waits for audio
    assert d.s.state is State.THINKING
    assert d.s.conversation == [ChatMessage("user", "What is the capital of France?")]
    out = d.send(ReplyAudio(turn, 0, b"\x00\x00" * 100, 100, 20.0))
    assert [type(m) for m in sent(out)] == [p.ReplyText]
    assert [type(e) for e in out if not isinstance(e, Send | Lifecycle)] == [SendAudio]
    assert out.index(of(out, SendAudio)[0]) > 0  # text first, then its audio
    assert not of(d.silence(30), StartTurn)  # one turn, one reply


def test_turn_waits_for_its_transcript_after_the_silence() -> None:
    """Nothing can be sent before the transcript: the turn is final when it arrives."""
    d = make()
    d.speak()
    (start,) = of(d.silence(7), StartTurn)
    assert isinstance(start, StartTurn)
    assert not of(d.silence(12), ReleaseTurn)
    out = d.send(FinalTranscript(start.turn_id, "Hello there.", 80.0))
    assert of(out, ReleaseTurn) == [ReleaseTurn(start.turn_id)]
    (final,) = sent(out)
    assert isinstance(final, p.TranscriptFinal) and final.text == "Hello there."


def test_unfinished_transcript_holds_the_turn_open() -> None:
    d = make(settings(turn_end=HOLD_30_FRAMES))
    turn = spoken_turn(d, "Add milk, eggs, and")
    assert not of(d.silence(12), ReleaseTurn)  # the usual end of turn: held
    assert not of(d.silence(10), ReleaseTurn)  # 29 frames
    out = d.silence(1)  # 30 frames: answered anyway
    assert of(out, ReleaseTurn) == [ReleaseTurn(turn)]


def test_unconfirmed_speech_delays_the_held_decision() -> None:
    """A word starting just as the hold runs out is not cut off by it."""
    d = make(settings(turn_end=HOLD_30_FRAMES))
    turn = spoken_turn(d, "Add milk, eggs, and")
    d.silence(22)  # 29 silent frames
    out = d.speak(2)  # shorter than min speech: not yet a turn, but not silence
    assert not of(out, ReleaseTurn)
    out = d.speak(1)  # confirmed: the same turn goes on
    assert of(out, CancelTurn) == [CancelTurn(turn)] and not of(out, ReleaseTurn)


def test_going_on_after_an_unfinished_pause_continues_the_same_turn() -> None:
    d = make()
    turn = spoken_turn(d, "Add milk, eggs, and")
    d.silence(15)  # past the endpointer's end of turn, held by the session
    out = d.speak(5)
    assert of(out, CancelTurn) == [CancelTurn(turn)]  # the speculation was wrong
    assert sent(out) == [p.SpeechStarted(turn, sent(out)[0].audio_ms)]  # type: ignore[union-attr]
    assert not sent(out, p.ReplyCancelled)  # nothing had been said
    out = d.speak(10) + d.silence(7)
    (again,) = of(out, StartTurn)
    assert isinstance(again, StartTurn) and again.turn_id == turn
    assert again.audio is not None and again.audio.size > 16000  # both halves


def test_a_turn_scored_complete_is_final_before_the_endpointer() -> None:
    d = make()
    turn = spoken_turn(d)  # 7 silent frames, 224 ms: past the 200 ms path
    assert not of(d.silence(1), ReleaseTurn)  # no score yet: the endpointer's 608 ms
    out = d.send(TurnEndScored(turn, 0.9))
    assert of(out, ReleaseTurn) == [ReleaseTurn(turn)]
    assert [type(m) for m in sent(out)] == [p.TranscriptFinal]
    assert not of(d.silence(30), StartTurn)  # the endpointer's end of turn finds no turn
    out = d.send(ReplyFinished(turn, None, 10.0))
    metrics = sent(out)[-1]
    assert isinstance(metrics, p.Metrics) and metrics.end_of_turn == "complete"
    assert metrics.endpointing_ms == pytest.approx(8 * 32, abs=1)


def test_the_eagerness_picks_the_policy_around_the_endpointer() -> None:
    assert settings().end_of_turn == TurnEndPolicy.from_eagerness("medium", 608.0)
    high = settings(eagerness="high").end_of_turn
    assert (high.hold_ms, high.default_ms) == (800.0, 608.0)
    assert settings(eagerness="high", turn_end=HOLD_30_FRAMES).end_of_turn is HOLD_30_FRAMES


def test_a_complete_score_waits_for_its_silence() -> None:
    """Scored during a short pause (SpeechPaused at 96 ms), final at 200 ms of silence."""
    endpoint = EndpointConfig(min_speech_ms=96, pause_ms=96, end_of_turn_ms=608)
    d = make(SessionConfig(endpoint=endpoint))
    d.speak()
    (start,) = of(d.silence(3), StartTurn)
    assert isinstance(start, StartTurn)
    assert d.send(FinalTranscript(start.turn_id, "What time is it?", 10.0)) == []
    assert d.send(TurnEndScored(start.turn_id, 0.9)) == []  # 96 ms of silence
    assert not of(d.silence(3), ReleaseTurn)  # 192 ms
    assert of(d.silence(1), ReleaseTurn) == [ReleaseTurn(start.turn_id)]  # 224 ms


def test_speech_before_any_reply_audio_goes_on_with_the_answered_turn() -> None:
    """Final early, and the user goes on before a word of the reply was sent: the
    answer is withdrawn and the two stretches of speech are one utterance."""
    d = make()
    turn = spoken_turn(d)
    assert of(d.send(TurnEndScored(turn, 0.9)), ReleaseTurn) == [ReleaseTurn(turn)]
    d.send(ReplySentence(turn, 0, "Paris.", 40.0))  # text, but no audio yet
    out = d.speak(5)
    assert of(out, CancelTurn) == [CancelTurn(turn)]
    assert sent(out, p.ReplyCancelled) == [p.ReplyCancelled(turn, "continued", "")]
    (started,) = sent(out, p.SpeechStarted)
    assert started.turn_id == turn + 1  # type: ignore[union-attr]
    assert d.s.conversation == []  # its words come back in the longer turn's transcript
    (start,) = of(d.silence(7), StartTurn)
    assert isinstance(start, StartTurn) and start.turn_id == turn + 1
    assert start.audio is not None
    # All of it: the first 20 speech frames, the 7 frames of pause and the 5 new ones.
    assert len(start.audio) >= (20 + 7 + 5) * FRAME
    d.send(FinalTranscript(start.turn_id, "What is the capital of France, and Spain?", 90.0))
    d.silence(12)
    assert d.s.conversation == [ChatMessage("user", "What is the capital of France, and Spain?")]


def test_speech_after_the_reply_audio_began_is_a_barge_in() -> None:
    d = make()
    turn = spoken_turn(d)
    d.send(TurnEndScored(turn, 0.9))
    d.silence(1)
    d.send(ReplySentence(turn, 0, "Paris.", 40.0))
    d.send(ReplyAudio(turn, 0, b"\x00\x00" * 100, 100, 20.0))
    out = d.speak(5)
    assert sent(out, p.ReplyCancelled) == [p.ReplyCancelled(turn, "barge_in", "Paris.")]
    assert d.s.conversation == [
        ChatMessage("user", "What is the capital of France?"),
        ChatMessage("assistant", "Paris."),
    ]


def test_first_audio_waits_while_the_vad_hears_the_user_maybe_going_on() -> None:
    d = make()
    turn = spoken_turn(d)
    d.send(TurnEndScored(turn, 0.9))
    d.send(ReplySentence(turn, 0, "Paris.", 40.0))
    d.frames(SPEECH, 1)  # a frame of speech: not yet a turn (min_speech_ms)
    assert d.send(ReplyAudio(turn, 0, b"\x00\x00" * 100, 100, 20.0)) == []
    out = d.silence(1)  # it was not speech: the reply is heard, text first
    assert [type(e) for e in out if isinstance(e, Send | SendAudio)] == [Send, SendAudio]
    assert sent(out) == [p.ReplyText(turn, 0, "Paris.")]


def test_first_audio_held_for_speech_that_goes_on_is_never_sent() -> None:
    d = make()
    turn = spoken_turn(d)
    d.send(TurnEndScored(turn, 0.9))
    d.send(ReplySentence(turn, 0, "Paris.", 40.0))
    d.frames(SPEECH, 1)
    d.send(ReplyAudio(turn, 0, b"\x00\x00" * 100, 100, 20.0))
    out = d.speak(5)
    assert not of(out, SendAudio) and not sent(out, p.ReplyText)
    assert sent(out, p.ReplyCancelled) == [p.ReplyCancelled(turn, "continued", "")]


def test_a_reply_without_audio_still_sends_its_text() -> None:
    d = make()
    turn = released_turn(d)
    d.send(ReplySentence(turn, 0, "...", 40.0))  # nothing Piper can say
    out = d.send(ReplyFinished(turn, None, 1.0))
    assert [type(m) for m in sent(out)] == [p.ReplyText, p.ReplyDone, p.Metrics]


def test_a_finished_reply_asks_for_the_next_turns_prompt_to_be_prefilled() -> None:
    """Once a reply is over and the conversation keeps it, the session hands the
    history the next turn starts with (and its tools) to be prefilled while the user
    listens (WarmNext); the next turn starts from that same history."""
    d = make()
    d.send(Configure(ENDPOINT, instructions="Be brief."))
    turn = released_turn(d)
    assert not of(d.send(ReplySentence(turn, 0, "Paris.", 40.0)), WarmNext)
    out = d.send(ReplyFinished(turn, None, 1.0))
    (warm,) = of(out, WarmNext)
    assert isinstance(warm, WarmNext)
    assert warm.history == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "What is the capital of France?"),
        ChatMessage("assistant", "Paris."),
    )
    assert warm.tools == d.s.tools
    (start,) = of(d.speak() + d.silence(7), StartTurn)
    assert isinstance(start, StartTurn) and start.history == warm.history


def test_a_low_score_holds_the_turn_open() -> None:
    """Words that read finished but a model that says go on: held like 'eggs, and'."""
    d = make(settings(turn_end=HOLD_30_FRAMES))
    turn = spoken_turn(d, "What is the weather like in.")
    d.send(TurnEndScored(turn, 0.001))
    assert not of(d.silence(22), ReleaseTurn)  # 29 frames
    out = d.silence(1)
    assert of(out, ReleaseTurn) == [ReleaseTurn(turn)]


def test_dangling_words_veto_a_complete_score() -> None:
    d = make(settings(turn_end=UNSURE_24_FRAMES))
    turn = spoken_turn(d, "Add milk, eggs, and")
    assert d.send(TurnEndScored(turn, 0.9)) == []  # "and": never the 200 ms path
    assert not of(d.silence(16), ReleaseTurn)  # 23 frames
    assert of(d.silence(1), ReleaseTurn) == [ReleaseTurn(turn)]  # nor held: unsure


def test_an_unsure_turn_waits_past_the_endpointer_and_goes_on_with_the_user() -> None:
    """P(complete) between the hold and the 200 ms path: the words may be half of a
    request said with a pause ("Can you turn off the lights" 0.7 s "in the kitchen"),
    so the turn stays open past the endpointer's 608 ms until ``unsure_ms``; speech
    in that time is more of the same turn, never an answer cut short."""
    d = make(settings(turn_end=UNSURE_24_FRAMES))
    turn = spoken_turn(d, "Can you turn off the lights?")
    d.send(TurnEndScored(turn, 0.08))
    assert not of(d.silence(15), ReleaseTurn)  # 22 frames: past the endpointer's 19
    out = d.speak(5)
    assert of(out, CancelTurn) == [CancelTurn(turn)] and not sent(out, p.ReplyCancelled)
    out = d.speak(10) + d.silence(7)
    (again,) = of(out, StartTurn)
    assert isinstance(again, StartTurn) and again.turn_id == turn


def test_a_turn_whose_score_is_on_its_way_waits_for_it_as_an_unsure_one() -> None:
    """A scorer slowed by the reply model's speculative passes must not let half a
    request through at the endpointer's silence: with a score coming, the turn waits
    up to ``unsure_ms`` for it, and is final as soon as it says complete."""
    d = Driver(Session("s", settings(turn_end=UNSURE_24_FRAMES), "tiny.en", "fake", scored=True))
    d.send(p.Start(sample_rate=16000))
    turn = spoken_turn(d, "Can you turn off the lights?")
    assert not of(d.silence(15), ReleaseTurn)  # 22 frames: past the endpointer's 19
    out = d.send(TurnEndScored(turn, 0.9))
    assert of(out, ReleaseTurn) == [ReleaseTurn(turn)]
    assert metrics_tier(d, turn) == "complete"


def test_a_score_that_never_comes_costs_at_most_the_unsure_wait() -> None:
    d = Driver(Session("s", settings(turn_end=UNSURE_24_FRAMES), "tiny.en", "fake", scored=True))
    d.send(p.Start(sample_rate=16000))
    turn = spoken_turn(d, "Can you turn off the lights?")
    assert not of(d.silence(16), ReleaseTurn)  # 23 frames
    assert of(d.silence(1), ReleaseTurn) == [ReleaseTurn(turn)]  # 24: 768 ms


def metrics_tier(d: Driver, turn: int) -> str | None:
    (metrics,) = sent(d.send(ReplyFinished(turn, None, 10.0)), p.Metrics)
    assert isinstance(metrics, p.Metrics)
    return metrics.end_of_turn


def test_a_doubted_transcript_waits_as_an_unsure_turn() -> None:
    d = make(settings(turn_end=UNSURE_24_FRAMES))
    d.speak()
    (start,) = of(d.silence(7), StartTurn)
    assert isinstance(start, StartTurn)
    d.send(FinalTranscript(start.turn_id, "What's a new recipe for dinner?", 50.0, -0.93))
    assert not of(d.send(TurnEndScored(start.turn_id, 0.9)), ReleaseTurn)  # not at 200 ms
    assert not of(d.silence(16), ReleaseTurn)  # 23 frames
    assert of(d.silence(1), ReleaseTurn) == [ReleaseTurn(start.turn_id)]
    assert metrics_tier(d, start.turn_id) == "unsure"


def test_an_unscored_turn_is_final_at_the_endpointers_silence() -> None:
    """No score (yet): the endpointer's silence, as without a scorer; a slow scorer
    never makes a turn wait longer."""
    d = make(settings(turn_end=UNSURE_24_FRAMES))
    turn = spoken_turn(d, "Can you turn off the lights?")
    assert not of(d.silence(11), ReleaseTurn)  # 18 frames
    assert of(d.silence(1), ReleaseTurn) == [ReleaseTurn(turn)]  # 19: 608 ms


def test_a_score_for_a_dropped_speculation_is_ignored() -> None:
    d = make()
    turn = spoken_turn(d)
    d.speak(5)  # the user goes on: the speculation is cancelled
    assert d.send(TurnEndScored(turn, 0.9)) == []
    out = d.silence(7)
    (again,) = of(out, StartTurn)
    assert isinstance(again, StartTurn)
    d.send(FinalTranscript(again.turn_id, "What is the capital of France?", 10.0))
    assert not of(d.silence(1), ReleaseTurn)  # the old score does not count for it


def test_reply_audio_speaking_done_and_metrics() -> None:
    d = make()
    turn = released_turn(d)
    t_release = d.now
    d.send(ReplySentence(turn, 0, "Paris.", 40.0))
    d.now += 0.3
    out = d.send(ReplyAudio(turn, 0, b"\x01\x00" * 100, 100, 30.0))
    assert of(out, SendAudio) == [SendAudio(turn, 0, b"\x01\x00" * 100, 0, 100, f"item_r{turn}")]
    assert d.s.state is State.SPEAKING
    out = d.send(ReplyAudio(turn, 0, b"\x01\x00" * 100, 100, None))
    assert of(out, SendAudio)[0].seq == 1  # type: ignore[attr-defined]
    stats = GenerationStats(tokens=5, forward_passes=6, stopped_by="end")
    out = d.send(ReplyFinished(turn, stats, 200.0))
    done, metrics = sent(out)
    assert done == p.ReplyDone(turn, "Paris.")
    assert isinstance(metrics, p.Metrics)
    assert metrics.speculative and metrics.reply_tokens == 5 and metrics.forward_passes == 6
    assert metrics.asr_ms == 100.0 and metrics.tts_first_chunk_ms == 30.0
    # Speech ended where the silence began: 19 frames (608 ms) before the release.
    assert metrics.endpointing_ms == pytest.approx(608, abs=1)
    assert metrics.first_audio_ms == pytest.approx(608 + 300, abs=1)
    assert metrics.end_of_turn == "unsure"  # no score: the endpointer's silence
    assert d.now - t_release == pytest.approx(0.3)
    assert d.s.state is State.LISTENING
    assert d.s.conversation[-1] == ChatMessage("assistant", "Paris.")


def test_empty_transcript_ends_the_turn_without_a_reply() -> None:
    d = make()
    turn = spoken_turn(d, "")
    d.send(ReplyFinished(turn, None, None))  # the pipeline stops at an empty transcript
    out = d.silence(12)
    assert [type(m) for m in sent(out)] == [p.TranscriptFinal, p.ReplyDone, p.Metrics]
    assert d.s.state is State.LISTENING and d.s.conversation == []


def test_partial_transcripts_one_at_a_time() -> None:
    d = make(settings(partial_interval_ms=320, min_partial_speech_ms=320))
    out = d.speak(9)
    assert not of(out, StartPartial)
    out = d.speak(1)  # 10 frames = 320 ms heard
    (job,) = of(out, StartPartial)
    assert isinstance(job, StartPartial) and job.audio.size > 0
    assert not of(d.speak(20), StartPartial)  # one in flight: no second job
    (msg,) = sent(d.send(PartialTranscript(job.turn_id, "what is")))
    assert msg == p.TranscriptPartial(job.turn_id, "what is")
    assert of(d.speak(1), StartPartial)  # overdue: the next starts at once
    assert sent(d.send(PartialTranscript(job.turn_id, None))) == []  # skipped job


def test_no_partial_starts_in_the_silence_before_a_pause() -> None:
    """The final ASR starts at the pause; a partial begun just before would delay it."""
    d = make(settings(partial_interval_ms=320, min_partial_speech_ms=320))
    (job,) = of(d.speak(10), StartPartial)
    d.speak(9)  # 320 ms more speech: the next partial is due once this one is in
    d.send(PartialTranscript(job.turn_id, "what is"))
    out = d.silence(6)  # silence, not yet the pause (224 ms)
    assert not of(out, StartPartial)
    assert of(d.silence(1), StartTurn)  # the pause: the final ASR, no partial ahead of it
    assert of(d.speak(1), StartPartial) == []  # one frame is not yet speech again


# --- barge-in, cancel, text, push-to-talk ----------------------------------------


def test_barge_in_cancels_and_keeps_only_what_was_sent() -> None:
    d = make()
    turn = released_turn(d)
    d.send(ReplySentence(turn, 0, "Paris is the capital of France.", 40.0))
    d.send(ReplySentence(turn, 1, "It has many museums and cafes.", 80.0))
    d.send(ReplyAudio(turn, 0, b"\x00\x00" * 100, 100, 20.0))
    d.send(ReplyAudio(turn, 1, b"\x00\x00" * 50, 100, 20.0))  # half of sentence two
    out = d.speak(5)
    assert of(out, CancelTurn) == [CancelTurn(turn)]
    cancelled = sent(out, p.ReplyCancelled)[0]
    assert cancelled == p.ReplyCancelled(
        turn, "barge_in", "Paris is the capital of France. It has many"
    )
    started = sent(out, p.SpeechStarted)[0]
    assert started.turn_id == turn + 1  # type: ignore[union-attr]
    assert d.s.conversation[-1].content == "Paris is the capital of France. It has many"
    # Audio of the cancelled turn that is still in the pipe is never sent.
    assert d.send(ReplyAudio(turn, 1, b"\x00\x00" * 50, 100, None)) == []
    assert d.send(ReplyFinished(turn, None, 1.0)) == []
    assert d.s.state is State.LISTENING


def test_barge_in_keeps_only_audio_the_client_was_written() -> None:
    """Audio handed to a slow connection but not yet written was never heard: a
    barge-in keeps only the frames the socket took (issue 17)."""
    d = make()
    turn = released_turn(d)
    d.send(ReplySentence(turn, 0, "Paris is the capital of France.", 40.0))
    d.send(ReplyAudio(turn, 0, b"\x00\x00" * 50, 100, 20.0))  # written: half the sentence
    d.write_audio = False
    d.send(ReplyAudio(turn, 0, b"\x00\x00" * 50, 100, None))  # queued, never written
    cancelled = sent(d.speak(5), p.ReplyCancelled)[0]
    assert cancelled == p.ReplyCancelled(turn, "barge_in", "Paris is the")
    assert d.s.conversation[-1] == ChatMessage("assistant", "Paris is the")


def test_a_finished_reply_keeps_only_what_was_written() -> None:
    d = make()
    turn = released_turn(d)
    d.send(ReplySentence(turn, 0, "Paris is the capital of France.", 40.0))
    d.send(ReplySentence(turn, 1, "It has many museums.", 60.0))
    d.send(ReplyAudio(turn, 0, b"\x00\x00" * 100, 100, 20.0))
    d.write_audio = False
    d.send(ReplyAudio(turn, 1, b"\x00\x00" * 100, 100, None))
    out = d.send(ReplyFinished(turn, None, 1.0))
    assert sent(out, p.ReplyDone)[0] == p.ReplyDone(
        turn, "Paris is the capital of France. It has many museums."
    )
    assert d.s.conversation[-1] == ChatMessage("assistant", "Paris is the capital of France.")


def test_history_is_bounded_and_text_is_rate_limited() -> None:
    d = make(settings(max_history_messages=4, text_per_minute=60, text_burst=2))
    for i in range(3):  # the fifth message drops the oldest 1 + a quarter of 4
        d.now += 1.0  # one token back per second
        (start,) = of(d.send(p.Text(f"question {i}")), StartTurn)
        d.send(ReplySentence(start.turn_id, 0, f"Answer {i}.", 1.0))  # type: ignore[attr-defined]
        d.send(ReplyFinished(start.turn_id, None, 1.0))  # type: ignore[attr-defined]
    kept = [m.content for m in d.s.conversation]
    assert kept == ["question 1", "Answer 1.", "question 2", "Answer 2."]
    d.now += 2.0  # the bucket is full again: a burst of two
    assert of(d.send(p.Text("burst one")), StartTurn)
    assert of(d.send(p.Text("burst two")), StartTurn)
    (error,) = sent(d.send(p.Text("one too many")))
    assert isinstance(error, p.Error) and error.code == "rate_limited"
    d.now += 1.0
    assert of(d.send(p.Text("after a second")), StartTurn)


def test_client_cancel_while_thinking() -> None:
    d = make()
    turn = released_turn(d)
    out = d.send(p.Cancel())
    assert of(out, CancelTurn) == [CancelTurn(turn)]
    assert sent(out, p.ReplyCancelled)[0] == p.ReplyCancelled(turn, "client_cancel", "")
    assert d.s.state is State.LISTENING
    assert d.send(p.Cancel()) == []  # nothing left to cancel


def test_text_message_is_a_released_turn_and_replaces_the_current_one() -> None:
    d = make()
    d.now = 5.0
    out = d.send(p.Text("Tell me a joke"))
    (start,) = of(out, StartTurn)
    assert isinstance(start, StartTurn) and start.text == "Tell me a joke" and start.audio is None
    assert of(out, ReleaseTurn) == [ReleaseTurn(start.turn_id)]
    assert d.s.state is State.THINKING
    assert d.s.conversation == [ChatMessage("user", "Tell me a joke")]
    out = d.send(p.Text("Actually, the weather?"))
    assert sent(out, p.ReplyCancelled)[0].reason == "new_input"  # type: ignore[union-attr]
    (second,) = of(out, StartTurn)
    assert isinstance(second, StartTurn) and second.history == (
        ChatMessage("user", "Tell me a joke"),
    )


def test_push_to_talk_end_of_input_answers_at_once() -> None:
    d = make()
    (err,) = sent(d.send(p.EndOfInput()))
    assert isinstance(err, p.Error) and err.code == "no_speech"
    d.speak(10)
    out = d.send(p.EndOfInput())
    assert [type(m) for m in sent(out)] == [p.SpeechStopped]
    (start,) = of(out, StartTurn)
    assert of(out, ReleaseTurn) == [ReleaseTurn(start.turn_id)]  # type: ignore[attr-defined]
    assert isinstance(start, StartTurn) and start.audio is not None and start.audio.size > 0


def test_failed_turn_reports_an_error_and_listens_again() -> None:
    d = make()
    turn = released_turn(d)
    out = d.send(TurnFailed(turn, "boom"))
    assert [type(m) for m in sent(out)] == [p.ReplyCancelled, p.Metrics, p.Error]
    assert d.s.state is State.LISTENING


def test_failed_speculation_is_silent_and_the_final_turn_starts_afresh() -> None:
    d = make()
    d.speak()
    (start,) = of(d.silence(7), StartTurn)
    assert d.send(TurnFailed(start.turn_id, "boom")) == []  # type: ignore[attr-defined]
    (again,) = of(d.silence(12), StartTurn)
    assert isinstance(again, StartTurn) and again.turn_id == start.turn_id  # type: ignore[attr-defined]
    out = d.send(FinalTranscript(again.turn_id, "Hello.", 50.0))
    assert of(out, ReleaseTurn) == [ReleaseTurn(again.turn_id)]


def test_disconnect_cancels_the_turn_and_sends_nothing() -> None:
    d = make()
    turn = released_turn(d)
    out = d.send(Disconnected())
    assert out == [CancelTurn(turn)]
    assert d.s.state is State.CLOSED
    assert d.send(ReplyAudio(turn, 0, b"\x00\x00", 1, None)) == []


def test_disconnect_drops_a_speculative_turn() -> None:
    d = make()
    turn = spoken_turn(d)
    assert d.send(Disconnected()) == [CancelTurn(turn)]


# --- the transition table and helpers --------------------------------------------


def test_every_state_is_in_the_transition_table_and_closed_is_final() -> None:
    assert set(TRANSITIONS) == set(State)
    assert TRANSITIONS[State.CLOSED] == frozenset()
    assert all(
        State.CLOSED in targets for s, targets in TRANSITIONS.items() if s is not State.CLOSED
    )


def test_illegal_transition_is_refused() -> None:
    d = make()
    with pytest.raises(AssertionError):
        d.s._to(State.SPEAKING)  # listening -> speaking skips thinking


def test_every_transition_is_exercised() -> None:
    """idle -> listening -> thinking -> speaking -> listening -> thinking -> ... -> closed."""
    seen: list[tuple[State, State]] = []
    d = Driver(Session("x", settings(), "a", "b"))

    def step(event: object) -> None:
        before = d.s.state
        d.send(event)
        if d.s.state is not before:
            seen.append((before, d.s.state))

    step(p.Start(sample_rate=16000))
    step(p.Text("one"))
    step(ReplySentence(1, 0, "A.", 1.0))
    step(ReplyAudio(1, 0, b"\x00\x00", 1, 1.0))
    step(ReplyFinished(1, None, 1.0))
    step(p.Text("two"))
    step(p.Cancel())
    step(Disconnected())
    other = Driver(Session("y", settings(), "a", "b"))
    other.send(Disconnected())
    seen.append((State.IDLE, other.s.state))
    expected = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert set(seen) | {(State.THINKING, State.CLOSED), (State.SPEAKING, State.CLOSED)} == expected


def test_truncate_to_sent() -> None:
    sentences = ["One two three four.", "Five six."]
    assert truncate_to_sent(sentences, {}, {}) == ""
    assert truncate_to_sent(sentences, {0: 50}, {0: 100}) == "One two"
    assert (
        truncate_to_sent(sentences, {0: 100, 1: 100}, {0: 100, 1: 100})
        == "One two three four. Five six."
    )


def test_endpoint_config_flows_into_the_session() -> None:
    cfg = SessionConfig(endpoint=EndpointConfig(pause_ms=96, end_of_turn_ms=160))
    assert cfg.endpoint != ENDPOINT
    d = make(cfg)
    d.speak()
    (start,) = of(d.silence(3), StartTurn)
    d.send(FinalTranscript(start.turn_id, "Hi.", 10.0))  # type: ignore[attr-defined]
    assert of(d.silence(2), ReleaseTurn)


# --- resumption ------------------------------------------------------------------


def resumable(store: ResumeStore, token: str) -> Driver:
    return Driver(Session("r", settings(), "a", "b", store, token))


def test_ready_carries_a_resume_token_and_a_drop_parks_the_conversation() -> None:
    store = ResumeStore(ttl_s=60)
    d = resumable(store, "tok-1")
    (ready,) = sent(d.send(p.Start(sample_rate=16000)))
    assert isinstance(ready, p.Ready) and ready.resume_token == "tok-1" and not ready.resumed
    d.send(p.Text("My name is Ada."))
    d.send(ReplySentence(1, 0, "Nice to meet you, Ada.", 10.0))
    d.send(ReplyAudio(1, 0, b"\x00\x00" * 10, 20, 1.0))  # half of it went out
    d.now = 10.0
    d.send(Disconnected())
    assert len(store) == 1

    again = resumable(store, "tok-2")
    again.now = 30.0
    (ready,) = sent(again.send(p.Start(sample_rate=8000, resume_token="tok-1")))
    assert isinstance(ready, p.Ready) and ready.resumed and ready.resume_token == "tok-2"
    assert ready.history == 2
    assert again.s.conversation == [
        ChatMessage("user", "My name is Ada."),
        ChatMessage("assistant", "Nice to"),  # only what was sent as audio
    ]
    (start,) = of(again.send(p.Text("What is my name?")), StartTurn)
    assert isinstance(start, StartTurn) and start.history == tuple(again.s.conversation[:2])


def test_resume_tokens_are_single_use_and_expire() -> None:
    store = ResumeStore(ttl_s=60)
    d = resumable(store, "tok")
    d.send(p.Start(sample_rate=16000))
    d.send(Disconnected())  # parked at t=0
    late = resumable(store, "x")
    late.now = 61.0
    (err,) = sent(late.send(p.Start(sample_rate=16000, resume_token="tok")))
    assert isinstance(err, p.Error) and err.code == "resume_expired"
    assert late.s.state is State.IDLE
    (err,) = sent(late.send(p.Start(sample_rate=16000, resume_token="made-up")))
    assert isinstance(err, p.Error) and err.code == "bad_resume_token"
    assert isinstance(sent(late.send(p.Start(sample_rate=16000)))[0], p.Ready)  # fresh start


def test_a_taken_token_cannot_be_replayed() -> None:
    store = ResumeStore(ttl_s=60)
    d = resumable(store, "tok")
    d.send(p.Start(sample_rate=16000))
    d.send(Disconnected())
    assert sent(resumable(store, "a").send(p.Start(sample_rate=16000, resume_token="tok")))
    (err,) = sent(resumable(store, "b").send(p.Start(sample_rate=16000, resume_token="tok")))
    assert isinstance(err, p.Error) and err.code == "bad_resume_token"


def test_without_a_store_there_is_no_token_and_resuming_is_refused() -> None:
    d = make()
    (err,) = sent(Driver(d.s).send(p.Start(sample_rate=16000, resume_token="t")))
    assert isinstance(err, p.Error) and err.code == "already_started"
    fresh = Driver(Session("x", settings(), "a", "b"))
    (err,) = sent(fresh.send(p.Start(sample_rate=16000, resume_token="t")))
    assert isinstance(err, p.Error) and err.code == "bad_resume_token"
    (ready,) = sent(fresh.send(p.Start(sample_rate=16000)))
    assert isinstance(ready, p.Ready) and ready.resume_token == ""


# --- requests of the OpenAI-Realtime codec -----------------------------------------


def test_user_text_waits_in_the_conversation_until_respond() -> None:
    d = make()
    assert d.send(UserText("What is the capital of Italy?")) == []
    assert d.s.conversation == [ChatMessage("user", "What is the capital of Italy?")]
    (start,) = of(d.send(Respond()), StartTurn)
    assert isinstance(start, StartTurn) and start.text is None and start.audio is None
    assert start.history == (ChatMessage("user", "What is the capital of Italy?"),)
    (err,) = sent(d.send(Respond()))
    assert isinstance(err, p.Error) and err.code == "response_in_progress"


def test_respond_needs_something_to_answer() -> None:
    d = make()
    (err,) = sent(d.send(Respond()))
    assert isinstance(err, p.Error) and err.code == "nothing_to_answer"
    (start,) = of(d.send(Respond(audio=np.zeros(16000, np.float32))), StartTurn)
    assert isinstance(start, StartTurn) and start.audio is not None


def test_configure_sets_instructions_speech_and_the_endpointer() -> None:
    d = make()
    longer = EndpointConfig(min_speech_ms=96, pause_ms=224, end_of_turn_ms=900)
    d.send(Configure(longer, instructions="Be brief.", speak=False))
    assert d.s.config.endpoint == longer and d.s.config.end_of_turn.default_ms == 900
    d.send(UserText("Hi"))
    (start,) = of(d.send(Respond()), StartTurn)
    assert isinstance(start, StartTurn) and not start.speak
    assert start.history[0] == ChatMessage("system", "Be brief.")
    out = d.send(ReplySentence(start.turn_id, 0, "Hello.", 5.0))
    assert sent(out) == [p.ReplyText(start.turn_id, 0, "Hello.")]  # no audio to wait for
    out = d.send(ReplyFinished(start.turn_id, None, 9.0))
    assert sent(out, p.ReplyDone) == [p.ReplyDone(start.turn_id, "Hello.")]
    assert d.s.conversation[-1] == ChatMessage("assistant", "Hello.")


def test_respond_overrides_instructions_and_speech_for_one_reply() -> None:
    d = make()
    d.send(UserText("Hi"))
    (start,) = of(d.send(Respond(instructions="Shout.", speak=False)), StartTurn)
    assert isinstance(start, StartTurn) and not start.speak
    assert start.history[0] == ChatMessage("system", "Shout.")
    d.send(ReplyFinished(start.turn_id, None, 1.0))
    (start,) = of(d.send(UserText("Again")) + d.send(Respond()), StartTurn)
    assert isinstance(start, StartTurn) and start.speak and start.history[0].role == "user"


def test_clear_input_forgets_the_speech_and_its_speculation() -> None:
    d = make()
    d.speak()
    out = d.silence(7)  # paused: the speculative turn runs
    (start,) = of(out, StartTurn)
    assert isinstance(start, StartTurn)
    out = d.send(ClearInput())
    assert of(out, CancelTurn) == [CancelTurn(start.turn_id)]
    assert not of(d.silence(20), ReleaseTurn)  # its end of turn never comes
    (started,) = sent(d.speak(), p.SpeechStarted)
    assert isinstance(started, p.SpeechStarted) and started.turn_id > start.turn_id


def test_speech_after_a_text_reply_is_shown_is_a_barge_in_not_more_of_the_turn() -> None:
    d = make()
    d.send(Configure(ENDPOINT, speak=False))
    turn = released_turn(d)
    d.send(ReplySentence(turn, 0, "Paris.", 5.0))
    (cancelled,) = sent(d.speak(), p.ReplyCancelled)
    assert isinstance(cancelled, p.ReplyCancelled) and cancelled.reason == "barge_in"
    assert cancelled.spoken_text == "Paris."  # all of it was shown
