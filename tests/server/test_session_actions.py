"""Tool calls in the session: when an action goes out, what the conversation keeps,
action results, and the tools a session is started with (docs/protocol.md, "Actions")."""

from __future__ import annotations

import json

from model.engine import ChatMessage, GenerationStats
from model.tools import DEFAULT_TOOLS, ToolCall
from server import protocol as p
from server.session import (
    Configure,
    FinalTranscript,
    ReleaseTurn,
    ReplyAction,
    ReplyAudio,
    ReplyFinished,
    ReplySentence,
    Respond,
    Session,
    StartTurn,
    State,
    TurnEndScored,
)

from .test_session import ENDPOINT, Driver, of, released_turn, sent, settings, spoken_turn

TIMER = ToolCall("timer.set", {"seconds": 300}, passes=4)
TIMER_TEXT = '<tool_call>{"name": "timer.set", "arguments": {"seconds": 300}}</tool_call>'
AUDIO = b"\x00\x00" * 100


def acting(
    start: p.Start | None = None, can_act: bool = True
) -> tuple[Driver, list[p.ServerMessage]]:
    d = Driver(Session("test", settings(), "tiny.en", "fake", can_act=can_act))
    out = d.send(start or p.Start(sample_rate=16000))
    return d, sent(out)


def test_a_session_gets_the_default_tools_and_passes_them_to_its_turns() -> None:
    d, (ready,) = acting()
    assert isinstance(ready, p.Ready)
    assert ready.tools == [t.name for t in DEFAULT_TOOLS]
    d.speak()
    (start,) = of(d.silence(7), StartTurn)
    assert isinstance(start, StartTurn) and start.tools == DEFAULT_TOOLS


def test_start_names_its_own_tools_or_none() -> None:
    lamp = {
        "name": "lamp.dim",
        "description": "Dim the desk lamp.",
        "parameters": {"type": "object", "properties": {"percent": {"type": "integer"}}},
    }
    _, (ready,) = acting(p.Start(sample_rate=16000, tools=[lamp]))
    assert isinstance(ready, p.Ready) and ready.tools == ["lamp.dim"]
    _, (ready,) = acting(p.Start(sample_rate=16000, tools=[]))
    assert isinstance(ready, p.Ready) and ready.tools == []


def test_bad_tools_are_an_error_and_the_session_stays_idle() -> None:
    d, messages = acting(p.Start(sample_rate=16000, tools=[{"name": "no spaces allowed"}]))
    (error,) = messages
    assert isinstance(error, p.Error) and error.code == "bad_tools"
    assert d.s.state is State.IDLE
    assert "tools[0].name" in error.message
    _, (ready,) = acting(p.Start(sample_rate=16000, tools=[{"name": "ok.tool"}]))
    assert isinstance(ready, p.Ready)


def test_an_engine_without_tools_says_so_and_the_session_goes_on() -> None:
    _, messages = acting(p.Start(sample_rate=16000, tools=[]), can_act=False)
    assert [type(m) for m in messages] == [p.Ready]  # asked for none: nothing to say
    _, (ready, error) = acting(p.Start(sample_rate=16000, tools=[{"name": "x"}]), can_act=False)
    assert isinstance(ready, p.Ready) and ready.tools == []
    assert isinstance(error, p.Error) and error.code == "tools_unsupported"


def test_the_action_goes_out_with_the_first_audio_before_the_confirmation() -> None:
    d, _ = acting()
    turn = released_turn(d)
    assert d.send(ReplyAction(turn, TIMER)) == []
    assert d.send(ReplySentence(turn, 0, "Timer set for five minutes.", 40.0)) == []
    out = d.send(ReplyAudio(turn, 0, AUDIO, 100, 20.0))
    action, text = sent(out)
    assert action == p.Action(turn, f"call_{turn}", "timer.set", {"seconds": 300})
    assert text == p.ReplyText(turn, 0, "Timer set for five minutes.")
    stats = GenerationStats(5, 12, "end")
    metrics = sent(d.send(ReplyFinished(turn, stats, 90.0)), p.Metrics)[0]
    assert isinstance(metrics, p.Metrics)
    assert metrics.action == "timer.set" and metrics.action_passes == 4
    assert d.s.conversation[-1] == ChatMessage(
        "assistant", f"{TIMER_TEXT} Timer set for five minutes."
    )


def test_an_answer_withdrawn_before_it_was_heard_never_acted() -> None:
    """The user goes on before any reply audio: the client must not have acted."""
    d, _ = acting()
    turn = spoken_turn(d, "Set a timer for five minutes.")
    d.send(TurnEndScored(turn, 0.9))
    d.send(ReplyAction(turn, TIMER))
    out = d.speak(5)
    assert not sent(out, p.Action)
    assert sent(out, p.ReplyCancelled) == [p.ReplyCancelled(turn, "continued", "")]
    assert all("tool_call" not in m.content for m in d.s.conversation)


def test_a_call_of_a_tool_the_session_does_not_have_is_dropped() -> None:
    d, _ = acting(p.Start(sample_rate=16000, tools=[]))
    turn = released_turn(d)
    assert d.send(ReplyAction(turn, TIMER)) == []
    d.send(ReplySentence(turn, 0, "Okay.", 40.0))
    out = d.send(ReplyAudio(turn, 0, AUDIO, 100, 20.0))
    assert not sent(out, p.Action)


def test_an_action_result_joins_the_conversation_after_the_reply() -> None:
    d, _ = acting()
    turn = released_turn(d)
    d.send(ReplyAction(turn, TIMER))
    d.send(ReplySentence(turn, 0, "Timer set.", 40.0))
    d.send(ReplyAudio(turn, 0, AUDIO, 100, 20.0))
    # the client answers while the confirmation is still playing
    assert d.send(p.ActionResult(f"call_{turn}", "Timer running: 300 s")) == []
    d.send(ReplyFinished(turn, GenerationStats(3, 9, "end"), 50.0))
    roles = [m.role for m in d.s.conversation]
    assert roles == ["user", "assistant", "tool"]
    assert json.loads(d.s.conversation[-1].content) == {
        "name": "timer.set",
        "output": "Timer running: 300 s",
    }
    # one result per call: a second one is an error, as is an unknown id
    (error,) = sent(d.send(p.ActionResult(f"call_{turn}", "again")))
    assert isinstance(error, p.Error) and error.code == "unknown_call_id"


def test_a_barge_in_keeps_the_call_that_went_out_and_the_words_heard() -> None:
    d, _ = acting()
    turn = released_turn(d)
    d.send(ReplyAction(turn, TIMER))
    d.send(ReplySentence(turn, 0, "Timer set.", 40.0))
    d.send(ReplyAudio(turn, 0, AUDIO, 100, 20.0))
    out = d.speak(5)
    assert sent(out, p.ReplyCancelled) == [p.ReplyCancelled(turn, "barge_in", "Timer set.")]
    assert d.s.conversation[-1] == ChatMessage("assistant", f"{TIMER_TEXT} Timer set.")
    # its result, arriving later, still joins the conversation
    d.send(p.ActionResult(f"call_{turn}", "ok"))
    assert d.s.conversation[-1].role == "tool"


def test_a_text_only_reply_sends_its_action_at_once() -> None:
    d, _ = acting()
    d.s.speak = False
    out = d.send(p.Text("Set a timer for five minutes."))
    (start,) = of(out, StartTurn)
    assert isinstance(start, StartTurn)
    out = d.send(ReplyAction(start.turn_id, TIMER))
    assert sent(out) == [
        p.Action(start.turn_id, f"call_{start.turn_id}", "timer.set", {"seconds": 300})
    ]


def test_a_transcript_the_asr_does_not_trust_never_acts() -> None:
    """A looped decode (audio.asr.looks_looped in both windows) is answered from its
    de-duplicated words, but a call its reply makes is not acted on; the same turn
    with a trusted transcript acts."""
    for trusted in (True, False):
        d, _ = acting()
        d.speak()
        (start,) = of(d.silence(7), StartTurn)
        assert isinstance(start, StartTurn)
        turn = start.turn_id
        d.send(FinalTranscript(turn, "Set a timer for five minutes.", 100.0, -0.2, trusted))
        assert of(d.silence(12), ReleaseTurn)
        d.send(ReplyAction(turn, TIMER))
        d.send(ReplySentence(turn, 0, "Okay.", 40.0))
        out = d.send(ReplyAudio(turn, 0, AUDIO, 100, 20.0))
        assert sent(out, p.ReplyText) == [p.ReplyText(turn, 0, "Okay.")]
        assert bool(sent(out, p.Action)) is trusted
        d.send(ReplyFinished(turn, GenerationStats(3, 9, "end"), 50.0))
        calls = [m for m in d.s.conversation if "tool_call" in m.content]
        assert bool(calls) is trusted


def test_a_requested_reply_to_an_untrusted_transcript_gets_no_tools() -> None:
    """Transcribed only (Realtime's create_response false), then answered on request:
    the reply to untrusted words is offered no tools, nor acts; a trusted twin is."""
    for trusted in (True, False):
        d, _ = acting()
        d.send(Configure(ENDPOINT, respond=False))
        d.speak()
        (start,) = of(d.silence(7), StartTurn)
        assert isinstance(start, StartTurn) and not start.reply
        turn = start.turn_id
        d.send(FinalTranscript(turn, "Set a timer for five minutes.", 100.0, -0.2, trusted))
        assert of(d.silence(12), ReleaseTurn)
        d.send(ReplyFinished(turn, None, None))
        assert d.s.conversation[-1] == ChatMessage("user", "Set a timer for five minutes.")
        (answer,) = of(d.send(Respond()), StartTurn)
        assert isinstance(answer, StartTurn) and answer.audio is None
        assert answer.tools == (DEFAULT_TOOLS if trusted else ())
        out = d.send(ReplyAction(answer.turn_id, TIMER))
        out += d.send(ReplySentence(answer.turn_id, 0, "Okay.", 40.0))
        out += d.send(ReplyAudio(answer.turn_id, 0, AUDIO, 100, 20.0))
        assert bool(sent(out, p.Action)) is trusted
