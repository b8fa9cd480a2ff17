"""Property-based tests of the wire codec (hypothesis): any frame decodes to a message
or to a typed ProtocolError, never anything else."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from server import protocol as p

# JSON of any shape: scalars, lists and objects nested a few levels, with the keys and
# values real messages use mixed in so that near-valid messages are common.
KEYS = st.sampled_from(
    ["type", "sample_rate", "text", "client", "output_sample_rate", "protocol", "resume_token"]
) | st.text(max_size=8)
TYPES = st.sampled_from(["start", "text", "cancel", "end_of_input", "ready", "dance", ""])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | TYPES
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(KEYS, inner, max_size=6),
    max_leaves=30,
)
FIELDS = [f.name for f in fields(p.Start)] + ["text"]
MESSAGES = st.fixed_dictionaries({"type": TYPES}, optional={k: SCALARS for k in FIELDS})


def decode(raw: str | bytes) -> p.ClientMessage | p.ProtocolError:
    try:
        return p.decode_client(raw)
    except p.ProtocolError as err:
        assert err.code in {"bad_json", "bad_message", "unknown_type"}
        return err


@settings(max_examples=400)
@given(JSON)
def test_any_json_is_a_message_or_a_protocol_error(obj: Any) -> None:
    decode(json.dumps(obj))


@settings(max_examples=400)
@given(MESSAGES)
def test_near_valid_messages_decode_to_well_typed_messages(obj: dict[str, Any]) -> None:
    out = decode(json.dumps(obj))
    if isinstance(out, p.Start):
        assert isinstance(out.sample_rate, int) and not isinstance(out.sample_rate, bool)
        assert isinstance(out.protocol, int) and isinstance(out.client, str)
        assert p.decode_client(p.encode(out)) == out  # what decodes, round-trips


@settings(max_examples=300)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_any_frame_is_a_message_or_a_protocol_error(raw: str | bytes) -> None:
    decode(raw)


def test_deep_nesting_is_a_protocol_error_not_a_crash() -> None:
    """100,000 ``[`` once raised RecursionError out of the decoder and closed the
    session with 1011 (issue 17)."""
    for raw in ("[" * 100_000, '{"a":' * 100_000, "[" * 100_000 + "]" * 100_000):
        err = decode(raw)
        assert isinstance(err, p.ProtocolError) and err.code == "bad_json"


def test_a_lone_surrogate_is_not_text() -> None:
    """JSON may escape one; the tokenizer cannot encode it, and the turn once failed."""
    err = decode('{"type": "text", "text": "\\ud800 lone surrogate"}')
    assert isinstance(err, p.ProtocolError) and err.code == "bad_message"
    assert decode('{"type": "text", "text": "\\ud83d\\ude00 a pair is fine"}') == p.Text(
        "😀 a pair is fine"
    )
