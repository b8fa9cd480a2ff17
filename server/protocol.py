"""Wire format of protocol v1 (docs/protocol.md): typed messages and their codec.

Text frames carry one JSON object with a ``type`` field; binary frames carry audio.
Client -> server audio is raw PCM16 little-endian mono at the declared rate. Server ->
client audio frames start with an 8-byte header (turn id, frame sequence number, both
uint32 little-endian) so a client can drop the audio of a cancelled turn by its id.

This module has no I/O; the server and the Python clients both use it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field, fields
from enum import IntEnum
from typing import Any, ClassVar, Literal

PROTOCOL_VERSION = 1
PATH = "/v1/voice"
INPUT_SAMPLE_RATES = (8000, 16000, 24000, 48000)
OUTPUT_SAMPLE_RATES = (8000, 16000, 22050, 24000, 48000)
MAX_AUDIO_FRAME_SECONDS = 1.0  # one binary frame may hold at most this much audio
MAX_TEXT_CHARS = 2000
AUDIO_HEADER = struct.Struct("<II")  # turn_id, seq


class ProtocolError(Exception):
    """A message the server cannot accept; becomes an ``error`` event."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- client -> server ------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    type: ClassVar[str] = "start"
    sample_rate: int
    client: str = "unknown"
    output_sample_rate: int | None = None
    protocol: int = PROTOCOL_VERSION
    resume_token: str | None = None  # from an earlier ready: continue that conversation
    # [{name, description, parameters}] the assistant may call (docs/protocol.md, "Actions");
    # None: the server's default device tools; []: no tools
    tools: list[Any] | None = None


@dataclass(frozen=True)
class Text:
    """A typed user message instead of speech."""

    type: ClassVar[str] = "text"
    text: str


@dataclass(frozen=True)
class Cancel:
    """Stop the current reply (like a barge-in, without speaking)."""

    type: ClassVar[str] = "cancel"


@dataclass(frozen=True)
class EndOfInput:
    """Push-to-talk released: the current utterance is complete, answer now."""

    type: ClassVar[str] = "end_of_input"


@dataclass(frozen=True)
class ActionResult:
    """What came of an ``action`` the client carried out; the next reply may use it."""

    type: ClassVar[str] = "action_result"
    call_id: str
    output: Any = None  # any JSON value; a short string reads best to the model


ClientMessage = Start | Text | Cancel | EndOfInput | ActionResult
_CLIENT_TYPES: dict[str, type[ClientMessage]] = {
    cls.type: cls for cls in (Start, Text, Cancel, EndOfInput, ActionResult)
}


# --- server -> client ------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    type: ClassVar[str] = "ready"
    session_id: str
    input_sample_rate: int
    output_sample_rate: int
    output_format: str = "pcm_s16le"
    audio_header_bytes: int = AUDIO_HEADER.size
    protocol: int = PROTOCOL_VERSION
    asr: str = ""
    reply_engine: str = ""
    resume_token: str = ""  # send in a later start to continue this conversation
    resumed: bool = False  # this session continues an earlier conversation
    history: int = 0  # messages of conversation the session starts with (when resumed)
    tools: list[str] = field(default_factory=list)  # what the assistant may call


@dataclass(frozen=True)
class SpeechStarted:
    type: ClassVar[str] = "speech_started"
    turn_id: int
    audio_ms: int  # position in the session's input audio


@dataclass(frozen=True)
class SpeechStopped:
    type: ClassVar[str] = "speech_stopped"
    turn_id: int
    audio_ms: int


@dataclass(frozen=True)
class TranscriptPartial:
    type: ClassVar[str] = "transcript_partial"
    turn_id: int
    text: str


@dataclass(frozen=True)
class TranscriptFinal:
    type: ClassVar[str] = "transcript_final"
    turn_id: int
    text: str


@dataclass(frozen=True)
class ReplyText:
    """One sentence of the reply, sent before its audio."""

    type: ClassVar[str] = "reply_text"
    turn_id: int
    index: int
    text: str


@dataclass(frozen=True)
class Action:
    """The reply calls a tool: sent before the reply's spoken confirmation."""

    type: ClassVar[str] = "action"
    turn_id: int
    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ReplyDone:
    type: ClassVar[str] = "reply_done"
    turn_id: int
    text: str


# Why a reply stopped before its end ("closed": the session ended; no message says so).
CancelReason = Literal["barge_in", "continued", "client_cancel", "new_input", "error", "closed"]


@dataclass(frozen=True)
class ReplyCancelled:
    type: ClassVar[str] = "reply_cancelled"
    turn_id: int
    reason: CancelReason
    spoken_text: str  # what the conversation keeps: the part already sent as audio


@dataclass(frozen=True)
class Metrics:
    """Per-turn latency breakdown in milliseconds (None: stage did not run)."""

    type: ClassVar[str] = "metrics"
    turn_id: int
    endpointing_ms: float | None
    asr_ms: float | None
    reply_first_sentence_ms: float | None
    reply_ms: float | None
    tts_first_chunk_ms: float | None
    first_audio_ms: float | None  # end of user speech (or text arrival) -> first audio
    speculative: bool = False
    reply_tokens: int = 0
    forward_passes: int = 0
    # How the end of the turn was decided (docs/turn_end.md): "complete" (scored complete,
    # final after 200 ms), "unsure" (the endpointer's 416 ms), "incomplete" (held open),
    # "empty" (no words); None for a text turn, end_of_input or the length limit.
    end_of_turn: str | None = None
    action: str | None = None  # the tool the reply called, if it acted
    action_passes: int = 0  # model passes the call took to write


@dataclass(frozen=True)
class Error:
    type: ClassVar[str] = "error"
    code: str
    message: str


ServerMessage = (
    Ready
    | SpeechStarted
    | SpeechStopped
    | TranscriptPartial
    | TranscriptFinal
    | ReplyText
    | Action
    | ReplyDone
    | ReplyCancelled
    | Metrics
    | Error
)
_SERVER_TYPES: dict[str, type[ServerMessage]] = {
    cls.type: cls
    for cls in (
        Ready,
        SpeechStarted,
        SpeechStopped,
        TranscriptPartial,
        TranscriptFinal,
        ReplyText,
        Action,
        ReplyDone,
        ReplyCancelled,
        Metrics,
        Error,
    )
}


# --- codec -----------------------------------------------------------------------


def encode(message: ClientMessage | ServerMessage) -> str:
    return json.dumps({"type": message.type, **asdict(message)}, separators=(",", ":"))


def _build(table: dict[str, type[Any]], raw: str | bytes) -> Any:
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError("bad_json", f"text frame is not valid JSON: {exc}") from None
    except RecursionError:  # "[[[[..." nested deeper than the decoder's stack
        raise ProtocolError("bad_json", "text frame is nested too deeply") from None
    if not isinstance(obj, dict):
        raise ProtocolError("bad_message", "a message must be a JSON object")
    kind = obj.pop("type", None)
    cls = table.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise ProtocolError("bad_message", f"{kind}: unknown field(s) {', '.join(unknown)}")
    try:
        message = cls(**obj)
    except TypeError as exc:
        raise ProtocolError("bad_message", f"{kind}: {exc}") from None
    _check_types(message, kind)
    return message


_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "str": (str,),
    "float | None": (int, float, type(None)),
    "int | None": (int, type(None)),
    "str | None": (str, type(None)),
    "bool": (bool,),
}


def _check_types(message: Any, kind: str) -> None:
    for f in fields(message):
        value = getattr(message, f.name)
        allowed = _SCALARS.get(str(f.type))
        bad_bool = isinstance(value, bool) and bool not in (allowed or ())
        if allowed is not None and (not isinstance(value, allowed) or bad_bool):
            raise ProtocolError("bad_message", f"{kind}: field {f.name!r} must be {f.type}")


def decode_client(raw: str | bytes) -> ClientMessage:
    message: ClientMessage = _build(_CLIENT_TYPES, raw)
    match message:
        case Text(text=text) if not text.strip():
            raise ProtocolError("bad_message", "text: empty text")
        case Text(text=text) if len(text) > MAX_TEXT_CHARS:
            raise ProtocolError("bad_message", f"text: longer than {MAX_TEXT_CHARS} characters")
        case Text(text=text) if not encodable(text):
            raise ProtocolError(
                "bad_message", "text: a lone surrogate (\\ud800-\\udfff) is not text"
            )
        case Start(tools=tools) if tools is not None and not isinstance(tools, list):
            raise ProtocolError("bad_message", "start: tools must be a list")
        case ActionResult(output=output) if len(json.dumps(output)) > MAX_TEXT_CHARS:
            raise ProtocolError(
                "bad_message", f"action_result: output longer than {MAX_TEXT_CHARS} characters"
            )
        case _:
            pass
    return message


def encodable(text: str) -> bool:
    """JSON may escape a lone surrogate ("\\ud800"), which no UTF-8 text holds."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode_server(raw: str | bytes) -> ServerMessage:
    message: ServerMessage = _build(_SERVER_TYPES, raw)
    return message


def pack_audio(turn_id: int, seq: int, pcm: bytes) -> bytes:
    return AUDIO_HEADER.pack(turn_id, seq) + pcm


def unpack_audio(frame: bytes) -> tuple[int, int, bytes]:
    if len(frame) < AUDIO_HEADER.size:
        raise ProtocolError("bad_audio", "audio frame shorter than its header")
    turn_id, seq = AUDIO_HEADER.unpack_from(frame)
    return turn_id, seq, frame[AUDIO_HEADER.size :]


class CloseCode(IntEnum):
    """WebSocket close codes the server uses (docs/protocol.md)."""

    NORMAL = 1000
    GOING_AWAY = 1001  # server shutting down (conversation parked: resume it)
    POLICY_VIOLATION = 1008  # too many connections from one address
    MESSAGE_TOO_BIG = 1009  # frame over the server's size limit (sent by websockets)
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013  # server full: the reason says when to retry
    TOO_MANY_ERRORS = 4002  # the client kept sending invalid messages
    SLOW_CONSUMER = 4003  # the client fell too far behind reading reply audio
    START_TIMEOUT = 4004  # no start message in time after connecting
    SESSION_TOO_LONG = 4005  # session length limit (conversation parked: resume it)
