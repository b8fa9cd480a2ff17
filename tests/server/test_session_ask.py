"""Asking before acting in the session (docs/actions.md, "Asking first"): a call of a
tool marked ``confirm`` is asked about, not made; the user's next words make it (a
yes) or drop it (anything else). The turn pipeline's part, what is said, is in
tests/server/test_turn_pipeline.py; the yes/no reader and the references in
tests/model/test_ask.py."""

from __future__ import annotations

from model.ask import earlier_calls, missing, resolve
from model.engine import ChatMessage, GenerationStats
from model.tools import DEFAULT_TOOLS, ToolCall
from server import protocol as p
from server.resume import ResumeStore
from server.session import (
    Configure,
    Disconnected,
    Effect,
    FinalTranscript,
    ReleaseTurn,
    ReplyAction,
    ReplyAudio,
    ReplyFinished,
    ReplySentence,
    Respond,
    Session,
    StartTurn,
    UserText,
)

from .test_session import ENDPOINT, Driver, of, sent, settings
from .test_session_actions import AUDIO, acting

TOOLS = {t.name: t for t in DEFAULT_TOOLS}
MESSAGE = ToolCall("message.send", {"to": "my sister", "text": "I'm running late"}, passes=3)
QUESTION = "Send 'I'm running late' to your sister?"
SENDING = "Sending your sister your message: I'm running late."
DONE = GenerationStats(0, 0, "end")


def typed(d: Driver, text: str) -> StartTurn:
    (start,) = of(d.send(p.Text(text)), StartTurn)
    assert isinstance(start, StartTurn)
    return start


def reply(d: Driver, turn: int, sentence: str, call: ToolCall | None = None) -> list[Effect]:
    """What the pipeline delivers of a reply: its call, one sentence and its audio."""
    out = d.send(ReplyAction(turn, call)) if call is not None else []
    out += d.send(ReplySentence(turn, 0, sentence, 40.0))
    out += d.send(ReplyAudio(turn, 0, AUDIO, 100, 20.0))
    return out + d.send(ReplyFinished(turn, DONE, 50.0))


def asked(d: Driver) -> int:
    """The user asks for a message; the reply asks about it, and nothing acts."""
    start = typed(d, "Text my sister that I'm running late.")
    assert start.pending is None
    out = reply(d, start.turn_id, QUESTION, MESSAGE)
    assert sent(out, p.ReplyText) == [p.ReplyText(start.turn_id, 0, QUESTION)]
    assert not sent(out, p.Action)
    assert d.s.conversation[-1] == ChatMessage("assistant", QUESTION)  # no call made
    return start.turn_id


def test_a_message_that_needs_confirmation_is_sent_only_after_a_yes() -> None:
    d, _ = acting()
    asked(d)
    start = typed(d, "Yes, please.")
    assert start.pending == MESSAGE  # the pipeline says the template, asks no model
    out = reply(d, start.turn_id, SENDING)
    turn = start.turn_id
    assert sent(out, p.Action) == [
        p.Action(turn, f"call_{turn}", "message.send", MESSAGE.arguments)
    ]
    kinds = [type(m) for m in sent(out)]
    assert kinds.index(p.Action) < kinds.index(p.ReplyText)  # with the first audio
    said = d.s.conversation[-1].content
    assert said.startswith('<tool_call>{"name": "message.send"') and said.endswith(SENDING)
    # made once: the next yes answers nothing
    again = typed(d, "Yes.")
    assert again.pending is None
    assert not sent(reply(d, again.turn_id, "Okay."), p.Action)


def test_a_no_drops_the_pending_call() -> None:
    d, _ = acting()
    asked(d)
    start = typed(d, "No, thanks.")
    assert start.pending == MESSAGE
    assert not sent(reply(d, start.turn_id, "Okay, I won't."), p.Action)
    later = typed(d, "Yes.")
    assert later.pending is None
    assert not sent(reply(d, later.turn_id, "Okay."), p.Action)


def test_another_request_drops_the_pending_call_and_is_answered() -> None:
    d, _ = acting()
    asked(d)
    start = typed(d, "What time is it?")
    out = reply(d, start.turn_id, "It is five past nine.")
    assert sent(out, p.ReplyText) == [p.ReplyText(start.turn_id, 0, "It is five past nine.")]
    assert not sent(out, p.Action)
    assert typed(d, "Yes.").pending is None


def test_a_barge_in_during_the_question_keeps_the_call_for_the_next_words() -> None:
    d, _ = acting()
    start = typed(d, "Text my sister that I'm running late.")
    turn = start.turn_id
    d.send(ReplyAction(turn, MESSAGE))
    d.send(ReplySentence(turn, 0, QUESTION, 40.0))
    d.send(ReplyAudio(turn, 0, AUDIO, 100, 20.0))
    out = d.speak()  # "Yes" over the question
    assert [m.reason for m in sent(out, p.ReplyCancelled)] == ["barge_in"]  # type: ignore[attr-defined]
    (answer,) = of(d.silence(7), StartTurn)
    assert isinstance(answer, StartTurn) and answer.pending == MESSAGE
    d.send(FinalTranscript(answer.turn_id, "Yes.", 100.0, -0.2))
    assert of(d.silence(12), ReleaseTurn)
    out = reply(d, answer.turn_id, SENDING)
    assert [a.name for a in sent(out, p.Action)] == ["message.send"]  # type: ignore[attr-defined]


def test_a_yes_the_asr_did_not_trust_makes_no_call() -> None:
    d, _ = acting()
    asked(d)
    d.speak()
    (answer,) = of(d.silence(7), StartTurn)
    assert isinstance(answer, StartTurn) and answer.pending == MESSAGE
    d.send(FinalTranscript(answer.turn_id, "Yes.", 100.0, -0.2, trusted=False))
    assert of(d.silence(12), ReleaseTurn)
    assert not sent(reply(d, answer.turn_id, "Okay."), p.Action)


def test_a_tool_that_needs_no_confirmation_acts_at_once() -> None:
    d, _ = acting()
    start = typed(d, "Set a timer for five minutes.")
    out = reply(d, start.turn_id, "Timer set.", ToolCall("timer.set", {"seconds": 300}))
    assert [a.name for a in sent(out, p.Action)] == ["timer.set"]  # type: ignore[attr-defined]
    assert typed(d, "Yes.").pending is None


def test_her_after_call_my_sister_resolves_to_the_sister() -> None:
    """The call made after a yes stays in the conversation, and so does the one asked
    about: the next turn's "her" resolves against either (the pipeline resolves with
    model/ask.py's resolve over what StartTurn carries)."""
    tools = {t.name: t for t in DEFAULT_TOOLS}
    sister = ToolCall("call.start", {"contact": "my sister"})
    her = ToolCall("message.send", {"to": "her instead", "text": "I'm running late"})
    for answered in (True, False):
        d, _ = acting()
        start = typed(d, "Call my sister.")
        reply(d, start.turn_id, "Call your sister?", sister)
        if answered:
            yes = typed(d, "Yes.")
            reply(d, yes.turn_id, "Calling your sister.")
        nxt = typed(d, "Actually, text her instead that I'm running late.")
        earlier = earlier_calls(nxt.history) + ([nxt.pending] if nxt.pending else [])
        made = resolve(her, tools["message.send"], earlier)
        assert made == ToolCall("message.send", {"to": "my sister", "text": "I'm running late"})
        assert (nxt.pending is None) is answered
    # with no earlier call, "her" is asked about
    d, _ = acting()
    nxt = typed(d, "Text her that I'm running late.")
    dropped = resolve(her, tools["message.send"], earlier_calls(nxt.history))
    assert missing(dropped, tools["message.send"]) == "Who should I send it to?"


def test_a_requested_reply_answers_the_question_with_the_user_s_last_words() -> None:
    """On /v1/realtime a typed yes is conversation.item.create then response.create, and
    a spoken one with create_response false is transcribed, then answered on request:
    either makes the call. A request with no new words drops it."""
    for how in ("typed", "spoken", "nothing new"):
        d, _ = acting()
        asked(d)
        if how == "typed":
            d.send(UserText("Yes."))
        elif how == "spoken":
            d.send(Configure(ENDPOINT, respond=False))
            d.speak()
            (heard,) = of(d.silence(7), StartTurn)
            assert isinstance(heard, StartTurn)
            d.send(FinalTranscript(heard.turn_id, "Yes.", 100.0, -0.2))
            assert of(d.silence(12), ReleaseTurn)
            d.send(ReplyFinished(heard.turn_id, None, None))
        (start,) = of(d.send(Respond(unprompted=True)), StartTurn)
        assert isinstance(start, StartTurn)
        made = how != "nothing new"
        assert start.pending == (MESSAGE if made else None), how
        out = reply(d, start.turn_id, SENDING if made else "Okay.")
        assert [a.name for a in sent(out, p.Action)] == (["message.send"] if made else []), how  # type: ignore[attr-defined]


def spoken(d: Driver, transcript: FinalTranscript) -> int:
    """A spoken turn whose final transcript is ``transcript`` (its turn id filled in)."""
    d.speak()
    (start,) = of(d.silence(7), StartTurn)
    assert isinstance(start, StartTurn)
    d.send(FinalTranscript(**{**transcript.__dict__, "turn_id": start.turn_id}))
    assert of(d.silence(12), ReleaseTurn)
    return start.turn_id


def test_a_low_confidence_transcript_does_not_act() -> None:
    """Below Whisper's bars (model.ask.unheard) no call is made, whatever the reply
    model wrote (the pipeline says it did not catch that): nor a yes that answers a
    question, which then stands for the next words."""
    timer = ToolCall("timer.set", {"seconds": 300})
    for logprob, no_speech, acts in ((-0.2, 0.01, True), (-1.3, 0.01, False), (-0.2, 0.8, False)):
        d, _ = acting()
        words = FinalTranscript(0, "Set a timer for five minutes.", 90.0, logprob, True, no_speech)
        turn = spoken(d, words)
        out = reply(d, turn, "Timer set.", timer)
        assert [a.name for a in sent(out, p.Action)] == (["timer.set"] if acts else [])  # type: ignore[attr-defined]
    d, _ = acting()
    asked(d)
    turn = spoken(d, FinalTranscript(0, "Yes.", 90.0, -1.4, True, 0.01))
    assert not sent(reply(d, turn, "Sorry, I didn't catch that."), p.Action)
    again = typed(d, "Yes.")
    assert again.pending == MESSAGE
    assert [a.name for a in sent(reply(d, again.turn_id, SENDING), p.Action)] == ["message.send"]  # type: ignore[attr-defined]


def test_unsure_words_heard_twice_act_and_a_call_heard_two_ways_waits_for_a_yes() -> None:
    """Words under Whisper's bar that a second model heard the same (``heard_twice``)
    are acted on; a call the pipeline marks ``doubted`` (the second model heard other
    words) is kept as a question and made only after a yes."""
    timer = ToolCall("timer.set", {"seconds": 300})
    d, _ = acting()
    words = FinalTranscript(0, "Set a timer for five minutes.", 90.0, -1.3, True, 0.01, True)
    out = reply(d, spoken(d, words), "Timer set.", timer)
    assert [a.name for a in sent(out, p.Action)] == ["timer.set"]  # type: ignore[attr-defined]
    d, _ = acting()
    doubted = ToolCall("timer.set", {"seconds": 300}, doubted=True)
    sure = FinalTranscript(0, "Set a timer for five minutes.", 90.0, -0.2, True, 0.01)
    out = reply(d, spoken(d, sure), "Set a timer for five minutes?", doubted)
    assert not sent(out, p.Action)
    yes = typed(d, "Yes.")
    assert yes.pending == timer
    out = reply(d, yes.turn_id, "Timer set for five minutes.")
    assert [a.name for a in sent(out, p.Action)] == ["timer.set"]  # type: ignore[attr-defined]


def test_a_requested_reply_to_words_the_asr_was_unsure_of_acts_on_nothing() -> None:
    """Realtime's create_response false, then response.create: the words were heard
    unsurely, so the reply asked for is told so (StartTurn.sure) and acts on nothing."""
    for logprob, acts in ((-0.2, True), (-1.3, False)):
        d, _ = acting()
        d.send(Configure(ENDPOINT, respond=False))
        d.speak()
        (heard,) = of(d.silence(7), StartTurn)
        assert isinstance(heard, StartTurn) and heard.sure  # the pipeline weighs its own
        d.send(FinalTranscript(heard.turn_id, "Set a timer for five minutes.", 90.0, logprob))
        assert of(d.silence(12), ReleaseTurn)
        d.send(ReplyFinished(heard.turn_id, None, None))
        (start,) = of(d.send(Respond(unprompted=True)), StartTurn)
        assert isinstance(start, StartTurn) and start.sure is acts
        out = reply(d, start.turn_id, "Timer set.", ToolCall("timer.set", {"seconds": 300}))
        assert [a.name for a in sent(out, p.Action)] == (["timer.set"] if acts else [])  # type: ignore[attr-defined]


def test_a_call_the_router_was_unsure_of_is_made_only_after_a_yes() -> None:
    d, _ = acting()
    unsure = ToolCall("timer.set", {"seconds": 300}, margin=1.0)
    start = typed(d, "Five minutes.")
    assert not sent(reply(d, start.turn_id, "Set a timer for five minutes?", unsure), p.Action)
    yes = typed(d, "Yes.")
    assert yes.pending == unsure
    out = reply(d, yes.turn_id, "Timer set for five minutes.")
    assert [a.name for a in sent(out, p.Action)] == ["timer.set"]  # type: ignore[attr-defined]


def test_a_call_for_the_user_or_the_assistant_is_never_made() -> None:
    """The nearest tool to "Read me my last message." (the pipeline refuses it)."""
    d, _ = acting()
    start = typed(d, "Read me my last message.")
    nearest = ToolCall("message.send", {"to": "me", "text": "my last message"})
    assert not sent(reply(d, start.turn_id, "Sorry, I can't do that.", nearest), p.Action)
    assert typed(d, "Yes.").pending is None


def test_the_name_after_who_should_i_call_is_the_pending_call_s_contact() -> None:
    """ "Call her." with nobody named before: the call goes to the session without its
    contact (model.ask.resolve) and is asked about; "My sister." completes it, which
    is asked about in turn (call.start is marked confirm); a yes makes it."""
    d, _ = acting()
    start = typed(d, "Call her.")
    incomplete = ToolCall("call.start", {}, passes=3)
    assert not sent(reply(d, start.turn_id, "Who should I call?", incomplete), p.Action)
    name = typed(d, "My sister.")
    assert name.pending == incomplete
    assert not sent(reply(d, name.turn_id, "Call your sister?"), p.Action)
    yes = typed(d, "Yes.")
    assert yes.pending == ToolCall("call.start", {"contact": "my sister"}, passes=3)
    out = reply(d, yes.turn_id, "Calling your sister.")
    assert sent(out, p.Action) == [
        p.Action(yes.turn_id, f"call_{yes.turn_id}", "call.start", {"contact": "my sister"})
    ]


def test_a_number_the_request_did_not_say_is_asked_for_and_the_answer_makes_the_call() -> None:
    """ "Set a timer." with a made-up 100 s: the pipeline drops the number
    (model.ask.unsaid) and asks "For how long?"; the session makes nothing; "Ten
    minutes." completes the call, which is made at once (timer.set is not asked about)."""
    d, _ = acting()
    start = typed(d, "Set a timer.")
    incomplete = ToolCall("timer.set", {}, passes=2)
    assert missing(incomplete, TOOLS["timer.set"]) == "For how long?"
    assert not sent(reply(d, start.turn_id, "For how long?", incomplete), p.Action)
    answer = typed(d, "Ten minutes.")
    assert answer.pending == incomplete
    out = reply(d, answer.turn_id, "Timer set for ten minutes.")
    assert sent(out, p.Action) == [
        p.Action(answer.turn_id, f"call_{answer.turn_id}", "timer.set", {"seconds": 600})
    ]
    assert typed(d, "Ten minutes.").pending is None  # answered once


def test_a_ty_answered_out_of_range_is_asked_about_as_its_teen_and_a_yes_makes_it() -> None:
    """ "What temperature?" "Sixteen." heard "60 degrees." (model.ask.teen_twin): the
    session asks about 16 and makes it on a yes, never 60 or the cabin's bound."""
    d, _ = acting()
    start = typed(d, "Set the temperature.")
    incomplete = ToolCall("climate.set", {})
    assert not sent(reply(d, start.turn_id, "What temperature?", incomplete), p.Action)
    answer = typed(d, "60 degrees.")
    assert answer.pending == incomplete
    twin = ToolCall("climate.set", {"temperature_c": 16}, doubted=True)
    out = reply(d, answer.turn_id, "Set the temperature to sixteen degrees?")
    assert not sent(out, p.Action)
    yes = typed(d, "Yes.")
    assert yes.pending == twin
    out = reply(d, yes.turn_id, "Temperature set to sixteen degrees.")
    assert sent(out, p.Action) == [
        p.Action(yes.turn_id, f"call_{yes.turn_id}", "climate.set", {"temperature_c": 16})
    ]


def test_a_name_completes_a_tool_not_asked_about_at_once() -> None:
    """A tool without ``confirm`` (the client's own) is made as soon as it has a name."""
    page = {
        "name": "pager.page",
        "parameters": {
            "type": "object",
            "properties": {"contact": {"type": "string"}},
            "required": ["contact"],
        },
    }
    d, _ = acting(p.Start(sample_rate=16000, tools=[page]))
    start = typed(d, "Page him.")
    reply(d, start.turn_id, "Who should I call?", ToolCall("pager.page", {}))
    name = typed(d, "Doctor Jones.")
    out = reply(d, name.turn_id, "Done: pager page with contact Doctor Jones.")
    assert sent(out, p.Action) == [
        p.Action(name.turn_id, f"call_{name.turn_id}", "pager.page", {"contact": "Doctor Jones"})
    ]


def test_a_pending_question_survives_a_resume_and_a_yes_completes_it() -> None:
    """The question is parked with the conversation (server/resume.py; the fleet's
    Redis store keeps the same, server/store.py): the resumed session's yes sends."""
    store = ResumeStore(ttl_s=60)
    d = Driver(Session("r1", settings(), "a", "b", store, "tok-1", can_act=True))
    d.send(p.Start(sample_rate=16000))
    asked(d)
    d.now = 5.0
    d.send(Disconnected())
    again = Driver(Session("r2", settings(), "a", "b", store, "tok-2", can_act=True))
    again.now = 20.0
    (ready,) = sent(again.send(p.Start(sample_rate=16000, resume_token="tok-1")))
    assert isinstance(ready, p.Ready) and ready.resumed
    assert again.s.pending == MESSAGE
    yes = typed(again, "Yes, please.")
    assert yes.pending == MESSAGE
    out = reply(again, yes.turn_id, SENDING)
    assert sent(out, p.Action) == [
        p.Action(yes.turn_id, f"call_{yes.turn_id}", "message.send", MESSAGE.arguments)
    ]


def test_a_question_cut_by_a_dropped_connection_is_parked_once_some_was_heard() -> None:
    for heard in (True, False):
        store = ResumeStore(ttl_s=60)
        d = Driver(Session("r1", settings(), "a", "b", store, "tok-1", can_act=True))
        d.send(p.Start(sample_rate=16000))
        start = typed(d, "Text my sister that I'm running late.")
        d.send(ReplyAction(start.turn_id, MESSAGE))
        d.send(ReplySentence(start.turn_id, 0, QUESTION, 40.0))
        if heard:
            d.send(ReplyAudio(start.turn_id, 0, AUDIO, 100, 20.0))
        d.send(Disconnected())
        again = Driver(Session("r2", settings(), "a", "b", store, "tok-2", can_act=True))
        again.send(p.Start(sample_rate=16000, resume_token="tok-1"))
        assert again.s.pending == (MESSAGE if heard else None), heard
