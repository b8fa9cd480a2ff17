"""The asyncio layer: WebSocket connections in, session effects out.

The only module that imports ``websockets``. Each connection owns a
:class:`server.session.Session` and runs its effects: outgoing frames go through one
queue and one writer task (so they leave in exactly the order the session decided),
blocking inference goes to the runtime's worker threads, and each turn is one task.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import http
import json
import logging
import os
import re
import secrets
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol, cast

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidHandshake, TooManyHeaders
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol
from websockets.streams import StreamReader
from websockets.typing import Subprotocol

from model.engine import ChatMessage
from model.tools import Tool

from . import auth, metrics, realtime
from . import protocol as p
from .auth import AuthConfig
from .lifecycle import Lifecycle, ReplyEnded
from .metrics import ServerMetrics
from .realtime import Emit, Out, Realtime
from .resume import ResumeStore
from .runtime import Runtime, WorkerKind
from .session import (
    AudioBytes,
    AudioWritten,
    CancelTurn,
    Close,
    Disconnected,
    Effect,
    Event,
    Expired,
    PartialTranscript,
    ReleaseTurn,
    ReplyAudio,
    ReplyFinished,
    RunVad,
    Send,
    SendAudio,
    Session,
    SessionConfig,
    StartPartial,
    StartTurn,
    State,
    VadResult,
    WarmNext,
)
from .store import Parking, RedisStore, TextBudget
from .turn import Pacing, run_turn

log = logging.getLogger("quicksilver")

MAX_FRAME_BYTES = 256 * 1024  # websockets closes with 1009 above this
# A handshake request's headers, held in memory until it is answered: websockets
# allows 128 lines of 8 KiB each; 32 is twice what browsers and OpenAI's SDK send.
MAX_HEADERS = 32
MAX_HEADER_LINE_BYTES = 8 * 1024  # a Cookie or a subprotocol with a client token fits


@dataclass(frozen=True)
class Limits:
    """What one server process allows (docs/security.md, "Limits", says why each)."""

    max_sessions: int = 100  # open sessions; over it: close 1013 with a retry hint
    max_sessions_per_address: int = 20  # one car fleet's NAT may share an address
    # With API keys: open sessions of one key (and the client tokens it minted), across
    # the fleet with --store redis://; 0: no limit of its own (max_sessions holds).
    max_sessions_per_key: int = 0
    # With API keys: `text` messages of one key a minute, all its sessions together
    # (across the fleet with --store redis://); 0: only each session's own rate.
    text_per_minute_per_key: int = 0
    # Connections accepted and not yet answered (each may hold MAX_HEADERS x
    # MAX_HEADER_LINE_BYTES until handshake_timeout_s), in all, and from one address
    # as many as it may have sessions (max_sessions_per_address: behind a load
    # balancer, raising that raises both); over either a new connection gets a 503 at
    # once, before its request is read.
    max_handshakes: int = 64
    handshake_timeout_s: float = 5.0  # from accept (and TLS) to the request answered
    start_timeout_s: float = 10.0  # an open socket that never sends start
    max_session_s: float = 4 * 3600.0  # then closed with 4005; its token resumes it
    outbox_messages: int = 512  # queued frames to one client (~50 s of paced audio)
    # A client that falls this far behind real time reading reply audio is closed
    # (4003) instead of holding server memory and its turn's place.
    max_audio_backlog_s: float = 5.0
    shutdown_grace_s: float = 10.0  # SIGTERM: in-flight turns may finish this long
    # The kernel's send buffer per connection. Linux grows it to megabytes for a client
    # that stops reading, and audio in it counts as sent though nobody heard it; 64 KiB
    # is 0.7-4 s of reply audio (48-8 kHz), far above one round trip of a slow link.
    socket_send_buffer: int = 64 * 1024


@dataclass(frozen=True)
class ServerConfig:
    session: SessionConfig = field(default_factory=SessionConfig)
    pacing: Pacing = field(default_factory=Pacing)
    resume_ttl_s: float = 120.0  # how long a dropped session's conversation is kept
    limits: Limits = field(default_factory=Limits)
    # where parked conversations are saved on shutdown and restored from on start: a
    # file of its own directory, which is kept private (0700, the file 0600)
    resume_file: Path | None = None
    auth: AuthConfig = field(default_factory=AuthConfig)  # docs/security.md
    tls: ssl.SSLContext | None = None
    # "memory": conversations park in this process; redis://HOST:PORT/DB: in the
    # fleet's Redis (server/store.py), under this node's id ("": hostname:port)
    store: str = "memory"
    node_id: str = ""


_CLOSE = object()
_RETRY_AFTER_S = 10


@dataclass(frozen=True)
class _Frame:
    """A frame of reply audio on its way to the client."""

    turn_id: int
    sentence: int
    samples: int
    data: str | bytes


class Wire(Protocol):
    """A wire protocol over the session: client frames in, frames to send out."""

    def open(self, now: float) -> Sequence[Out]: ...

    def receive(self, frame: str | bytes, now: float) -> Sequence[Out]: ...

    def encode(self, message: p.ServerMessage) -> list[str]: ...

    def lifecycle(self, event: Lifecycle) -> list[str]: ...

    def audio(self, effect: SendAudio) -> str | bytes: ...


class VoiceWire:
    """Protocol v1 (server/protocol.py): the client starts the session; audio is binary."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def open(self, now: float) -> list[Effect]:
        return []

    def receive(self, frame: str | bytes, now: float) -> list[Effect]:
        if isinstance(frame, bytes):
            return self.session.receive(AudioBytes(frame), now)
        try:
            message = p.decode_client(frame)
        except p.ProtocolError as err:
            return self.session.protocol_error(err)
        return self.session.receive(message, now)

    def encode(self, message: p.ServerMessage) -> list[str]:
        return [p.encode(message)]

    def lifecycle(self, event: Lifecycle) -> list[str]:
        """v1 has a message for each of these (sent beside them): nothing to add."""
        return []

    def audio(self, effect: SendAudio) -> bytes:
        return p.pack_audio(effect.turn_id, effect.seq, effect.pcm)


class Connection:
    def __init__(
        self,
        ws: ServerConnection,
        rt: Runtime,
        config: ServerConfig,
        resume: ResumeStore | None,
        metrics: ServerMetrics | None = None,
        realtime_model: str | None = None,
        preset: dict[str, Any] | None = None,
        shared: RedisStore | None = None,
        owner: str = auth.OPEN_OWNER,
        texts: TextBudget | None = None,
    ) -> None:
        """``realtime_model`` set: the client speaks OpenAI Realtime (server/realtime.py)
        and named that model; its conversations are not parked (it has no resume).
        ``preset``: the session config of the client secret it connected with.
        ``shared``: the fleet's store; the session then parks in a store of its own,
        which :class:`Parking` fills and writes out. ``owner``: whose the connection
        is (auth.Accepted.owner); ``texts``: the text budget of each key."""
        self.ws = ws
        self.rt = rt
        self.config = config
        self.metrics = metrics
        names = (rt.asr_name, rt.reply.name)
        token = secrets.token_urlsafe(18)
        self.parking: Parking | None = None
        if realtime_model is not None:
            resume = None
        elif shared is not None and config.resume_ttl_s > 0:
            resume = ResumeStore(config.resume_ttl_s).for_owner(owner)
            self.parking = Parking(shared, owner, token)
        self.resume = resume
        self.shared = shared
        self.owner = owner
        self.texts = texts
        self.session = Session(
            uuid.uuid4().hex[:12],
            config.session,
            *names,
            resume,
            token,
            can_act=rt.reply.supports_tools,
            scored=rt.turn_end is not None,
        )
        self.wire: Wire = (
            VoiceWire(self.session)
            if realtime_model is None
            else Realtime(self.session, rt.asr_name, realtime_model, preset, rt.max_reply_tokens)
        )
        self.vad_state = rt.vad.new_state()
        self.loop = asyncio.get_running_loop()
        # Bounded: a client that stops reading is closed, never buffered without end.
        self.outbox: asyncio.Queue[str | bytes | _Frame | Close | object] = asyncio.Queue(
            config.limits.outbox_messages + 1  # + room for the final close
        )
        # A turn's audio (what was queued, written, whether it still plays) is the
        # session's to keep (Session.plays, .unwritten_s); here: its task, and how long
        # the turn now writing waited on the client.
        self.turns: dict[int, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self.tasks: set[asyncio.Task[object]] = set()
        self.behind: tuple[int, float] = (0, 0.0)  # turn, seconds it waited on the client
        self.write_waiters: list[asyncio.Future[None]] = []  # woken by each frame written
        self.aborted = False
        self.closed = asyncio.Event()  # run() has returned
        self._warming = threading.Event()  # set: the next turn's prefill stops (WarmNext)

    async def run(self) -> None:
        log.info("session %s connected from %s", self.session.id, self.ws.remote_address)
        writer = asyncio.create_task(self._write())
        limits = self.config.limits
        timers = [
            self.loop.call_later(limits.start_timeout_s, self._start_overdue),
            self.loop.call_later(
                limits.max_session_s,
                self.expire,
                p.CloseCode.SESSION_TOO_LONG,
                f"session length limit ({limits.max_session_s:.0f} s); resume with your token",
            ),
        ]
        try:
            await self.apply(self.wire.open(self.loop.time()))
            async for frame in self.ws:
                if not await self._through_store(frame):
                    continue
                # After the session closed, frames are still read (and dropped) until the
                # client answers the close: unread frames would hold the connection, and
                # its slot, until websockets' close timeout.
                if self.session.state is not State.CLOSED:
                    await self.apply(self.wire.receive(frame, self.loop.time()))
        except ConnectionClosed:
            pass
        finally:
            for timer in timers:
                timer.cancel()
            await self.apply(self.session.receive(Disconnected(), self.loop.time()))
            self._warming.set()
            for task in [*self.tasks, *(t for t, _ in self.turns.values())]:
                task.cancel()
            for task in [*self.tasks, *(t for t, _ in self.turns.values())]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self.parking is not None:
                await self.parking.close(self.session.conversation, self.session.pending)
            self._put(_CLOSE, force=True)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
            self.closed.set()
            log.info("session %s closed", self.session.id)

    def _start_overdue(self) -> None:
        if self.session.state is State.IDLE:
            limit = self.config.limits.start_timeout_s
            self.expire(p.CloseCode.START_TIMEOUT, f"no start message within {limit:g} s")

    def expire(self, code: int, reason: str) -> None:
        """End the session from outside its receive loop (a limit, shutdown)."""
        self._spawn(self.apply(self.session.receive(Expired(code, reason), self.loop.time())))

    async def deliver(self, event: Event) -> None:
        if isinstance(event, ReplyFinished):
            await self._drained(event.turn_id)  # the history keeps only written words
        await self.apply(self.session.receive(event, self.loop.time()))
        if isinstance(event, ReplyAudio):
            await self._keep_up(event.turn_id)

    async def apply(self, effects: Sequence[Out]) -> None:
        for effect in effects:
            match effect:
                case Emit(text=text):
                    self._put(text)
                case Send(message=message):
                    for text in self.wire.encode(message):
                        self._put(text)
                    if self.metrics is not None:
                        self.metrics.sent(message)
                    if isinstance(message, p.Metrics):
                        log.info("metrics %s %s", self.session.id, p.encode(message))
                case SendAudio(turn_id=turn_id, pcm=pcm, sentence=sentence):
                    samples = len(pcm) // 2
                    self._put(_Frame(turn_id, sentence, samples, self.wire.audio(effect)))
                case Lifecycle():
                    if self.parking is not None and _completes(effect):
                        await self.parking.written(self.session.conversation, self.session.pending)
                    for text in self.wire.lifecycle(effect):
                        self._put(text)
                case RunVad(samples=samples):
                    # a chunk that completes no frame is kept here: the hand-off to the
                    # VAD thread and back costs more than the model's frame (~0.3 against
                    # ~0.2 ms) and holds the GIL; the model itself stays off the loop
                    probs = self.rt.vad.held(self.vad_state, samples)
                    if probs is None:
                        probs = await self.rt.worker(WorkerKind.VAD).run(
                            self.rt.vad.process, self.vad_state, samples
                        )
                    await self.deliver(VadResult(samples, probs))
                case StartPartial():
                    self._spawn(self._partial(effect))
                case StartTurn():
                    self._warming.set()  # the turn prefills the rest itself
                    released = asyncio.Event()
                    task = asyncio.create_task(
                        run_turn(self.rt, effect, released, self.deliver, self.config.pacing)
                    )
                    self.turns[effect.turn_id] = (task, released)
                    task.add_done_callback(functools.partial(self._forget_turn, effect.turn_id))
                case ReleaseTurn(turn_id=turn_id):
                    # a turn whose transcript came back empty may have ended already
                    if (entry := self.turns.get(turn_id)) is not None:
                        entry[1].set()
                case WarmNext(history=history, tools=tools):
                    self._warming.set()
                    self._warming = threading.Event()
                    self._spawn(self._warm(history, tools, self._warming))
                case CancelTurn(turn_id=turn_id):  # its queued audio no longer plays
                    await self._cancel(turn_id)
                case Close(code=code):
                    if self.metrics is not None:
                        self.metrics.closes.labels(str(code)).inc()
                    if self.aborted:  # the outbox is stuck: close past it
                        self._spawn(self.ws.close(effect.code, effect.reason))
                    else:
                        self._put(effect, force=True)
        if self.parking is not None:
            self.parking.changed(self.session.conversation, self.session.pending)

    # -- the fleet's store (server/store.py); nothing else here touches Redis --

    async def _through_store(self, frame: str | bytes) -> bool:
        """The fleet's say on a client frame before the session sees it: a resuming
        ``start`` first takes its conversation from the store, a ``text`` counts in its
        key's budget. False: the frame was answered here; the session never sees it."""
        if (self.parking is None and self.texts is None) or not isinstance(frame, str):
            return True
        try:
            message = p.decode_client(frame)
        except p.ProtocolError:
            return True  # the session answers it (or it is the Realtime codec's)
        if isinstance(message, p.Start) and self.session.state is State.IDLE:
            return await self._unparked(message)
        if isinstance(message, p.Text) and self.session.state is not State.IDLE:
            return await self._text_allowed()
        return True

    async def _text_allowed(self) -> bool:
        """A ``text`` message within its key's budget (:class:`TextBudget`, counted
        across the fleet), or answered ``rate_limited``."""
        if self.texts is None or self.session.state is State.CLOSED:
            return True
        fleet = self.shared.fleet if self.shared is not None else None
        if self.texts.allow(self.owner, fleet):
            return True
        n = self.texts.per_minute
        await self.apply([Send(p.Error("rate_limited", f"{_PER_KEY_TEXT} ({n} a minute)"))])
        return False

    async def _unparked(self, start: p.Start) -> bool:
        """The conversation a resume token names is taken from the fleet's store into
        the session's own store, where the session takes it as it would on one node;
        or answered ``resume_unavailable`` while Redis is down."""
        if self.parking is None:
            return True
        self.session.resume_token = self.parking.begin()
        if start.resume_token is None or self.resume is None:
            return True
        try:
            parked = await self.parking.store.take(start.resume_token, self.owner)
        except p.ProtocolError as err:
            if err.code != "resume_unavailable":
                return True  # the session answers bad_resume_token itself
            await self.apply([Send(p.Error(err.code, err.message))])
            return False
        self.resume.park(start.resume_token, parked.conversation, self.loop.time(), parked.pending)
        return True

    def _put(self, item: object, force: bool = False) -> None:
        """Queue a frame for the writer; a full outbox means the client stopped reading."""
        if self.aborted and item is not _CLOSE:
            return
        if self.outbox.full() and not force:
            self._abort("stopped reading (outbox full)")
            return
        if self.outbox.full():  # the close itself: make room, the client reads nothing
            self.outbox.get_nowait()
        self.outbox.put_nowait(item)

    def _abort(self, why: str) -> None:
        """Close a client that does not keep up, without waiting for it to read."""
        if self.aborted:
            return
        log.warning("session %s: closing a slow client: %s", self.session.id, why)
        self.aborted = True
        while not self.outbox.empty():
            self.outbox.get_nowait()
        self._wake_writers()
        self.expire(p.CloseCode.SLOW_CONSUMER, f"client too slow: {why}")

    async def _keep_up(self, turn_id: int) -> None:
        """Pace a turn's audio by what the client has taken, not only by the clock: wait
        while more than the pacing lead is queued."""
        while self.session.unwritten_s(turn_id) > self.config.pacing.lead_ms / 1000:
            if not await self._wait_for_client(turn_id):
                return

    async def _drained(self, turn_id: int) -> None:
        """Wait until every queued frame of the turn is written (or dropped)."""
        while self.session.unwritten_s(turn_id) > 0:
            if not await self._wait_for_client(turn_id):
                return

    async def _wait_for_client(self, turn_id: int) -> bool:
        """Wait for the writer to hand the client a frame. The time a turn spends
        waiting on its client adds up to how far the client is behind real time (the
        turn itself is paced at real time); past max_audio_backlog_s the client is
        closed. False: closed, stop waiting."""
        if self.aborted:
            return False
        t0 = self.loop.time()
        waiter = self.loop.create_future()
        self.write_waiters.append(waiter)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, 0.25)
        turn, behind = self.behind
        stalled = (behind if turn == turn_id else 0.0) + self.loop.time() - t0
        self.behind = (turn_id, stalled)
        limit = self.config.limits.max_audio_backlog_s
        if stalled > limit:
            self._abort(f"more than {limit:g} s behind real time")
            return False
        return True

    def _wake_writers(self) -> None:
        """A frame was written or dropped: the turns waiting on the client look again."""
        waiters, self.write_waiters = self.write_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _forget_turn(self, turn_id: int, task: asyncio.Task[None]) -> None:
        entry = self.turns.get(turn_id)
        if entry is not None and entry[0] is task:
            del self.turns[turn_id]

    async def _cancel(self, turn_id: int) -> None:
        entry = self.turns.pop(turn_id, None)
        if entry is None:
            return
        task = entry[0]
        task.cancel()
        if task is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _spawn(self, coro: Awaitable[object]) -> None:
        task: asyncio.Task[object] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _warm(
        self, history: tuple[ChatMessage, ...], tools: tuple[Tool, ...], stop: threading.Event
    ) -> None:
        """Prefill the next turn's prompt (WarmNext); a failure (the cache pool full,
        say) costs the next turn its prefill, nothing else."""
        try:
            n = await self.rt.warm_next(history, tools, stop)
        except Exception as exc:
            log.warning("prefilling session %s's next turn failed: %s", self.session.id, exc)
            return
        if n:
            log.debug("session %s's next turn: %d tokens prefilled", self.session.id, n)

    async def _partial(self, job: StartPartial) -> None:
        """At most one per session; skipped while other work needs the ASR worker or,
        on a CPU host, the cores (Runtime.partial_now)."""
        text: str | None = None
        if self.rt.partial_now():
            worker = self.rt.worker(WorkerKind.ASR)
            text = (await worker.run(self.rt.asr.transcribe, job.audio)).text
        await self.deliver(PartialTranscript(job.turn_id, text))

    async def _write(self) -> None:
        while (item := await self.outbox.get()) is not _CLOSE:
            try:
                match item:
                    case Close(code=code, reason=reason):
                        await self.ws.close(code, reason)
                        return
                    case _Frame(turn_id=turn_id) if not self.session.plays(turn_id):
                        self._wake_writers()  # barged in: never sent
                    case _Frame():
                        await self.ws.send(item.data)
                        written = AudioWritten(item.turn_id, item.sentence, item.samples)
                        effects = self.session.receive(written, self.loop.time())
                        self._wake_writers()  # the ledger has counted it
                        await self.apply(effects)
                    case str() | bytes():
                        await self.ws.send(item)
            except ConnectionClosed:
                return


WEB_ROOT = Path(__file__).resolve().parent.parent / "clients" / "web"
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
}
_WEB_NAME = re.compile(r"^/web/([A-Za-z0-9_-]+\.[a-z]+)$")


def web_file(path: str) -> Path | None:
    """The demo page's files: ``/`` and ``/web/NAME``, never anything outside the folder."""
    name = "index.html" if path == "/" else (m.group(1) if (m := _WEB_NAME.match(path)) else None)
    if name is None or Path(name).suffix not in _CONTENT_TYPES:
        return None
    file = WEB_ROOT / name
    return file if file.is_file() else None


def _completes(event: Lifecycle) -> bool:
    """A reply that is done and joins the conversation: the fleet's store writes it
    before the client hears of it (Parking.written)."""
    return isinstance(event, ReplyEnded) and event.status == "completed" and event.keep


def _file_response(connection: ServerConnection, file: Path) -> Response:
    response = connection.respond(http.HTTPStatus.OK, file.read_text("utf-8"))
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = _CONTENT_TYPES[file.suffix]
    response.headers["Cache-Control"] = "no-cache"
    return response


class LagMonitor:
    """Event-loop lag: how late a 10 ms sleep wakes up, over the last ~5 minutes."""

    def __init__(self, interval_s: float = 0.01, window: int = 30_000) -> None:
        self.interval_s = interval_s
        self.samples: collections.deque[float] = collections.deque(maxlen=window)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.interval_s)
            self.samples.append(max(0.0, loop.time() - t0 - self.interval_s))

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {}
        lag = sorted(self.samples)

        def pick(q: float) -> float:
            return round(lag[min(len(lag) - 1, int(q * len(lag)))] * 1000, 2)

        return {"p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": pick(1.0), "n": len(lag)}


class Handshakes:
    """Connections accepted whose opening handshake is not answered yet, in all and
    per address. Each may hold a request's headers until the handshake timeout, so
    both counts are capped when the connection is accepted, before anything is read."""

    def __init__(self, limit: int, per_address: int) -> None:
        self.limit = limit
        self.per_address = per_address
        self.refused = 0  # connections turned away at accept, since the start
        self._by_address: collections.Counter[str] = collections.Counter()

    @property
    def in_flight(self) -> int:
        return self._by_address.total()

    def open(self, address: str) -> str | None:
        """Count a new connection in; why it is refused (a metrics reason), or None."""
        if self.in_flight >= self.limit:
            reason = "handshakes"
        elif self._by_address[address] >= self.per_address:
            reason = "handshakes_per_address"
        else:
            self._by_address[address] += 1
            return None
        self.refused += 1
        return reason

    def done(self, address: str) -> None:
        self._by_address[address] -= 1
        if self._by_address[address] <= 0:
            del self._by_address[address]


class _Opening(NamedTuple):
    """A voice handshake that was answered 101, until its handler runs."""

    address: str
    owner: str  # auth.Accepted.owner
    refused: tuple[int, str] | None  # close code and reason: the session is refused


@dataclass
class App:
    """Shared by every connection: the runtime, the config, live counters."""

    rt: Runtime
    config: ServerConfig
    lag: LagMonitor = field(default_factory=LagMonitor)
    sessions: set[Connection] = field(default_factory=set)
    resume: ResumeStore | None = field(init=False)  # the in-process store
    shared: RedisStore | None = field(init=False)  # the fleet's store (--store redis://)
    texts: TextBudget | None = field(init=False)  # text messages per key (a limit)
    metrics: ServerMetrics = field(init=False)
    closing: bool = False  # shutting down: new connections are refused
    authenticator: auth.Authenticator = field(init=False)
    minting: auth.Minting = field(init=False)
    handshakes: Handshakes = field(init=False)
    # handshakes accepted with a client secret that carries a session config
    _preset_of: weakref.WeakKeyDictionary[ServerConnection, dict[str, Any]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    # Admitted, not yet handled: they count as sessions, so a session that was let
    # in (its client token used up) is never refused for room a moment later.
    _opening: dict[ServerConnection, _Opening] = field(default_factory=dict)
    _per_address: collections.Counter[str] = field(default_factory=collections.Counter)
    _per_owner: collections.Counter[str] = field(default_factory=collections.Counter)
    _beating: asyncio.Task[None] | None = None  # the store's heartbeat

    def __post_init__(self) -> None:
        self.authenticator = auth.Authenticator(self.config.auth)
        self.minting = auth.Minting.of(self.config.auth)
        limits = self.config.limits
        per_address = min(limits.max_handshakes, limits.max_sessions_per_address)
        self.handshakes = Handshakes(limits.max_handshakes, per_address)
        ttl = self.config.resume_ttl_s
        self.shared = None
        if self.config.store != "memory":
            self.shared = RedisStore(self.config.store, self.config.node_id, ttl)
        self.resume = ResumeStore(ttl) if ttl > 0 and self.shared is None else None
        per_key = self.config.limits.text_per_minute_per_key
        self.texts = TextBudget(per_key) if per_key > 0 else None
        self.metrics = ServerMetrics(
            sessions=lambda: len(self.sessions),
            resumable=lambda: len(self.resume) if self.resume is not None else 0,
            queued=lambda: {k.value: w.pending for k, w in self.rt.workers.items()},
            handshakes=lambda: self.handshakes.in_flight,
            store_up=lambda: self.shared is None or self.shared.ok,
        )

    # -- the connection's life before its session (BodyConnection reports here) --

    def accepted(self, address: str) -> bool:
        """A connection was accepted: whether it may send its request."""
        if (reason := self.handshakes.open(address)) is None:
            return True
        self.metrics.rejected.labels(reason).inc()
        return False

    def answered(self, address: str) -> None:
        """A counted connection's handshake is over (answered, timed out, or gone)."""
        self.handshakes.done(address)

    def lost(self, connection: ServerConnection) -> None:
        self._opening.pop(connection, None)  # admitted, but never got to its handler

    def may_mint(self, headers: list[tuple[str, str]]) -> bool:
        """Whether a mint request's body is worth reading: it carries an API key."""
        return auth.minting_key(self.config.auth, headers) is not None

    # -- requests --

    def route(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == p.PATH:
            return self._admit(connection, request, "voice")
        if path == realtime.PATH:
            return self._admit(connection, request, "realtime")
        headers = list(request.headers.raw_items())
        refused = self.authenticator.http_access(path, headers, _peer(connection))
        if refused is not None:
            self.metrics.rejected.labels(refused.error).inc()
            return _json_response(connection, refused.reply())
        if path in auth.MINT_PATHS:
            if isinstance(connection, BodyConnection) and connection.bad_body is not None:
                return _json_response(connection, connection.bad_body)
            payload = connection.body if isinstance(connection, BodyConnection) else b""
            reply = auth.mint_response(
                self.config.auth,
                request.method,
                request.path,
                headers,
                payload,
                time.time(),
                self.minting,
                self._check_session,
            )
            return _json_response(connection, reply)
        if path == "/healthz":
            if self.shared is None:
                return connection.respond(http.HTTPStatus.OK, "ok\n")
            health = {"status": "ok", "store": "redis", "store_ok": self.shared.ok}
            return connection.respond(http.HTTPStatus.OK, json.dumps(health) + "\n")
        if path == "/readyz":
            if (why := self.unready()) is None:
                return connection.respond(http.HTTPStatus.OK, "ready\n")
            body = json.dumps({"ready": False, "reason": why})
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, body + "\n")
        if path == "/stats":
            return connection.respond(http.HTTPStatus.OK, json.dumps(self.stats()) + "\n")
        if path == "/metrics":
            response = connection.respond(http.HTTPStatus.OK, "")
            return _with_body(response, self.metrics.exposition(), metrics.CONTENT_TYPE)
        if (page := web_file(path)) is not None:
            return _file_response(connection, page)
        endpoints = f"the voice endpoints are {p.PATH} and {realtime.PATH}"
        body = json.dumps({"error": "not_found", "message": endpoints})
        return connection.respond(http.HTTPStatus.NOT_FOUND, body + "\n")

    def _admit(self, connection: ServerConnection, request: Request, scope: str) -> Response | None:
        """A voice endpoint's handshake: a WebSocket upgrade, credentials and origin
        (server/auth.py), room for the session. A client token is used up last, once
        nothing else refuses the connection, so a failed try leaves it good."""
        try:
            connection.protocol.process_request(request)
        except InvalidHandshake:
            return None  # websockets' accept() answers it: 426 no upgrade, 400 ...
        peer = _peer(connection)
        now = time.time()
        headers = list(request.headers.raw_items())
        decision = self.authenticator.check(request.path, headers, peer, now, scope)
        owner = decision.owner if isinstance(decision, auth.Accepted) else auth.OPEN_OWNER
        room = self.refusal(peer, owner)
        if isinstance(decision, auth.Accepted) and room is None:
            decision = self.authenticator.claim(decision, now)
        if isinstance(decision, auth.Rejected):
            self.metrics.rejected.labels(decision.error).inc()
            log.warning("refused a handshake from %s: %s", peer, decision.error)
            return _json_response(connection, decision.reply())
        log.info("handshake from %s accepted: %s", peer, decision.describe())
        self._opening[connection] = _Opening(peer, decision.owner, room)
        token = decision.token if room is None else None  # a refused one keeps its preset
        if token is not None and (preset := self.minting.presets.take(token.id)):
            self._preset_of[connection] = preset
        return None

    def _check_session(self, session: dict[str, Any]) -> str | None:
        return realtime.check_session(session, self.rt.asr_name, self.config.session.endpoint)

    def stats(self) -> dict[str, object]:
        pending = {kind.value: w.pending for kind, w in self.rt.workers.items()}
        return {
            "sessions": len(self.sessions),
            "resumable": len(self.resume) if self.resume is not None else 0,
            "handshakes": {
                "in_flight": self.handshakes.in_flight,
                "refused": self.handshakes.refused,
            },
            **({"store": self.shared.stats()} if self.shared is not None else {}),
            "loop_lag": self.lag.summary(),
            "queued": pending,
            "tasks": len(asyncio.all_tasks()),
            "final_transcripts": self.rt.finals(),
            "second_hearings": self.rt.finals(again=True),
            "partial_transcripts": dict(self.rt.partials),
            **({"reply_passes": passes} if (passes := self.rt.passes()) is not None else {}),
        }

    def unready(self) -> str | None:
        """Why a balancer should send this node no new sessions (/readyz), or None.
        A node still loading its models is not listening yet."""
        if self.closing:
            return "draining"
        let_in = sum(1 for o in self._opening.values() if o.refused is None)
        if len(self.sessions) + let_in >= self.config.limits.max_sessions:
            return "full"
        return None

    def registry_entry(self) -> dict[str, object]:
        """This node in the fleet's registry (server/store.py), beat every second."""
        return {
            "sessions": len(self.sessions),
            "draining": self.closing,
            "addresses": dict(self._per_address),
            "owners": dict(self._per_owner),  # API key fingerprints (auth.owner_of)
            "texts": self.texts.report() if self.texts is not None else {},
        }

    async def start_store(self, node_id: str) -> None:
        """Join the fleet's registry (one beat, bounded by the store's timeouts, so a
        node whose Redis is down still starts) and keep beating in the background."""
        if self.shared is None:
            return
        self.shared.node_id = self.config.node_id or node_id
        await self.shared.beat(self.registry_entry())
        self._beating = asyncio.create_task(self.shared.run(self.registry_entry))

    async def stop_store(self) -> None:
        if self.shared is None:
            return
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating
        await self.shared.leave()

    def refusal(self, address: str, owner: str = auth.OPEN_OWNER) -> tuple[int, str] | None:
        """Why a new connection from ``address`` of ``owner`` is refused (close code,
        reason). Per address and per key, the other nodes of a fleet count too."""
        limits = self.config.limits
        let_in = [o.address for o in self._opening.values() if o.refused is None]
        owners = [o.owner for o in self._opening.values() if o.refused is None]
        if self.closing:
            return p.CloseCode.GOING_AWAY, "server shutting down; reconnect in a moment"
        if len(self.sessions) + len(let_in) >= limits.max_sessions:
            return (
                p.CloseCode.TRY_AGAIN_LATER,
                f"server full ({limits.max_sessions} sessions); retry in {_RETRY_AFTER_S} s",
            )
        # the fleet's other nodes, as their last heartbeats said (none while Redis is down)
        elsewhere = self.shared.fleet.addresses[address] if self.shared is not None else 0
        here = self._per_address[address] + let_in.count(address)
        if here + elsewhere >= limits.max_sessions_per_address:
            n = limits.max_sessions_per_address
            return p.CloseCode.POLICY_VIOLATION, f"too many connections from your address ({n})"
        if (n := limits.max_sessions_per_key) and owner != auth.OPEN_OWNER:
            elsewhere = self.shared.fleet.owners[owner] if self.shared is not None else 0
            if self._per_owner[owner] + owners.count(owner) + elsewhere >= n:
                return p.CloseCode.POLICY_VIOLATION, f"{_PER_KEY} ({n})"
        return None

    async def handle(self, ws: ServerConnection) -> None:
        address = str(ws.remote_address[0]) if ws.remote_address else "?"
        opening = self._opening.pop(ws, None)
        if opening is None:  # gone before its handler ran (lost() dropped it)
            opening = _Opening(address, "", (p.CloseCode.POLICY_VIOLATION, "not admitted"))
        if (refused := opening.refused or self.refusal(address, opening.owner)) is not None:
            code, reason = refused
            label = "per_key" if reason.startswith(_PER_KEY) else _REJECTED.get(code)
            self.metrics.rejected.labels(label or "not_admitted").inc()
            log.warning("refused a connection from %s: %s", address, reason)
            await ws.close(code, reason)
            return
        sock = ws.transport.get_extra_info("socket")
        if sock is not None and self.config.limits.socket_send_buffer:
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.limits.socket_send_buffer
            )
        model = _realtime_model(ws.request.path) if ws.request is not None else None
        preset = self._preset_of.pop(ws, None)
        resume = self.resume.for_owner(opening.owner) if self.resume is not None else None
        connection = Connection(
            ws,
            self.rt,
            self.config,
            resume,
            self.metrics,
            model,
            preset,
            self.shared,
            opening.owner,
            self.texts if opening.owner != auth.OPEN_OWNER else None,
        )
        self.sessions.add(connection)
        self._per_address[address] += 1
        self._per_owner[opening.owner] += 1
        try:
            await connection.run()
        finally:
            self.sessions.discard(connection)
            for counts, counted in ((self._per_address, address), (self._per_owner, opening.owner)):
                counts[counted] -= 1
                if not counts[counted]:
                    del counts[counted]

    async def drain(self, grace_s: float) -> None:
        """Shutdown: let the turns in flight finish (up to ``grace_s``), then end every
        session with 1001; their conversations are parked for resumption."""
        self.closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while (turns := [t for c in self.sessions for t, _ in c.turns.values()]) and (
            left := deadline - loop.time()
        ) > 0:
            await asyncio.wait(turns, timeout=left)
        closing = [asyncio.create_task(c.closed.wait()) for c in self.sessions]
        for connection in list(self.sessions):
            connection.expire(p.CloseCode.GOING_AWAY, "server shutting down")
        if closing:
            await asyncio.wait(closing, timeout=5)
        for task in closing:
            task.cancel()

    def save_resumable(self, now: float) -> None:
        """Write the parked conversations (live resume tokens, transcripts) where only
        this user can read them: the file 0600 from its creation, its directory 0700."""
        path = self.config.resume_file
        if path is None or self.resume is None:
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.chmod(0o700)  # the resume file's own directory (ServerConfig)
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)  # O_EXCL below: never write through what was there
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(self.resume.dump(now, time.time())))
        tmp.replace(path)  # atomic: a crash never leaves half a file
        log.info("saved %d resumable conversation(s) to %s", len(self.resume), path)

    def load_resumable(self, now: float) -> None:
        path = self.config.resume_file
        if path is None or self.resume is None or not path.is_file():
            return
        try:
            n = self.resume.load(json.loads(path.read_text()), now, time.time())
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring %s: not a resumable-sessions file (%s)", path, exc)
            return
        log.info("restored %d resumable conversation(s) from %s", n, path)


def _realtime_model(path_query: str) -> str | None:
    """The model a Realtime client named (``?model=``, echoed back), None on /v1/voice."""
    path, _, query = path_query.partition("?")
    if path != realtime.PATH:
        return None
    named = urllib.parse.parse_qs(query).get("model", [realtime.DEFAULT_MODEL])[0]
    return named[: realtime.MAX_ID_CHARS] if p.encodable(named) else realtime.DEFAULT_MODEL


_PER_KEY = "too many sessions for your API key"
_PER_KEY_TEXT = "text: your API key's sessions send too many messages"
_REJECTED: dict[int, str] = {
    p.CloseCode.GOING_AWAY: "shutting_down",
    p.CloseCode.TRY_AGAIN_LATER: "server_full",
    p.CloseCode.POLICY_VIOLATION: "per_address",
}


class _BodyReader(StreamReader):
    """websockets reads no request body (a handshake has none) and refuses a request
    that announces one. A POST to a mint path may carry a JSON body, though (OpenAI's
    SDK sends a client secret's session in one): this reader hides that request's
    Content-Length from websockets and reads the body (at most MAX_MINT_BODY_BYTES)
    once the headers end and ``may_mint`` found an API key in them. A body it does not
    read (no key; a second Content-Length, which RFC 9112 section 6.3 says to reject;
    one too large) it drops as it arrives, and ``bad_body`` says what to answer.
    Every request's header lines are capped in number and length."""

    def __init__(self, may_mint: Callable[[list[tuple[str, str]]], bool] | None = None) -> None:
        super().__init__()
        self.body = b""
        self.bad_body: auth.HttpReply | None = None
        self._may_mint = may_mint
        self._lines = 0
        self._mint = False
        self._length: int | None = None
        self._authorization: list[tuple[str, str]] = []
        self._headers_done = False
        self._dropping = False

    def feed_data(self, data: bytes | bytearray) -> None:
        if not self._dropping:
            super().feed_data(data)

    def read_line(
        self, m: int, too_long_exc_type: type[Exception] = RuntimeError
    ) -> Generator[None, None, bytearray]:
        if self._headers_done:
            return (yield from super().read_line(m, too_long_exc_type))
        line = yield from super().read_line(min(m, MAX_HEADER_LINE_BYTES), too_long_exc_type)
        self._lines += 1
        if not line.strip() and self._lines > 1:
            self._headers_done = True
            yield from self._end_of_headers()
            return line
        if self._lines > MAX_HEADERS + 1:  # + the request line
            raise TooManyHeaders(f"more than {MAX_HEADERS} headers")
        if self._lines == 1:
            method, _, rest = bytes(line).partition(b" ")
            path = rest.split(b" ", 1)[0].split(b"?", 1)[0].decode("ascii", "replace")
            self._mint = method == b"POST" and path in auth.MINT_PATHS
            return line
        if not self._mint:
            return line
        name, _, value = bytes(line).partition(b":")
        match name.strip().lower():
            case b"content-length":
                return self._content_length(value.strip())
            case b"authorization":
                self._authorization.append(("Authorization", value.strip().decode("latin-1")))
        return line

    def _content_length(self, value: bytes) -> bytearray:
        if self._length is not None:
            self._refuse(400, "conflicting Content-Length headers")
        elif not value.isdigit():
            self._refuse(400, "Content-Length is not a number")
        elif int(value) > auth.MAX_MINT_BODY_BYTES:
            self._refuse(413, f"the body is over {auth.MAX_MINT_BODY_BYTES} bytes", "too_large")
        self._length = int(value) if value.isdigit() else 0
        return bytearray(b"X-Quicksilver-Body: read\r\n")

    def _refuse(self, status: int, message: str, code: str = "bad_request") -> None:
        if self.bad_body is None:
            self.bad_body = auth.Rejected(status, code, message).reply()

    def _end_of_headers(self) -> Generator[None, None, None]:
        if self.bad_body is None:
            if not self._length:
                return
            if self._may_mint is None or self._may_mint(self._authorization):
                self.body = bytes((yield from self.read_exact(self._length)))
                return
        # Unread bytes would be parsed as WebSocket frames; none of them is kept.
        self._dropping = True
        del self.buffer[:]


class BodyConnection(ServerConnection):
    """websockets' server connection, counted from the moment it is accepted until its
    handshake is answered (:class:`Handshakes`, through ``app``), and reading a mint
    request's body (:class:`_BodyReader`)."""

    app: ClassVar[App | None] = None  # set by :meth:`of`

    def __init__(self, protocol: ServerProtocol, *args: Any, **kwargs: Any) -> None:
        reader = _BodyReader(self.app.may_mint if self.app is not None else None)
        # Nothing has been received yet: the request parser starts over on this reader.
        protocol.reader = reader
        protocol.parser = protocol.parse()
        next(protocol.parser)
        self._reader = reader
        self._counted = ""  # the peer's address while its handshake is counted
        self._refused = False  # turned away at accept (Handshakes)
        super().__init__(protocol, *args, **kwargs)

    @classmethod
    def of(cls, app: App) -> type[BodyConnection]:
        """This class, its connections reporting to ``app``."""
        return cast(type[BodyConnection], type(cls.__name__, (cls,), {"app": app}))

    @property
    def body(self) -> bytes:
        return self._reader.body

    @property
    def bad_body(self) -> auth.HttpReply | None:
        return self._reader.bad_body

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.app is None:
            return
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else "?"
        if not self.app.accepted(address):
            # A canned answer, and what the client sends is dropped unread until it
            # closes or _LINGER_S passes (closing on unread bytes would reset the
            # connection, and the answer with it).
            self._refused = True
            writer = cast(asyncio.WriteTransport, transport)
            writer.write(_BUSY)
            if writer.can_write_eof():
                writer.write_eof()
            self.loop.call_later(_LINGER_S, writer.abort)
            return
        self._counted = address

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)

    def eof_received(self) -> None:
        if not self._refused:
            super().eof_received()

    async def handshake(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().handshake(*args, **kwargs)
        finally:
            self._answered()

    def connection_lost(self, exc: Exception | None) -> None:
        self._answered()
        if self.app is not None:
            self.app.lost(self)
        super().connection_lost(exc)

    def _answered(self) -> None:
        if self._counted and self.app is not None:
            self.app.answered(self._counted)
        self._counted = ""


_LINGER_S = 1.0
_BUSY_BODY = json.dumps({"error": "busy", "message": "too many connections opening; retry"})
_BUSY = (
    "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
    f"Content-Type: application/json\r\nContent-Length: {len(_BUSY_BODY) + 1}\r\n\r\n"
    f"{_BUSY_BODY}\n"
).encode()


def _peer(connection: ServerConnection) -> str:
    return str(connection.remote_address[0]) if connection.remote_address else ""


def _subprotocol(_: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """Browsers pass a client token as a subprotocol and fail the connection unless
    the server picks one they offered (docs/security.md)."""
    chosen = auth.select_subprotocol(offered)
    return Subprotocol(chosen) if chosen is not None else None


def _json_response(connection: ServerConnection, reply: auth.HttpReply) -> Response:
    response = connection.respond(http.HTTPStatus(reply.status), "")
    for name, value in reply.headers:
        response.headers[name] = value
    return _with_body(response, reply.text().encode(), "application/json")


def _with_body(response: Response, body: bytes, content_type: str) -> Response:
    del response.headers["Content-Type"]
    del response.headers["Content-Length"]
    response.headers["Content-Type"] = content_type
    response.headers["Content-Length"] = str(len(body))
    return dataclasses.replace(response, body=body)


async def start_server(
    rt: Runtime, host: str, port: int, config: ServerConfig | None = None
) -> tuple[Server, App]:
    """Start listening; the caller closes the returned server (sessions get 1001)."""
    app = App(rt, config or ServerConfig())
    app.load_resumable(asyncio.get_running_loop().time())
    auth.redact_credentials(logging.getLogger("websockets.server"))
    server = await serve(
        app.handle,
        host,
        port,
        process_request=app.route,
        select_subprotocol=_subprotocol,
        create_connection=BodyConnection.of(app),
        max_size=MAX_FRAME_BYTES,
        # also the TLS handshake's limit (websockets passes it on as ssl_handshake_timeout)
        open_timeout=app.config.limits.handshake_timeout_s,
        ssl=app.config.tls,
    )
    port = server.sockets[0].getsockname()[1]
    await app.start_store(f"{socket.gethostname()}:{port}")
    return server, app


async def run_until(
    rt: Runtime,
    host: str,
    port: int,
    stop: asyncio.Event,
    on_ready: Callable[[str], None],
    config: ServerConfig | None = None,
) -> None:
    server, app = await start_server(rt, host, port, config)
    monitor = asyncio.create_task(app.lag.run())
    sock_host, sock_port = server.sockets[0].getsockname()[:2]
    scheme = "wss" if app.config.tls is not None else "ws"
    on_ready(f"{scheme}://{sock_host}:{sock_port}{p.PATH}")
    await stop.wait()
    grace = app.config.limits.shutdown_grace_s
    log.info(
        "shutting down: %d session(s), up to %.0f s for turns in flight", len(app.sessions), grace
    )
    # Still listening while draining: /readyz answers 503 "draining", so a balancer
    # moves new sessions elsewhere, and a voice handshake is closed with 1001.
    await app.drain(grace)
    server.close()  # whoever is left gets 1001 (going away)
    await server.wait_closed()
    app.save_resumable(asyncio.get_running_loop().time())
    await app.stop_store()
    monitor.cancel()
