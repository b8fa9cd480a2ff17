"""The wire codec: every message round-trips, every malformed one is a typed error."""

from __future__ import annotations

import json

import pytest

from server import protocol as p

CLIENT = [
    p.Start(sample_rate=16000, client="glasses", output_sample_rate=24000),
    p.Text(text="What time is it?"),
    p.Cancel(),
    p.EndOfInput(),
]
SERVER = [
    p.Ready("abc", 16000, 22050, asr="tiny.en", reply_engine="smollm2-ar"),
    p.SpeechStarted(1, 320),
    p.SpeechStopped(1, 2100),
    p.TranscriptPartial(1, "what is"),
    p.TranscriptFinal(1, "What is the time?"),
    p.ReplyText(1, 0, "It is noon."),
    p.ReplyDone(1, "It is noon."),
    p.ReplyCancelled(1, "barge_in", "It is"),
    p.Metrics(1, 600.0, 420.5, 300.0, 900.0, 45.0, 1400.0, True, 12, 13),
    p.Error("bad_json", "nope"),
]


@pytest.mark.parametrize("message", CLIENT, ids=lambda m: m.type)
def test_client_messages_round_trip(message: p.ClientMessage) -> None:
    assert p.decode_client(p.encode(message)) == message


@pytest.mark.parametrize("message", SERVER, ids=lambda m: m.type)
def test_server_messages_round_trip(message: p.ServerMessage) -> None:
    wire = p.encode(message)
    assert json.loads(wire)["type"] == message.type
    assert p.decode_server(wire) == message


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("{not json", "bad_json"),
        (b"\xff\xfe", "bad_json"),
        ("[1, 2]", "bad_message"),
        ('{"type": "dance"}', "unknown_type"),
        ('{"no_type": 1}', "unknown_type"),
        ('{"type": 7}', "unknown_type"),
        ('{"type": "start"}', "bad_message"),
        ('{"type": "start", "sample_rate": "16000"}', "bad_message"),
        ('{"type": "start", "sample_rate": true}', "bad_message"),
        ('{"type": "start", "sample_rate": 16000, "volume": 3}', "bad_message"),
        ('{"type": "text", "text": "   "}', "bad_message"),
        ('{"type": "text", "text": 5}', "bad_message"),
        (json.dumps({"type": "text", "text": "x" * 5000}), "bad_message"),
        ('{"type": "ready", "session_id": "x"}', "unknown_type"),
    ],
)
def test_malformed_client_messages_are_typed_errors(raw: str | bytes, code: str) -> None:
    with pytest.raises(p.ProtocolError) as err:
        p.decode_client(raw)
    assert err.value.code == code
    assert err.value.message


def test_audio_frames_carry_turn_and_sequence() -> None:
    frame = p.pack_audio(7, 3, b"\x01\x00\x02\x00")
    assert len(frame) == p.AUDIO_HEADER.size + 4
    assert p.unpack_audio(frame) == (7, 3, b"\x01\x00\x02\x00")
    with pytest.raises(p.ProtocolError):
        p.unpack_audio(b"\x00\x01")
