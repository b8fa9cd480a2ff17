"""A call's confirmation checked against the call (model/confirm.py): the sentences
issue 39 heard after real calls are replaced by the call said plainly, sentences that
say what the call did are kept, and the stream speaks nothing it has not checked."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

import model.diffusion_engine
from model.confirm import Confirmation, confirmed, is_question, problems, question, template
from model.engine import ChatMessage, GenerationStats, drain
from model.spoken import say_duration, say_integer, say_number, spoken_duration, spoken_numbers
from model.tools import DEFAULT_TOOLS, ToolCall

TOOLS = {t.name: t for t in DEFAULT_TOOLS}
REMINDER = ToolCall("reminder.create", {"text": "call my mom", "when": "at six"})


def checked(call: ToolCall, sentence: str) -> str:
    return confirmed(call, sentence, TOOLS.get(call.name))


@pytest.mark.parametrize(
    ("call", "heard", "spoken"),
    [
        (
            ToolCall("climate.set", {"temperature_c": 19}),
            "Okay, the car is now ninety degrees degrees.",
            "Setting the temperature to nineteen degrees.",
        ),
        (
            ToolCall("timer.set", {"seconds": 1800}),
            "Okay, I'm set to 1800 hours.",
            "Timer set for thirty minutes.",
        ),
        (REMINDER, "I cancelled the reminder.", "Reminder set: call your mom at six."),
        (
            ToolCall("timer.set", {"seconds": 600}),
            "I set a timer for ten minutes minutes.",
            "Timer set for ten minutes.",
        ),
    ],
)
def test_the_confirmations_heard_in_issue_39_are_replaced(
    call: ToolCall, heard: str, spoken: str
) -> None:
    assert problems(call, heard, TOOLS[call.name])
    assert checked(call, heard) == spoken


@pytest.mark.parametrize(
    ("call", "sentence"),
    [
        (ToolCall("timer.set", {"seconds": 600}), "I set a timer for ten minutes."),
        (ToolCall("timer.set", {"seconds": 1800}), "Timer set for half an hour."),
        (ToolCall("timer.set", {"seconds": 5400}), "Okay, an hour and a half."),
        (ToolCall("climate.set", {"temperature_c": 19}), "Setting it to 19 degrees."),
        (ToolCall("climate.set", {"temperature_c": 21.5}), "Twenty one point five degrees."),
        (REMINDER, "Okay, I'll remind you to call your mom at six."),
        (ToolCall("call.start", {"contact": "Anna"}), "Calling Anna."),
        (ToolCall("message.send", {"to": "Anna", "text": "late"}), "Sent Anna your message."),
        (ToolCall("lights.set", {"on": False}), "Turning off the lights."),
        (ToolCall("volume.set", {"level": 5}), "Volume set to five."),
        (ToolCall("timer.cancel"), "Timer cancelled."),
        (ToolCall("media.next"), "Skipping this song."),
        (ToolCall("notes.add", {"text": "milk"}), "Added milk to your notes."),
        (ToolCall("media.play", {"query": "Duran Duran"}), "Playing Duran Duran."),
    ],
)
def test_a_confirmation_that_says_what_the_call_did_is_kept(call: ToolCall, sentence: str) -> None:
    assert problems(call, sentence, TOOLS.get(call.name)) == []
    assert checked(call, sentence) == sentence


@pytest.mark.parametrize(
    ("call", "sentence", "why"),
    [
        (ToolCall("timer.set", {"seconds": 600}), "Timer set for eleven minutes.", "duration"),
        (ToolCall("volume.set", {"level": 5}), "Volume set to 7.", "number"),
        (ToolCall("call.start", {"contact": "Anna"}), "Calling Bob.", "name"),
        (ToolCall("call.start", {"contact": "my dad"}), "Calling your mom.", "name"),
        (ToolCall("lights.set", {"on": True}), "Lights off.", "value"),
        (ToolCall("volume.set", {"change": "up"}), "Turning the volume down.", "value"),
        (ToolCall("timer.cancel"), "I started a new timer.", "verb"),
        (ToolCall("media.play", {"query": "jazz"}), "Sorry, I can't play that.", "refusal"),
        (ToolCall("call.start", {"contact": "Anna"}), "Calling Anna at 5.", "number"),
        # heard from the served engine on held-out commands
        (ToolCall("media.pause"), "Okay, I'm now playing again.", "verb"),
        (
            ToolCall("message.send", {"to": "my wife", "text": "can you pick up some milk"}),
            "Okay, I'll send you some milk.",
            "name",
        ),
        (
            ToolCall("reminder.create", {"text": "pick up the kids", "when": "tomorrow at 9"}),
            "Reminder, I'm sorry for any confusion.",
            "refusal",
        ),
    ],
)
def test_a_confirmation_that_contradicts_its_call_fails_for_what_it_says(
    call: ToolCall, sentence: str, why: str
) -> None:
    found = problems(call, sentence, TOOLS.get(call.name))
    assert {p.split()[0] for p in found} == {why}, found
    assert checked(call, sentence) == template(call)


def _arguments(name: str) -> dict[str, Any]:
    return {
        "timer.set": {"seconds": 5400},
        "navigation.start": {"destination": "the old harbour"},
        "media.play": {"query": "some jazz"},
        "message.send": {"to": "my sister", "text": "I'm running late"},
        "call.start": {"contact": "my dad"},
        "climate.set": {"temperature_c": 19.5},
        "reminder.create": {"text": "buy milk", "when": "in ten minutes"},
        "lights.set": {"on": False},
        "volume.set": {"change": "down"},
    }.get(name, {})


@pytest.mark.parametrize("tool", DEFAULT_TOOLS, ids=lambda t: t.name)
def test_every_default_tool_has_a_template_its_own_check_keeps(tool: Any) -> None:
    call = ToolCall(tool.name, _arguments(tool.name))
    said = template(call)
    assert not said.startswith("Done:"), said
    assert problems(call, said, tool) == [], said


@pytest.mark.parametrize("tool", DEFAULT_TOOLS, ids=lambda t: t.name)
def test_every_default_tool_s_question_is_told_from_other_sentences(tool: Any) -> None:
    """A client that answers questions (the spoken eval) knows each one the session
    asks, and not a call's confirmation or a chat reply's question."""
    call = ToolCall(tool.name, _arguments(tool.name))
    assert is_question(question(call)), question(call)
    assert not is_question(template(call))
    assert is_question(question(ToolCall("notes.add", {"text": "milk"})))
    assert not is_question("Would you like to hear more?")


def test_the_templates_say_the_arguments_as_speech() -> None:
    assert template(ToolCall("timer.set", {"seconds": 5400})) == (
        "Timer set for one hour and thirty minutes."
    )
    assert template(ToolCall("climate.set", {"temperature_c": 1})) == (
        "Setting the temperature to one degree."
    )
    assert template(ToolCall("call.start", {"contact": "my dad"})) == "Calling your dad."
    assert template(ToolCall("volume.set", {"level": 10})) == "Volume set to ten."


def test_a_session_s_own_tool_gets_the_generic_template() -> None:
    call = ToolCall("notes.add", {"text": "milk", "count": 3, "pinned": True})
    assert template(call) == "Done: notes add with text milk, count three, pinned on."
    # a default tool's name with other arguments is a session's own tool too
    assert template(ToolCall("timer.set", {"minutes": 3})) == "Done: timer set with minutes three."
    assert template(ToolCall("scene.reset")) == "Done: scene reset."
    assert checked(call, "Added 4 notes.") == template(call)


def test_numbers_are_said_as_they_are_read_back() -> None:
    for n in [*range(0, 2000), 21300, 100000, 999999]:
        assert spoken_numbers(say_integer(n)) == [n], n
    assert say_number(19.5) == "nineteen point five"
    for seconds in (1, 45, 60, 90, 600, 1800, 3600, 3661, 5400, 86400):
        assert spoken_duration(say_duration(seconds)) == seconds
    assert say_duration(1800) == "thirty minutes"


def test_the_stream_holds_each_sentence_until_it_is_checked() -> None:
    check = Confirmation(ToolCall("timer.set", {"seconds": 600}), TOOLS["timer.set"])
    assert check.feed("I set a timer for ") == []
    assert check.feed("ten") == []  # "ten" may yet be "ten minutes minutes"
    assert check.feed(" minutes.") == []  # "minutes." may yet be "minutes.5"
    assert check.feed(" It rings at") == ["I set a timer for ten minutes. "]
    assert check.feed(" 1800 hours. And more.") == [" Timer set for ten minutes."]
    assert check.replaced
    assert check.flush() == []  # after a replaced sentence the model's words are dropped


def test_a_stream_s_last_sentence_is_checked_when_it_ends() -> None:
    check = Confirmation(ToolCall("climate.set", {"temperature_c": 19}))
    assert check.feed("Okay, the car is now ninety degrees degrees") == []
    assert check.flush() == ["Setting the temperature to nineteen degrees."]
    kept = Confirmation(ToolCall("climate.set", {"temperature_c": 19}))
    assert kept.feed("Nineteen degrees it is") == []
    assert kept.flush() == ["Nineteen degrees it is"]


WRONG = "Okay, I'm set to 1800 hours."


@pytest.fixture(scope="module")
def served(model_cache: Path) -> Any:
    """The engine serve runs: the int8 diffusion model with the tools adapter and its
    router (model/assemble.py), built as serve builds it (tests/conftest.py)."""
    from cli.main import prepare_model
    from model.assemble import load_generator

    prepare_model("diffusion-onnx", model_cache)
    return load_generator("diffusion-onnx", model_cache)


def _timer(gen: Any) -> tuple[ToolCall, str]:
    convo = [ChatMessage("user", "Set a timer for ten minutes.")]
    items, _ = drain(gen.generate(convo, 48, lambda: False, DEFAULT_TOOLS))
    call, *speech = items
    assert call == ToolCall("timer.set", {"seconds": 600}, call.passes), items
    assert all(isinstance(s, str) for s in speech)
    return call, "".join(speech)


@pytest.mark.models
@pytest.mark.slow
def test_the_served_engine_speaks_a_confirmation_its_call_keeps(served: Any) -> None:
    """The real sampler's confirmation of a real call: spoken only as checked."""
    call, spoken = _timer(served)
    assert spoken.strip()
    assert problems(call, spoken, TOOLS["timer.set"]) == [], spoken


@pytest.mark.models
@pytest.mark.slow
def test_the_served_engine_replaces_a_confirmation_with_a_wrong_number(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same call, its confirmation sampled by the real sampler (the cache moves
    as it would) and then swapped for a sentence that says a wrong number: what the
    engine yields is the template, never the wrong sentence."""
    real = model.diffusion_engine.sample

    def then_wrong(*args: Any, **kwargs: Any) -> Generator[int, None, GenerationStats]:
        _, stats = drain(real(*args, **kwargs))
        yield from served.tokenizer.encode_plain(WRONG)
        return stats

    monkeypatch.setattr(model.diffusion_engine, "sample", then_wrong)
    _, spoken = _timer(served)
    assert spoken == "Timer set for ten minutes."


def test_a_call_confirmed_with_no_words_is_said_by_its_template() -> None:
    check = Confirmation(ToolCall("lights.set", {"on": True}))
    assert check.feed(" ") == []
    assert check.flush() == ["Turning the lights on."]
