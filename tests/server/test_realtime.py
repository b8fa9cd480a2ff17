"""The OpenAI-Realtime codec over a real session, driven synchronously: client events
in, Realtime server events and session effects out; no socket, no loop, no models.

The endpoint settings are the session tests' (min speech 3 frames, pause 7, end of
turn 19); pipeline results (transcripts, sentences, audio) are delivered by hand.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audio import g711
from audio.endpoint import EndpointConfig
from model.engine import ChatMessage
from model.tools import ToolCall
from server import protocol as p
from server.lifecycle import Lifecycle
from server.realtime import RATE, VOICE, Emit, Out, Realtime
from server.session import (
    AudioWritten,
    Close,
    Event,
    FinalTranscript,
    PartialTranscript,
    ReplyAction,
    ReplyAudio,
    ReplyFinished,
    ReplySentence,
    RunVad,
    Send,
    SendAudio,
    Session,
    SessionConfig,
    StartTurn,
    VadResult,
)

FRAME = 512
ENDPOINT = EndpointConfig(min_speech_ms=96, pause_ms=224, end_of_turn_ms=608)
ITALY = "What is the capital of Italy?"
ROME = "The capital of Italy is Rome."

Json = dict[str, Any]


@dataclass
class Driver:
    """Runs the codec as server/app.py does: encodes what it sends, reports every
    audio frame written at once, and keeps the other effects for the test to read."""

    codec: Realtime
    now: float = 0.0
    effects: list[Out] = field(default_factory=list)

    @property
    def session(self) -> Session:
        return self.codec.session

    def send(self, event: Json | str | bytes) -> list[Json]:
        raw = event if isinstance(event, str | bytes) else json.dumps(event)
        return self.run(self.codec.receive(raw, self.now))

    def deliver(self, event: Event) -> list[Json]:
        return self.run(self.session.receive(event, self.now))

    def run(self, out: list[Out] | list[Any]) -> list[Json]:
        events: list[Json] = []
        for effect in out:
            match effect:
                case Emit(text=text):
                    events.append(json.loads(text))
                case Send(message=message):
                    events += [json.loads(t) for t in self.codec.encode(message)]
                case Lifecycle():
                    events += [json.loads(t) for t in self.codec.lifecycle(effect)]
                case SendAudio():
                    events.append(json.loads(self.codec.audio(effect)))
                    written = AudioWritten(effect.turn_id, effect.sentence, len(effect.pcm) // 2)
                    events += self.deliver(written)
                case _:
                    self.effects.append(effect)
        return events

    def frames(self, prob: float, n: int) -> list[Json]:
        events: list[Json] = []
        for _ in range(n):
            self.now += FRAME / 16000
            result = VadResult(np.zeros(FRAME, np.float32), np.array([prob], np.float32))
            events += self.deliver(result)
        return events

    def started(self) -> StartTurn:
        start = [e for e in self.effects if isinstance(e, StartTurn)][-1]
        assert isinstance(start, StartTurn)
        return start


def make(max_errors: int = 20) -> tuple[Driver, Json]:
    session = Session("rt", SessionConfig(endpoint=ENDPOINT, max_errors=max_errors), "tiny.en", "x")
    d = Driver(Realtime(session, "tiny.en", "gpt-realtime"))
    (created,) = d.run(d.codec.open(d.now))
    return d, created


def types(events: list[Json]) -> list[str]:
    return [e["type"] for e in events]


def one(events: list[Json], kind: str) -> Json:
    (event,) = [e for e in events if e["type"] == kind]
    return event


def user_text(text: str = ITALY) -> Json:
    content = [{"type": "input_text", "text": text}]
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": content},
    }


def pcm(seconds: float, rate: int = RATE) -> bytes:
    return bytes(2 * int(rate * seconds))


def append(data: bytes) -> Json:
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(data).decode()}


def answer(d: Driver, turn: int, sentence: str = ROME) -> list[Json]:
    """The pipeline's sentence, 0.2 s of its audio, and the end of the reply."""
    out = d.deliver(ReplySentence(turn, 0, sentence, 50.0))
    out += d.deliver(ReplyAudio(turn, 0, pcm(0.2), int(RATE * 0.2), 20.0))
    return out + d.deliver(ReplyFinished(turn, None, 90.0))


# --- the session ----------------------------------------------------------------


def test_connecting_creates_a_ga_session_at_24khz() -> None:
    d, created = make()
    assert created["type"] == "session.created" and created["event_id"]
    session = created["session"]
    assert session["type"] == "realtime" and session["model"] == "gpt-realtime"
    assert session["output_modalities"] == ["audio"]
    fmt = {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["input"]["format"] == session["audio"]["output"]["format"] == fmt
    detection = session["audio"]["input"]["turn_detection"]
    assert detection["type"] == "server_vad" and detection["silence_duration_ms"] == 608
    assert session["audio"]["output"]["voice"] == VOICE
    assert d.session.output_rate == RATE


def test_session_update_configures_the_session() -> None:
    d, _ = make()
    update = {
        "type": "realtime",
        "instructions": "Answer like a pirate.",
        "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 900}}},
    }
    (updated,) = d.send({"type": "session.update", "event_id": "e1", "session": update})
    assert updated["type"] == "session.updated"
    assert updated["session"]["instructions"] == "Answer like a pirate."
    assert updated["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 900
    assert d.session.config.endpoint.end_of_turn_ms == 900
    assert d.session.config.end_of_turn.default_ms == 900  # the policy follows it
    d.send(user_text())
    d.send({"type": "response.create"})
    history = d.started().history
    assert history[0].role == "system" and history[0].content == "Answer like a pirate."
    assert history[-1].content == ITALY


# --- errors -------------------------------------------------------------------------


def update(session: Json) -> Json:
    return {"type": "session.update", "session": session}


def vad(**fields: object) -> Json:
    return update({"type": "realtime", "audio": {"input": {"turn_detection": fields}}})


BAD: list[tuple[Json | str | bytes, str, str | None]] = [
    ("{not json", "invalid_json", None),
    ("[1, 2]", "invalid_event", None),
    ({"event_id": "x"}, "invalid_event", "type"),
    ({"type": "nonsense.event"}, "unknown_event", "type"),
    ({"type": "transcription_session.update"}, "beta_protocol", "type"),
    (update({"instructions": "hi"}), "beta_protocol", "session.type"),
    (update({"type": "realtime", "modalities": ["audio"]}), "beta_protocol", "session.modalities"),
    (update({"type": "realtime", "colour": "red"}), "unknown_parameter", "session.colour"),
    (update({"type": "realtime", "instructions": 5}), "invalid_type", "session.instructions"),
    (update({"type": "transcription"}), "not_supported", "session.type"),
    (
        update({"type": "realtime", "output_modalities": ["audio", "text"]}),
        "invalid_value",
        "session.output_modalities",
    ),
    (
        update({"type": "realtime", "tools": [{"type": "function", "name": "f"}]}),
        "not_supported",
        "session.tools",
    ),
    (
        update({"type": "realtime", "audio": {"input": {"format": {"type": "audio/opus"}}}}),
        "invalid_value",
        "session.audio.input.format.type",
    ),
    (
        update(
            {
                "type": "realtime",
                "audio": {"input": {"format": {"type": "audio/pcmu", "rate": 24000}}},
            }
        ),
        "invalid_value",
        "session.audio.input.format.rate",
    ),
    (
        update(
            {
                "type": "realtime",
                "audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}},
            }
        ),
        "invalid_value",
        "session.audio.output.format.rate",
    ),
    (
        update({"type": "realtime", "audio": {"output": {"voice": "alloy"}}}),
        "invalid_value",
        "session.audio.output.voice",
    ),
    (vad(type="none_vad"), "invalid_value", "session.audio.input.turn_detection.type"),
    (
        vad(type="semantic_vad", eagerness="eager"),
        "invalid_value",
        "session.audio.input.turn_detection.eagerness",
    ),
    (
        vad(type="semantic_vad", silence_duration_ms=500),
        "unknown_parameter",
        "session.audio.input.turn_detection.silence_duration_ms",
    ),
    (
        vad(type="server_vad", idle_timeout_ms=10),
        "invalid_value",
        "session.audio.input.turn_detection.idle_timeout_ms",
    ),
    (
        vad(type="server_vad", interrupt_response=0),
        "invalid_type",
        "session.audio.input.turn_detection.interrupt_response",
    ),
    (
        update({"type": "realtime", "max_output_tokens": 0}),
        "invalid_value",
        "session.max_output_tokens",
    ),
    (
        update({"type": "realtime", "audio": {"input": {"transcription": None}}}),
        "not_supported",
        "session.audio.input.transcription",
    ),
    (
        update({"type": "realtime", "audio": {"input": {"transcription": {"language": "fr"}}}}),
        "not_supported",
        "session.audio.input.transcription.language",
    ),
    (
        vad(type="server_vad", silence_duration_ms="long"),
        "invalid_type",
        "session.audio.input.turn_detection.silence_duration_ms",
    ),
    (
        vad(type="server_vad", threshold=1.5),
        "invalid_value",
        "session.audio.input.turn_detection.threshold",
    ),
    (
        vad(type="server_vad", create_response="no"),
        "invalid_type",
        "session.audio.input.turn_detection.create_response",
    ),
    (append(b"\x00\x01\x02"), "invalid_audio", "audio"),
    ({"type": "input_audio_buffer.append", "audio": "!!not base64!!"}, "invalid_audio", "audio"),
    ({"type": "input_audio_buffer.append", "audio": 12}, "invalid_type", "audio"),
    ({"type": "input_audio_buffer.append"}, "missing_required_parameter", "audio"),
    (
        {
            "type": "conversation.item.truncate",
            "item_id": "x",
            "content_index": 0,
            "audio_end_ms": 1,
        },
        "item_not_found",
        "item_id",
    ),
    ({"type": "conversation.item.truncate", "item_id": "x"}, "item_not_found", "item_id"),
    ({"type": "conversation.item.retrieve", "item_id": "x"}, "item_not_found", "item_id"),
    ({"type": "conversation.item.retrieve"}, "missing_required_parameter", "item_id"),
    ({"type": "conversation.item.delete", "item_id": 5}, "invalid_type", "item_id"),
    ({"type": "output_audio_buffer.clear"}, "not_supported", "type"),
    (
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "c", "output": "{}"},
        },
        "unknown_call_id",  # no call awaits it
        None,
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "system", "content": []},
        },
        "not_supported",
        "item.role",
    ),
    (
        {"type": "response.create", "response": {"conversation": "conv_1"}},
        "invalid_value",
        "response.conversation",
    ),
    (
        {"type": "response.create", "response": {"max_output_tokens": 5000}},
        "invalid_value",
        "response.max_output_tokens",
    ),
    (
        {"type": "response.create", "response": {"input": [{"type": "function_call_output"}]}},
        "not_supported",
        "response.input[0]",
    ),
    (
        {"type": "response.create", "response": {"input": [{"type": "item_reference", "id": "x"}]}},
        "item_not_found",
        "response.input[0]",
    ),
    (
        {"type": "response.create", "response": {"metadata": {"k": 1}}},
        "invalid_type",
        "response.metadata.k",
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": "AAAAAA=="}],
            },
        },
        "invalid_value",
        "item.content[0].audio",
    ),
    ({"type": "response.create", "response": {"tools": []}}, "not_supported", "response.tools"),
    ({"type": "response.create"}, "nothing_to_answer", None),
    ({"type": "response.cancel"}, "response_cancel_not_active", None),
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty", None),
    (b"\x00\x00", "invalid_event", None),
]


@pytest.mark.parametrize(("event", "code", "param"), BAD)
def test_bad_events_get_an_error_and_the_session_goes_on(
    event: Json | str | bytes, code: str, param: str | None
) -> None:
    d, _ = make()
    if isinstance(event, dict):
        event = {**event, "event_id": "evt_client_1"}
    (error,) = d.send(event)
    assert error["type"] == "error", error
    assert error["error"]["code"] == code, error
    assert error["error"]["param"] == param
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]
    if isinstance(event, dict) and "type" in event:
        assert error["error"]["event_id"] == "evt_client_1"
    assert types(d.send(update({"type": "realtime"}))) == ["session.updated"]


def test_a_rejected_update_changes_nothing() -> None:
    d, created = make()
    bad = {"type": "realtime", "instructions": "Be brief.", "audio": {"output": {"voice": "alloy"}}}
    assert types(d.send(update(bad))) == ["error"]
    (updated,) = d.send(update({"type": "realtime"}))
    assert updated["session"] == created["session"]


def test_too_many_bad_events_close_the_connection() -> None:
    d, _ = make(max_errors=3)
    d.send("{")
    d.send({"type": "nope"})
    out = d.codec.receive("[]", d.now)
    assert any(isinstance(e, Close) and e.code == p.CloseCode.TOO_MANY_ERRORS for e in out)


# --- a text turn ------------------------------------------------------------------------


def test_a_text_turn_streams_transcript_and_audio_then_completes() -> None:
    d, _ = make()
    added = d.send(user_text())
    assert types(added) == ["conversation.item.added", "conversation.item.done"]
    user_item = added[0]["item"]
    assert user_item["role"] == "user" and user_item["content"][0]["text"] == ITALY
    opened = d.send({"type": "response.create", "event_id": "e2"})
    assert types(opened) == [
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    response_id = opened[0]["response"]["id"]
    assert opened[3]["previous_item_id"] == user_item["id"]
    start = d.started()
    assert start.text is None and start.audio is None and start.speak
    assert start.output_rate == RATE and start.history[-1].content == ITALY

    events = answer(d, start.turn_id)
    assert types(events) == [
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        "quicksilver.metrics",
    ]
    assert events[0]["delta"] == ROME and events[0]["response_id"] == response_id
    assert base64.b64decode(events[1]["delta"]) == pcm(0.2)
    done = one(events, "response.done")["response"]
    assert done["status"] == "completed" and done["id"] == response_id
    assert done["output"][0]["content"][0] == {"type": "output_audio", "transcript": ROME}
    assert one(events, "quicksilver.metrics")["response_id"] == response_id
    assert len({e["event_id"] for e in [*added, *opened, *events]}) == len(added + opened + events)


def test_text_modality_answers_without_speech() -> None:
    d, _ = make()
    d.send(update({"type": "realtime", "output_modalities": ["text"]}))
    d.send(user_text())
    d.send({"type": "response.create"})
    start = d.started()
    assert not start.speak
    (delta,) = d.deliver(ReplySentence(start.turn_id, 0, ROME, 50.0))
    assert delta["type"] == "response.output_text.delta" and delta["delta"] == ROME
    events = d.deliver(ReplyFinished(start.turn_id, None, 90.0))
    assert types(events)[:2] == ["response.output_text.done", "response.content_part.done"]
    assert one(events, "response.done")["response"]["output_modalities"] == ["text"]


def test_per_response_instructions_and_modality() -> None:
    d, _ = make()
    d.send(user_text())
    params = {"instructions": "One word only.", "output_modalities": ["text"]}
    (created, *_) = d.send({"type": "response.create", "response": params})
    assert created["response"]["output_modalities"] == ["text"]
    start = d.started()
    assert not start.speak and start.history[0].content == "One word only."


def test_response_cancel_and_a_second_response_create() -> None:
    d, _ = make()
    d.send(user_text())
    d.send({"type": "response.create"})
    turn = d.started().turn_id
    (error,) = d.send({"type": "response.create", "event_id": "again"})
    assert error["error"]["code"] == "conversation_already_has_active_response"
    assert error["error"]["event_id"] == "again"
    events = d.send({"type": "response.cancel"})
    done = one(events, "response.done")["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    assert d.deliver(ReplySentence(turn, 0, ROME, 50.0)) == []  # nothing of it after


# --- speech -----------------------------------------------------------------------------


def spoken_turn(d: Driver) -> tuple[list[Json], int]:
    """Speech, a pause (the speculative turn), its transcript, the end of the turn."""
    events = d.frames(0.9, 20) + d.frames(0.05, 7)
    turn = d.started().turn_id
    events += d.deliver(FinalTranscript(turn, ITALY, 80.0))
    return events + d.frames(0.05, 12), turn


def test_a_spoken_turn_commits_transcribes_and_answers() -> None:
    d, _ = make()
    events, turn = spoken_turn(d)
    assert types(events) == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
        "response.created",
        "rate_limits.updated",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    item_id = events[0]["item_id"]
    assert {e.get("item_id") for e in events[:3]} == {item_id}
    heard = one(events, "conversation.item.input_audio_transcription.completed")
    assert heard["item_id"] == item_id and heard["transcript"] == ITALY
    assert heard["usage"]["seconds"] > 0
    done = one(answer(d, turn), "response.done")["response"]
    assert done["status"] == "completed"


def test_barge_in_cancels_the_response_with_turn_detected() -> None:
    d, _ = make()
    _, turn = spoken_turn(d)
    d.deliver(ReplySentence(turn, 0, "Rome is the capital of Italy, and it is old.", 50.0))
    d.deliver(ReplyAudio(turn, 0, pcm(0.2), RATE * 2, 20.0))
    events = d.frames(0.9, 5)
    done = one(events, "response.done")["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "turn_detected"
    assert (
        one(events, "response.output_audio_transcript.done")["transcript"] == "Rome"
    )  # the part sent as audio
    started = one(events, "input_audio_buffer.speech_started")
    assert types(events).index("response.done") < types(events).index(
        "input_audio_buffer.speech_started"
    )
    assert d.deliver(ReplyAudio(turn, 0, pcm(0.1), RATE * 2, None)) == []
    assert started["item_id"] != done["output"][0]["id"]


def test_appended_audio_reaches_the_session_a_second_at_a_time() -> None:
    d, _ = make()
    assert d.send(append(pcm(3.0))) == []
    runs = [e for e in d.effects if isinstance(e, RunVad)]
    assert len(runs) == 3
    assert (
        abs(sum(r.samples.size for r in runs) - 3 * 16000) < 500
    )  # at 16 kHz (less the filter delay)


def test_manual_turns_commit_then_respond() -> None:
    d, _ = make()
    (updated,) = d.send(
        vad_off := update({"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    )
    assert updated["session"]["audio"]["input"]["turn_detection"] is None
    assert vad_off
    assert d.send(append(pcm(0.05))) == []
    assert not [e for e in d.effects if isinstance(e, RunVad)]  # no VAD in manual turns
    (error,) = d.send({"type": "input_audio_buffer.commit"})
    assert error["error"]["code"] == "input_audio_buffer_commit_empty"
    d.send(append(pcm(0.5)))
    committed = d.send({"type": "input_audio_buffer.commit"})
    assert types(committed) == ["input_audio_buffer.committed", "conversation.item.added"]
    item_id = committed[0]["item_id"]
    assert types(d.send({"type": "response.create"}))[0] == "response.created"
    start = d.started()
    assert start.audio is not None and start.audio.size == 8800  # both appends, at 16 kHz
    events = d.deliver(FinalTranscript(start.turn_id, ITALY, 80.0))
    heard = one(events, "conversation.item.input_audio_transcription.completed")
    assert heard["item_id"] == item_id and heard["transcript"] == ITALY
    assert one(answer(d, start.turn_id), "response.done")["response"]["status"] == "completed"


def test_clear_forgets_the_manual_buffer() -> None:
    d, _ = make()
    d.send(update({"type": "realtime", "audio": {"input": {"turn_detection": None}}}))
    d.send(append(pcm(0.5)))
    assert types(d.send({"type": "input_audio_buffer.clear"})) == ["input_audio_buffer.cleared"]
    (error,) = d.send({"type": "input_audio_buffer.commit"})
    assert error["error"]["code"] == "input_audio_buffer_commit_empty"


# --- any input --------------------------------------------------------------------------

CODES = {
    "invalid_json",
    "invalid_event",
    "unknown_event",
    "beta_protocol",
    "unknown_parameter",
    "missing_required_parameter",
    "invalid_type",
    "invalid_value",
    "not_supported",
    "invalid_audio",
    "input_audio_buffer_commit_empty",
    "input_audio_buffer_full",
    "conversation_already_has_active_response",
    "response_cancel_not_active",
    "nothing_to_answer",
    "rate_limited",
    "item_not_found",
    "item_in_progress",
}
KINDS = st.sampled_from(
    [
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "response.create",
        "response.cancel",
        "conversation.item.truncate",
        "conversation.item.retrieve",
        "conversation.item.delete",
        "output_audio_buffer.clear",
        "dance",
    ]
)
KEYS = st.sampled_from(
    [
        "type",
        "session",
        "audio",
        "item",
        "response",
        "input",
        "format",
        "turn_detection",
        "output_modalities",
        "instructions",
        "content",
        "role",
        "text",
        "rate",
        "voice",
        "event_id",
        "conversation",
        "max_output_tokens",
        "eagerness",
        "idle_timeout_ms",
        "create_response",
    ]
) | st.text(max_size=6)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=True)
    | st.sampled_from(
        [
            *("realtime", "server_vad", "semantic_vad", "audio/pcm", "audio/pcmu", "none"),
            *("user", "message", "input_text", "input_audio", "item_reference", "AAAA"),
            *("item_qs1", "item_qs2", "item_qs3"),
        ]
    )
    | st.text(max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)
EVENTS = st.fixed_dictionaries(
    {"type": KINDS},
    optional={
        k: VALUES
        for k in ["session", "audio", "item", "response", "event_id", "item_id", "audio_end_ms"]
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=6))
def test_any_events_give_effects_or_documented_errors_never_a_crash(events: list[Json]) -> None:
    d, _ = make(max_errors=1000)
    for event in events:
        for out in d.send(event):
            assert out["type"] and out["event_id"]
            if out["type"] == "error":
                assert out["error"]["code"] in CODES, out


def test_committed_audio_that_holds_no_words_still_completes_its_item() -> None:
    d, _ = make()
    d.send(update({"type": "realtime", "audio": {"input": {"turn_detection": None}}}))
    d.send(append(pcm(0.5)))
    item_id = d.send({"type": "input_audio_buffer.commit"})[0]["item_id"]
    d.send({"type": "response.create"})
    turn = d.started().turn_id
    events = d.deliver(FinalTranscript(turn, "", 80.0))
    heard = one(events, "conversation.item.input_audio_transcription.completed")
    assert (heard["item_id"], heard["transcript"], heard["usage"]["seconds"]) == (item_id, "", 0.5)
    events = d.deliver(ReplyFinished(turn, None, None))
    assert one(events, "response.done")["response"]["status"] == "completed"


# --- telephony audio ----------------------------------------------------------------


def formats(kind: str) -> Json:
    fmt = {"type": kind}
    return update(
        {"type": "realtime", "audio": {"input": {"format": fmt}, "output": {"format": fmt}}}
    )


def test_mu_law_both_ways_at_8khz() -> None:
    d, _ = make()
    (updated,) = d.send(formats("audio/pcmu"))
    audio = updated["session"]["audio"]
    assert audio["input"]["format"] == audio["output"]["format"] == {"type": "audio/pcmu"}
    tone = (8000 * np.sin(np.arange(8000) * 2 * np.pi * 440 / 8000)).astype(np.int16)
    assert d.send(append(g711.ulaw_encode(tone))) == []  # 1 s: 8000 bytes, odd lengths fine
    heard = np.concatenate([e.samples for e in d.effects if isinstance(e, RunVad)])
    assert abs(heard.size - 16000) < 500  # upsampled to the session's 16 kHz
    assert 0.15 < float(np.sqrt(np.mean(heard**2))) < 0.2  # the tone's level: 8000/32768/sqrt(2)
    d.send(user_text())
    d.send({"type": "response.create"})
    start = d.started()
    assert start.output_rate == 8000  # Piper's speech is asked for at 8 kHz
    reply = (4000 * np.sin(np.arange(800) * 0.3)).astype(np.int16)
    d.deliver(ReplySentence(start.turn_id, 0, ROME, 50.0))
    events = d.deliver(ReplyAudio(start.turn_id, 0, reply.tobytes(), 800, 20.0))
    delta = base64.b64decode(one(events, "response.output_audio.delta")["delta"])
    assert delta == g711.ulaw_encode(reply)  # one byte a sample
    done = one(d.deliver(ReplyFinished(start.turn_id, None, 90.0)), "response.done")
    assert done["response"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}


def test_a_law_manual_commit_is_heard_at_16khz() -> None:
    d, _ = make()
    d.send(formats("audio/pcma"))
    d.send(update({"type": "realtime", "audio": {"input": {"turn_detection": None}}}))
    assert d.send(append(g711.alaw_encode(np.zeros(400, np.int16)))) == []  # 50 ms
    assert types(d.send({"type": "input_audio_buffer.commit"})) == ["error"]
    d.send(append(g711.alaw_encode(np.zeros(3600, np.int16))))
    assert types(d.send({"type": "input_audio_buffer.commit"}))[0] == "input_audio_buffer.committed"
    d.send({"type": "response.create"})
    start = d.started()
    assert start.audio is not None and start.audio.size == 8000  # 0.5 s at 16 kHz


def test_a_manual_buffer_follows_a_change_of_input_format() -> None:
    d, _ = make()
    d.send(update({"type": "realtime", "audio": {"input": {"turn_detection": None}}}))
    d.send(append(pcm(0.3)))  # 24 kHz PCM
    d.send(formats("audio/pcmu"))
    d.send(append(g711.ulaw_encode(np.zeros(1600, np.int16))))  # 0.2 s at 8 kHz
    d.send({"type": "input_audio_buffer.commit"})
    d.send({"type": "response.create"})
    audio = d.started().audio
    assert audio is not None and audio.size == 8000  # 0.3 s + 0.2 s, at 16 kHz


# --- turn detection -----------------------------------------------------------------


def test_semantic_vad_sets_the_end_of_turn_eagerness() -> None:
    d, _ = make()
    (updated,) = d.send(vad(type="semantic_vad", eagerness="high"))
    detection = updated["session"]["audio"]["input"]["turn_detection"]
    assert detection == {
        "type": "semantic_vad",
        "eagerness": "high",
        "create_response": True,
        "interrupt_response": True,
    }
    assert d.session.config.eagerness == "high"
    assert d.session.config.end_of_turn.hold_ms == 800  # the high policy's hold
    d.send(vad(type="semantic_vad", eagerness="auto"))
    assert d.session.config.eagerness == "medium"
    d.send(vad(type="server_vad"))
    assert d.session.config.eagerness == "medium"  # the server's own again


def test_create_response_false_transcribes_and_waits_for_response_create() -> None:
    d, _ = make()
    d.send(vad(type="server_vad", create_response=False))
    events, turn = spoken_turn(d)
    start = d.started()
    assert not start.reply  # the pipeline only transcribes
    assert "conversation.item.input_audio_transcription.completed" in types(events)
    assert "response.created" not in types(events)
    after = d.deliver(ReplyFinished(turn, None, None))
    assert "response.done" not in types(after)
    assert d.session.conversation[-1].content == ITALY
    opened = d.send({"type": "response.create"})
    assert types(opened)[0] == "response.created"
    answer_start = d.started()
    assert answer_start.reply and answer_start.audio is None
    assert answer_start.history[-1].content == ITALY


def test_interrupt_response_false_lets_the_reply_finish_then_answers_the_speech() -> None:
    d, _ = make()
    d.send(vad(type="server_vad", interrupt_response=False))
    _, turn = spoken_turn(d)
    d.deliver(ReplySentence(turn, 0, ROME, 50.0))
    d.deliver(ReplyAudio(turn, 0, pcm(0.2), RATE * 2, 20.0))
    events = d.frames(0.9, 20) + d.frames(0.05, 25)  # talked over, then past the end of turn
    assert types(events) == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
    ]
    assert len([e for e in d.effects if isinstance(e, StartTurn)]) == 1  # it waits
    more = d.deliver(ReplyAudio(turn, 0, pcm(0.1), RATE * 2, None))
    assert types(more) == ["response.output_audio.delta"]  # the reply goes on
    done = d.deliver(ReplyFinished(turn, None, 90.0))
    assert one(done, "response.done")["response"]["status"] == "completed"
    assert d.session.conversation[-1].content == ROME  # all of it was heard
    second = d.started()
    assert second.turn_id != turn and second.audio is not None  # now the speech's turn
    heard = d.deliver(FinalTranscript(second.turn_id, "And France?", 80.0))
    completed = one(heard, "conversation.item.input_audio_transcription.completed")
    assert completed["item_id"] == events[0]["item_id"]
    assert "response.created" in types(heard)


def test_idle_timeout_commits_silence_and_answers_once() -> None:
    d, _ = make()
    d.send(user_text())
    d.send({"type": "response.create"})
    answer(d, d.started().turn_id)
    d.send(vad(type="server_vad", idle_timeout_ms=1000))
    quiet = append(pcm(0.5))
    assert d.send(quiet) == [] and d.send(quiet) == [] and d.send(quiet) == []
    # 1.5 s appended; 1.5 - 0.5 s playback lead counted before this append: 1.0 s
    events = d.send(quiet)
    assert types(events)[:5] == [
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
    ]
    triggered = events[0]
    assert triggered["audio_start_ms"] == 500 and triggered["audio_end_ms"] == 1500
    assert events[1]["item_id"] == triggered["item_id"]
    start = d.started()
    assert start.history[-1] == d.session.conversation[-1]  # the conversation as it stands
    assert d.send(quiet) == []  # once, not again while it answers
    answer(d, start.turn_id)  # at 2.5 s: idle from 3.0 s, once its audio has played
    assert d.send(quiet) == [] and d.send(quiet) == [] and d.send(quiet) == []
    assert types(d.send(quiet))[0] == "input_audio_buffer.timeout_triggered"  # at 4.0 s


def test_idle_timeout_waits_while_speech_is_heard() -> None:
    d, _ = make()
    d.send(vad(type="server_vad", idle_timeout_ms=1000))
    heard = d.frames(0.9, 10)  # the VAD hears speech: an utterance is open
    assert types(heard) == ["input_audio_buffer.speech_started"]
    assert [e for e in d.send(append(pcm(1.5))) if e] == []
    assert [e for e in d.send(append(pcm(0.5))) if e] == []


# --- transcription ------------------------------------------------------------------


def test_transcription_is_echoed_and_partials_become_deltas() -> None:
    d, _ = make()
    change = {"input": {"transcription": {"model": "gpt-4o-transcribe", "language": "en"}}}
    (updated,) = d.send(update({"type": "realtime", "audio": change}))
    assert updated["session"]["audio"]["input"]["transcription"] == {
        "model": "gpt-4o-transcribe",
        "language": "en",
    }
    (started,) = d.frames(0.9, 20)[:1]
    turn = 1  # the session's first turn: its speech is being heard
    deltas = [
        e
        for text in ("What is", "What is the capital", "What is the capital", "Where is it")
        for e in d.deliver(PartialTranscript(turn, text))
    ]
    assert [e["delta"] for e in deltas] == ["What is", " the capital"]
    assert {e["item_id"] for e in deltas} == {started["item_id"]}
    assert types(deltas) == ["conversation.item.input_audio_transcription.delta"] * 2


# --- conversation items ---------------------------------------------------------------


def spoken_reply(d: Driver, sentences: list[str], seconds: float = 1.0) -> tuple[int, str]:
    """A text question answered with ``sentences``, each ``seconds`` of audio sent whole;
    the turn and its assistant item."""
    d.send(user_text())
    opened = d.send({"type": "response.create"})
    item_id = one(opened, "response.output_item.added")["item"]["id"]
    turn = d.started().turn_id
    samples = int(RATE * seconds)
    for i, sentence in enumerate(sentences):
        d.deliver(ReplySentence(turn, i, sentence, 50.0))
        d.deliver(ReplyAudio(turn, i, pcm(seconds), samples, 20.0))
    d.deliver(ReplyFinished(turn, None, 90.0))
    return turn, item_id


def test_retrieve_gives_back_the_item_as_last_sent() -> None:
    d, _ = make()
    added = one(d.send(user_text()), "conversation.item.added")["item"]
    (retrieved,) = d.send({"type": "conversation.item.retrieve", "item_id": added["id"]})
    assert retrieved["type"] == "conversation.item.retrieved" and retrieved["item"] == added
    _, item_id = spoken_reply(d, [ROME])
    (retrieved,) = d.send({"type": "conversation.item.retrieve", "item_id": item_id})
    item = retrieved["item"]
    assert item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"] == [{"type": "output_audio", "transcript": ROME}]


def test_delete_removes_the_message_from_what_the_model_reads() -> None:
    d, _ = make()
    first = one(d.send(user_text("Hello there.")), "conversation.item.added")["item"]["id"]
    d.send(user_text())
    assert [m.content for m in d.session.conversation] == ["Hello there.", ITALY]
    (deleted,) = d.send({"type": "conversation.item.delete", "item_id": first})
    assert deleted == {**deleted, "type": "conversation.item.deleted", "item_id": first}
    assert [m.content for m in d.session.conversation] == [ITALY]
    (error,) = d.send({"type": "conversation.item.retrieve", "item_id": first})
    assert error["error"]["code"] == "item_not_found"
    d.send({"type": "response.create"})
    assert [m.content for m in d.started().history] == [ITALY]


def test_an_item_being_answered_cannot_be_deleted_or_truncated() -> None:
    d, _ = make()
    d.send(user_text())
    opened = d.send({"type": "response.create"})
    item_id = one(opened, "response.output_item.added")["item"]["id"]
    (error,) = d.send({"type": "conversation.item.delete", "item_id": item_id})
    assert error["error"]["code"] == "item_in_progress"
    truncate = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0}
    (error,) = d.send({**truncate, "audio_end_ms": 0})
    assert error["error"]["code"] == "item_in_progress"


def test_truncate_keeps_the_words_of_the_audio_heard() -> None:
    d, _ = make()
    sentences = ["Rome is the capital of Italy.", "It is a very old city indeed."]
    _, item_id = spoken_reply(d, sentences)
    assert d.session.conversation[-1].content == " ".join(sentences)
    truncate = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0}
    (error,) = d.send({**truncate, "audio_end_ms": 2001})  # 2 s of audio were sent
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "audio_end_ms")
    (done,) = d.send({**truncate, "audio_end_ms": 1500, "event_id": "t1"})
    assert done["type"] == "conversation.item.truncated"
    assert (done["item_id"], done["content_index"], done["audio_end_ms"]) == (item_id, 0, 1500)
    kept = "Rome is the capital of Italy. It is a very"  # all of one, half of the other
    assert d.session.conversation[-1] == ChatMessage("assistant", kept)
    item = d.send({"type": "conversation.item.retrieve", "item_id": item_id})[0]["item"]
    assert item["content"][0]["transcript"] == kept
    (error,) = d.send({**truncate, "audio_end_ms": 1600})  # past what is left now
    assert error["error"]["code"] == "invalid_value"
    d.send({**truncate, "audio_end_ms": 0})
    assert [m.role for m in d.session.conversation] == ["user"]  # nothing heard: gone
    d.send({"type": "response.create"})
    assert d.started().history[-1].content == ITALY


def test_truncate_refuses_user_items_and_other_parts() -> None:
    d, _ = make()
    user = one(d.send(user_text()), "conversation.item.added")["item"]["id"]
    truncate = {"type": "conversation.item.truncate", "content_index": 0, "audio_end_ms": 0}
    (error,) = d.send({**truncate, "item_id": user})
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "item_id")
    _, item_id = spoken_reply(d, [ROME])
    (error,) = d.send({**truncate, "item_id": item_id, "content_index": 1})
    assert (error["error"]["code"], error["error"]["param"]) == ("invalid_value", "content_index")


def test_a_barged_in_reply_can_be_truncated_further() -> None:
    d, _ = make()
    events, turn = spoken_turn(d)
    opened_item = one(events, "response.output_item.added")["item"]["id"]
    d.deliver(ReplySentence(turn, 0, "Rome is the capital of Italy, and it is old.", 50.0))
    d.deliver(ReplyAudio(turn, 0, pcm(1.0), RATE * 2, 20.0))  # half the sentence sent
    events = d.frames(0.9, 5)
    assert one(events, "response.done")["response"]["status"] == "cancelled"
    spoken = d.session.conversation[-1]
    assert spoken.role == "assistant" and spoken.content == "Rome is the capital of"
    truncate = {"type": "conversation.item.truncate", "item_id": opened_item, "content_index": 0}
    assert types(d.send({**truncate, "audio_end_ms": 500})) == ["conversation.item.truncated"]
    assert d.session.conversation[-1] == ChatMessage("assistant", "Rome is")


def test_a_user_audio_item_is_transcribed_and_answered_on_response_create() -> None:
    d, _ = make()
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "audio": base64.b64encode(pcm(0.5)).decode()}],
    }
    (added,) = d.send({"type": "conversation.item.create", "item": item})
    assert added["type"] == "conversation.item.added"
    item_id = added["item"]["id"]
    assert added["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    (error,) = d.send({"type": "conversation.item.create", "item": item})
    assert error["error"]["code"] == "not_supported"  # one audio item waits at a time
    d.send({"type": "response.create"})
    start = d.started()
    assert start.audio is not None and start.audio.size == 8000
    heard = one(d.deliver(FinalTranscript(start.turn_id, ITALY, 80.0)), "conversation.item.done")
    assert heard["item"]["id"] == item_id
    assert heard["item"]["content"][0]["transcript"] == ITALY


# --- responses --------------------------------------------------------------------------


def test_an_out_of_band_response_leaves_the_conversation_alone() -> None:
    d, _ = make()
    user = one(d.send(user_text()), "conversation.item.added")["item"]["id"]
    params = {
        "conversation": "none",
        "metadata": {"topic": "summary"},
        "output_modalities": ["text"],
        "input": [
            {"type": "item_reference", "id": user},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Answer in one word."}],
            },
        ],
    }
    opened = d.send({"type": "response.create", "response": params})
    assert "conversation.item.added" not in types(opened)
    created = one(opened, "response.created")["response"]
    assert created["conversation_id"] is None and created["metadata"] == {"topic": "summary"}
    start = d.started()
    assert [m.content for m in start.history] == [ITALY, "Answer in one word."]
    d.deliver(ReplySentence(start.turn_id, 0, "Rome.", 50.0))
    events = d.deliver(ReplyFinished(start.turn_id, None, 90.0))
    assert "conversation.item.done" not in types(events)
    assert one(events, "response.done")["response"]["output"][0]["content"][0]["text"] == "Rome."
    assert [m.content for m in d.session.conversation] == [ITALY]  # nothing remembered
    d.send({"type": "response.create"})  # the conversation still waits for its answer
    assert d.started().history[-1].content == ITALY


def test_max_output_tokens_of_the_session_and_of_a_response() -> None:
    session = Session("rt", SessionConfig(endpoint=ENDPOINT), "tiny.en", "x")
    d = Driver(Realtime(session, "tiny.en", "gpt-realtime", max_reply_tokens=64))
    (created,) = d.run(d.codec.open(d.now))
    assert created["session"]["max_output_tokens"] == "inf"
    (updated,) = d.send(update({"type": "realtime", "max_output_tokens": 20}))
    assert updated["session"]["max_output_tokens"] == 20
    d.send(user_text())
    opened = d.send({"type": "response.create"})
    assert d.started().max_tokens == 20
    limits = one(opened, "rate_limits.updated")["rate_limits"]
    assert limits[0] == {**limits[0], "name": "requests", "limit": 5, "remaining": 4}
    assert limits[1] == {"name": "tokens", "limit": 20, "remaining": 20, "reset_seconds": 0.0}
    d.send({"type": "response.cancel"})
    opened = d.send({"type": "response.create", "response": {"max_output_tokens": 7}})
    assert d.started().max_tokens == 7
    assert one(opened, "response.created")["response"]["max_output_tokens"] == 7
    assert one(opened, "rate_limits.updated")["rate_limits"][0]["remaining"] == 3
    d.send({"type": "response.cancel"})
    d.send(update({"type": "realtime", "max_output_tokens": "inf"}))
    opened = d.send({"type": "response.create"})
    assert d.started().max_tokens is None  # the server's budget
    assert one(opened, "rate_limits.updated")["rate_limits"][1]["limit"] == 64


def test_a_client_secrets_session_applies_before_session_created() -> None:
    preset = {"type": "realtime", "instructions": "Be terse.", "output_modalities": ["text"]}
    session = Session("rt", SessionConfig(endpoint=ENDPOINT), "tiny.en", "x")
    d = Driver(Realtime(session, "tiny.en", "gpt-realtime", preset=preset))
    (created,) = d.run(d.codec.open(d.now))
    assert created["session"]["instructions"] == "Be terse."
    assert created["session"]["output_modalities"] == ["text"]
    d.send(user_text())
    d.send({"type": "response.create"})
    start = d.started()
    assert not start.speak and start.history[0].content == "Be terse."
    bad = {"type": "realtime", "audio": {"output": {"voice": "alloy"}}}
    session = Session("rt2", SessionConfig(endpoint=ENDPOINT), "tiny.en", "x")
    d = Driver(Realtime(session, "tiny.en", "gpt-realtime", preset=bad))
    created, error = d.run(d.codec.open(d.now))
    assert created["type"] == "session.created" and error["error"]["code"] == "invalid_value"


TIMER_TOOL = {
    "type": "function",
    "name": "timer_set",
    "description": "Start a countdown timer.",
    "parameters": {
        "type": "object",
        "properties": {"seconds": {"type": "integer", "minimum": 1}},
        "required": ["seconds"],
    },
}


def acting() -> Driver:
    session = Session("rt", SessionConfig(endpoint=ENDPOINT), "tiny.en", "x", can_act=True)
    d = Driver(Realtime(session, "tiny.en", "gpt-realtime"))
    d.run(d.codec.open(d.now))
    return d


def test_a_realtime_session_starts_without_tools_as_openai_s_do() -> None:
    """The reply engine may call tools (can_act), but a session declares none until
    session.update gives it functions."""
    d = acting()
    assert d.session.tools == ()
    d.send(user_text())
    d.send({"type": "response.create"})
    assert d.started().tools == ()


def test_session_tools_become_the_reply_engine_s_tools() -> None:
    d = acting()
    (updated,) = d.send(update({"type": "realtime", "tools": [TIMER_TOOL], "tool_choice": "auto"}))
    assert updated["session"]["tools"] == [TIMER_TOOL]
    assert [t.name for t in d.session.tools] == ["timer_set"]
    d.send(user_text("Set a timer for five minutes."))
    d.send({"type": "response.create"})
    assert [t.name for t in d.started().tools] == ["timer_set"]
    (updated,) = d.send(update({"type": "realtime", "tool_choice": "none"}))  # listed, never called
    assert updated["session"]["tool_choice"] == "none" and d.session.tools == ()


@pytest.mark.parametrize(
    ("session", "code"),
    [
        ({"tools": [{"type": "mcp", "server_url": "x"}]}, "not_supported"),
        ({"tools": [{**TIMER_TOOL, "name": "has space"}]}, "invalid_value"),
        ({"tools": "timer"}, "invalid_type"),
        ({"tool_choice": "required"}, "not_supported"),
        ({"tool_choice": {"type": "function", "name": "timer_set"}}, "not_supported"),
        ({"tool_choice": "sometimes"}, "invalid_value"),
    ],
)
def test_tools_the_server_cannot_honour_are_refused(session: Json, code: str) -> None:
    d = acting()
    (error,) = d.send(update({"type": "realtime", **session}))
    assert error["type"] == "error" and error["error"]["code"] == code


def test_an_engine_that_cannot_act_refuses_tools() -> None:
    d, _ = make()  # can_act False
    (error,) = d.send(update({"type": "realtime", "tools": [TIMER_TOOL]}))
    assert error["error"]["code"] == "not_supported" and error["error"]["param"] == "session.tools"


def test_a_function_marked_confirm_is_called_only_after_a_yes() -> None:
    """``confirm`` (this server's own field: OpenAI's function tools have no approval
    setting) is echoed back; a call of it is asked about, and a typed yes answered on
    request is its function_call (docs/actions.md, "Asking first")."""
    d = acting()
    door = {**TIMER_TOOL, "name": "door_unlock", "confirm": True}
    (updated,) = d.send(update({"type": "realtime", "tools": [door]}))
    assert updated["session"]["tools"] == [door]
    d.send(user_text("Unlock the door."))
    d.send({"type": "response.create"})
    turn = d.started().turn_id
    events = d.deliver(ReplyAction(turn, ToolCall("door_unlock", {"seconds": 5})))
    events += answer(d, turn, "Should I do door unlock with seconds five?")
    assert "response.function_call_arguments.done" not in types(events)
    d.send(user_text("Yes."))
    d.send({"type": "response.create"})
    assert d.started().pending == ToolCall("door_unlock", {"seconds": 5})
    events = answer(d, d.started().turn_id, "Done: door unlock with seconds five.")
    done = one(events, "response.function_call_arguments.done")
    assert done["name"] == "door_unlock" and json.loads(done["arguments"]) == {"seconds": 5}


def test_a_call_is_a_function_call_item_and_its_output_joins_the_conversation() -> None:
    d = acting()
    d.send(update({"type": "realtime", "tools": [TIMER_TOOL]}))
    d.send(user_text("Set a timer for five minutes."))
    opened = d.send({"type": "response.create"})
    response_id = opened[0]["response"]["id"]
    turn = d.started().turn_id
    call = ToolCall("timer_set", {"seconds": 300}, passes=4)
    events = d.deliver(ReplyAction(turn, call))
    events += answer(d, turn, "Timer set for five minutes.")
    kinds = types(events)
    i = kinds.index("response.function_call_arguments.done")
    assert kinds[: i + 1] == [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ]
    assert kinds.index("response.output_item.done") < kinds.index(
        "response.output_audio_transcript.delta"
    )
    done_args = events[i]
    assert done_args["name"] == "timer_set" and json.loads(done_args["arguments"]) == {
        "seconds": 300
    }
    call_id = done_args["call_id"]
    assert done_args["response_id"] == response_id and done_args["output_index"] == 1
    response = one(events, "response.done")["response"]
    assert [o["type"] for o in response["output"]] == ["message", "function_call"]
    assert response["output"][1]["arguments"] == done_args["arguments"]

    out = d.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": call_id, "output": "ticking"},
        }
    )
    assert types(out) == ["conversation.item.added", "conversation.item.done"]
    assert out[0]["item"]["type"] == "function_call_output"
    last = d.session.conversation[-1]
    assert last.role == "tool" and json.loads(last.content)["output"] == "ticking"
    (error,) = d.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "call_99", "output": "x"},
        }
    )
    assert error["error"]["code"] == "unknown_call_id"


def test_tracing_auto_is_taken_and_echoed_and_nothing_else_is() -> None:
    """The Agents SDK asks for tracing "auto" by default; no trace is recorded here."""
    d, _ = make()
    (updated,) = d.send(update({"type": "realtime", "tracing": "auto"}))
    assert updated["session"]["tracing"] == "auto"
    (error,) = d.send(update({"type": "realtime", "tracing": {"workflow_name": "x"}}))
    assert error["error"]["code"] == "not_supported"
