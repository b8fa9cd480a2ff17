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
import functools
import http
import json
import logging
import re
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from . import protocol as p
from .resume import ResumeStore
from .runtime import Runtime, WorkerKind
from .session import (
    AudioBytes,
    CancelTurn,
    Close,
    Disconnected,
    Effect,
    Event,
    PartialTranscript,
    ReleaseTurn,
    RunVad,
    Send,
    SendAudio,
    Session,
    SessionConfig,
    StartPartial,
    StartTurn,
    State,
    VadResult,
)
from .turn import Pacing, run_turn

log = logging.getLogger("quicksilver")

MAX_FRAME_BYTES = 256 * 1024  # websockets closes with 1009 above this


@dataclass(frozen=True)
class ServerConfig:
    session: SessionConfig = field(default_factory=SessionConfig)
    pacing: Pacing = field(default_factory=Pacing)
    resume_ttl_s: float = 120.0  # how long a dropped session's conversation is kept


_CLOSE = object()


class Connection:
    def __init__(
        self,
        ws: ServerConnection,
        rt: Runtime,
        config: ServerConfig,
        resume: ResumeStore | None,
    ) -> None:
        self.ws = ws
        self.rt = rt
        self.config = config
        names = (rt.asr_name, rt.reply.name)
        token = secrets.token_urlsafe(18)
        self.session = Session(uuid.uuid4().hex[:12], config.session, *names, resume, token)
        self.vad_state = rt.vad.new_state()
        self.loop = asyncio.get_running_loop()
        self.outbox: asyncio.Queue[str | bytes | Close | object] = asyncio.Queue()
        self.turns: dict[int, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        log.info("session %s connected from %s", self.session.id, self.ws.remote_address)
        writer = asyncio.create_task(self._write())
        try:
            async for frame in self.ws:
                await self.apply(self._receive_frame(frame))
                if self.session.state is State.CLOSED:
                    break
        except ConnectionClosed:
            pass
        finally:
            await self.apply(self.session.receive(Disconnected(), self.loop.time()))
            for task in [*self.tasks, *(t for t, _ in self.turns.values())]:
                task.cancel()
            for task in [*self.tasks, *(t for t, _ in self.turns.values())]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.outbox.put_nowait(_CLOSE)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
            log.info("session %s closed", self.session.id)

    def _receive_frame(self, frame: str | bytes) -> list[Effect]:
        now = self.loop.time()
        if isinstance(frame, bytes):
            return self.session.receive(AudioBytes(frame), now)
        try:
            message = p.decode_client(frame)
        except p.ProtocolError as err:
            return self.session.protocol_error(err)
        return self.session.receive(message, now)

    async def deliver(self, event: Event) -> None:
        await self.apply(self.session.receive(event, self.loop.time()))

    async def apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case Send(message=message):
                    self.outbox.put_nowait(p.encode(message))
                    if isinstance(message, p.Metrics):
                        log.info("metrics %s %s", self.session.id, p.encode(message))
                case SendAudio(turn_id=turn_id, seq=seq, pcm=pcm):
                    self.outbox.put_nowait(p.pack_audio(turn_id, seq, pcm))
                case RunVad(samples=samples):
                    probs = await self.rt.worker(WorkerKind.VAD).run(
                        self.rt.vad.process, self.vad_state, samples
                    )
                    await self.deliver(VadResult(samples, probs))
                case StartPartial():
                    self._spawn(self._partial(effect))
                case StartTurn():
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
                case CancelTurn(turn_id=turn_id):
                    await self._cancel(turn_id)
                case Close():
                    self.outbox.put_nowait(effect)

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

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _partial(self, job: StartPartial) -> None:
        """At most one per session; skipped while the ASR worker has a queue."""
        worker = self.rt.worker(WorkerKind.ASR)
        text: str | None = None
        if worker.pending == 0:
            text = (await worker.run(self.rt.asr.transcribe, job.audio)).text
        await self.deliver(PartialTranscript(job.turn_id, text))

    async def _write(self) -> None:
        while (item := await self.outbox.get()) is not _CLOSE:
            try:
                if isinstance(item, Close):
                    await self.ws.close(item.code, item.reason)
                    return
                assert isinstance(item, str | bytes)
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


@dataclass
class App:
    """Shared by every connection: the runtime, the config, live counters."""

    rt: Runtime
    config: ServerConfig
    lag: LagMonitor = field(default_factory=LagMonitor)
    sessions: set[Connection] = field(default_factory=set)
    resume: ResumeStore | None = field(init=False)

    def __post_init__(self) -> None:
        ttl = self.config.resume_ttl_s
        self.resume = ResumeStore(ttl) if ttl > 0 else None

    def route(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == p.PATH:
            return None
        if path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "ok\n")
        if path == "/stats":
            return connection.respond(http.HTTPStatus.OK, json.dumps(self.stats()) + "\n")
        if (page := web_file(path)) is not None:
            return _file_response(connection, page)
        body = json.dumps({"error": "not_found", "message": f"the voice endpoint is {p.PATH}"})
        return connection.respond(http.HTTPStatus.NOT_FOUND, body + "\n")

    def stats(self) -> dict[str, object]:
        pending = {name: w.pending for name, w in self.rt.workers.items()}
        return {
            "sessions": len(self.sessions),
            "resumable": len(self.resume) if self.resume is not None else 0,
            "loop_lag": self.lag.summary(),
            "queued": pending,
        }

    async def handle(self, ws: ServerConnection) -> None:
        connection = Connection(ws, self.rt, self.config, self.resume)
        self.sessions.add(connection)
        try:
            await connection.run()
        finally:
            self.sessions.discard(connection)


async def start_server(
    rt: Runtime, host: str, port: int, config: ServerConfig | None = None
) -> tuple[Server, App]:
    """Start listening; the caller closes the returned server (sessions get 1001)."""
    app = App(rt, config or ServerConfig())
    server = await serve(
        app.handle, host, port, process_request=app.route, max_size=MAX_FRAME_BYTES
    )
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
    on_ready(f"ws://{sock_host}:{sock_port}{p.PATH}")
    await stop.wait()
    log.info("shutting down: closing %d session(s)", len(app.sessions))
    server.close()  # every open session gets a close frame with 1001 (going away)
    await server.wait_closed()
    monitor.cancel()
