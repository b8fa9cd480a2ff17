"""Asking before acting, without a model (model/ask.py, model/confirm.py's question):
the yes/no reader, the question said about a call, and references to earlier calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audio.asr import Transcriber
from audio.speech import SpeechFactory, normalize_words, pad
from bench.asr import noisy_copy
from model.ask import (
    answer,
    asked,
    claims,
    earlier_calls,
    heard_alike,
    missing,
    named,
    named_tools,
    offered,
    outside,
    resolve,
    statement,
    teen_twin,
    unheard,
    unplaced,
    unsaid,
    untied,
)
from model.confirm import question
from model.engine import ChatMessage
from model.spoken import say_integer
from model.tools import (
    DEFAULT_TOOLS,
    ToolCall,
    kept_reply,
    parse_tools,
    render_call,
    split_call,
)

TOOLS = {t.name: t for t in DEFAULT_TOOLS}
SISTER = ToolCall("call.start", {"contact": "my sister"})


@pytest.mark.parametrize(
    "text",
    ["Yes.", "yes", "Yeah.", "Sure!", "Yes, please.", "Yes please.", "Do it.", "Please do.",
     "Send it.", "Go ahead.", "Okay, go ahead.", "Yep, thanks.", "Yes \u2026 send it."],
)  # fmt: skip
def test_a_plain_yes_is_a_yes(text: str) -> None:
    assert answer(text) == "yes"


@pytest.mark.parametrize(
    "text",
    ["No.", "no", "Nope.", "Don't.", "Cancel.", "Never mind.", "No, thanks.", "No, don\u2019t."],
)
def test_a_plain_no_is_a_no(text: str) -> None:
    assert answer(text) == "no"


@pytest.mark.parametrize(
    "text",
    ["", "  ", "Please.", "What time is it?", "No, call my brother.", "Yes. No.",
     "Yes, and set a timer.", "I said yes yesterday.", "Send it to my mom."],
)  # fmt: skip
def test_anything_else_is_neither(text: str) -> None:
    """A new request, both at once, or a yes inside other words is no answer: the
    turn is answered as one, and the call asked about is dropped."""
    assert answer(text) is None


def test_a_question_says_the_call_with_the_user_s_words_turned_round() -> None:
    message = ToolCall("message.send", {"to": "my sister", "text": "I'm running late."})
    assert question(message) == "Send 'I'm running late' to your sister?"
    assert question(SISTER) == "Call your sister?"
    assert question(ToolCall("call.start", {"contact": "Anna"})) == "Call Anna?"
    door = ToolCall("door.unlock", {"side": "left", "all": True})
    assert question(door) == "Should I do door unlock with side left, all on?"
    assert question(ToolCall("message.send", {"to": "Bob"})) == (  # a call missing an argument
        "Should I do message send with to Bob?"
    )


def test_confirm_is_on_for_messages_and_calls_and_read_from_the_wire() -> None:
    assert {t.name for t in DEFAULT_TOOLS if t.confirm} == {"message.send", "call.start"}
    (door,) = parse_tools([{"name": "door.unlock", "confirm": True}])
    assert door.confirm and door.schema()["confirm"] is True
    (lamp,) = parse_tools([{"name": "lamp.on"}])
    assert not lamp.confirm and "confirm" not in lamp.schema()
    with pytest.raises(ValueError, match=r"tools\[0\].confirm"):
        parse_tools([{"name": "lamp.on", "confirm": "yes"}])


def test_her_after_call_my_sister_resolves_to_the_sister() -> None:
    her = ToolCall("message.send", {"to": "her instead", "text": "I'm running late"}, passes=2)
    made = resolve(her, TOOLS["message.send"], [SISTER])
    assert made == ToolCall("message.send", {"to": "my sister", "text": "I'm running late"}, 2)
    for said in ("her", "Him.", "them", "that person", "it"):
        call = ToolCall("call.start", {"contact": said})
        assert resolve(call, TOOLS["call.start"], [SISTER]) == SISTER, said


def test_the_latest_call_that_named_someone_is_the_one_meant() -> None:
    earlier = [
        ToolCall("call.start", {"contact": "Anna"}),
        ToolCall("message.send", {"to": "my dad", "text": "hi"}),
        ToolCall("timer.set", {"seconds": 60}),  # names nobody
    ]
    him = ToolCall("call.start", {"contact": "him"})
    assert resolve(him, TOOLS["call.start"], earlier) == ToolCall(
        "call.start", {"contact": "my dad"}
    )


def test_a_reference_nothing_resolves_is_asked_about() -> None:
    """The reference is dropped: the call is incomplete, and missing says what to ask."""
    her = ToolCall("message.send", {"to": "her", "text": "hi"})
    dropped = resolve(her, TOOLS["message.send"], [])
    assert dropped == ToolCall("message.send", {"text": "hi"})
    assert missing(dropped, TOOLS["message.send"]) == "Who should I send it to?"
    assert asked(dropped, TOOLS["message.send"])
    timer = [ToolCall("timer.set", {"seconds": 60})]
    call = resolve(ToolCall("call.start", {"contact": "her"}), TOOLS["call.start"], timer)
    assert missing(call, TOOLS["call.start"]) == "Who should I call?"
    assert missing(SISTER, TOOLS["call.start"]) is None


@pytest.mark.parametrize(
    ("text", "name"),
    [("My sister.", "my sister"), ("my sister", "my sister"), ("To Tom, please.", "Tom"),
     ("Um, Dr. Smith.", "Dr. Smith"), ("Call my mom.", "my mom"), ("It's Anna.", "Anna")],
)  # fmt: skip
def test_a_name_answered_to_who_should_i_call_completes_the_call(text: str, name: str) -> None:
    who = ToolCall("call.start", {}, passes=4)
    assert named(who, TOOLS["call.start"], text) == ToolCall("call.start", {"contact": name}, 4)


@pytest.mark.parametrize(
    "text",
    ["Yes.", "No.", "What time is it?", "Set a timer for ten minutes.", "Her.", "Never mind.",
     "Play some jazz music in the car now please."],
)  # fmt: skip
def test_words_that_are_no_name_complete_nothing(text: str) -> None:
    assert named(ToolCall("call.start", {}), TOOLS["call.start"], text) is None


@pytest.mark.parametrize(
    ("call", "out"),
    [
        (ToolCall("message.send", {"to": "me", "text": "my last message"}), True),
        (ToolCall("message.send", {"to": "you", "text": "thank you very much"}), True),
        (ToolCall("call.start", {"contact": "me up into hours"}), True),
        (ToolCall("message.send", {"to": "my mom", "text": "call me"}), False),
        (ToolCall("call.start", {"contact": "Yusuf"}), False),
        (ToolCall("media.play", {"query": "me and bobby mcgee"}), False),  # names nobody
    ],
)
def test_a_call_for_the_user_or_the_assistant_is_outside_what_the_tools_do(
    call: ToolCall, out: bool
) -> None:
    assert outside(call, TOOLS[call.name]) is out


@pytest.mark.parametrize(
    ("text", "call"),
    [
        ("Read my messages.",
         ToolCall("message.send", {"to": "my messages", "text": "Read my messages"})),
        ("Thanks, goodbye.", ToolCall("message.send", {"to": "goodbye", "text": "goodbye"})),
        ("Goodbye.", ToolCall("call.start", {"contact": "Goodbye"})),
        ("Okay, that's all for now.", ToolCall("media.next")),
        ("Yes, please.", ToolCall("media.next")),
        ("Thanks, that's great.", ToolCall("media.pause")),
        ("I'm done for today.", ToolCall("timer.cancel")),
        ("Lock the doors.", ToolCall("lights.set", {"on": False})),
        ("Turn on the windshield wipers.", ToolCall("lights.set", {"on": True})),
        ("This can mowed an unwraken unit.", ToolCall("volume.set", {"change": "down"})),
    ],
)  # fmt: skip
def test_a_call_nothing_in_the_request_ties_to_its_tool_is_outside(
    text: str, call: ToolCall
) -> None:
    """What the served engine made of those lines (typed, int8, default tools)."""
    assert outside(call, TOOLS[call.name], text)
    assert not outside(ToolCall("media.next"), TOOLS["media.next"], "Play something else.")
    assert not outside(ToolCall("media.next"), TOOLS["media.next"])  # no words to read
    # a session's own tool of that name may mean something else: its words are unknown
    (own,) = parse_tools([{"name": "media.next", "description": "Show the next photo."}])
    assert not outside(ToolCall("media.next"), own, "Okay, that's all for now.")


def own_commands() -> list[tuple[str, ToolCall]]:
    """Every command of data/actions (trained on and evaluated on) with its words."""
    data = Path(__file__).resolve().parents[2] / "data" / "actions"
    calls = []
    for name in ("train", "dev_commands", "heldout_commands", "heldout"):
        for line in (data / f"{name}.jsonl").read_text().splitlines():
            row = json.loads(line)
            call, _ = split_call(row["reply"])
            if call is not None:
                calls.append((row["question"], call))
    return calls


def test_no_trained_or_held_out_command_is_outside_what_the_tools_do() -> None:
    """The check refuses none of the project's own commands (data/actions: every
    command it was trained and is evaluated on, with its words)."""
    calls = own_commands()
    assert len({c.name for _, c in calls}) == len(TOOLS)  # every tool's commands were read
    assert len(calls) == 2880
    assert [(t, c) for t, c in calls if outside(c, TOOLS[c.name], t)] == []


@pytest.mark.parametrize(
    "text",
    [
        "I called my mom yesterday.",
        "That timer went off too early.",
        "The lights in this city are beautiful.",
        "The music at the party was too loud.",
        "My sister sent me a funny message this morning.",
        "That\u2019s a beautiful song.",
        "We watched a movie, it was great.",
    ],
)
def test_a_report_or_an_opinion_is_a_statement(text: str) -> None:
    assert statement(text)


@pytest.mark.parametrize(
    "text",
    [
        "Text Sam that I was late.",  # a verb first: the past tense is the message's
        "I want to text Sam that I was late.",
        "It's too dark in here.",  # a need, not an opinion
        "I'm cold.",
        "This song is great, play it again.",  # one clause asks
        "Can you call my mom?",
        "Okay, that's all for now.",
        "Yes, please.",
        "",
    ],
)
def test_a_request_or_a_need_is_not_a_statement(text: str) -> None:
    assert not statement(text)


def test_no_trained_or_held_out_command_is_a_statement() -> None:
    assert [t for t, _ in own_commands() if statement(t)] == []


def test_a_statement_is_offered_only_the_sessions_own_tools() -> None:
    (own,) = parse_tools([{"name": "log.call", "description": "Log a call the user made."}])
    tools = (*DEFAULT_TOOLS, own)
    assert offered(tools, "I called my mom yesterday.") == (own,)
    assert offered(tools, "Call my mom.") == tools


def test_no_trained_or_held_out_command_has_a_number_it_did_not_say() -> None:
    """Every number of the project's own commands is said in their words ("a quarter of
    an hour" is 900 seconds): :func:`unsaid` drops none."""
    numbered = [(t, c) for t, c in own_commands() if c.name in ("timer.set", "climate.set")]
    assert len(numbered) > 400
    assert [(t, c) for t, c in numbered if unsaid(c, TOOLS[c.name], t) != c] == []


@pytest.mark.parametrize(
    ("text", "call", "question"),
    [
        ("Set a timer.", ToolCall("timer.set", {"seconds": 100}), "For how long?"),
        ("That time I went off too early", ToolCall("timer.set", {"seconds": 100}), None),
        # outside the cabin's range, and no "-ty" a "-teen" was heard as
        ("Bring the cabin to 45 degrees.", ToolCall("climate.set", {"temperature_c": 32}), None),
        ("Skip to the next track.", ToolCall("climate.set", {"temperature_c": 20}), None),
    ],
)
def test_a_number_the_request_did_not_say_is_dropped_and_asked_for(
    text: str, call: ToolCall, question: str | None
) -> None:
    tool = TOOLS[call.name]
    incomplete = unsaid(call, tool, text)
    assert incomplete.arguments == {}
    expected = question or ("For how long?" if call.name == "timer.set" else "What temperature?")
    assert missing(incomplete, tool) == expected
    assert asked(incomplete, tool)
    assert unsaid(call, tool, None) == call  # words not known: nothing dropped


@pytest.mark.parametrize(
    ("text", "twin"),
    [
        ("Bring the cabinet to 60 degrees now.", 16),  # "sixteen", as Whisper heard it
        ("bring the cabin to sixty degrees", 16),
        ("Make it 90 degrees.", 19),
        ("Set it to 20 degrees.", None),  # fits: taken as said
        ("Bring it to 45 degrees.", None),  # no whole ten
        ("Make it 30 or 60 degrees.", None),  # two numbers
    ],
)
def test_a_ty_the_range_refuses_is_asked_about_as_its_teen(text: str, twin: int | None) -> None:
    tool = TOOLS["climate.set"]
    (p,) = tool.params
    assert teen_twin(p, text) == twin
    call = unsaid(ToolCall("climate.set", {"temperature_c": 32}), tool, text)  # clamped
    if twin is None:
        assert not call.doubted
        return
    assert call.arguments == {"temperature_c": twin} and call.doubted and asked(call, tool)
    assert question(call) == f"Set the temperature to {say_integer(twin)} degrees?"


def test_a_ty_answered_out_of_range_is_asked_about_as_its_teen() -> None:
    """ "What temperature?" "Sixteen." heard "60.": the call completed with 16, asked."""
    tool = TOOLS["climate.set"]
    done = named(ToolCall("climate.set", {}), tool, "60 degrees.")
    assert done is not None and done.arguments == {"temperature_c": 16} and done.doubted
    assert asked(done, tool) and missing(done, tool) is None


def test_a_ty_that_fits_is_never_a_teen() -> None:
    """A timer of "60 minutes" or a volume of "40" is what it says: only a number the
    bounds refuse is read as its twin."""
    (seconds,) = TOOLS["timer.set"].params
    assert teen_twin(seconds, "Set a timer for 60 minutes.") is None


@pytest.mark.parametrize(
    ("call", "text", "value"),
    [
        (ToolCall("timer.set", {}), "Ten minutes.", 600),
        (ToolCall("timer.set", {}), "Half an hour, please.", 1800),
        (ToolCall("climate.set", {}), "Nineteen.", 19),
        (ToolCall("climate.set", {}), "Make it 21.5 degrees", 21.5),
        (ToolCall("climate.set", {}), "45 degrees.", None),  # out of range
        (ToolCall("timer.set", {}), "Yes.", None),
        (ToolCall("timer.set", {}), "What is the capital of France?", None),
        (ToolCall("timer.set", {}), "Play some jazz and set it to ten.", None),  # a request
    ],
)
def test_a_number_answered_completes_the_call(
    call: ToolCall, text: str, value: float | None
) -> None:
    tool = TOOLS[call.name]
    done = named(call, tool, text)
    if value is None:
        assert done is None
        return
    assert done is not None and done.arguments == {tool.params[0].name: value}
    assert missing(done, tool) is None


def test_unsure_words_and_an_unsure_router_are_not_acted_on() -> None:
    """Whisper's bars (faster-whisper's log_prob_threshold and no_speech_threshold),
    and the router's (model.router.SURE): typed words have no ASR figures."""
    assert not unheard(None, None)
    assert not unheard(-0.3, 0.05)
    assert unheard(-1.2, 0.05)  # a decode faster-whisper would deem failed
    assert unheard(-0.3, 0.7)  # likely no speech
    timer = TOOLS["timer.set"]
    assert not asked(ToolCall("timer.set", {"seconds": 60}, margin=12.0), timer)
    assert not asked(ToolCall("timer.set", {"seconds": 60}), timer)  # no router weighed it
    assert asked(ToolCall("timer.set", {"seconds": 60}, margin=1.5), timer)
    assert asked(ToolCall("timer.set", {"seconds": 60}, margin=-2.0), timer)


def test_a_name_keeps_its_words_without_a_trailing_instead() -> None:
    call = ToolCall("call.start", {"contact": "my brother instead"})
    assert resolve(call, TOOLS["call.start"], [SISTER]) == ToolCall(
        "call.start", {"contact": "my brother"}
    )
    media = ToolCall("media.play", {"query": "it"})  # not a name: left as it is
    assert resolve(media, TOOLS["media.play"], [SISTER]) == media


def test_earlier_calls_are_read_from_the_replies_the_conversation_kept() -> None:
    made = kept_reply(render_call(TOOLS["call.start"], SISTER.arguments), "Calling your sister.")
    history = [
        ChatMessage("user", "Call my sister."),
        ChatMessage("assistant", made),
        ChatMessage("user", "Tell me a joke."),
        ChatMessage("assistant", "Why did the <tool_call> cross the road?"),
    ]
    assert earlier_calls(history) == [SISTER]


@pytest.mark.models
def test_whisper_s_own_figures_put_misheard_noisy_speech_under_the_bar(
    tiny: Transcriber, speech: SpeechFactory
) -> None:
    """Real tiny.en on Piper's "Call my sister.": clean, it is heard and may be acted
    on; under white noise as loud as the speech or louder, Whisper mishears it ("All
    my sister", "all my truth") and says it is unsure: no call is made on it."""
    clean = speech.piper("Call my sister.")
    served = pad(clean, 0.3, 0.05)  # about what the server hands ASR (its pre-roll)
    heard = tiny.transcribe(served)
    assert normalize_words(heard.text) == ["call", "my", "sister"], heard
    assert not unheard(heard.avg_logprob, heard.no_speech_prob), heard
    for snr_db in (0.0, -5.0):
        noisy = tiny.transcribe(noisy_copy(clean, served, snr_db, "white", 1))
        assert unheard(noisy.avg_logprob, noisy.no_speech_prob), (snr_db, noisy)


@pytest.mark.parametrize(
    "reply",
    ["I'll add milk to my shopping list.", "Okay, I'll read your last message.",
     "Sure, I've added it.", "Okay, I'm going to go ahead and book a table.",
     "I added milk to my shopping list.", "Okay, I just sent it."],
)  # fmt: skip
def test_a_reply_that_claims_an_action_is_seen(reply: str) -> None:
    """The first is the served engine's reply to "Add milk to my shopping list." (no call),
    the fifth the 4-bit file's (``export --bits 4``)."""
    assert claims(reply) is True


def test_no_reply_without_a_call_in_the_saved_evals_claims_an_action() -> None:
    """The replies the served engines gave without a call (chat, missed commands) in the
    project's saved evals: none would be replaced."""
    replies: list[str] = []

    def walk(o: object) -> None:
        if isinstance(o, dict):
            if isinstance(o.get("reply"), str) and "call" in o and not o["call"]:
                replies.append(o["reply"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    for file in (Path(__file__).resolve().parents[2] / "docs" / "results" / "evals").glob("*.json"):
        walk(json.loads(file.read_text()))
    assert len(replies) > 300
    assert [r for r in replies if claims(r)] == []


def test_an_opening_is_told_as_soon_as_its_first_word_allows() -> None:
    assert claims("The capital") is False  # spoken at once
    assert claims("Okay, I") is None  # may still be a claim
    assert claims("Okay, I think it is nine.") is None  # held: its reply's end tells
    assert claims("Okay, I think it is nine, or so I believe.") is False
    assert claims("I'm sorry, I can't help with that one today.") is False


_ALIKE = [  # the first and second hearings of spoken eval lines (tiny.en, base; issue 39)
    (ToolCall("timer.cancel"), "Get rid of the timer.", "Ah, get rid of the timer.", True),
    (
        ToolCall("climate.set", {"temperature_c": 23}),
        "So I want you to bring the cabin to 23 degrees for me.",
        "So I want you to bring the cab into twenty three degrees for me.",
        True,
    ),
    (
        ToolCall("reminder.create", {"text": "call the dentist"}),
        "Would you make sure I remember to call the dentist, please?",
        "Oh, would you make sure I remember to call the dentist, please?",
        True,
    ),
    (
        ToolCall("message.send", {"to": "Emily", "text": "I'll be there in 10 minutes"}),
        "So shoot Emily a message saying I'll be there in 10 minutes.",
        "So shoot Emily a message saying I'll be there in ten minutes.",
        True,
    ),
    # misheard one way, heard another: the call's words, number or tool are not in both
    (
        ToolCall("media.play", {"query": "some news"}),
        "Can I hear some news for me?",
        "Can I hear some blues for me?",
        False,
    ),
    (
        ToolCall("navigation.start", {"destination": "23 debris"}),
        "So I want you to bring the cabin to 23 debris for me.",
        "So I want you to ring the cab into 23 degrees for me.",
        False,
    ),
    (
        ToolCall("reminder.create", {"text": "call her dentist"}),
        "But what you make sure I remember to call her dentist, please.",
        "Or will you make sure I remember to call the dentist please?",
        False,
    ),
    (
        ToolCall("timer.set", {"seconds": 600}),
        "Set a timer for ten minutes.",
        "Set a timer.",
        False,
    ),
    (
        ToolCall("lights.set", {"on": True}),
        "Can we get some light in here?",
        "Can we get sunlight?",
        False,
    ),
    (ToolCall("timer.cancel"), "Get rid of the timer.", "", False),
    (  # a direction neither hearing has: the decoder's guess
        ToolCall("volume.set", {"change": "down"}),
        "But the volume at the eye",
        "Put the volume at the line.",
        False,
    ),
    (
        ToolCall("volume.set", {"change": "up"}),
        "I can barely hear this.",
        "I can barely hear it.",
        True,
    ),
]


@pytest.mark.parametrize(("call", "first", "again", "alike"), _ALIKE)
def test_a_second_hearing_asks_for_the_call_when_its_words_are_there_too(
    call: ToolCall, first: str, again: str, alike: bool
) -> None:
    """model.ask.heard_alike: words that differ where the call does not read them are
    alike; a string of the call, a number or a tool's own word missing is not."""
    assert heard_alike(call, TOOLS[call.name], first, again) is alike


def test_every_own_command_heard_alike_twice_is_made() -> None:
    """A command of data/actions heard word for word by both models is made: every
    string, number and volume direction of its call is in its words."""
    calls = own_commands()
    assert [(t, c) for t, c in calls if not heard_alike(c, TOOLS[c.name], t, t + " ")] == []
    volume = [c for _, c in calls if c.name == "volume.set" and "change" in c.arguments]
    assert len(volume) >= 150  # their directions were read


OWN = parse_tools(
    [
        {"name": "garage.open", "description": "Open the garage door."},
        {
            "name": "thermostat.set",
            "description": "Set the home thermostat.",
            "parameters": {
                "type": "object",
                "properties": {"degrees": {"type": "number"}},
                "required": ["degrees"],
            },
        },
        {
            "name": "shoppingList_add",
            "description": "",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}},
                "required": ["item"],
            },
        },
    ]
)


@pytest.mark.parametrize(
    ("text", "tool", "arguments"),
    [
        ("Open the garage door.", "garage.open", {}),
        ("Could you open up the garage?", "garage.open", {}),
        ("Make it 19 degrees in the house.", "thermostat.set", {"degrees": 19}),
        ("Set the thermostat to 21.", "thermostat.set", {"degrees": 21}),
        ("Add milk to my shopping list.", "shoppingList_add", {"item": "milk"}),
    ],
)
def test_a_session_s_own_tool_named_in_the_request_is_tied_to_it(
    text: str, tool: str, arguments: dict[str, object]
) -> None:
    (own,) = [t for t in OWN if t.name == tool]
    assert not untied(ToolCall(tool, arguments), own, text)


@pytest.mark.parametrize(
    ("text", "tool", "arguments"),
    [
        ("Play some jazz.", "shoppingList_add", {"item": "jazz"}),  # the nearest tool
        ("Navigate to the airport.", "garage.open", {}),
        ("Set a timer for ten minutes.", "thermostat.set", {"degrees": 10}),  # "set" alone
        ("Turn the heat up to 23.", "thermostat.set", {"degrees": 23}),  # other words: asked
    ],
)
def test_a_call_of_a_session_s_own_tool_nothing_said_names_is_asked_about(
    text: str, tool: str, arguments: dict[str, object]
) -> None:
    (own,) = [t for t in OWN if t.name == tool]
    assert untied(ToolCall(tool, arguments), own, text)
    assert question(ToolCall(tool, arguments)).startswith("Should I do ")


def test_the_default_tools_are_read_by_their_own_words_not_tied() -> None:
    # outside() reads a default tool with words fitted to it; untied leaves it alone
    call = ToolCall("media.next", {})
    assert not untied(call, TOOLS["media.next"], "Okay, that's all for now.")
    assert outside(call, TOOLS["media.next"], "Okay, that's all for now.")


def test_the_tools_a_request_names_are_what_the_model_chooses_among() -> None:
    def names(text: str) -> list[str]:
        return [t.name for t in named_tools(OWN, text)]

    assert names("Put eggs on the shopping list.") == ["shoppingList_add"]
    assert names("Open the garage and set the thermostat.") == ["garage.open", "thermostat.set"]
    assert names("Play some jazz.") == []  # none: the model chooses among them all
    (tv,) = parse_tools([{"name": "tv.power", "description": "Switch the TV on or off."}])
    assert named_tools([tv], "Turn on the TV.") == [tv]  # two letters name it too


def test_a_place_that_is_a_person_is_unplaced() -> None:
    nav = TOOLS["navigation.start"]
    for place in ("my boss", "Mom", "our neighbours", "my sister."):
        assert unplaced(ToolCall("navigation.start", {"destination": place}), nav), place
    for place in ("the dentist", "my mom's house", "my office", "home", "Boss Burgers"):
        assert not unplaced(ToolCall("navigation.start", {"destination": place}), nav), place
    # a person is what a call's contact is
    assert not unplaced(ToolCall("call.start", {"contact": "my boss"}), TOOLS["call.start"])


def test_no_trained_or_held_out_command_goes_to_a_person() -> None:
    calls = own_commands()
    assert [(t, c) for t, c in calls if unplaced(c, TOOLS[c.name])] == []
