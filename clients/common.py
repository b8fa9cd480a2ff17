"""Pieces every Python client shares: WAV files, paced streaming, sessions, reconnection.

The glasses and car clients, the load test and the latency harness all build on these:
audio in and out (:class:`Pcm`, WAV files, real-time :class:`Pacer`), the ``start`` /
``ready`` handshake with an optional resume token, reply audio per turn with the audio
of cancelled turns dropped (:class:`TurnAudio`), and reconnection with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from server import protocol as p

FRAME_MS = 20  # client capture frame, as a microphone driver would deliver it
SPEECH_LEVEL = 0.02  # |sample| above this (of full scale) counts as speech in a WAV


class ClientError(Exception):
    """The session ended without what the client came for; the message says why."""


class ResumeRefused(ClientError):
    """The server refused a resume token (``bad_resume_token``, ``resume_expired``, or
    ``resume_unavailable`` while a fleet's store is down)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


# Network failures worth a reconnect (vs. a refused session, which is final).
NETWORK_ERRORS = (OSError, ConnectionClosed, InvalidHandshake, TimeoutError)


@dataclass(frozen=True)
class Pcm:
    """Mono PCM16 audio."""

    samples: NDArray[np.int16]
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate

    def at_rate(self, rate: int) -> Pcm:
        """The same audio at another sample rate (soxr, whole buffer)."""
        if rate == self.rate:
            return self
        from audio.resample import float32_to_int16, int16_to_float32, resample

        out = float32_to_int16(resample(int16_to_float32(self.samples), self.rate, rate))
        return Pcm(out.astype(np.int16), rate)


API_KEY_ENV = "QUICKSILVER_API_KEY"


def auth_headers() -> dict[str, str]:
    """``Authorization`` for a server with API keys: $QUICKSILVER_API_KEY holds an API
    key or a client token from ``quicksilver token`` (docs/security.md)."""
    credential = os.environ.get(API_KEY_ENV, "").strip()
    return {"Authorization": f"Bearer {credential}"} if credential else {}


def read_wav(path: Path) -> Pcm:
    """A 16-bit WAV as mono; rates the protocol does not take are resampled to 16 kHz."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: need 16-bit PCM, got {8 * w.getsampwidth()}-bit")
        rate, channels = w.getframerate(), w.getnchannels()
        data = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    if channels > 1:
        data = data.reshape(-1, channels).mean(axis=1).astype(np.int16)
    pcm = Pcm(data.astype(np.int16), rate)
    return pcm if rate in p.INPUT_SAMPLE_RATES else pcm.at_rate(16000)


def write_wav(path: Path, pcm: bytes, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)


def frames(pcm: Pcm, frame_ms: int = FRAME_MS) -> list[bytes]:
    step = pcm.rate * frame_ms // 1000
    data = pcm.samples.astype("<i2")
    return [data[i : i + step].tobytes() for i in range(0, len(data), step)]


def silence(rate: int, seconds: float) -> Pcm:
    return Pcm(np.zeros(int(rate * seconds), np.int16), rate)


def speech_bounds(pcm: Pcm, level: float = SPEECH_LEVEL) -> tuple[float, float]:
    """Ground truth from the audio itself: (first, last) sample above ``level``, in s.

    Test speech is synthesized with digital silence around it, so a plain level
    threshold finds where the talking starts and stops without any VAD.
    """
    loud = np.flatnonzero(np.abs(pcm.samples.astype(np.int32)) > level * 32768)
    if loud.size == 0:
        raise ValueError("the audio holds no sample above the speech level")
    return float(loud[0]) / pcm.rate, float(loud[-1] + 1) / pcm.rate


class Pacer:
    """Sends at real time: frame k goes out at t0 + k * frame duration."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.sent_s = 0.0

    async def wait(self, seconds: float) -> None:
        delay = self.t0 + self.sent_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        self.sent_s += seconds


@dataclass
class TurnAudio:
    """Reply audio received per turn; cancelled turns' audio is dropped."""

    chunks: dict[int, list[bytes]] = field(default_factory=dict)
    cancelled: set[int] = field(default_factory=set)
    first_audio_at: dict[int, float] = field(default_factory=dict)

    def add(self, frame: bytes) -> int:
        turn_id, _seq, pcm = p.unpack_audio(frame)
        if turn_id not in self.cancelled:
            self.chunks.setdefault(turn_id, []).append(pcm)
            self.first_audio_at.setdefault(turn_id, time.monotonic())
        return turn_id

    def cancel(self, turn_id: int) -> None:
        self.cancelled.add(turn_id)
        self.chunks.pop(turn_id, None)

    def pcm(self, turn_id: int) -> bytes:
        return b"".join(self.chunks.get(turn_id, []))


async def start_session(
    ws: ClientConnection,
    rate: int,
    client: str,
    resume_token: str | None = None,
    output_rate: int = 16000,
    tools: list[Any] | None = None,
) -> p.Ready:
    """Send ``start`` and wait for ``ready``; a refused resume raises :class:`ResumeRefused`.
    ``tools``: the tools the assistant may call (None: the server's default set)."""
    start = p.Start(
        sample_rate=rate,
        client=client,
        output_sample_rate=output_rate,
        resume_token=resume_token,
        tools=tools,
    )
    await ws.send(p.encode(start))
    message = p.decode_server(await ws.recv())
    match message:
        case p.Ready():
            return message
        case p.Error(
            code=("bad_resume_token" | "resume_expired" | "resume_unavailable") as code,
            message=text,
        ):
            raise ResumeRefused(code, text)
        case p.Error(code=code, message=text):
            raise ClientError(f"server refused the session: {code}: {text}")
    raise ClientError(f"expected ready, got {message.type}")


def backoff(
    first_s: float = 0.25, factor: float = 2.0, max_s: float = 5.0, jitter: float = 0.2
) -> Iterator[float]:
    """Reconnection delays: exponential, capped, with +-``jitter`` so clients spread out."""
    delay = first_s
    while True:
        yield delay * random.uniform(1 - jitter, 1 + jitter)
        delay = min(max_s, delay * factor)


def unreachable(url: str, exc: BaseException) -> ClientError:
    """The message a user sees when the server is not there."""
    if isinstance(exc, InvalidURI):
        return ClientError(f"not a WebSocket URL: {url}")
    reason = str(exc) or type(exc).__name__
    return ClientError(
        f"cannot reach the server at {url}: {reason} (is `quicksilver serve` running there?)"
    )


@dataclass(frozen=True)
class Arrival:
    """One frame from the server, stamped on arrival (``time.monotonic()``).

    ``message`` is the decoded event (None for audio); ``audio`` is ``(turn_id, seq,
    pcm)`` for an audio frame. The last arrival of a connection has ``closed`` set.
    """

    at: float
    message: p.ServerMessage | None = None
    audio: tuple[int, int, bytes] | None = None
    raw: str | bytes = b""
    closed: BaseException | None = None


class Inbox:
    """Reads a connection into a queue of :class:`Arrival` until it closes."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[Arrival] = asyncio.Queue()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        closed: BaseException = ConnectionClosedEnd()
        try:
            async for frame in self.ws:
                now = time.monotonic()
                if isinstance(frame, bytes):
                    self.queue.put_nowait(Arrival(now, audio=p.unpack_audio(frame), raw=frame))
                else:
                    self.queue.put_nowait(Arrival(now, p.decode_server(frame), raw=frame))
        except (ConnectionClosed, OSError, p.ProtocolError) as exc:
            closed = exc
        finally:
            self.queue.put_nowait(Arrival(time.monotonic(), closed=closed))

    async def get(self) -> Arrival:
        """The next arrival; raises the reason once the connection has closed."""
        arrival = await self.queue.get()
        if arrival.closed is not None:
            self.queue.put_nowait(arrival)  # every later get() sees the close too
            raise arrival.closed
        return arrival

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class ConnectionClosedEnd(ConnectionError):
    """The server ended the connection (a normal close)."""

    def __init__(self) -> None:
        super().__init__("the server closed the connection")
