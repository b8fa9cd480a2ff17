"""OpenAI Realtime (GA) over the voice session: the second wire codec (docs/realtime.md).

The official ``openai`` SDKs (``client.realtime.connect()``) and the voice tools built
on them speak this protocol. :class:`Realtime` parses their client events into the
events of the same :class:`server.session.Session` that protocol v1 drives, and turns
the session's messages and reply audio into Realtime server events with ids; the
pipeline and the models are shared. Like the session it does no I/O: server/app.py
sends what it returns and runs the session's effects.

Audio is PCM16 at 24 kHz both ways (``audio/pcm``, the GA protocol's only PCM rate),
base64 in JSON events; the session resamples it to its 16 kHz and asks the turn
pipeline for 24 kHz speech. What this server does not do yet is answered with an
``error`` event (``not_supported``), never ignored.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from audio.endpoint import EndpointConfig
from audio.resample import SAMPLE_RATE, pcm16_to_float32, resample
from model.chat import SPOKEN_SYSTEM_PROMPT

from . import protocol as p
from .session import (
    AudioBytes,
    ClearInput,
    Configure,
    Effect,
    Respond,
    Send,
    SendAudio,
    Session,
    StartTurn,
    UserText,
)

PATH = "/v1/realtime"
RATE = 24_000
FORMAT = {"type": "audio/pcm", "rate": RATE}
VOICE = "en_US-joe-medium"  # the one Piper voice installed
DEFAULT_MODEL = "quicksilver"
MAX_INSTRUCTIONS_CHARS = 4000
MAX_ID_CHARS = 64
# Manual turns (turn_detection null): committed speech goes to Whisper whole, so at most
# its 30 s window less the endpointer's pre-roll; a commit needs OpenAI's minimum.
MAX_BUFFER_BYTES = 28 * RATE * 2
MIN_COMMIT_BYTES = RATE * 2 // 10  # 100 ms
_APPEND_STEP = int(RATE * p.MAX_AUDIO_FRAME_SECONDS) * 2  # what the session takes at once

# GA client events not handled yet, with why (docs/realtime.md lists them).
NOT_YET = {
    "conversation.item.retrieve": "the conversation's items cannot be read back yet",
    "conversation.item.delete": "items cannot be deleted yet",
    "conversation.item.truncate": "truncating an item is not supported yet",
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
# GA session fields not built yet; a value that says what the server does anyway passes.
NOT_YET_FIELDS: dict[str, tuple[object, ...]] = {
    "tools": ([],),
    "tool_choice": ("auto", "none"),
    "tracing": (None,),
    "max_output_tokens": (),
    "prompt": (),
    "truncation": (),
    "include": (),
    "reasoning": (),
    "parallel_tool_calls": (),
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
_KEPT_ITEMS = 200  # item ids remembered for previous_item_id (the session keeps fewer)

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


@dataclass(frozen=True)
class Settings:
    """The Realtime session as the client configured it."""

    model: str
    vad: ServerVad | None  # None: manual turns (commit, then response.create)
    instructions: str | None = None  # None: the reply model's own system prompt
    speak: bool = True  # output_modalities ["audio"]; False: ["text"]


@dataclass
class _Response:
    id: str
    item_id: str
    speak: bool
    done: bool = False


class Realtime:
    """One connection's codec: client events in, session effects and server events out."""

    def __init__(self, session: Session, asr: str, model: str = DEFAULT_MODEL) -> None:
        self.session = session
        self.asr = asr
        self._base = session.config.endpoint
        self.settings = Settings(model, ServerVad.of(self._base))
        self._n = 0
        self._items: list[str] = []  # conversation item ids, oldest first
        self._user_items: dict[int, str] = {}  # turn -> its user item (speech)
        self._speech_ms: dict[int, tuple[int, int]] = {}  # turn -> speech start, stop
        self._committed: dict[int, str] = {}  # turn -> the manual commit it answers
        self._responses: dict[int, _Response] = {}  # turn -> its response
        self._buffer = bytearray()  # manual turns: audio appended since the last commit
        self._pending: tuple[str, bytes] | None = None  # committed, not yet answered

    # -- client events --

    def open(self, now: float) -> list[Out]:
        """Start the session: its ready message becomes ``session.created``."""
        start = p.Start(sample_rate=RATE, client="realtime", output_sample_rate=RATE)
        return list(self.session.receive(start, now))

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
                return self._append(_audio(_required(event, "audio", "")), now)
            case "input_audio_buffer.commit":
                _known(event, set(), "")
                return self._commit(now)
            case "input_audio_buffer.clear":
                _known(event, set(), "")
                return self._clear(now)
            case "conversation.item.create":
                _known(event, {"item", "previous_item_id"}, "")
                return self._create_item(event, now)
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
        old, self.settings = self.settings, settings
        out: list[Out] = []
        if (old.vad is None) != (settings.vad is None):
            self._buffer.clear()
            if settings.vad is None:  # manual from now on: what the VAD was hearing goes
                out += self.session.receive(ClearInput(), now)
        endpoint = (
            settings.vad.endpoint(self._base) if settings.vad else self.session.config.endpoint
        )
        out += self.session.receive(Configure(endpoint, settings.instructions, settings.speak), now)
        return [*out, Emit(self._event("session.updated", session=self._session_object()))]

    def _append(self, pcm: bytes, now: float) -> list[Out]:
        if self.settings.vad is None:
            if len(self._buffer) + len(pcm) > MAX_BUFFER_BYTES:
                seconds = MAX_BUFFER_BYTES // (2 * RATE)
                raise RealtimeError(
                    "input_audio_buffer_full",
                    f"a manual turn holds at most {seconds} s of audio: commit or clear it",
                    "audio",
                )
            self._buffer += pcm
            return []
        out: list[Out] = []
        for i in range(0, len(pcm), _APPEND_STEP):
            out += self.session.receive(AudioBytes(pcm[i : i + _APPEND_STEP]), now)
        return out

    def _commit(self, now: float) -> list[Out]:
        if self.settings.vad is not None:  # the turn heard so far ends now
            return list(self.session.receive(p.EndOfInput(), now))
        if self._pending is not None:
            raise RealtimeError(
                "not_supported",
                "committed audio is waiting for response.create: one commit at a time",
            )
        if len(self._buffer) < MIN_COMMIT_BYTES:
            raise RealtimeError(
                "input_audio_buffer_commit_empty",
                f"buffer too small: a commit needs at least 100 ms of audio, "
                f"it has {len(self._buffer) * 500 // RATE} ms",
            )
        item_id = self._id("item")
        self._pending, self._buffer = (item_id, bytes(self._buffer)), bytearray()
        previous = self._add_item(item_id)
        item = _user_audio(item_id, None, "in_progress")
        return [
            Emit(
                self._event(
                    "input_audio_buffer.committed", previous_item_id=previous, item_id=item_id
                )
            ),
            Emit(self._event("conversation.item.added", previous_item_id=previous, item=item)),
        ]

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
        text, item_id = _user_message(_required(event, "item", ""))
        item_id = item_id or self._id("item")
        out: list[Out] = list(self.session.receive(UserText(text), now))
        previous = self._add_item(item_id)
        item = {
            **_item(item_id, "user", "completed"),
            "content": [{"type": "input_text", "text": text}],
        }
        return [
            *out,
            Emit(self._event("conversation.item.added", previous_item_id=previous, item=item)),
            Emit(self._event("conversation.item.done", previous_item_id=previous, item=item)),
        ]

    def _respond(self, params: object, now: float) -> list[Out]:
        instructions, speak = _response_params({} if params is None else params)
        audio = None
        if self._pending is not None:
            audio = resample(pcm16_to_float32(self._pending[1]), RATE, SAMPLE_RATE)
        out: list[Out] = list(self.session.receive(Respond(audio, instructions, speak), now))
        start = next((e for e in out if isinstance(e, StartTurn)), None)
        if start is None:  # refused: the session's error is in out
            return out
        if self._pending is not None:
            item_id, pcm = self._pending
            self._committed[start.turn_id] = item_id
            self._speech_ms[start.turn_id] = (0, len(pcm) * 500 // RATE)
            self._pending = None
        opened = [Emit(e) for e in self._open_response(start.turn_id, start.speak)]
        return [*opened, *out]

    def _cancel(self, response_id: object, now: float) -> list[Out]:
        if response_id is not None and not isinstance(response_id, str):
            raise RealtimeError("invalid_type", "response_id must be a string", "response_id")
        active = [r.id for r in self._responses.values() if not r.done]
        if response_id is not None and response_id not in active:
            raise RealtimeError(
                "response_cancel_not_active", f"response {response_id!r} is not in progress"
            )
        out: list[Out] = list(self.session.receive(p.Cancel(), now))
        if not out:
            raise RealtimeError("response_cancel_not_active", "no response is in progress")
        return out

    # -- server events --

    def encode(self, message: p.ServerMessage) -> list[str]:
        """A session message as the Realtime server events it means (maybe none)."""
        match message:
            case p.Ready():
                return [self._event("session.created", session=self._session_object())]
            case p.SpeechStarted(turn_id=turn, audio_ms=ms):
                item_id = self._user_items.setdefault(turn, self._id("item"))
                start = self._speech_ms.get(turn, (ms, ms))[0]  # again when speech resumes
                self._speech_ms[turn] = (start, ms)
                return [
                    self._event(
                        "input_audio_buffer.speech_started", audio_start_ms=ms, item_id=item_id
                    )
                ]
            case p.SpeechStopped(turn_id=turn, audio_ms=ms):
                item_id = self._user_items.setdefault(turn, self._id("item"))
                self._speech_ms[turn] = (self._speech_ms.get(turn, (ms, ms))[0], ms)
                return [
                    self._event(
                        "input_audio_buffer.speech_stopped", audio_end_ms=ms, item_id=item_id
                    )
                ]
            case p.TranscriptFinal(turn_id=turn, text=text):
                return self._heard(turn, text)
            case p.ReplyText(turn_id=turn, index=index, text=text):
                return self._delta(turn, text if index == 0 else " " + text)
            case p.ReplyDone(turn_id=turn, text=text):
                return self._close_response(turn, text, "completed", None)
            case p.ReplyCancelled():
                return self._cancelled(message)
            case p.Metrics():
                return [self._metrics(message)]
            case p.Error(code=code, message=text):
                return [self._error(_CODES.get(code, code), text, None, None)]
            case p.TranscriptPartial():  # whole re-transcriptions, not deltas: not sent
                return []
        raise AssertionError(f"unhandled message {message!r}")

    def audio(self, effect: SendAudio) -> str:
        """A frame of reply audio: the session sends a reply's first sentence before its
        first frame, so its response is open."""
        r = self._responses[effect.turn_id]
        delta = base64.b64encode(effect.pcm).decode("ascii")
        return self._event("response.output_audio.delta", **_ids(r), delta=delta)

    def _heard(self, turn: int, text: str) -> list[str]:
        """The user's speech is final: its item, its transcript, and the response to it."""
        item_id = self._committed.get(turn)
        if item_id is None and not text.strip():  # noise: nothing is answered or kept
            return []
        start, stop = self._speech_ms.get(turn, (0, 0))
        out: list[str] = []
        if item_id is None:
            item_id = self._user_items.setdefault(turn, self._id("item"))
            previous = self._add_item(item_id)
            added = _user_audio(item_id, None, "in_progress")
            out += [
                self._event(
                    "input_audio_buffer.committed", previous_item_id=previous, item_id=item_id
                ),
                self._event("conversation.item.added", previous_item_id=previous, item=added),
            ]
        usage = {"type": "duration", "seconds": max(0, stop - start) / 1000}
        out += [
            self._event(
                "conversation.item.input_audio_transcription.completed",
                item_id=item_id,
                content_index=0,
                transcript=text,
                usage=usage,
            ),
            self._event("conversation.item.done", item=_user_audio(item_id, text, "completed")),
        ]
        if turn not in self._responses:
            out += self._open_response(turn, self.settings.speak)
        return out

    def _open_response(self, turn: int, speak: bool) -> list[str]:
        r = _Response(self._id("resp"), self._id("item"), speak)
        self._responses[turn] = r
        previous = self._add_item(r.item_id)
        item = {**_item(r.item_id, "assistant", "in_progress"), "content": []}
        return [
            self._event("response.created", response=self._response(r, "in_progress", [], None)),
            self._event("response.output_item.added", response_id=r.id, output_index=0, item=item),
            self._event("conversation.item.added", previous_item_id=previous, item=item),
            self._event("response.content_part.added", **_ids(r), part=_part(speak, "")),
        ]

    def _delta(self, turn: int, delta: str) -> list[str]:
        r = self._responses.get(turn)
        if r is None:
            return []
        kind = "response.output_audio_transcript.delta" if r.speak else "response.output_text.delta"
        return [self._event(kind, **_ids(r), delta=delta)]

    def _cancelled(self, message: p.ReplyCancelled) -> list[str]:
        if message.reason == "error":
            details = {"type": "failed", "error": {"type": "server_error", "code": "turn_failed"}}
            return self._close_response(message.turn_id, message.spoken_text, "failed", details)
        reason = _CANCEL_REASONS.get(message.reason, "client_cancelled")
        details = {"type": "cancelled", "reason": reason}
        out = self._close_response(message.turn_id, message.spoken_text, "cancelled", details)
        if message.reason == "continued":  # its words are heard again in the next turn
            gone = [self._user_items.get(message.turn_id)]
            gone.append(r.item_id if (r := self._responses.get(message.turn_id)) else None)
            for item_id in filter(None, gone):
                if item_id in self._items:
                    self._items.remove(item_id)
                out.append(self._event("conversation.item.deleted", item_id=item_id))
        return out

    def _close_response(self, turn: int, text: str, status: str, details: Json | None) -> list[str]:
        r = self._responses.get(turn)
        if r is None or r.done:
            return []
        r.done = True
        part = _part(r.speak, text)
        item = {
            **_item(r.item_id, "assistant", "completed" if status == "completed" else "incomplete"),
            "content": [part],
        }
        if r.speak:
            out = [
                self._event("response.output_audio.done", **_ids(r)),
                self._event("response.output_audio_transcript.done", **_ids(r), transcript=text),
            ]
        else:
            out = [self._event("response.output_text.done", **_ids(r), text=text)]
        return [
            *out,
            self._event("response.content_part.done", **_ids(r), part=part),
            self._event("response.output_item.done", response_id=r.id, output_index=0, item=item),
            self._event("conversation.item.done", item=item),
            self._event("response.done", response=self._response(r, status, [item], details)),
        ]

    def _metrics(self, message: p.Metrics) -> str:
        """The turn's latency breakdown, as an event standard clients ignore; the last
        event of a turn, so its state goes."""
        turn = message.turn_id
        r = self._responses.pop(turn, None)
        item_id = self._committed.pop(turn, None) or self._user_items.pop(turn, None)
        self._speech_ms.pop(turn, None)
        return self._event(
            "quicksilver.metrics",
            response_id=r.id if r else None,
            item_id=item_id,
            metrics=asdict(message),
        )

    def _response(
        self, r: _Response, status: str, output: list[Json], details: Json | None
    ) -> Json:
        return {
            "id": r.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": output,
            "output_modalities": ["audio" if r.speak else "text"],
            "audio": {"output": {"format": FORMAT, "voice": VOICE}},
            "conversation_id": f"conv_{self.session.id}",
        }

    def _session_object(self) -> Json:
        s = self.settings
        vad = s.vad
        detection = None
        if vad is not None:
            detection = {
                "type": "server_vad",
                **asdict(vad),
                "create_response": True,
                "interrupt_response": True,
                "idle_timeout_ms": None,
            }
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": f"sess_{self.session.id}",
            "model": s.model,
            "output_modalities": ["audio" if s.speak else "text"],
            "instructions": SPOKEN_SYSTEM_PROMPT if s.instructions is None else s.instructions,
            "audio": {
                "input": {
                    "format": FORMAT,
                    "transcription": {"model": self.asr},
                    "noise_reduction": None,
                    "turn_detection": detection,
                },
                "output": {"format": FORMAT, "voice": VOICE, "speed": 1.0},
            },
            "tools": [],
            "tool_choice": "auto",
            "tracing": None,
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

    def _audio_settings(self, s: Settings, value: object) -> Settings:
        audio = _object(value, "session.audio")
        _known(audio, {"input", "output"}, "session.audio")
        if "input" in audio:
            inp = _object(audio["input"], "session.audio.input")
            where = "session.audio.input"
            _known(inp, {"format", "turn_detection", "transcription", "noise_reduction"}, where)
            if "format" in inp:
                _format(inp["format"], f"{where}.format")
            if "transcription" in inp:
                self._transcription(inp["transcription"], f"{where}.transcription")
            if "noise_reduction" in inp:
                _not_yet(inp["noise_reduction"], f"{where}.noise_reduction", (None,))
            if "turn_detection" in inp:
                s = replace(s, vad=self._vad(inp["turn_detection"], s.vad))
        if "output" in audio:
            out = _object(audio["output"], "session.audio.output")
            _known(out, {"format", "voice", "speed"}, "session.audio.output")
            if "format" in out:
                _format(out["format"], "session.audio.output.format")
            if "voice" in out and out["voice"] != VOICE:
                raise RealtimeError(
                    "invalid_value",
                    f"voice: the installed voice is {VOICE!r}",
                    "session.audio.output.voice",
                )
            if "speed" in out:
                _not_yet(out["speed"], "session.audio.output.speed", (1, 1.0))
        return s

    def _transcription(self, value: object, param: str) -> None:
        if value is None:
            raise RealtimeError(
                "not_supported",
                "speech is always transcribed here: the replies need its words",
                param,
            )
        config = _object(value, param)
        _known(config, {"model", "language", "prompt"}, param)
        for key in ("language", "prompt"):
            if key in config:
                raise RealtimeError(
                    "not_supported", f"{param}.{key} is not supported yet", f"{param}.{key}"
                )
        if config.get("model", self.asr) != self.asr:
            raise RealtimeError(
                "invalid_value", f"the transcription model here is {self.asr!r}", f"{param}.model"
            )

    def _vad(self, value: object, current: ServerVad | None) -> ServerVad | None:
        param = "session.audio.input.turn_detection"
        if value is None:
            return None
        config = _object(value, param)
        kind = config.get("type")
        if kind == "semantic_vad":
            raise RealtimeError(
                "not_supported",
                "semantic_vad is not supported yet: use server_vad",
                f"{param}.type",
            )
        if kind != "server_vad":
            raise RealtimeError(
                "invalid_value", "turn_detection.type must be server_vad (or null)", f"{param}.type"
            )
        vad = current or ServerVad.of(self._base)
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
                case "create_response" | "interrupt_response":
                    if _bool(v, where) is not True:
                        raise RealtimeError(
                            "not_supported", f"{key} false is not supported yet", where
                        )
                case "idle_timeout_ms":
                    _not_yet(v, where, (None,))
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
        del self._items[:-_KEPT_ITEMS]
        return previous

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


def _format(value: object, param: str) -> None:
    fmt = _object(value, param)
    _known(fmt, {"type", "rate"}, param)
    kind = fmt.get("type", "audio/pcm")
    if kind in ("audio/pcmu", "audio/pcma"):
        raise RealtimeError(
            "not_supported", f"{kind} is not supported yet: use audio/pcm", f"{param}.type"
        )
    if kind != "audio/pcm":
        raise RealtimeError("invalid_value", "the audio format is audio/pcm", f"{param}.type")
    rate = fmt.get("rate", RATE)
    if rate != RATE or isinstance(rate, bool):
        raise RealtimeError("invalid_value", f"audio/pcm is {RATE} Hz", f"{param}.rate")


def _audio(value: object) -> bytes:
    """Base64 PCM16 of input_audio_buffer.append."""
    if not isinstance(value, str):
        raise RealtimeError("invalid_type", "audio must be a base64 string", "audio")
    try:
        pcm = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("invalid_audio", "audio is not valid base64", "audio") from None
    if len(pcm) % 2:
        raise RealtimeError(
            "invalid_audio", "audio holds whole PCM16 samples (even length)", "audio"
        )
    return pcm


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


def _ids(r: _Response) -> Json:
    return {"response_id": r.id, "item_id": r.item_id, "output_index": 0, "content_index": 0}


def _user_message(value: object) -> tuple[str, str | None]:
    """conversation.item.create's item: a user text message (its text, its id)."""
    item = _object(value, "item")
    kind = item.get("type", "message")
    if kind in ("function_call", "function_call_output"):
        raise RealtimeError(
            "not_supported", f"{kind} items need tools, which are not supported yet", "item.type"
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
    texts = [_input_text(part, f"item.content[{i}]") for i, part in enumerate(content)]
    text = " ".join(texts)
    if not text.strip():
        raise RealtimeError("invalid_value", "the message has no text", "item.content")
    if len(text) > p.MAX_TEXT_CHARS:
        raise RealtimeError(
            "invalid_value",
            f"a message holds at most {p.MAX_TEXT_CHARS} characters",
            "item.content",
        )
    return text, item_id


def _input_text(value: object, param: str) -> str:
    part = _object(value, param)
    _known(part, {"type", "text"}, param)
    kind = part.get("type")
    if kind in ("input_audio", "input_image"):
        raise RealtimeError(
            "not_supported", f"{kind} content is not supported yet", f"{param}.type"
        )
    if kind != "input_text":
        raise RealtimeError("invalid_value", f"{param}.type must be input_text", f"{param}.type")
    return _text(_required(part, "text", param), f"{param}.text", p.MAX_TEXT_CHARS)


def _response_params(value: object) -> tuple[str | None, bool | None]:
    """response.create's response: this reply's instructions and modality."""
    params = _object(value, "response")
    instructions: str | None = None
    speak: bool | None = None
    for key, v in params.items():
        param = f"response.{key}"
        match key:
            case "instructions":
                instructions = _text(v, param, MAX_INSTRUCTIONS_CHARS)
            case "output_modalities":
                speak = _modalities(v, param)
            case "conversation":
                _not_yet(v, param, ("auto",))
            case "modalities" | "voice" | "output_audio_format" | "temperature":
                raise RealtimeError(
                    "beta_protocol", f"{param} is of the retired beta protocol", param
                )
            case (
                "input"
                | "tools"
                | "tool_choice"
                | "max_output_tokens"
                | "metadata"
                | "audio"
                | "prompt"
            ):
                raise RealtimeError("not_supported", f"{param} is not supported yet", param)
            case _:
                raise RealtimeError("unknown_parameter", f"unknown parameter {param}", param)
    return instructions, speak
