"""OpenAI Realtime (GA) over the voice session: the second wire codec (docs/realtime.md).

The official ``openai`` SDKs (``client.realtime.connect()``) and the voice tools built
on them speak this protocol. :class:`Realtime` parses their client events into the
events of the same :class:`server.session.Session` that protocol v1 drives, and turns
the session's lifecycle events (server/lifecycle.py), messages and reply audio into
Realtime server events with ids; the pipeline and the models are shared. The session
owns every turn's state: the codec keeps none of a turn or a response, only its
settings, the manual input buffer and the items the client was told of. Like the
session it does no I/O and reads no clock: server/app.py sends what it returns and runs
the session's effects.

Audio is PCM16 at 24 kHz (``audio/pcm``, the GA protocol's only PCM rate) or G.711
mu-law / A-law at 8 kHz (``audio/pcmu``, ``audio/pcma``, telephony), base64 in JSON
events; the session resamples input to its 16 kHz and asks the turn pipeline for
speech at the output format's rate. The codec keeps the conversation's items (what
``conversation.item.retrieve`` reads back); an item that stands for a message of the
session's conversation has that message's id (what ``.delete`` and ``.truncate``
change), and a response is named by the turn it answers. What this
server does not do is answered with an ``error`` event (``not_supported``), never
ignored.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np

from audio import g711
from audio.endpoint import EndpointConfig
from audio.resample import SAMPLE_RATE, float32_to_pcm16, pcm16_to_float32, resample
from model.chat import SPOKEN_SYSTEM_PROMPT
from model.engine import ChatMessage
from model.tools import Tool, ToolError, parse_tools

from . import protocol as p
from .lifecycle import (
    CallAdded,
    HeardAudio,
    Lifecycle,
    ReplyEnded,
    ReplyStarted,
    SentenceAdded,
    TranscriptGrew,
    TurnClosed,
    TurnOpened,
    TurnWithdrawn,
    UserHeard,
    user_item,
)
from .session import (
    Amend,
    AudioBytes,
    ClearInput,
    Configure,
    Effect,
    Respond,
    Send,
    SendAudio,
    Session,
    SessionConfig,
    StartTurn,
    UserText,
)
from .turn_end import Eagerness

PATH = "/v1/realtime"
RATE = 24_000
# The audio formats and their rates: PCM16 at 24 kHz, or G.711 at 8 kHz.
RATES = {"audio/pcm": RATE, "audio/pcmu": 8000, "audio/pcma": 8000}
FORMAT = {"type": "audio/pcm", "rate": RATE}
VOICE = "en_US-joe-medium"  # the one Piper voice installed
DEFAULT_MODEL = "quicksilver"
MAX_INSTRUCTIONS_CHARS = 4000
MAX_ID_CHARS = 64
MAX_OUTPUT_TOKENS = 4096  # OpenAI's bound; the server's reply budget caps it anyway
# Manual turns (turn_detection null): committed speech goes to Whisper whole, so at most
# its 30 s window less the endpointer's pre-roll; a commit needs OpenAI's minimum.
MAX_BUFFER_SECONDS = 28
MIN_COMMIT_MS = 100
# Reply audio is paced at real time plus server.turn.Pacing's lead: when its response
# is done, this much of it may still be playing (idle_timeout_ms counts from its end).
PLAYBACK_LEAD_MS = 500
MIN_IDLE_TIMEOUT_MS = 1000  # shorter would fire inside the end of turn's own silence
MAX_IDLE_TIMEOUT_MS = 600_000
MAX_METADATA = 16

# GA client events not handled, with why (docs/realtime.md lists them).
NOT_YET = {
    "output_audio_buffer.clear": "there is no server-side output buffer (WebRTC/SIP only)",
}
BETA_EVENTS = {"transcription_session.update"}
# Session fields of the retired beta protocol, and where the GA protocol keeps them.
BETA_FIELDS = {
    "modalities": "session.output_modalities",
    "input_audio_format": "session.audio.input.format",
    "output_audio_format": "session.audio.output.format",
    "input_audio_transcription": "session.audio.input.transcription",
    "input_audio_noise_reduction": "session.audio.input.noise_reduction",
    "turn_detection": "session.audio.input.turn_detection",
    "voice": "session.audio.output.voice",
    "speed": "session.audio.output.speed",
    "max_response_output_tokens": "session.max_output_tokens",
    "temperature": "nothing: GA has no temperature",
}
# GA session fields not built; a value that says what the server does anyway passes.
NOT_YET_FIELDS: dict[str, tuple[object, ...]] = {
    "prompt": (None,),
    "truncation": ("auto",),  # the session drops the oldest messages past its limit
    "include": (),
    "reasoning": (),
    "parallel_tool_calls": (),
}
# response.create fields not built (tools wait for the device-actions issue's tools).
NOT_YET_RESPONSE = {
    "tools",
    "tool_choice",
    "audio",
    "prompt",
    "reasoning",
    "parallel_tool_calls",
}
# Session error codes under their Realtime names (the rest keep theirs).
_CODES = {
    "no_speech": "input_audio_buffer_commit_empty",
    "response_in_progress": "conversation_already_has_active_response",
}
_SERVER_ERRORS = {"turn_failed"}
_CANCEL_REASONS = {
    "barge_in": "turn_detected",
    "continued": "turn_detected",
    "client_cancel": "client_cancelled",
    "new_input": "client_cancelled",
}
_EAGERNESS: dict[str, Eagerness] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "auto": "medium",
}
_KEPT_ITEMS = 200  # items remembered for previous_item_id and retrieve

Json = dict[str, Any]


class RealtimeError(Exception):
    """A client event the codec rejects: an ``invalid_request_error`` event."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


@dataclass(frozen=True)
class Emit:
    """A server event of the codec's own (no session message behind it), encoded."""

    text: str


Out = Effect | Emit


@dataclass(frozen=True)
class ServerVad:
    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int
    idle_timeout_ms: int | None = None
    create_response: bool = True
    interrupt_response: bool = True

    @classmethod
    def of(cls, endpoint: EndpointConfig) -> ServerVad:
        return cls(endpoint.threshold, round(endpoint.pre_roll_ms), round(endpoint.end_of_turn_ms))

    def endpoint(self, base: EndpointConfig) -> EndpointConfig:
        """The endpointer for these settings: the silence ends the turn (and the
        end-of-turn policy is built around it, docs/turn_end.md)."""
        return replace(
            base,
            threshold=self.threshold,
            neg_threshold=min(base.neg_threshold, self.threshold),
            pre_roll_ms=float(self.prefix_padding_ms),
            end_of_turn_ms=float(self.silence_duration_ms),
            pause_ms=min(base.pause_ms, float(self.silence_duration_ms)),
        )

    def json(self) -> Json:
        return {"type": "server_vad", **asdict(self)}


@dataclass(frozen=True)
class SemanticVad:
    """The end of turn decided by what was said: the server's endpointer with the
    end-of-turn policy of this eagerness (server/turn_end.py)."""

    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True

    def json(self) -> Json:
        return {"type": "semantic_vad", **asdict(self)}


Detection = ServerVad | SemanticVad | None  # None: manual turns


@dataclass(frozen=True)
class Settings:
    """The Realtime session as the client configured it."""

    model: str
    vad: Detection
    instructions: str | None = None  # None: the reply model's own system prompt
    speak: bool = True  # output_modalities ["audio"]; False: ["text"]
    input_format: str = "audio/pcm"
    output_format: str = "audio/pcm"
    transcription: Json = field(default_factory=dict)  # as the client named it
    max_output_tokens: int | None = None  # None: "inf", the server's reply budget
    tools: tuple[Tool, ...] = ()  # the session's functions (the reply engine's tools)
    tool_choice: Literal["auto", "none"] = "auto"
    # null or "auto": echoed; no trace is recorded here (OpenAI's traces live in its
    # dashboard), and an Agents SDK session asks for "auto" by default
    tracing: str | None = None


class Realtime:
    """One connection's codec: client events in, session effects and server events out."""

    def __init__(
        self,
        session: Session,
        asr: str,
        model: str = DEFAULT_MODEL,
        preset: Json | None = None,
        max_reply_tokens: int | None = None,
    ) -> None:
        """``preset``: the session config of the client secret this connection used
        (``POST /v1/realtime/client_secrets``), applied before ``session.created``.
        ``max_reply_tokens``: the server's reply budget, reported in rate limits."""
        self.session = session
        self.asr = asr
        self.preset = preset
        self.max_reply_tokens = max_reply_tokens
        self._base = session.config.endpoint
        self._base_eagerness = session.config.eagerness
        self.settings = Settings(model, ServerVad.of(self._base), transcription={"model": asr})
        self._n = 0
        # The conversation's items as the client was last told of them (what
        # conversation.item.retrieve reads back); an item of a message has its id.
        self._items: list[str] = []  # conversation item ids, oldest first
        self._store: dict[str, Json] = {}  # item id -> the item as last sent
        self._heard_audio: dict[str, HeardAudio] = {}  # assistant item id -> its audio sent
        self._buffer = bytearray()  # manual turns: PCM16 appended since the last commit
        self._pending: tuple[str, bytes, int] | None = None  # committed: item, PCM16, rate
        self._input_ms = 0.0  # audio appended so far
        self._idle_from: float | None = 0.0  # silence counts from here (idle_timeout_ms)

    # -- client events --

    def open(self, now: float) -> list[Out]:
        """Start the session: its ready message becomes ``session.created``, showing
        the client secret's session config when there is one."""
        # OpenAI's sessions start without tools; session.update gives them.
        start = p.Start(sample_rate=RATE, client="realtime", output_sample_rate=RATE, tools=[])
        out: list[Out] = list(self.session.receive(start, now))
        if self.preset is not None:
            try:
                settings = self._settings(self.preset)
            except RealtimeError as err:  # checked at minting; a changed server may differ
                error = self._error(err.code, f"client secret's session: {err.message}", None, None)
                return [*out, Emit(error)]
            out += self._apply(settings, now)
        return out

    def receive(self, frame: str | bytes, now: float) -> list[Out]:
        event_id: str | None = None
        try:
            if isinstance(frame, bytes):
                raise RealtimeError(
                    "invalid_event", "send audio as input_audio_buffer.append, not binary frames"
                )
            event = _parse(frame)
            event_id = event.get("event_id")
            out = self._dispatch(event, now)
        except RealtimeError as err:
            error = Emit(self._error(err.code, err.message, err.param, event_id))
            return [error, *self.session.rejected()]
        return [self._answer_errors(e, event_id) for e in out]

    def _answer_errors(self, effect: Out, event_id: str | None) -> Out:
        """The session's errors, answering this client event, carry its id."""
        if isinstance(effect, Send) and isinstance(effect.message, p.Error):
            error = effect.message
            return Emit(
                self._error(_CODES.get(error.code, error.code), error.message, None, event_id)
            )
        return effect

    def _dispatch(self, event: Json, now: float) -> list[Out]:
        kind = event["type"]
        match kind:
            case "session.update":
                _known(event, {"session"}, "")
                return self._update(self._settings(_required(event, "session", "")), now)
            case "input_audio_buffer.append":
                _known(event, {"audio"}, "")
                return self._append(_required(event, "audio", ""), now)
            case "input_audio_buffer.commit":
                _known(event, set(), "")
                return self._commit(now)
            case "input_audio_buffer.clear":
                _known(event, set(), "")
                return self._clear(now)
            case "conversation.item.create":
                _known(event, {"item", "previous_item_id"}, "")
                return self._create_item(event, now)
            case "conversation.item.retrieve":
                _known(event, {"item_id"}, "")
                item = self._store[self._item_id(event)]
                return [Emit(self._event("conversation.item.retrieved", item=item))]
            case "conversation.item.delete":
                _known(event, {"item_id"}, "")
                return self._delete(self._item_id(event), now)
            case "conversation.item.truncate":
                _known(event, {"item_id", "content_index", "audio_end_ms"}, "")
                return self._truncate(event, now)
            case "response.create":
                _known(event, {"response"}, "")
                return self._respond(event.get("response"), now)
            case "response.cancel":
                _known(event, {"response_id"}, "")
                return self._cancel(event.get("response_id"), now)
            case _ if kind in NOT_YET:
                raise RealtimeError("not_supported", f"{kind}: {NOT_YET[kind]}", "type")
            case _ if kind in BETA_EVENTS:
                raise RealtimeError(
                    "beta_protocol", f"{kind} is of the retired beta protocol", "type"
                )
        raise RealtimeError("unknown_event", f"unknown client event type {kind!r}", "type")

    def _update(self, settings: Settings, now: float) -> list[Out]:
        out = self._apply(settings, now)
        return [*out, Emit(self._event("session.updated", session=self._session_object()))]

    def _apply(self, settings: Settings, now: float) -> list[Out]:
        """The session listens and answers as ``settings`` say from now on."""
        old, self.settings = self.settings, settings
        out: list[Out] = []
        if (old.vad is None) != (settings.vad is None):
            self._buffer.clear()
            if settings.vad is None:  # manual from now on: what the VAD was hearing goes
                out += self.session.receive(ClearInput(), now)
        old_rate, rate = RATES[old.input_format], RATES[settings.input_format]
        if self._buffer and old_rate != rate:  # the manual buffer is kept at the new rate
            audio = resample(pcm16_to_float32(bytes(self._buffer)), old_rate, rate)
            self._buffer = bytearray(float32_to_pcm16(audio))
        return out + self.session.receive(self._configure(settings), now)

    def _configure(self, s: Settings) -> Configure:
        vad = s.vad
        if isinstance(vad, ServerVad):
            endpoint, eagerness = vad.endpoint(self._base), self._base_eagerness
        elif isinstance(vad, SemanticVad):
            endpoint, eagerness = self._base, _EAGERNESS[vad.eagerness]
        else:
            endpoint, eagerness = self.session.config.endpoint, self._base_eagerness
        return Configure(
            endpoint,
            s.instructions,
            s.speak,
            eagerness=eagerness,
            input_rate=RATES[s.input_format],
            output_rate=RATES[s.output_format],
            respond=vad.create_response if vad is not None else True,
            max_tokens=s.max_output_tokens,
            interrupt=vad.interrupt_response if vad is not None else True,
            tools=s.tools if s.tool_choice == "auto" else (),
            output_format=s.output_format,
        )

    def _append(self, value: object, now: float) -> list[Out]:
        kind = self.settings.input_format
        pcm = _decode_audio(_base64(value, "audio"), kind, "audio")
        rate = RATES[kind]
        if self.settings.vad is None:
            if len(self._buffer) + len(pcm) > MAX_BUFFER_SECONDS * rate * 2:
                raise RealtimeError(
                    "input_audio_buffer_full",
                    f"a manual turn holds at most {MAX_BUFFER_SECONDS} s of audio: "
                    "commit or clear it",
                    "audio",
                )
            self._buffer += pcm
            self._input_ms += len(pcm) * 500 / rate
            return []
        out = self._idle_timeout(now)
        step = int(rate * p.MAX_AUDIO_FRAME_SECONDS) * 2  # what the session takes at once
        for i in range(0, len(pcm), step):
            out += self.session.receive(AudioBytes(pcm[i : i + step]), now)
        self._input_ms += len(pcm) * 500 / rate
        return out

    def _idle_timeout(self, now: float) -> list[Out]:
        """server_vad's idle_timeout_ms: no speech for that long since the last
        response's audio ended (or since the session or the last speech began) commits
        the silence as a user item and answers the conversation. Counted in appended
        audio, which a live microphone sends at real time; the audio of this append is
        not counted yet, as the VAD has not heard it."""
        vad = self.settings.vad
        if not isinstance(vad, ServerVad) or vad.idle_timeout_ms is None:
            return []
        idle_from = self._idle_from
        if idle_from is None or self._input_ms - idle_from < vad.idle_timeout_ms:
            return []
        # Only while nothing is heard or answered: the session knows (if_idle).
        answer = list(self.session.receive(Respond(unprompted=True, if_idle=True), now))
        if not answer:
            return []
        self._idle_from = None  # once, until a response ends again
        item_id = self._id("item")
        previous = self._add_item(item_id)
        item = self._put(_user_audio(item_id, None, "completed"))
        events = [
            self._event(
                "input_audio_buffer.timeout_triggered",
                audio_start_ms=round(idle_from),
                audio_end_ms=round(self._input_ms),
                item_id=item_id,
            ),
            self._event("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id),
            self._event("conversation.item.added", previous_item_id=previous, item=item),
            self._event("conversation.item.done", previous_item_id=previous, item=item),
        ]
        return [*map(Emit, events), *answer]

    def _commit(self, now: float) -> list[Out]:
        if self.settings.vad is not None:  # the turn heard so far ends now
            return list(self.session.receive(p.EndOfInput(), now))
        rate = RATES[self.settings.input_format]
        if len(self._buffer) < MIN_COMMIT_MS * rate * 2 // 1000:
            raise RealtimeError(
                "input_audio_buffer_commit_empty",
                f"buffer too small: a commit needs at least {MIN_COMMIT_MS} ms of audio, "
                f"it has {len(self._buffer) * 500 // rate} ms",
            )
        item_id = self._id("item")
        out = self._hold_audio(item_id, bytes(self._buffer), rate)
        self._buffer = bytearray()
        previous = self._items[-2] if len(self._items) > 1 else None
        committed = self._event(
            "input_audio_buffer.committed", previous_item_id=previous, item_id=item_id
        )
        return [Emit(committed), *out]

    def _hold_audio(self, item_id: str, pcm: bytes, rate: int) -> list[Out]:
        """Committed user audio joins the conversation; response.create transcribes
        and answers it."""
        if self._pending is not None:
            raise RealtimeError(
                "not_supported",
                "committed audio is waiting for response.create: one audio item at a time",
            )
        self._pending = (item_id, pcm, rate)
        previous = self._add_item(item_id)
        item = self._put(_user_audio(item_id, None, "in_progress"))
        return [Emit(self._event("conversation.item.added", previous_item_id=previous, item=item))]

    def _clear(self, now: float) -> list[Out]:
        self._buffer.clear()
        out: list[Out] = []
        if self.settings.vad is not None:
            out += self.session.receive(ClearInput(), now)
        return [*out, Emit(self._event("input_audio_buffer.cleared"))]

    def _create_item(self, event: Json, now: float) -> list[Out]:
        previous = event.get("previous_item_id")
        if previous is not None and previous != (self._items[-1] if self._items else None):
            raise RealtimeError(
                "not_supported",
                "items go at the end of the conversation: previous_item_id must be the last item",
                "previous_item_id",
            )
        item_value = _required(event, "item", "")
        if isinstance(item_value, dict) and item_value.get("type") == "function_call_output":
            return self._call_output(item_value, now)
        message = _user_message(_required(event, "item", ""), self.settings.input_format)
        item_id = message.id or self._id("item")
        if item_id in self._store:
            raise RealtimeError("invalid_value", f"item {item_id!r} already exists", "item.id")
        if message.audio is not None:
            return self._hold_audio(item_id, message.audio, RATES[self.settings.input_format])
        out: list[Out] = list(self.session.receive(UserText(message.text, item_id), now))
        previous = self._add_item(item_id)
        item = {
            **_item(item_id, "user", "completed"),
            "content": [{"type": "input_text", "text": message.text}],
        }
        self._put(item)
        return [
            *out,
            Emit(self._event("conversation.item.added", previous_item_id=previous, item=item)),
            Emit(self._event("conversation.item.done", previous_item_id=previous, item=item)),
        ]

    def _call_output(self, value: Json, now: float) -> list[Out]:
        """A function's result (the v1 action_result): it joins the conversation after
        the reply that called it, and the client asks for the next reply itself."""
        _known(value, {"type", "call_id", "output", "id", "object", "status"}, "item")
        call_id = _text(_required(value, "call_id", "item"), "item.call_id", MAX_ID_CHARS)
        output = _text(_required(value, "output", "item"), "item.output", p.MAX_TEXT_CHARS)
        out: list[Out] = list(self.session.receive(p.ActionResult(call_id, output), now))
        if any(isinstance(e, Send) and isinstance(e.message, p.Error) for e in out):
            return out  # unknown_call_id: no item
        item_id = value.get("id") or self._id("item")
        item_id = _text(item_id, "item.id", MAX_ID_CHARS)
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "function_call_output",
            "call_id": call_id,
            "output": output,
            "status": "completed",
        }
        previous = self._add_item(item_id)
        self._put(item)
        return [
            *out,
            Emit(self._event("conversation.item.added", previous_item_id=previous, item=item)),
            Emit(self._event("conversation.item.done", previous_item_id=previous, item=item)),
        ]

    def _item_id(self, event: Json) -> str:
        item_id = _text(_required(event, "item_id", ""), "item_id", MAX_ID_CHARS)
        if item_id not in self._store:
            raise RealtimeError(
                "item_not_found", f"no item {item_id!r} in the conversation", "item_id"
            )
        return item_id

    def _delete(self, item_id: str, now: float) -> list[Out]:
        if self.session.in_progress(item_id):
            raise RealtimeError(
                "item_in_progress", f"item {item_id!r} is being answered: cancel first", "item_id"
            )
        out: list[Out] = list(self.session.receive(Amend(item_id, None), now))
        if self._pending is not None and self._pending[0] == item_id:
            self._pending = None  # committed audio never answered
        self._forget(item_id)
        self._items.remove(item_id)
        return [*out, Emit(self._event("conversation.item.deleted", item_id=item_id))]

    def _truncate(self, event: Json, now: float) -> list[Out]:
        """What the user heard of an assistant reply: the conversation keeps the words
        of its first ``audio_end_ms`` (OpenAI drops the transcript instead; a text model
        reads only the words, so here it keeps the ones that were heard)."""
        item_id = self._item_id(event)
        _int(_required(event, "content_index", ""), "content_index", 0, 0)  # one part
        audio_end_ms = _int(_required(event, "audio_end_ms", ""), "audio_end_ms", 0, 2**31)
        item = self._store[item_id]
        if item.get("role") != "assistant":
            raise RealtimeError(
                "invalid_value", "only assistant message items can be truncated", "item_id"
            )
        if self.session.in_progress(item_id):
            raise RealtimeError(
                "item_in_progress", "the response is still in progress: cancel it first", "item_id"
            )
        heard = self._heard_audio.get(item_id)
        if heard is None:
            raise RealtimeError("invalid_value", "the item has no audio to truncate", "item_id")
        if audio_end_ms > heard.ms:
            raise RealtimeError(
                "invalid_value",
                f"audio_end_ms {audio_end_ms} is past the item's audio ({heard.ms} ms)",
                "audio_end_ms",
            )
        text, self._heard_audio[item_id] = heard.cut(audio_end_ms)
        new = ChatMessage("assistant", text) if text else None
        out: list[Out] = list(self.session.receive(Amend(item_id, new), now))
        self._put({**item, "content": [_part(True, text)]})
        truncated = self._event(
            "conversation.item.truncated",
            item_id=item_id,
            content_index=0,
            audio_end_ms=audio_end_ms,
        )
        return [*out, Emit(truncated)]

    def _respond(self, params: object, now: float) -> list[Out]:
        """Ask the session for a reply; its response opens when the reply starts."""
        request = _response_params({} if params is None else params, self._reference)
        respond = replace(request.respond, keep=request.keep, metadata=request.metadata)
        if request.max_tokens is not None:
            respond = replace(respond, max_tokens=request.max_tokens)
        if request.keep and self._pending is not None:  # the committed audio, at 16 kHz
            item_id, pcm, rate = self._pending
            audio = resample(pcm16_to_float32(pcm), rate, SAMPLE_RATE)
            respond = replace(respond, audio=audio, user_item=item_id)
        out: list[Out] = list(self.session.receive(respond, now))
        if respond.audio is not None and any(isinstance(e, StartTurn) for e in out):
            self._pending = None
        return out

    def _reference(self, item_id: str, param: str) -> ChatMessage:
        """An ``item_reference`` of response.create's input: the message it stands for."""
        message = self.session.message(item_id) if item_id in self._store else None
        if message is None:
            raise RealtimeError(
                "item_not_found", f"no message item {item_id!r} in the conversation", param
            )
        return message

    def _cancel(self, response_id: object, now: float) -> list[Out]:
        if response_id is not None and not isinstance(response_id, str):
            raise RealtimeError("invalid_type", "response_id must be a string", "response_id")
        active = self.session.replying()
        if response_id is not None and (active is None or response_id != _response_id(active)):
            raise RealtimeError(
                "response_cancel_not_active", f"response {response_id!r} is not in progress"
            )
        out: list[Out] = list(self.session.receive(p.Cancel(), now))
        if not out:
            raise RealtimeError("response_cancel_not_active", "no response is in progress")
        return out

    # -- server events --

    def encode(self, message: p.ServerMessage) -> list[str]:
        """A session message as the Realtime server events it means (maybe none): what
        happens to a turn is translated from the lifecycle events beside them."""
        match message:
            case p.Ready():
                return [self._event("session.created", session=self._session_object())]
            case p.SpeechStarted(turn_id=turn, audio_ms=ms):
                kind, field = "input_audio_buffer.speech_started", "audio_start_ms"
                return [self._event(kind, **{field: ms}, item_id=user_item(turn))]
            case p.SpeechStopped(turn_id=turn, audio_ms=ms):
                self._idle_from = float(ms)
                kind, field = "input_audio_buffer.speech_stopped", "audio_end_ms"
                return [self._event(kind, **{field: ms}, item_id=user_item(turn))]
            case p.Error(code=code, message=text):
                return [self._error(_CODES.get(code, code), text, None, None)]
            case (
                p.TranscriptPartial()
                | p.TranscriptFinal()
                | p.ReplyText()
                | p.Action()
                | p.ReplyDone()
                | p.ReplyCancelled()
                | p.Metrics()
            ):
                return []
        raise AssertionError(f"unhandled message {message!r}")

    def lifecycle(self, event: Lifecycle) -> list[str]:
        """What happened to a turn, as Realtime server events."""
        match event:
            case TurnOpened():
                return []
            case TranscriptGrew(item_id=item_id, delta=delta):
                kind = "conversation.item.input_audio_transcription.delta"
                return [self._event(kind, item_id=item_id, content_index=0, delta=delta)]
            case UserHeard():
                return self._heard(event)
            case ReplyStarted():
                return self._open_response(event)
            case SentenceAdded(turn_id=turn, item_id=item_id, index=index, text=text):
                part = "output_audio_transcript" if event.speak else "output_text"
                delta = text if index == 0 else " " + text
                kind = f"response.{part}.delta"
                return [self._event(kind, **_ids(turn, item_id), delta=delta)]
            case CallAdded():
                return self._function_call(event)
            case ReplyEnded():
                return self._close_response(event)
            case TurnWithdrawn(items=items):
                return [self._deleted(item_id) for item_id in items]
            case TurnClosed(turn_id=turn, user_item=item_id, replied=replied):
                metrics = asdict(event.metrics)
                response_id = _response_id(turn) if replied else None
                kind = "quicksilver.metrics"
                return [
                    self._event(kind, response_id=response_id, item_id=item_id, metrics=metrics)
                ]
        raise AssertionError(f"unhandled event {event!r}")

    def audio(self, effect: SendAudio) -> str:
        """A frame of reply audio: its response and item are named by the frame."""
        data = _encode_audio(effect.pcm, _output_format(effect.output_format))
        delta = base64.b64encode(data).decode("ascii")
        ids = _ids(effect.turn_id, effect.item_id)
        return self._event("response.output_audio.delta", **ids, delta=delta)

    def _heard(self, e: UserHeard) -> list[str]:
        """The user's words are final: their item (unless the client added it, committed
        audio) and its transcript. Noise is neither answered nor kept."""
        if not e.announced and not e.text.strip():
            return []
        out: list[str] = []
        if not e.announced:
            previous = self._add_item(e.item_id)
            added = self._put(_user_audio(e.item_id, None, "in_progress"))
            out += [
                self._event(
                    "input_audio_buffer.committed", previous_item_id=previous, item_id=e.item_id
                ),
                self._event("conversation.item.added", previous_item_id=previous, item=added),
            ]
        usage = {"type": "duration", "seconds": e.speech_ms / 1000}
        done = self._put(_user_audio(e.item_id, e.text, "completed"))
        return [
            *out,
            self._event(
                "conversation.item.input_audio_transcription.completed",
                item_id=e.item_id,
                content_index=0,
                transcript=e.text,
                usage=usage,
            ),
            self._event("conversation.item.done", item=done),
        ]

    def _open_response(self, e: ReplyStarted) -> list[str]:
        rid = _response_id(e.turn_id)
        item = {**_item(e.item_id, "assistant", "in_progress"), "content": []}
        out = [
            self._event("response.created", response=self._response(e, "in_progress", [], None)),
            self._rate_limits(e),
            self._event("response.output_item.added", response_id=rid, output_index=0, item=item),
        ]
        if e.keep:
            previous = self._add_item(e.item_id)
            self._put(item)
            out.append(self._event("conversation.item.added", previous_item_id=previous, item=item))
        part = _part(e.speak, "")
        ids = _ids(e.turn_id, e.item_id)
        return [*out, self._event("response.content_part.added", **ids, part=part)]

    def _rate_limits(self, e: ReplyStarted) -> str:
        """``requests``: replies the client may still ask for (response.create and text
        share the session's bucket; spoken turns are not counted), and when it is full
        again. ``tokens``: this reply's token budget, reserved whole."""
        burst, left, reset_s = e.requests
        limits: list[Json] = [
            {"name": "requests", "limit": burst, "remaining": left, "reset_seconds": reset_s}
        ]
        budget = self._budget(e.max_tokens)
        if budget is not None:
            limits.append(
                {"name": "tokens", "limit": budget, "remaining": budget, "reset_seconds": 0.0}
            )
        return self._event("rate_limits.updated", rate_limits=limits)

    def _budget(self, asked: int | None) -> int | None:
        server = self.max_reply_tokens
        if server is None:
            return asked
        return min(server, asked) if asked is not None else server

    def _function_call(self, call: CallAdded) -> list[str]:
        """The reply calls a tool: a function_call item beside its message, whole at
        once (the call is written before any of the reply is sent)."""
        rid = _response_id(call.turn_id)
        index = 1  # the message item is output 0; a reply makes one call at most
        item = {**_call_json(call), "status": "in_progress", "arguments": ""}
        ids = {"response_id": rid, "item_id": call.item_id, "output_index": index}
        out = [
            self._event(
                "response.output_item.added", response_id=rid, output_index=index, item=item
            )
        ]
        previous = self._add_item(call.item_id) if call.keep else None
        if call.keep:
            out.append(self._event("conversation.item.added", previous_item_id=previous, item=item))
        done = _call_json(call)
        args = done["arguments"]
        out += [
            self._event(
                "response.function_call_arguments.delta", **ids, call_id=call.call_id, delta=args
            ),
            self._event(
                "response.function_call_arguments.done",
                **ids,
                call_id=call.call_id,
                name=call.name,
                arguments=args,
            ),
            self._event(
                "response.output_item.done", response_id=rid, output_index=index, item=done
            ),
        ]
        if call.keep:
            self._put(done)
            out.append(self._event("conversation.item.done", item=done))
        return out

    def _deleted(self, item_id: str) -> str:
        """An item the session withdrew (its words are heard again in the next turn)."""
        if item_id in self._items:
            self._items.remove(item_id)
        self._forget(item_id)
        return self._event("conversation.item.deleted", item_id=item_id)

    def _close_response(self, e: ReplyEnded) -> list[str]:
        details: Json | None = None
        if e.status == "failed":
            details = {"type": "failed", "error": {"type": "server_error", "code": "turn_failed"}}
        elif e.status == "cancelled":
            reason = _CANCEL_REASONS.get(e.reason or "", "client_cancelled")
            details = {"type": "cancelled", "reason": reason}
        part = _part(e.speak, e.text)
        item = {
            **_item(
                e.item_id, "assistant", "completed" if e.status == "completed" else "incomplete"
            ),
            "content": [part],
        }
        ids = _ids(e.turn_id, e.item_id)
        if e.speak:
            out = [
                self._event("response.output_audio.done", **ids),
                self._event("response.output_audio_transcript.done", **ids, transcript=e.text),
            ]
        else:
            out = [self._event("response.output_text.done", **ids, text=e.text)]
        rid = _response_id(e.turn_id)
        out += [
            self._event("response.content_part.done", **ids, part=part),
            self._event("response.output_item.done", response_id=rid, output_index=0, item=item),
        ]
        if e.keep:
            if e.item_id in self._store:  # (not deleted while it was answered)
                self._put(item)
                if e.audio is not None:  # what truncate cuts
                    self._heard_audio[e.item_id] = e.audio
            out.append(self._event("conversation.item.done", item=item))
        self._idle_from = self._input_ms + PLAYBACK_LEAD_MS
        output = [item, *([_call_json(e.call)] if e.call is not None else [])]
        return [
            *out,
            self._event("response.done", response=self._response(e, e.status, output, details)),
        ]

    def _response(
        self, e: ReplyStarted | ReplyEnded, status: str, output: list[Json], details: Json | None
    ) -> Json:
        fmt = _format_json(_output_format(e.output_format))
        return {
            "id": _response_id(e.turn_id),
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": output,
            "output_modalities": ["audio" if e.speak else "text"],
            "audio": {"output": {"format": fmt, "voice": VOICE}},
            "conversation_id": f"conv_{self.session.id}" if e.keep else None,
            "max_output_tokens": "inf" if e.max_tokens is None else e.max_tokens,
            "metadata": e.metadata,
        }

    def _session_object(self) -> Json:
        s = self.settings
        tokens = s.max_output_tokens
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": f"sess_{self.session.id}",
            "model": s.model,
            "output_modalities": ["audio" if s.speak else "text"],
            "instructions": SPOKEN_SYSTEM_PROMPT if s.instructions is None else s.instructions,
            "audio": {
                "input": {
                    "format": _format_json(s.input_format),
                    "transcription": s.transcription,
                    "noise_reduction": None,
                    "turn_detection": None if s.vad is None else s.vad.json(),
                },
                "output": {"format": _format_json(s.output_format), "voice": VOICE, "speed": 1.0},
            },
            "max_output_tokens": "inf" if tokens is None else tokens,
            "tools": [{"type": "function", **t.schema()} for t in s.tools],
            "tool_choice": s.tool_choice,
            "tracing": s.tracing,
            "truncation": "auto",
        }

    # -- session.update --

    def _settings(self, value: object) -> Settings:
        """The settings after this update, validated whole before any of it applies."""
        session = _object(value, "session")
        if "type" not in session:
            raise RealtimeError(
                "beta_protocol",
                "session.type is missing: the beta session shape is retired, send the GA "
                'one ({"type": "realtime", "audio": {"input": ..., "output": ...}})',
                "session.type",
            )
        s = self.settings
        for key, v in session.items():
            param = f"session.{key}"
            match key:
                case "type":
                    _session_type(v)
                case "model":
                    s = replace(s, model=_text(v, param, MAX_ID_CHARS))
                case "instructions":
                    s = replace(s, instructions=_text(v, param, MAX_INSTRUCTIONS_CHARS))
                case "output_modalities":
                    s = replace(s, speak=_modalities(v, param))
                case "audio":
                    s = self._audio_settings(s, v)
                case "max_output_tokens":
                    s = replace(s, max_output_tokens=_max_tokens(v, param))
                case "tools":
                    s = replace(s, tools=self._tools(v, param))
                case "tool_choice":
                    s = replace(s, tool_choice=_tool_choice(v, param))
                case "tracing":
                    _not_yet(v, param, (None, "auto"))
                    s = replace(s, tracing=v)
                case _ if key in BETA_FIELDS:
                    raise RealtimeError(
                        "beta_protocol",
                        f"{param} is beta; the GA protocol has {BETA_FIELDS[key]}",
                        param,
                    )
                case _ if key in NOT_YET_FIELDS:
                    _not_yet(v, param, NOT_YET_FIELDS[key])
                case _:
                    raise RealtimeError("unknown_parameter", f"unknown parameter {param}", param)
        return s

    def _tools(self, value: object, param: str) -> tuple[Tool, ...]:
        """session.tools: functions, as the reply engine's tools."""
        if not isinstance(value, list):
            raise RealtimeError("invalid_type", f"{param} must be a list", param)
        for i, tool in enumerate(value):
            where = f"{param}[{i}]"
            if not isinstance(tool, dict) or tool.get("type", "function") != "function":
                raise RealtimeError(
                    "not_supported", f"{where}: only function tools (no MCP servers)", where
                )
        if value and not self.session.can_act:
            raise RealtimeError(
                "not_supported", "this server's reply engine cannot call tools", param
            )
        try:
            return parse_tools(value)
        except ToolError as err:
            raise RealtimeError("invalid_value", f"{param}: {err}", param) from None

    def _audio_settings(self, s: Settings, value: object) -> Settings:
        audio = _object(value, "session.audio")
        _known(audio, {"input", "output"}, "session.audio")
        if "input" in audio:
            inp = _object(audio["input"], "session.audio.input")
            where = "session.audio.input"
            _known(inp, {"format", "turn_detection", "transcription", "noise_reduction"}, where)
            if "format" in inp:
                s = replace(s, input_format=_format(inp["format"], f"{where}.format"))
            if "transcription" in inp:
                s = replace(s, transcription=_transcription(inp["transcription"], where))
            if "noise_reduction" in inp:
                _not_yet(inp["noise_reduction"], f"{where}.noise_reduction", (None,))
            if "turn_detection" in inp:
                s = replace(s, vad=self._vad(inp["turn_detection"], s.vad))
        if "output" in audio:
            out = _object(audio["output"], "session.audio.output")
            _known(out, {"format", "voice", "speed"}, "session.audio.output")
            if "format" in out:
                s = replace(s, output_format=_format(out["format"], "session.audio.output.format"))
            if "voice" in out and out["voice"] != VOICE:
                raise RealtimeError(
                    "invalid_value",
                    f"voice: the installed voice is {VOICE!r}",
                    "session.audio.output.voice",
                )
            if "speed" in out:
                _not_yet(out["speed"], "session.audio.output.speed", (1, 1.0))
        return s

    def _vad(self, value: object, current: Detection) -> Detection:
        param = "session.audio.input.turn_detection"
        if value is None:
            return None
        config = _object(value, param)
        kind = config.get("type")
        if kind == "semantic_vad":
            return _semantic_vad(config, param)
        if kind != "server_vad":
            raise RealtimeError(
                "invalid_value",
                "turn_detection.type must be server_vad or semantic_vad (or null)",
                f"{param}.type",
            )
        vad = current if isinstance(current, ServerVad) else ServerVad.of(self._base)
        for key, v in config.items():
            where = f"{param}.{key}"
            match key:
                case "type":
                    pass
                case "threshold":
                    vad = replace(vad, threshold=_number(v, where, 0.01, 0.99))
                case "prefix_padding_ms":
                    vad = replace(vad, prefix_padding_ms=_int(v, where, 0, 2000))
                case "silence_duration_ms":
                    vad = replace(vad, silence_duration_ms=_int(v, where, 100, 10_000))
                case "create_response":
                    vad = replace(vad, create_response=_bool(v, where))
                case "interrupt_response":
                    vad = replace(vad, interrupt_response=_bool(v, where))
                case "idle_timeout_ms":
                    idle = (
                        None
                        if v is None
                        else _int(v, where, MIN_IDLE_TIMEOUT_MS, MAX_IDLE_TIMEOUT_MS)
                    )
                    vad = replace(vad, idle_timeout_ms=idle)
                case _:
                    raise RealtimeError("unknown_parameter", f"unknown parameter {where}", where)
        return vad

    # -- ids and encoding --

    def _id(self, kind: str) -> str:
        self._n += 1
        return f"{kind}_qs{self._n}"

    def _add_item(self, item_id: str) -> str | None:
        """Append an item to the conversation; the id of the one before it."""
        previous = self._items[-1] if self._items else None
        self._items.append(item_id)
        for old in self._items[:-_KEPT_ITEMS]:
            self._forget(old)
        del self._items[:-_KEPT_ITEMS]
        return previous

    def _put(self, item: Json) -> Json:
        """Keep an item as last sent (conversation.item.retrieve reads it back)."""
        if item["id"] in self._items:
            self._store[item["id"]] = item
        return item

    def _forget(self, item_id: str) -> None:
        self._store.pop(item_id, None)
        self._heard_audio.pop(item_id, None)

    def _event(self, kind: str, **fields: Any) -> str:
        return json.dumps(
            {"type": kind, "event_id": self._id("event"), **fields}, separators=(",", ":")
        )

    def _error(self, code: str, message: str, param: str | None, event_id: str | None) -> str:
        kind = "server_error" if code in _SERVER_ERRORS else "invalid_request_error"
        error = {
            "type": kind,
            "code": code,
            "message": message,
            "param": param,
            "event_id": event_id,
        }
        return self._event("error", error=error)


def check_session(session: Json, asr: str, endpoint: EndpointConfig) -> str | None:
    """Why a client secret's session config would be refused (None: it is fine)."""
    codec = Realtime(Session("check", SessionConfig(endpoint=endpoint), asr, ""), asr)
    try:
        codec._settings(session)
    except RealtimeError as err:
        return f"{err.param}: {err.message}" if err.param else err.message
    return None


# --- parsing helpers -------------------------------------------------------------


def _parse(frame: str) -> Json:
    try:
        event = json.loads(frame)
    except ValueError as exc:
        raise RealtimeError("invalid_json", f"the event is not valid JSON: {exc}") from None
    except RecursionError:
        raise RealtimeError("invalid_json", "the event is nested too deeply") from None
    if not isinstance(event, dict):
        raise RealtimeError("invalid_event", "an event is a JSON object")
    if not isinstance(event.get("type"), str):
        raise RealtimeError("invalid_event", "an event needs a string type", "type")
    event_id = event.get("event_id")
    if event_id is not None and not (isinstance(event_id, str) and len(event_id) <= MAX_ID_CHARS):
        raise RealtimeError("invalid_event", "event_id must be a string", "event_id")
    return event


def _object(value: object, param: str) -> Json:
    if not isinstance(value, dict):
        raise RealtimeError("invalid_type", f"{param} must be an object", param)
    return value


def _required(obj: Json, key: str, where: str) -> object:
    param = f"{where}.{key}" if where else key
    if obj.get(key) is None:
        raise RealtimeError(
            "missing_required_parameter", f"missing required parameter {param}", param
        )
    return obj[key]


def _known(obj: Json, allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed - ({"type", "event_id"} if not where else set()))
    if extra:
        param = f"{where}.{extra[0]}" if where else extra[0]
        raise RealtimeError("unknown_parameter", f"unknown parameter {param}", param)


def _not_yet(value: object, param: str, accepted: tuple[object, ...]) -> None:
    """A GA field not built yet: only a value that asks for what happens anyway passes."""
    if not any(value == a and type(value) is type(a) for a in accepted):
        raise RealtimeError("not_supported", f"{param} is not supported yet", param)


def _text(value: object, param: str, limit: int) -> str:
    if not isinstance(value, str):
        raise RealtimeError("invalid_type", f"{param} must be a string", param)
    if len(value) > limit:
        raise RealtimeError("invalid_value", f"{param} is longer than {limit} characters", param)
    if not p.encodable(value):
        raise RealtimeError("invalid_value", f"{param} holds a lone surrogate", param)
    return value


def _bool(value: object, param: str) -> bool:
    if not isinstance(value, bool):
        raise RealtimeError("invalid_type", f"{param} must be a boolean", param)
    return value


def _int(value: object, param: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise RealtimeError("invalid_type", f"{param} must be an integer", param)
    if not lo <= value <= hi:
        raise RealtimeError("invalid_value", f"{param} must be between {lo} and {hi}", param)
    return value


def _number(value: object, param: str, lo: float, hi: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise RealtimeError("invalid_type", f"{param} must be a number", param)
    if not lo <= value <= hi:  # NaN fails too
        raise RealtimeError("invalid_value", f"{param} must be between {lo:g} and {hi:g}", param)
    return float(value)


def _session_type(value: object) -> None:
    if value == "transcription":
        raise RealtimeError(
            "not_supported", "transcription sessions are not supported yet", "session.type"
        )
    if value != "realtime":
        raise RealtimeError("invalid_value", 'session.type must be "realtime"', "session.type")


def _modalities(value: object, param: str) -> bool:
    """True for ["audio"] (speech and its transcript), False for ["text"]."""
    if value == ["audio"]:
        return True
    if value == ["text"]:
        return False
    raise RealtimeError("invalid_value", f'{param} must be ["audio"] or ["text"]', param)


def _format(value: object, param: str) -> str:
    """An audio format object: its type (audio/pcm at 24 kHz, audio/pcmu, audio/pcma)."""
    fmt = _object(value, param)
    _known(fmt, {"type", "rate"}, param)
    kind = fmt.get("type", "audio/pcm")
    if kind not in RATES:
        raise RealtimeError(
            "invalid_value",
            "the audio format is audio/pcm, audio/pcmu or audio/pcma",
            f"{param}.type",
        )
    rate = fmt.get("rate", RATES[kind])
    if rate != RATES[kind] or isinstance(rate, bool):
        raise RealtimeError("invalid_value", f"{kind} is {RATES[kind]} Hz", f"{param}.rate")
    return str(kind)


def _format_json(kind: str) -> Json:
    return {"type": kind, "rate": RATE} if kind == "audio/pcm" else {"type": kind}


def _base64(value: object, param: str) -> bytes:
    if not isinstance(value, str):
        raise RealtimeError("invalid_type", f"{param} must be a base64 string", param)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("invalid_audio", f"{param} is not valid base64", param) from None


def _decode_audio(data: bytes, kind: str, param: str) -> bytes:
    """Audio in ``kind`` -> PCM16 at that format's rate."""
    match kind:
        case "audio/pcmu":
            return g711.ulaw_decode(data).astype("<i2").tobytes()
        case "audio/pcma":
            return g711.alaw_decode(data).astype("<i2").tobytes()
    if len(data) % 2:
        raise RealtimeError(
            "invalid_audio", f"{param} holds whole PCM16 samples (even length)", param
        )
    return data


def _encode_audio(pcm: bytes, kind: str) -> bytes:
    """PCM16 at the format's rate -> audio in ``kind``."""
    samples = np.frombuffer(pcm, "<i2")
    match kind:
        case "audio/pcmu":
            return g711.ulaw_encode(samples)
        case "audio/pcma":
            return g711.alaw_encode(samples)
    return pcm


def _transcription(value: object, where: str) -> Json:
    """audio.input.transcription: echoed; the server's own ASR transcribes whatever
    model is named (it always transcribes: the replies need the words)."""
    param = f"{where}.transcription"
    if value is None:
        raise RealtimeError(
            "not_supported", "speech is always transcribed here: the replies need its words", param
        )
    config = _object(value, param)
    _known(config, {"model", "language", "prompt"}, param)
    if "prompt" in config:
        raise RealtimeError("not_supported", f"{param}.prompt is not supported", f"{param}.prompt")
    if config.get("language", "en") != "en":
        raise RealtimeError(
            "not_supported", "the speech recognizer here hears English only", f"{param}.language"
        )
    out: Json = {"model": _text(config.get("model", "whisper-1"), f"{param}.model", MAX_ID_CHARS)}
    if "language" in config:
        out["language"] = "en"
    return out


def _semantic_vad(config: Json, param: str) -> SemanticVad:
    vad = SemanticVad()
    for key, v in config.items():
        where = f"{param}.{key}"
        match key:
            case "type":
                pass
            case "eagerness":
                if v not in _EAGERNESS:
                    raise RealtimeError(
                        "invalid_value", "eagerness is low, medium, high or auto", where
                    )
                vad = replace(vad, eagerness=v)
            case "create_response":
                vad = replace(vad, create_response=_bool(v, where))
            case "interrupt_response":
                vad = replace(vad, interrupt_response=_bool(v, where))
            case _:
                raise RealtimeError("unknown_parameter", f"unknown parameter {where}", where)
    return vad


def _max_tokens(value: object, param: str) -> int | None:
    """max_output_tokens: 1-4096, or "inf" (None: the server's reply budget)."""
    if value == "inf":
        return None
    return _int(value, param, 1, MAX_OUTPUT_TOKENS)


def _item(item_id: str, role: Literal["user", "assistant"], status: str) -> Json:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": role,
        "status": status,
    }


def _user_audio(item_id: str, transcript: str | None, status: str) -> Json:
    return {
        **_item(item_id, "user", status),
        "content": [{"type": "input_audio", "transcript": transcript}],
    }


def _part(speak: bool, text: str) -> Json:
    return (
        {"type": "output_audio", "transcript": text}
        if speak
        else {"type": "output_text", "text": text}
    )


def _response_id(turn_id: int) -> str:
    """The response that answers a turn (the session's turn ids are unique)."""
    return f"resp_t{turn_id}"


def _ids(turn_id: int, item_id: str) -> Json:
    return {
        "response_id": _response_id(turn_id),
        "item_id": item_id,
        "output_index": 0,
        "content_index": 0,
    }


def _output_format(label: str | None) -> str:
    """The reply audio's format, as the codec named it to the session (Configure)."""
    return label if label in RATES else "audio/pcm"


def _call_json(call: CallAdded) -> Json:
    """A function_call item, complete."""
    return {
        "id": call.item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": "completed",
        "name": call.name,
        "call_id": call.call_id,
        "arguments": json.dumps(call.arguments, ensure_ascii=False),
    }


@dataclass(frozen=True)
class _Message:
    """conversation.item.create's user message: its text, or its audio (PCM16)."""

    id: str | None
    text: str
    audio: bytes | None = None


def _tool_choice(value: object, param: str) -> Literal["auto", "none"]:
    """``auto`` (the model decides) or ``none``; forcing a call is not built: the model
    decides from its first token (docs/actions.md)."""
    if value == "auto" or value == "none":
        return value
    if value == "required" or isinstance(value, dict):
        raise RealtimeError("not_supported", f"{param}: only auto and none", param)
    raise RealtimeError("invalid_value", f"{param} must be auto or none", param)


def _user_message(value: object, input_format: str) -> _Message:
    """conversation.item.create's item: a user message of text parts, or of one
    input_audio part in the session's input format."""
    item = _object(value, "item")
    kind = item.get("type", "message")
    if kind == "function_call":
        raise RealtimeError(
            "not_supported",
            "function_call items are written by the model, not created",
            "item.type",
        )
    if kind != "message":
        raise RealtimeError("invalid_value", "item.type must be message", "item.type")
    role = item.get("role")
    if role in ("system", "assistant"):
        hint = ": give instructions in session.update" if role == "system" else ""
        raise RealtimeError(
            "not_supported", f"{role} messages are not supported yet{hint}", "item.role"
        )
    if role != "user":
        raise RealtimeError("invalid_value", "item.role must be user", "item.role")
    _known(item, {"type", "role", "content", "id", "object", "status"}, "item")
    item_id = item.get("id")
    if item_id is not None:
        item_id = _text(item_id, "item.id", MAX_ID_CHARS)
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise RealtimeError("invalid_type", "item.content must be a list of parts", "item.content")
    parts = [_object(part, f"item.content[{i}]") for i, part in enumerate(content)]
    if any(part.get("type") == "input_audio" for part in parts):
        if len(parts) != 1:
            raise RealtimeError(
                "not_supported",
                "an audio message holds one input_audio part and nothing else",
                "item.content",
            )
        return _Message(item_id, "", _input_audio(parts[0], input_format))
    text = " ".join(_input_text(part, f"item.content[{i}]") for i, part in enumerate(parts))
    if not text.strip():
        raise RealtimeError("invalid_value", "the message has no text", "item.content")
    if len(text) > p.MAX_TEXT_CHARS:
        raise RealtimeError(
            "invalid_value",
            f"a message holds at most {p.MAX_TEXT_CHARS} characters",
            "item.content",
        )
    return _Message(item_id, text)


def _input_audio(part: Json, input_format: str) -> bytes:
    param = "item.content[0]"
    _known(part, {"type", "audio", "transcript"}, param)
    pcm = _decode_audio(
        _base64(_required(part, "audio", param), f"{param}.audio"), input_format, f"{param}.audio"
    )
    rate = RATES[input_format]
    if not MIN_COMMIT_MS * rate * 2 // 1000 <= len(pcm) <= MAX_BUFFER_SECONDS * rate * 2:
        raise RealtimeError(
            "invalid_value",
            f"an audio message holds {MIN_COMMIT_MS} ms to {MAX_BUFFER_SECONDS} s of audio",
            f"{param}.audio",
        )
    return pcm


def _input_text(value: object, param: str) -> str:
    part = _object(value, param)
    _known(part, {"type", "text"}, param)
    kind = part.get("type")
    if kind == "input_image":
        raise RealtimeError("not_supported", f"{kind} content is not supported", f"{param}.type")
    if kind != "input_text":
        raise RealtimeError("invalid_value", f"{param}.type must be input_text", f"{param}.type")
    return _text(_required(part, "text", param), f"{param}.text", p.MAX_TEXT_CHARS)


@dataclass
class _ResponseRequest:
    """response.create's response: the session's request and the response's shape."""

    respond: Respond
    keep: bool = True  # conversation "auto"; False: "none", out of band
    max_tokens: int | None = None
    metadata: Json | None = None


Reference = Callable[[str, str], ChatMessage]


def _response_params(value: object, reference: Reference) -> _ResponseRequest:
    """response.create's response: this reply's instructions, modality, budget, which
    conversation it joins and what it answers."""
    params = _object(value, "response")
    request = _ResponseRequest(Respond())
    for key, v in params.items():
        param = f"response.{key}"
        match key:
            case "instructions":
                text = _text(v, param, MAX_INSTRUCTIONS_CHARS)
                request.respond = replace(request.respond, instructions=text)
            case "output_modalities":
                request.respond = replace(request.respond, speak=_modalities(v, param))
            case "conversation":
                request.keep = _conversation(v, param)
            case "input":
                history = _input_items(v, param, reference)
                request.respond = replace(request.respond, history=history)
            case "max_output_tokens":
                request.max_tokens = _max_tokens(v, param)
            case "metadata":
                request.metadata = _metadata(v, param)
            case "modalities" | "voice" | "output_audio_format" | "temperature":
                raise RealtimeError(
                    "beta_protocol", f"{param} is of the retired beta protocol", param
                )
            case _ if key in NOT_YET_RESPONSE:
                raise RealtimeError("not_supported", f"{param} is not supported yet", param)
            case _:
                raise RealtimeError("unknown_parameter", f"unknown parameter {param}", param)
    return request


def _conversation(value: object, param: str) -> bool:
    """True for "auto" (the reply joins the conversation), False for "none"."""
    if value in ("auto", "none"):
        return value == "auto"
    raise RealtimeError("invalid_value", f'{param} is "auto" or "none"', param)


def _metadata(value: object, param: str) -> Json | None:
    if value is None:
        return None
    metadata = _object(value, param)
    if len(metadata) > MAX_METADATA:
        raise RealtimeError("invalid_value", f"{param} holds at most {MAX_METADATA} pairs", param)
    for key, v in metadata.items():
        _text(key, f"{param} key", 64)
        _text(v, f"{param}.{key}", 512)
    return metadata


def _input_items(value: object, param: str, reference: Reference) -> tuple[ChatMessage, ...]:
    """response.create's input: the messages this reply answers instead of the
    conversation (items, or references to the conversation's)."""
    if not isinstance(value, list):
        raise RealtimeError("invalid_type", f"{param} must be a list of items", param)
    if len(value) > 100:
        raise RealtimeError("invalid_value", f"{param} holds at most 100 items", param)
    return tuple(_input_item(v, f"{param}[{i}]", reference) for i, v in enumerate(value))


_PART_TEXT = {"input_text": "text", "output_text": "text", "text": "text"}
_PART_TRANSCRIPT = {"input_audio", "output_audio", "audio"}


def _input_item(value: object, param: str, reference: Reference) -> ChatMessage:
    item = _object(value, param)
    kind = item.get("type")
    if kind == "item_reference":
        _known(item, {"type", "id"}, param)
        return reference(_text(_required(item, "id", param), f"{param}.id", MAX_ID_CHARS), param)
    if kind in ("function_call", "function_call_output"):
        raise RealtimeError(
            "not_supported", f"{kind} items need tools, which are not supported yet", param
        )
    if kind != "message":
        raise RealtimeError(
            "invalid_value", f"{param}.type must be message or item_reference", f"{param}.type"
        )
    _known(item, {"type", "role", "content", "id", "object", "status"}, param)
    role = item.get("role")
    if role not in ("system", "user", "assistant"):
        raise RealtimeError(
            "invalid_value", f"{param}.role is system, user or assistant", f"{param}.role"
        )
    content = item.get("content")
    if not isinstance(content, list):
        raise RealtimeError("invalid_type", f"{param}.content must be a list", f"{param}.content")
    words = [_part_text(part, f"{param}.content[{i}]") for i, part in enumerate(content)]
    text = _text(" ".join(words), f"{param}.content", p.MAX_TEXT_CHARS)
    return ChatMessage(role, text)


def _part_text(value: object, param: str) -> str:
    """A content part's words: its text, or an audio part's transcript."""
    part = _object(value, param)
    kind = part.get("type")
    if kind in _PART_TEXT:
        return _text(_required(part, "text", param), f"{param}.text", p.MAX_TEXT_CHARS)
    if kind in _PART_TRANSCRIPT:
        if not isinstance(part.get("transcript"), str):
            raise RealtimeError(
                "not_supported", "audio in response input needs its transcript", param
            )
        return _text(part["transcript"], f"{param}.transcript", p.MAX_TEXT_CHARS)
    raise RealtimeError("invalid_value", f"{param}.type is a text or audio part", f"{param}.type")
