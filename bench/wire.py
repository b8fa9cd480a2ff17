"""What the OpenAI Realtime codec costs a turn against protocol v1, on the same turn.

    python -m bench.wire [--rounds 30] [--seconds 3]

Both wires drive the same sans-I/O session (server/session.py) with the same turn: the
user's audio (``--seconds`` of it, in 100 ms frames as a microphone sends them: v1 binary
PCM16 at 16 kHz, Realtime base64 ``input_audio_buffer.append`` at 24 kHz, its only PCM
rate), then the reply's first sentence and its audio frames back. The figure is the
wall time spent inside each wire's own code (decoding frames, encoding events) on the
path to the first reply audio: the last input frame, and every server message up to and
including the first audio frame. That is what the translation layer adds to the
first-audio latency; the session, the models and the network are the same for both.
The whole turn's codec time is printed beside it. Medians over ``--rounds``.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from server import protocol as p
from server.app import VoiceWire, Wire
from server.lifecycle import Lifecycle
from server.realtime import Realtime
from server.session import (
    Event,
    ReplyAudio,
    ReplyFinished,
    ReplySentence,
    Send,
    SendAudio,
    Session,
    SessionConfig,
    StartTurn,
)

OUT_RATE = 24_000
FRAME_S = 0.1


def _timed(clock: list[float], fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    out = fn()
    clock.append(time.perf_counter() - t0)
    return out


def _speech(rate: int, seconds: float) -> list[bytes]:
    """A tone with noise, as PCM16 frames of 100 ms (the codecs do not listen to it)."""
    t = np.arange(int(rate * seconds)) / rate
    rng = np.random.default_rng(0)
    x = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)
    pcm = (x * 32767).astype("<i2").tobytes()
    step = int(rate * FRAME_S) * 2
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]


def one_turn(kind: str, seconds: float) -> tuple[float, float]:
    """(codec seconds on the path to the first audio, codec seconds in the whole turn)."""
    session = Session("bench", SessionConfig(), "tiny.en", "bench")
    wire: Wire = VoiceWire(session) if kind == "v1" else Realtime(session, "tiny.en")
    whole: list[float] = []
    wire.open(0.0)
    if kind == "v1":
        start = p.encode(p.Start(sample_rate=16_000, output_sample_rate=OUT_RATE, tools=[]))
        _timed(whole, partial(wire.receive, start, 0.0))
        frames: list[str | bytes] = list(_speech(16_000, seconds))
    else:
        frames = [
            json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(f).decode()})
            for f in _speech(OUT_RATE, seconds)
        ]
    for i, frame in enumerate(frames):
        _timed(whole, partial(wire.receive, frame, i * FRAME_S))
    path = whole[-1:]  # the last frame is on the critical path; the rest came earlier
    # The turn the session would start at the end of speech (here: a text turn, so the
    # VAD is not needed; its request's encoding stands for the transcript's), then its
    # pipeline's reply: a sentence and 3 s of audio.
    started: list[Any] = []
    for request in _ask(kind):
        out = _timed(path, partial(wire.receive, request, seconds))
        started += _encoded(wire, out, path)
    whole += path[1:]
    (turn,) = [e for e in started if isinstance(e, StartTurn)]
    reply: list[Event] = [ReplySentence(turn.turn_id, 0, "The capital of Italy is Rome.", 300.0)]
    audio = bytes(int(OUT_RATE * FRAME_S) * 2)
    reply += [ReplyAudio(turn.turn_id, 0, audio, 30 * len(audio) // 2, 50.0) for _ in range(30)]
    first = True
    for event in [*reply, ReplyFinished(turn.turn_id, None, 900.0)]:
        for effect in session.receive(event, seconds + 0.5):
            clock: list[float] = []
            _encoded(wire, [effect], clock)
            whole += clock
            if first:
                path += clock
            if isinstance(effect, SendAudio):
                first = False
    return sum(path), sum(whole)


def _ask(kind: str) -> list[str]:
    if kind == "v1":
        return [p.encode(p.Text("What is the capital of Italy?"))]
    content = [{"type": "input_text", "text": "What is the capital of Italy?"}]
    item = {"type": "message", "role": "user", "content": content}
    return [
        json.dumps({"type": "conversation.item.create", "item": item}),
        json.dumps({"type": "response.create"}),
    ]


def _encoded(wire: Wire, effects: Any, clock: list[float]) -> list[Any]:
    """Encode what a wire sends of ``effects`` (timed into ``clock``); the rest back."""
    rest: list[Any] = []
    for effect in effects:
        if isinstance(effect, Send):
            _timed(clock, partial(wire.encode, effect.message))
        elif isinstance(effect, SendAudio):
            _timed(clock, partial(wire.audio, effect))
        elif isinstance(effect, Lifecycle):
            _timed(clock, partial(wire.lifecycle, effect))
        else:
            rest.append(effect)
    return rest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=3.0, help="the user's speech")
    args = ap.parse_args()
    rows: dict[str, dict[str, float]] = {}
    for kind in ("v1", "realtime"):
        runs = [one_turn(kind, args.seconds) for _ in range(args.rounds)]
        rows[kind] = {
            "first_audio_path_ms": round(1000 * statistics.median(r[0] for r in runs), 3),
            "whole_turn_ms": round(1000 * statistics.median(r[1] for r in runs), 3),
        }
    extra = rows["realtime"]["first_audio_path_ms"] - rows["v1"]["first_audio_path_ms"]
    print(json.dumps({"rounds": args.rounds, **rows, "realtime_extra_ms": round(extra, 3)}))


if __name__ == "__main__":
    main()
