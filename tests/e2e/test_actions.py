"""A spoken command through the real server acts: Piper speech in, a ``timer.set``
action out before a spoken confirmation (issue 20's end-to-end check), from the server
as it starts by default (its adapter is trained to call tools)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from audio.asr import Transcriber
from audio.resample import float32_to_int16, int16_to_float32
from audio.speech import SpeechFactory, normalize_words, word_error_rate
from clients.common import Pcm
from clients.glasses import first_turn, start_session, stream_audio
from model.ask import CANT
from model.tools import DEFAULT_TOOLS
from server import protocol as p
from tests.serverproc import ServerProcess, next_event
from tests.speech import in_each_voice, speak

pytestmark = [pytest.mark.e2e, pytest.mark.models]

COMMAND = "Set a timer for five minutes."


@in_each_voice
async def test_a_spoken_command_sets_a_timer_and_says_so(
    server: ServerProcess, speech: SpeechFactory, tiny: Transcriber, voice: str
) -> None:
    command = speak(speech, voice, COMMAND, lead_s=0.5)
    async with connect(server.url) as ws:
        ready = await start_session(ws, 16000, "test")
        assert "timer.set" in ready.tools  # the default device tools
        sender = asyncio.create_task(stream_audio(ws, Pcm(float32_to_int16(command), 16000)))
        async with asyncio.timeout(120):
            result = await first_turn(ws, ready, printer=False)
        sender.cancel()

    turn = result.turn_id
    actions = [m for m in result.events if isinstance(m, p.Action)]
    # The router names the call (model/router.py), the duration said is its value
    # (model/spoken.py: "five minutes", or Whisper's "5 minutes", is 300 seconds)
    assert [(a.turn_id, a.call_id, a.name, a.arguments) for a in actions] == [
        (turn, f"call_{turn}", "timer.set", {"seconds": 300})
    ], (result.transcript, actions)
    kinds = [type(m) for m in result.events]
    assert kinds.index(p.Action) < kinds.index(p.ReplyText)  # acts, then confirms
    assert result.reply and "tool_call" not in result.reply  # the call is never spoken
    # the confirmation names the duration, and what is spoken is what was written
    assert "five" in normalize_words(result.reply), result.reply
    heard = tiny.transcribe(int16_to_float32(np.frombuffer(result.audio, "<i2"))).text
    assert word_error_rate(result.reply, heard) <= 0.25, (result.reply, heard)
    metrics = next(m for m in result.events if isinstance(m, p.Metrics) and m.turn_id == turn)
    assert metrics.action == "timer.set" and metrics.action_passes > 0


async def typed_turn(ws: ClientConnection, text: str) -> list[p.ServerMessage]:
    """Type ``text`` into the session; the events of its reply, up to its end."""
    await ws.send(p.encode(p.Text(text)))
    events: list[p.ServerMessage] = []
    async with asyncio.timeout(120):
        while not isinstance(event := await next_event(ws, 120), p.ReplyDone):
            assert not isinstance(event, p.ReplyCancelled | p.Error), event
            events.append(event)
    return events


def actions_in(events: list[p.ServerMessage]) -> list[tuple[str, dict[str, Any]]]:
    """The calls a reply's events made: (name, arguments), in order."""
    return [(a.name, a.arguments) for a in events if isinstance(a, p.Action)]


async def said_to(ws: ClientConnection, text: str) -> str:
    """What the reply to ``text`` typed into the session says; nothing acts on it."""
    events = await typed_turn(ws, text)
    assert not [e for e in events if isinstance(e, p.Action)], (text, events)
    return " ".join(e.text for e in events if isinstance(e, p.ReplyText))


async def test_typed_commands_carry_the_user_s_own_words(server: ServerProcess) -> None:
    """String arguments are spans of what was said (model/spans.py): the contact, the
    message and the destination as the user put them, no carrier words around them. A
    message is asked about first and sent after a yes (docs/actions.md, "Asking first")."""
    async with connect(server.url) as ws:
        await start_session(ws, 16000, "test")
        question = await said_to(ws, "Send a message to Anna saying I am running late.")
        assert question == "Send 'I am running late' to Anna?", question
        events = await typed_turn(ws, "Yes, please.")
        assert actions_in(events) == [("message.send", {"to": "Anna", "text": "I am running late"})]
    want = {
        "Navigate to the nearest gas station, please.": (
            "navigation.start",
            {"destination": "the nearest gas station"},
        ),
    }
    async with connect(server.url) as ws:
        await start_session(ws, 16000, "test")
        for text, (name, arguments) in want.items():
            events = await typed_turn(ws, text)
            assert actions_in(events) == [(name, arguments)], text


async def test_a_guess_at_what_was_meant_is_asked_about_before_it_acts(
    server: ServerProcess,
) -> None:
    """Where the words may not be what was meant, the call is asked about, and a yes
    makes it: "sixty degrees", past the cabin's 16-32 (the engine clamps it to 32), is
    Whisper's usual hearing of "sixteen" (model.ask.teen_twin); a destination that is a
    person has no address (model.ask.unplaced)."""
    async with connect(server.url) as ws:
        await start_session(ws, 16000, "test")
        question = await said_to(ws, "Bring the cabin to 60 degrees.")
        assert question == "Set the temperature to sixteen degrees?", question
        events = await typed_turn(ws, "Yes.")
        assert actions_in(events) == [("climate.set", {"temperature_c": 16})]
        question = await said_to(ws, "Navigate to my boss.")
        assert question == "Start directions to your boss?", question


async def test_a_question_asked_where_tools_are_gets_its_whole_answer(
    server: ServerProcess,
) -> None:
    """Under the tools prompt the tools adapter ended factual answers before their last
    words ("The capital of Italy"); a reply there ends only after a sentence's end
    (model/sampler.py ends_after_sentence), so the answer is said, and nothing acts."""
    async with connect(server.url) as ws:
        await start_session(ws, 16000, "test")
        for question, answer in (
            ("What is the capital of Italy?", "Rome"),
            ("What is the capital of Germany?", "Berlin"),
        ):
            events = await typed_turn(ws, question)
            assert not any(isinstance(e, p.Action) for e in events), question
            reply = "".join(e.text for e in events if isinstance(e, p.ReplyText))
            assert answer in reply and reply.rstrip().endswith((".", "!", "?")), reply


async def test_a_request_no_tool_does_is_refused_out_loud(server: ServerProcess) -> None:
    """The engine writes the nearest tool's call for these ("Read me my last message."
    -> message.send {to: "me"}; "Okay, that's all for now." -> media.next); nothing in
    the words asks for it (model.ask.outside), so nothing acts and the user hears so
    (docs/actions.md, "Acting only when sure"). "Add milk to my shopping list." it
    answers "I'll add milk to my shopping list." with no call (model.ask.claims)."""
    requests = (
        "Read me my last message.",
        "Okay, that's all for now.",
        "Add milk to my shopping list.",
    )
    for text in requests:  # each the session's first words, as a new user says them
        assert await said_to_first_words(server, text) == CANT, text


async def test_a_session_with_part_of_the_tools_acts_with_them_and_no_other(
    server: ServerProcess,
) -> None:
    """A car head unit gives its session the cabin's tools only. A command for one of
    them acts; a command for a default tool it left out is refused out loud, not made
    with the nearest tool it has ("I need a timer for two minutes." in a session
    without timer.set was timer.cancel, "Timer cancelled."; docs/actions.md, "Sessions
    with some of the tools")."""
    cabin = [t.schema() for t in DEFAULT_TOOLS if t.name in ("climate.set", "timer.cancel")]
    async with connect(server.url) as ws:
        ready = await start_session(ws, 16000, "car", tools=cabin)
        assert sorted(ready.tools) == ["climate.set", "timer.cancel"]
        events = await typed_turn(ws, "Set the temperature to 21 degrees.")
        assert actions_in(events) == [("climate.set", {"temperature_c": 21})], events
    text = "I need a timer for two minutes."
    assert await said_to_first_words(server, text, tools=cabin) == CANT


HOME = [
    {"name": "garage.open", "description": "Open the garage door."},
    {"name": "doors.lock", "description": "Lock the front door."},
    {
        "name": "shopping.add",
        "description": "Add an item to the shopping list.",
        "parameters": {
            "type": "object",
            "properties": {"item": {"type": "string"}},
            "required": ["item"],
        },
    },
]


async def test_a_session_with_tools_of_its_own_acts_on_them_and_asks_the_rest(
    server: ServerProcess,
) -> None:
    """A smart-home client's own tools. The router cannot name them, but it is sure
    "Please open the garage for me." asks for an action (the model's token alone
    answered "I'm sorry ... as a voice assistant"); the model picks the tool. A request
    none of them does ("Play some jazz.") is not acted on: nothing in it names the tool
    the model would pick, so that call is asked about (model.ask.untied) and a no drops
    it. A question acts on nothing (docs/actions.md, "Sessions with tools of their own")."""
    async with connect(server.url) as ws:
        ready = await start_session(ws, 16000, "home", tools=HOME)
        assert sorted(ready.tools) == ["doors.lock", "garage.open", "shopping.add"]
        events = await typed_turn(ws, "Please open the garage for me.")
        assert actions_in(events) == [("garage.open", {})], events
        for text in ("Play some jazz.", "No.", "What is the capital of Italy?"):
            await said_to(ws, text)  # acts on nothing


async def said_to_first_words(
    server: ServerProcess, text: str, tools: list[Any] | None = None
) -> str:
    """The reply to ``text`` typed as a new session's first words (the session's
    ``tools``: None, the default set); nothing acts on it."""
    async with connect(server.url) as ws:
        await start_session(ws, 16000, "test", tools=tools)
        return await said_to(ws, text)


async def test_live_information_no_tool_gives_is_said_to_be_out_of_reach(
    server: ServerProcess,
) -> None:
    """The served model makes up what it cannot know ("The temperature outside is
    currently 100 degrees Fahrenheit.", "It's 2:30 AM."); asked for it where no tool
    gives it, the user hears that it cannot be checked (model.live), and a question
    about the topic in general still gets the model's answer."""
    for text, said in (
        ("What's the temperature outside?", "Sorry, I can't check the weather from here."),
        ("What time is it?", "Sorry, I can't check the time from here."),
    ):
        assert await said_to_first_words(server, text) == said, text
    reply = await said_to_first_words(server, "Why is the sky blue?")
    assert "blue" in reply.lower() and "can't check" not in reply, reply
