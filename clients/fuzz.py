"""Live fuzzer: random and mutated frames against a running server, on loopback only.

    python -m clients.fuzz --url ws://127.0.0.1:8765/v1/voice --frames 100000 \\
        --connections 4 [--seed 1] [--pid PID] [--max-seconds 1800] [--json report.json]

``--connections`` clients send frames as fast as the server reads them: JSON of any
shape and depth (nesting up to the frame limit, huge strings, wrong types, unknown
fields and types, server messages sent by a client), valid messages in the wrong order
(text before start, start twice, garbage and replayed resume tokens), valid messages
mutated (bit flips, truncation, splices, invalid UTF-8 in a text frame) and binary
frames of any size and parity (empty, odd, over one second of audio, past the 256 KiB
frame limit). A client whose connection the server closes (4002 after 20 invalid
messages, 1009 for a frame over the limit, 1007 for invalid UTF-8) reconnects and goes
on until ``--frames`` have been sent or ``--max-seconds`` have passed. Every close
code is recorded per connection; 1011 (internal error) or any code the server has no
reason to send is a failure.

Meanwhile a well-behaved session on its own connection asks text questions and checks
each answer: a ``reply_done`` whose text holds the expected word ("Tokyo" for the
capital of Japan). Every ``--witness-turns`` questions it starts a fresh session, one
at a time. With ``--pid`` the server's RSS, open fds and threads are sampled from /proc.

Exits non-zero on a 1011 or unexpected close, a wrong or missing answer, a server
message that does not decode, or a dead server. Only loopback URLs are accepted. Each
connection's frames come from a generator seeded with ``SEED/CLIENT/CONNECTION``; the
last frames before a bad close go into the report as base64, to replay.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import hashlib
import ipaddress
import json
import math
import os
import random
import re
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from numpy.typing import NDArray
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.frames import Frame as WireFrame
from websockets.frames import Opcode
from websockets.protocol import Event

from server import protocol as p

from .common import Inbox, auth_headers

FRAME_LIMIT = 256 * 1024  # the server closes with 1009 above this (docs/protocol.md)
# Every ACK_EVERY frames a marker goes out whose error names it (an unknown field,
# `{"type": "cancel", "fuzz_ack_N": 0}`), and the sender waits for the answer to the
# marker before: so at most ~2 * ACK_EVERY frames are ever unread by the session. A
# session the server has closed reads no more; with over 16 frames waiting, websockets
# stops reading the socket and the closing handshake waits out its 10 s close_timeout,
# holding one of the address's connection slots (docs/robustness.md).
ACK_EVERY = 6
ACK_FIELD = re.compile(r"fuzz_ack_(\d+)")
# Close codes the fuzzer expects (numbers, not p.CloseCode names: older servers lack some).
EXPECTED_CLOSES = {
    1000: "normal (the fuzzer closed)",
    1007: "invalid UTF-8 in a text frame",
    1008: "too many connections from one address",
    1009: "frame over 256 KiB",
    1013: "server full, try again later",
    4002: "20 invalid messages",
    4004: "no start message in time",
}
REFUSALS = (1008, 1013)  # the connection was refused: wait a moment before the next
# Questions the served reply model answers right in a fresh session and still after
# many turns of them (it answers the capital of France with "Le Grand Jardin"), on
# AVX-512 and AVX2 CPUs alike: "What color is the sky?" is a near-tie that the CPU's
# float rounding decides ("The sky is a deep, mysterious ... canvas" on an AVX2 EPYC,
# fp32 and int8 graphs both).
WITNESS_QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of Japan?", ("Tokyo",)),
    ("Say hello.", ("hello",)),
    ("How many days are in a week?", ("7", "seven")),
)


def require_loopback(url: str) -> None:
    """Refuse any target but this machine: 127.0.0.0/8, ::1 or localhost."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a WebSocket URL: {url}")
    host = parts.hostname
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"refusing {host}: only loopback targets (127.0.0.0/8, ::1, localhost)")


def http_base(url: str) -> str:
    return url.replace("ws://", "http://").replace("wss://", "https://").split("/v1/", 1)[0]


def http_get(url: str, timeout: float = 10) -> bytes | None:
    """GET without any proxy from the environment (the target is loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers=auth_headers())
    try:
        with opener.open(request, timeout=timeout) as response:
            body: bytes = response.read()
    except (OSError, ValueError):
        return None
    return body


async def healthy(url: str) -> bool:
    return await asyncio.to_thread(http_get, f"{http_base(url)}/healthz") == b"ok\n"


class FuzzConnection(ClientConnection):
    """A client connection that knows when the server's close frame has come in
    (websockets itself says so only once the TCP connection has ended)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.closing = asyncio.Event()

    def process_event(self, event: Event) -> None:
        super().process_event(event)
        if isinstance(event, WireFrame) and event.opcode is Opcode.CLOSE:
            self.closing.set()


class ServerClosing(Exception):
    """The server's close frame arrived while the fuzzer was waiting to send."""


async def open_ws(url: str, compression: str | None = "deflate") -> FuzzConnection:
    """A client connection: no proxy, no size limit on what comes back, no keepalive
    (a keepalive timeout would be a 1011 of the client's own making)."""
    ws = await connect(
        url,
        proxy=None,
        max_size=None,
        open_timeout=30,
        ping_interval=None,
        close_timeout=10,
        compression=compression,
        additional_headers=auth_headers(),  # $QUICKSILVER_API_KEY, for a server with keys
        create_connection=FuzzConnection,
    )
    assert isinstance(ws, FuzzConnection)
    return ws


async def unless_closing(ws: FuzzConnection, work: Awaitable[object]) -> None:
    """Await ``work`` (a send, a pong), or raise :class:`ServerClosing` as soon as the
    server's close frame is in: a server that has closed a session stops reading, so a
    send or ping could otherwise wait out its 10 s close_timeout."""
    if ws.closing.is_set():
        if isinstance(work, Coroutine):
            work.close()
        raise ServerClosing
    job = asyncio.ensure_future(work)
    closing = asyncio.ensure_future(ws.closing.wait())
    try:
        await asyncio.wait({job, closing}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        closing.cancel()
    if not job.done():
        job.cancel()
        with contextlib.suppress(BaseException):
            await job
        raise ServerClosing
    job.result()


# --- the server process, from /proc --------------------------------------------------


@dataclass(frozen=True)
class ProcSample:
    t: float  # seconds since the run started
    rss_kb: int
    fds: int
    threads: int


def read_proc(pid: int, t: float) -> ProcSample | None:
    """RSS, open fds and threads of ``pid``; None once it is gone (or a zombie)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if values.get("State", "").strip().startswith(("Z", "X")) or "VmRSS" not in values:
        return None
    rss = int(values["VmRSS"].split()[0])
    return ProcSample(round(t, 1), rss, fds, int(values["Threads"]))


def proc_summary(samples: list[ProcSample]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for key in ("rss_kb", "fds", "threads"):
        values = [getattr(s, key) for s in samples]
        if values:
            out[key] = {"start": values[0], "end": values[-1], "max": max(values)}
    return out


# --- frames ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    kind: str
    data: str | bytes
    as_text: bool = False  # bytes sent in a text frame (invalid UTF-8 on purpose)


@dataclass
class Shared:
    """What the connections learn from the server and pass to each other."""

    tokens: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=64))


KEYS = ("type", "sample_rate", "client", "output_sample_rate", "protocol", "resume_token", "text")
TYPES = ("start", "text", "cancel", "end_of_input", "ready", "reply_done", "error", "", "START")
TEXTS = (
    "What is the capital of France?",
    "Tell me a long story about the sea.",
    "\u00e9\u00e8\u00ea \u4f60\u597d \U0001f600",
    "\ud800 lone surrogate",
    "a\u0000b",
    " x ",
)


class FrameMaker:
    """Draws one frame at a time; every draw comes from ``rng`` alone."""

    def __init__(self, rng: random.Random, shared: Shared, limit: int = FRAME_LIMIT) -> None:
        self.rng = rng
        self.shared = shared
        self.limit = limit
        self.rate = 16000  # the connection's input rate, once a start was sent
        table: list[tuple[str, float, Callable[[], Frame]]] = [
            ("audio", 22, self.audio),
            ("audio_odd", 5, self.audio_odd),
            ("audio_empty", 2, lambda: Frame("audio_empty", b"")),
            ("audio_random", 4, self.audio_random),
            ("audio_over_1s", 2, self.audio_over_1s),
            ("binary_over_limit", 0.15, self.binary_over_limit),
            ("binary_json", 2, self.binary_json),
            ("json_random", 10, self.json_random),
            ("json_deep", 3, self.json_deep),
            ("json_huge", 1.5, self.json_huge),
            ("json_wrong_types", 8, self.json_wrong_types),
            ("json_unknown", 6, self.json_unknown),
            ("valid_start", 4, self.valid_start),
            ("valid_text", 1, self.valid_text),
            ("valid_cancel", 4, lambda: Frame("valid_cancel", p.encode(p.Cancel()))),
            (
                "valid_end_of_input",
                4,
                lambda: Frame("valid_end_of_input", p.encode(p.EndOfInput())),
            ),
            ("resume_garbage", 3, self.resume_garbage),
            ("resume_replay", 1, self.resume_replay),
            ("mutated", 12, self.mutated),
            ("text_garbage", 3, self.text_garbage),
            ("text_bad_utf8", 0.3, self.text_bad_utf8),
        ]
        self.kinds = [k for k, _, _ in table]
        self.makers = [m for _, _, m in table]
        self.weights = [w for _, w, _ in table]

    def next(self) -> Frame:
        (make,) = self.rng.choices(self.makers, self.weights)
        return make()

    # -- scalars and JSON values --

    def string(self, max_len: int = 40) -> str:
        r = self.rng.random()
        n = self.rng.randint(0, max_len)
        if r < 0.3:
            return self.rng.choice(TYPES + TEXTS)
        if r < 0.6:
            return "".join(self.rng.choice('abcxyz_- "\\/{}[]:,0') for _ in range(n))
        # any code point: controls, surrogates, astral planes
        return "".join(chr(self.rng.randint(0, 0x10FFFF)) for _ in range(n))

    def scalar(self) -> object:
        rng = self.rng
        return rng.choice(
            [
                None,
                True,
                False,
                0,
                -1,
                16000,
                48000,
                2**31,
                2**64 + 1,
                -(2**63),
                10**300,
                rng.randint(-(10**9), 10**9),
                rng.random() * 1e6,
                math.inf,
                -math.inf,
                math.nan,
                1e-320,
                16000.0,
                self.string(),
            ]
        )

    def value(self, depth: int) -> object:
        r = self.rng.random()
        if depth <= 0 or r < 0.45:
            return self.scalar()
        n = self.rng.randint(0, 5)
        if r < 0.72:
            return [self.value(depth - 1) for _ in range(n)]
        keys = [
            self.rng.choice(KEYS) if self.rng.random() < 0.5 else self.string(8) for _ in range(n)
        ]
        return {k: self.value(depth - 1) for k in keys}

    def dumps(self, obj: object) -> str:
        """JSON text; raw (non-ASCII) half the time, NaN and Infinity allowed."""
        text = json.dumps(obj, ensure_ascii=self.rng.random() < 0.5)
        try:
            text.encode()
        except UnicodeEncodeError:  # a lone surrogate cannot travel raw in a text frame
            text = json.dumps(obj)
        return text

    # -- valid messages --

    def start(self, **extra: object) -> dict[str, object]:
        rng = self.rng
        msg: dict[str, object] = {"type": "start", "sample_rate": rng.choice(p.INPUT_SAMPLE_RATES)}
        if rng.random() < 0.5:
            msg["output_sample_rate"] = rng.choice(p.OUTPUT_SAMPLE_RATES)
        if rng.random() < 0.5:
            msg["client"] = rng.choice(["glasses", "car", "web", "fuzz"])
        if rng.random() < 0.2:
            msg["protocol"] = 1
        msg.update(extra)
        return msg

    def valid_message(self) -> dict[str, object]:
        r = self.rng.random()
        if r < 0.4:
            return self.start()
        if r < 0.7:
            return {"type": "text", "text": self.rng.choice(TEXTS[:3])}
        return {"type": self.rng.choice(["cancel", "end_of_input"])}

    def valid_start(self) -> Frame:
        msg = self.start()
        self.rate = int(str(msg["sample_rate"]))
        return Frame("valid_start", json.dumps(msg))

    def valid_text(self) -> Frame:
        return Frame("valid_text", json.dumps({"type": "text", "text": self.rng.choice(TEXTS)}))

    # -- JSON --

    def json_random(self) -> Frame:
        return Frame("json_random", self.dumps(self.value(self.rng.randint(0, 6))))

    def json_deep(self) -> Frame:
        rng = self.rng
        room = self.limit // 2 - 64
        depth = min(room, rng.choice([50, 500, 900, 999, 1000, 1001, 2000, 10_000, 100_000, room]))
        style = rng.choice(["list", "dict", "field", "type", "unclosed", "mixed"])
        match style:
            case "list":
                text = "[" * depth + "]" * depth
            case "dict":
                depth = min(depth, (self.limit - 8) // 6)
                text = '{"a":' * depth + "1" + "}" * depth
            case "field":
                key = rng.choice(KEYS[1:])
                text = f'{{"type":"start","sample_rate":16000,"{key}":' + "[" * depth
                text += "]" * depth + "}"
            case "type":  # the unknown type is echoed back in the error message
                text = '{"type":' + "[" * depth + '"start"' + "]" * depth + "}"
            case "unclosed":
                text = rng.choice("[{") * depth
            case _:
                text = "".join(rng.choice(['[{"t":', "["]) for _ in range(depth // 3))
        return Frame("json_deep", text)

    def json_huge(self) -> Frame:
        rng = self.rng
        key = rng.choice(["text", "client", "resume_token", "type", "unknown_field"])
        head = {"type": "text"} if key == "text" else self.start()
        head.pop(key, None)
        shell = json.dumps({**head, key: ""})
        target = rng.choice(
            [2001, 10_000, 65_536, self.limit - 1, self.limit, self.limit + 1, self.limit + 5000]
        )
        unit = rng.choice(["x", "\u00e9", "\U0001f600"])  # 1, 2 and 4 UTF-8 bytes
        n = max(0, (target - len(shell.encode())) // len(unit.encode()))
        obj = {**head, key: unit * n}
        return Frame("json_huge", json.dumps(obj, ensure_ascii=False))

    def json_wrong_types(self) -> Frame:
        rng = self.rng
        msg = self.valid_message()
        keys = [k for k in msg if k != "type"] or ["text"]
        key = rng.choice([*keys, "type"])
        wrong: list[object] = [None, True, 1, 1.5, "16000", [], {}, [16000], {"a": 1}, 2**70]
        msg[key] = rng.choice([*wrong, self.value(3)])
        return Frame("json_wrong_types", self.dumps(msg))

    def json_unknown(self) -> Frame:
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            msg: object = {**self.valid_message(), self.string(12): self.value(2)}
        elif r < 0.6:
            msg = {"type": self.rng.choice(TYPES[4:]) if r < 0.45 else self.string(16)}
        elif r < 0.8:
            msg = rng.choice([[], {}, 1, "start", None, [{"type": "start", "sample_rate": 16000}]])
        else:
            msg = {"type": "reply_done", "turn_id": 1, "text": "Paris."}  # a server message
        return Frame("json_unknown", self.dumps(msg))

    def resume_garbage(self) -> Frame:
        rng = self.rng
        token = rng.choice(
            [
                "",
                "x",
                base64.urlsafe_b64encode(rng.randbytes(18)).decode(),
                self.string(30),
                "A" * rng.choice([100, 10_000, 200_000]),
                "../../etc/passwd",
                "\x00" * 24,
            ]
        )
        return Frame("resume_garbage", self.dumps(self.start(resume_token=token)))

    def resume_replay(self) -> Frame:
        """A real token from an earlier ready: valid once, refused after (single use)."""
        tokens = self.shared.tokens
        token = self.rng.choice(tokens) if tokens else "no-token-seen-yet"
        return Frame("resume_replay", json.dumps(self.start(resume_token=token)))

    # -- mutations of valid messages --

    def mutated(self) -> Frame:
        rng = self.rng
        data = bytearray(json.dumps(self.valid_message()).encode())
        for _ in range(rng.randint(1, 3)):
            op = rng.choice(["flip", "truncate", "insert", "delete", "duplicate", "replace"])
            i = rng.randrange(len(data) + 1) if data else 0
            match op:
                case "flip" if data:
                    j = min(i, len(data) - 1)
                    data[j] ^= 1 << rng.randrange(8)
                case "truncate":
                    del data[i:]
                case "insert":
                    data[i:i] = rng.choice([rng.randbytes(rng.randint(1, 8)), b'"', b"{", b","])
                case "delete":
                    del data[i : i + rng.randint(1, 6)]
                case "duplicate":
                    data[i:i] = data[i : i + rng.randint(1, 16)]
                case _:
                    data[i : i + 1] = rng.choice([b"9", b"-", b"e", b"null", b"\\u0000"])
        raw = bytes(data)
        try:
            return Frame("mutated", raw.decode())
        except UnicodeDecodeError:
            if rng.random() < 0.05:
                return Frame("text_bad_utf8", raw, as_text=True)
            return Frame("mutated", raw.decode(errors="replace"))

    def text_garbage(self) -> Frame:
        rng = self.rng
        text = rng.choice(
            [
                self.string(200),
                "not json",
                "",
                " ",
                "{oops",
                '{"type": "start", "sample_rate": 16000',
                "\ufeff" + json.dumps(self.start()),  # a byte order mark
                json.dumps(self.start()) + " trailing",
                json.dumps(self.start()) * 2,
                "NaN",
                "1" * 5000,  # more digits than int() accepts from text
            ]
        )
        with contextlib.suppress(UnicodeEncodeError):
            text.encode()
            return Frame("text_garbage", text)
        return Frame("text_garbage", text.encode(errors="replace").decode())

    def text_bad_utf8(self) -> Frame:
        junk = self.rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
        return Frame("text_bad_utf8", b'{"type":"' + junk + b'"}', as_text=True)

    # -- binary --

    def pcm(self, samples: int) -> bytes:
        rng = self.rng
        gen = np.random.default_rng(rng.getrandbits(64))
        style = rng.choice(["silence", "noise", "tone", "extremes", "bytes"])
        match style:
            case "silence":
                return bytes(2 * samples)
            case "noise":
                level = rng.choice([30, 300, 3000, 32767])
                return gen.integers(-level, level, samples, endpoint=True).astype("<i2").tobytes()
            case "tone":
                step = 2 * math.pi * rng.uniform(80, 4000) / self.rate
                wave = rng.uniform(100, 32767) * np.sin(step * np.arange(samples))
                tone: NDArray[np.int16] = wave.astype("<i2")
                return tone.tobytes()
            case "extremes":
                extremes: NDArray[np.int16] = np.resize(np.array([-32768, 32767], "<i2"), samples)
                return extremes.tobytes()
            case _:
                return rng.randbytes(2 * samples)

    def audio(self) -> Frame:
        rng = self.rng
        ms = rng.choice([1, 10, 20, 20, 20, 32, 100, 500, 1000])
        return Frame("audio", self.pcm(max(1, self.rate * ms // 1000)))

    def audio_odd(self) -> Frame:
        n = self.rng.choice([1, 3, 641, 2 * self.rate + 1, self.rng.randrange(1, self.limit, 2)])
        return Frame("audio_odd", self.rng.randbytes(n))

    def audio_random(self) -> Frame:
        return Frame("audio_random", self.rng.randbytes(self.rng.randint(0, 2 * self.rate)))

    def audio_over_1s(self) -> Frame:
        """More than one second of audio, inside the frame limit: frame_too_large."""
        n = 2 * self.rng.randint(self.rate + 1, self.limit // 2)
        return Frame(
            "audio_over_1s", bytes(n) if self.rng.random() < 0.5 else self.rng.randbytes(n)
        )

    def binary_over_limit(self) -> Frame:
        n = self.rng.choice([self.limit + 1, self.limit + 2, 2 * self.limit, 1024 * 1024])
        return Frame(
            "binary_over_limit", bytes(n) if self.rng.random() < 0.5 else self.rng.randbytes(n)
        )

    def binary_json(self) -> Frame:
        """A message in a binary frame: the server must take it as (bad) audio."""
        return Frame("binary_json", json.dumps(self.valid_message()).encode())


# --- the run ---------------------------------------------------------------------------


@dataclass
class Options:
    url: str
    frames: int = 100_000
    connections: int = 4
    seed: int = 0
    pid: int | None = None
    max_seconds: float = 1800.0
    sample_every_s: float = 2.0
    progress_every_s: float = 5.0
    answer_timeout_s: float = 180.0
    ask_gap_s: float = 3.5  # the server takes at most 20 text messages a minute
    # Questions per well-behaved session: after ~30 turns of the same three questions
    # the reply model's answers shrink ("The sky is a deep,"), load or not.
    witness_turns: int = 12
    keep_frames: int = 32  # frames per connection kept for a reproducer


class Acks:
    """The markers of one connection: how many were sent, the last one answered."""

    def __init__(self) -> None:
        self.sent = 0
        self.last = 0
        self.changed = asyncio.Event()

    def answered(self, n: int) -> None:
        self.last = max(self.last, n)
        self.changed.set()

    async def wait_for(self, n: int) -> None:
        while self.last < n:
            self.changed.clear()
            await self.changed.wait()


@dataclass
class ConnectionRecord:
    name: str  # CLIENT/CONNECTION: the generator's seed is SEED/CLIENT/CONNECTION
    frames: int = 0
    close_code: int | None = None
    close_reason: str = ""
    closed_by: str = ""  # "server" or "client"
    last_kind: str = ""


@dataclass
class Witness:
    asked: int = 0
    ok: int = 0
    rate_limited: int = 0
    failures: list[dict[str, object]] = field(default_factory=list)
    reply_ms: list[float] = field(default_factory=list)
    replies: collections.Counter[str] = field(default_factory=collections.Counter)
    answers: list[dict[str, object]] = field(default_factory=list)  # in order
    sessions: int = 0
    close_codes: collections.Counter[int] = field(default_factory=collections.Counter)


class Fuzz:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.t0 = time.monotonic()
        self.sent: collections.Counter[str] = collections.Counter()
        self.server_errors: collections.Counter[str] = collections.Counter()
        self.server_events: collections.Counter[str] = collections.Counter()
        self.closes: collections.Counter[int] = collections.Counter()
        self.close_reasons: collections.Counter[str] = collections.Counter()
        self.records: list[ConnectionRecord] = []
        self.crashes: list[dict[str, object]] = []
        self.undecodable: list[str] = []
        self.connect_failures = 0
        self.markers = 0  # ack markers sent (not counted in the frames)
        self.ack_timeouts = 0
        self.samples: list[ProcSample] = []
        self.shared = Shared()
        self.witness = Witness()
        self.server_died = ""
        self.stop = asyncio.Event()  # fuzzing is over (frames sent, time up, server dead)

    @property
    def total(self) -> int:
        return sum(self.sent.values())

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def out_of_budget(self) -> bool:
        if self.total >= self.opts.frames or self.elapsed() >= self.opts.max_seconds:
            self.stop.set()
        return self.stop.is_set()

    async def run(self) -> dict[str, object]:
        if self.opts.pid is not None:
            first = read_proc(self.opts.pid, 0.0)
            if first is None:
                raise ValueError(f"no live process {self.opts.pid}")
            self.samples.append(first)
        watchers = [asyncio.create_task(self._sample()), asyncio.create_task(self._progress())]
        witness = asyncio.create_task(self._witness())
        await asyncio.gather(*(self._client(i) for i in range(self.opts.connections)))
        self.stop.set()
        await witness
        for task in watchers:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._sample_once()
        if not self.server_died and not await healthy(self.opts.url):
            self.server_died = "GET /healthz failed after the run"
        return self.report()

    # -- fuzzing clients --

    async def _client(self, index: int) -> None:
        serial = 0
        while not self.out_of_budget():
            serial += 1
            name = f"{index}/{serial}"
            rng = random.Random(f"{self.opts.seed}/{name}")
            try:
                ws = await open_ws(self.opts.url, "deflate" if rng.random() < 0.8 else None)
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                await self._connect_failed(exc)
                continue
            record = ConnectionRecord(name)
            self.records.append(record)
            await self._fuzz_connection(ws, FrameMaker(rng, self.shared), record)

    async def _connect_failed(self, exc: BaseException) -> None:
        self.connect_failures += 1
        if self._dead() or self.connect_failures > 50:
            self.server_died = self.server_died or f"cannot connect: {exc!r}"
            self.stop.set()
        await asyncio.sleep(0.2)

    def _dead(self) -> bool:
        return self.opts.pid is not None and read_proc(self.opts.pid, 0.0) is None

    async def _fuzz_connection(
        self, ws: FuzzConnection, maker: FrameMaker, record: ConnectionRecord
    ) -> None:
        acks = Acks()
        reader = asyncio.create_task(self._read(ws, acks))
        ring: collections.deque[Frame] = collections.deque(maxlen=self.opts.keep_frames)
        try:
            if maker.rng.random() < 0.7:  # most connections fuzz a started session
                await self._send(ws, maker.valid_start(), ring, record)
            while not self.out_of_budget():
                await self._send(ws, maker.next(), ring, record)
                if record.frames % ACK_EVERY == 0:
                    await self._ack(ws, acks)
        except (ConnectionClosed, OSError, ServerClosing):
            pass
        except TimeoutError:
            self.ack_timeouts += 1
        finally:
            await _hang_up(ws)
            with contextlib.suppress(Exception):
                await reader
        self._closed(ws, record, ring)
        if record.close_code in REFUSALS:
            await asyncio.sleep(1.0)

    async def _ack(self, ws: FuzzConnection, acks: Acks) -> None:
        """Send the next marker; wait until the session has answered the one before."""
        acks.sent += 1
        self.markers += 1
        marker = json.dumps({"type": "cancel", f"fuzz_ack_{acks.sent}": 0})
        await unless_closing(ws, ws.send(marker))
        async with asyncio.timeout(self.opts.answer_timeout_s):
            await unless_closing(ws, acks.wait_for(acks.sent - 1))

    async def _send(
        self,
        ws: FuzzConnection,
        frame: Frame,
        ring: collections.deque[Frame],
        record: ConnectionRecord,
    ) -> None:
        ring.append(frame)
        record.frames += 1
        record.last_kind = frame.kind
        self.sent[frame.kind] += 1
        await unless_closing(ws, ws.send(frame.data, text=True if frame.as_text else None))

    async def _read(self, ws: ClientConnection, acks: Acks) -> None:
        async for raw in ws:
            if isinstance(raw, bytes):
                self.server_events["audio"] += 1
                if len(raw) < p.AUDIO_HEADER.size:
                    self.undecodable.append(f"audio frame of {len(raw)} bytes")
                continue
            try:
                message = p.decode_server(raw)
            except p.ProtocolError as err:
                self.undecodable.append(f"{err.code}: {raw[:200]!r}")
                continue
            match message:
                case p.Error(message=text) if (m := ACK_FIELD.search(text)) is not None:
                    acks.answered(int(m.group(1)))
                    continue
                case p.Error(code=code):
                    self.server_errors[code] += 1
            self.server_events[message.type] += 1
            match message:
                case p.Ready(resume_token=token, resumed=resumed):
                    self.server_events["ready_resumed"] += resumed
                    if token:
                        self.shared.tokens.append(token)

    def _closed(
        self, ws: ClientConnection, record: ConnectionRecord, ring: collections.deque[Frame]
    ) -> None:
        rcvd, sent = ws.protocol.close_rcvd, ws.protocol.close_sent
        by_server = rcvd is not None and (sent is None or bool(ws.protocol.close_rcvd_then_sent))
        record.closed_by = "server" if by_server else "client"
        record.close_code = rcvd.code if rcvd is not None else 1006  # 1006: no close frame
        record.close_reason = rcvd.reason if rcvd is not None else ""
        self.closes[record.close_code] += 1
        reason = re.sub(r"\d+", "N", record.close_reason)  # "frame with N bytes ..."
        self.close_reasons[f"{record.close_code} {reason}".strip()] += 1
        if record.close_code not in EXPECTED_CLOSES:
            self.crashes.append(
                {"connection": asdict(record), "seed": self.opts.seed, "frames": _dump(ring)}
            )

    # -- the well-behaved session --

    async def _witness(self) -> None:
        """Well-behaved sessions, one at a time, each asking ``witness_turns`` questions
        (0: one session for the whole run)."""
        w = self.witness
        while not self.stop.is_set() or w.asked == 0:
            try:
                ws = await open_ws(self.opts.url)
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                w.failures.append({"error": f"cannot connect: {exc!r}"})
                return
            w.sessions += 1
            if not await self._witness_session(ws):
                return

    async def _witness_session(self, ws: ClientConnection) -> bool:
        """Ask questions on one connection; False if it was lost."""
        w = self.witness
        inbox = Inbox(ws)
        try:
            await ws.send(p.encode(p.Start(16000, client="fuzz-witness", output_sample_rate=16000)))
            await self._next_message(inbox, p.Ready)
            asked = 0
            while (not self.stop.is_set() or w.asked == 0) and (
                not self.opts.witness_turns or asked < self.opts.witness_turns
            ):
                question, expect = WITNESS_QUESTIONS[asked % len(WITNESS_QUESTIONS)]
                asked += 1
                t_ask = time.monotonic()
                await self._ask(ws, inbox, question, expect)
                gap = self.opts.ask_gap_s - (time.monotonic() - t_ask)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), max(0.0, gap))
        except (ConnectionClosed, OSError, p.ProtocolError, ConnectionError) as exc:
            w.failures.append({"error": f"the well-behaved session lost its connection: {exc!r}"})
            return False
        finally:
            await inbox.close()
            with contextlib.suppress(ConnectionClosed, OSError):
                await ws.close()
            rcvd = ws.protocol.close_rcvd
            w.close_codes[rcvd.code if rcvd is not None else 1006] += 1
        return True

    async def _next_message(self, inbox: Inbox, kind: type[p.ServerMessage]) -> p.ServerMessage:
        async with asyncio.timeout(60):
            while not isinstance(message := (await inbox.get()).message, kind):
                pass
        return message

    async def _ask(
        self, ws: ClientConnection, inbox: Inbox, question: str, expect: tuple[str, ...]
    ) -> None:
        w = self.witness
        w.asked += 1
        t0 = time.monotonic()
        await ws.send(p.encode(p.Text(question)))
        turn: int | None = None
        reply = ""
        try:
            async with asyncio.timeout(self.opts.answer_timeout_s):
                while True:
                    message = (await inbox.get()).message
                    match message:
                        case p.TranscriptFinal(turn_id=t, text=text) if text == question:
                            turn = t
                        case p.ReplyDone(turn_id=t, text=done) if t == turn:
                            reply = done
                            break
                        case p.ReplyCancelled(turn_id=t, reason=reason) if t == turn:
                            w.failures.append(
                                {"question": question, "error": f"cancelled: {reason}"}
                            )
                            return
                        case p.Error(code="rate_limited"):
                            w.asked -= 1
                            w.rate_limited += 1
                            await asyncio.sleep(self.opts.ask_gap_s)
                            return
                        case p.Error(code=code, message=text):
                            w.failures.append({"question": question, "error": f"{code}: {text}"})
                            return
        except TimeoutError:
            w.failures.append({"question": question, "error": "no reply_done in time"})
            return
        ms = round((time.monotonic() - t0) * 1000, 1)
        w.reply_ms.append(ms)
        w.replies[reply] += 1
        w.answers.append({"session": w.sessions, "question": question, "reply": reply, "ms": ms})
        if reply.strip() and any(word.lower() in reply.lower() for word in expect):
            w.ok += 1
        else:
            w.failures.append({"question": question, "reply": reply, "error": f"no {expect!r}"})

    # -- resources and progress --

    def _sample_once(self) -> None:
        if self.opts.pid is None:
            return
        sample = read_proc(self.opts.pid, self.elapsed())
        if sample is None:
            self.server_died = self.server_died or f"process {self.opts.pid} is gone"
            self.stop.set()
        else:
            self.samples.append(sample)

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.opts.sample_every_s)
            self._sample_once()

    async def _progress(self) -> None:
        while True:
            await asyncio.sleep(self.opts.progress_every_s)
            print(self.progress_line(), file=sys.stderr, flush=True)

    def progress_line(self) -> str:
        t = self.elapsed()
        closes = ", ".join(f"{c}: {n}" for c, n in sorted(self.closes.items()))
        rss = f", server rss {self.samples[-1].rss_kb / 1024:.0f} MiB" if self.samples else ""
        w = self.witness
        return (
            f"fuzz {t:5.0f} s: {self.total}/{self.opts.frames} frames ({self.total / t:.0f}/s), "
            f"{len(self.records)} connections, closes {{{closes}}}, "
            f"answers {w.ok}/{w.asked} ok{rss}"
        )

    # -- the report --

    def failures(self) -> list[str]:
        out = []
        if self.closes.get(1011):
            out.append(f"{self.closes[1011]} connection(s) closed with 1011 (internal error)")
        unexpected = {
            c: n for c, n in self.closes.items() if c not in EXPECTED_CLOSES and c != 1011
        }
        if unexpected:
            out.append(f"unexpected close codes {unexpected}")
        w = self.witness
        if w.failures or w.ok == 0:
            out.append(f"well-behaved session: {w.ok}/{w.asked} answers correct")
        if set(w.close_codes) - {1000}:
            out.append(f"well-behaved sessions closed with {dict(w.close_codes)}")
        if self.undecodable:
            out.append(f"{len(self.undecodable)} server message(s) did not decode")
        if self.server_died:
            out.append(f"server died: {self.server_died}")
        return out

    def report(self) -> dict[str, object]:
        w = self.witness
        failures = self.failures()
        summary: dict[str, object] = {
            "url": self.opts.url,
            "seed": self.opts.seed,
            "seconds": round(self.elapsed(), 1),
            "frames_target": self.opts.frames,
            "frames_sent": self.total,
            "frames_by_kind": dict(self.sent.most_common()),
            "connections": len(self.records),
            "connect_failures": self.connect_failures,
            "ack_markers": self.markers,
            "ack_timeouts": self.ack_timeouts,
            "close_codes": {str(c): n for c, n in sorted(self.closes.items())},
            "close_reasons": dict(self.close_reasons.most_common()),
            "server_errors": dict(self.server_errors.most_common()),
            "server_events": dict(self.server_events.most_common()),
            "undecodable": self.undecodable[:20],
            "witness": {
                "asked": w.asked,
                "ok": w.ok,
                "rate_limited": w.rate_limited,
                "failures": w.failures,
                "reply_ms_median": _median(w.reply_ms),
                "reply_ms_max": max(w.reply_ms, default=None),
                "replies": dict(w.replies.most_common(10)),
                "sessions": w.sessions,
                "close_codes": {str(c): n for c, n in w.close_codes.items()},
            },
            "server": proc_summary(self.samples),
            "server_alive": not self.server_died,
            "failures": failures,
            "ok": not failures,
        }
        return {
            "summary": summary,
            "crashes": self.crashes,
            "samples": [asdict(s) for s in self.samples],
            "connections": [asdict(r) for r in self.records],
            "answers": w.answers,
        }


async def _hang_up(ws: FuzzConnection) -> None:
    """Close from our side, or after the server's close frame stop waiting soon.

    A server that closes a connection stops reading it; with more than 16 of our frames
    unread in its queue, websockets stops reading the socket, never sees our half of
    the closing handshake and holds the connection until its close_timeout (10 s).
    The code is in by then, so the fuzzer drops the socket instead of waiting.
    """
    if ws.protocol.close_rcvd is None:
        with contextlib.suppress(ConnectionClosed, OSError):
            await ws.close()
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.5):
            await ws.wait_closed()
    ws.transport.abort()


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _dump(ring: collections.deque[Frame]) -> list[dict[str, object]]:
    """The frames before a bad close, to replay: base64, the big ones cut to 64 KiB."""
    out: list[dict[str, object]] = []
    for frame in ring:
        raw = (
            frame.data.encode("utf-8", "surrogatepass")
            if isinstance(frame.data, str)
            else frame.data
        )
        text_frame = isinstance(frame.data, str) or frame.as_text
        out.append(
            {
                "kind": frame.kind,
                "text_frame": text_frame,
                "bytes": len(raw),
                "sha256": hashlib.sha256(raw).hexdigest(),
                "base64": base64.b64encode(raw[: 64 * 1024]).decode(),
                "cut": len(raw) > 64 * 1024,
            }
        )
    return out


async def run(opts: Options) -> dict[str, object]:
    require_loopback(opts.url)
    return await Fuzz(opts).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clients.fuzz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=f"ws://127.0.0.1:8765{p.PATH}")
    parser.add_argument("--frames", type=int, default=100_000, help="frames to send in all")
    parser.add_argument("--connections", type=int, default=4, help="concurrent fuzzing clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pid", type=int, help="the server's pid: sample RSS, fds, threads")
    parser.add_argument("--max-seconds", type=float, default=1800.0)
    parser.add_argument("--answer-timeout", type=float, default=180.0, help="seconds per answer")
    parser.add_argument(
        "--witness-turns", type=int, default=12, help="questions per well-behaved session (0: one)"
    )
    parser.add_argument("--json", type=Path, help="write the full report here")
    args = parser.parse_args(argv)
    if args.frames < 1 or args.connections < 1:
        parser.error("--frames and --connections must be at least 1")
    opts = Options(
        args.url, args.frames, args.connections, args.seed, args.pid, args.max_seconds,
        answer_timeout_s=args.answer_timeout, witness_turns=args.witness_turns,
    )  # fmt: skip
    try:
        report = asyncio.run(run(opts))
    except ValueError as exc:
        print(f"fuzz: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    summary = report["summary"]
    assert isinstance(summary, dict)
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
