"""A protocol-v1 peer on loopback that sends what a test tells it to: ``action`` frames
while the reply model is not yet trained to call tools (the real server sends them in
the end-to-end tests). It speaks through the real codec (``server/protocol.py``) and
serves the demo page's files the way the real server does (``server.app.web_file``).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
from collections.abc import AsyncIterator
from typing import TypeVar

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from model.tools import DEFAULT_TOOLS
from server import protocol as p
from server.app import web_file

M = TypeVar("M", bound=p.ClientMessage)

_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


class ScriptedServer:
    """One client at a time: ``ready`` for its ``start``, then whatever :meth:`send`
    is given; every text frame the client sends is decoded into :attr:`received`."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[p.ClientMessage] = asyncio.Queue()
        self.audio_frames = 0
        self.ws: ServerConnection | None = None
        self.connected = asyncio.Event()
        self.url = self.http = ""

    async def send(self, *messages: p.ServerMessage) -> None:
        await self.connected.wait()
        assert self.ws is not None
        for message in messages:
            await self.ws.send(p.encode(message))

    async def next(self, kind: type[M], timeout_s: float = 60) -> M:
        """The next message of ``kind`` the client sent (others are skipped)."""
        async with asyncio.timeout(timeout_s):  # a client that never sends it fails the test
            while not isinstance(message := await self.received.get(), kind):
                pass
        return message

    def _route(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == p.PATH:
            return None
        file = web_file(path)
        if file is None:
            return connection.respond(http.HTTPStatus.NOT_FOUND, "not found\n")
        response = connection.respond(http.HTTPStatus.OK, file.read_text("utf-8"))
        del response.headers["Content-Type"]
        response.headers["Content-Type"] = _TYPES[file.suffix]
        return response

    async def _session(self, ws: ServerConnection) -> None:
        start = p.decode_client(await ws.recv())
        assert isinstance(start, p.Start), start
        self.received.put_nowait(start)
        default = [t.name for t in DEFAULT_TOOLS]
        tools = default if start.tools is None else [t["name"] for t in start.tools]
        ready = p.Ready(
            "scripted", start.sample_rate, start.output_sample_rate or 22050, tools=tools
        )
        await ws.send(p.encode(ready))
        self.ws = ws
        self.connected.set()
        with contextlib.suppress(ConnectionClosed):
            async for frame in ws:
                if isinstance(frame, bytes):
                    self.audio_frames += 1
                else:
                    self.received.put_nowait(p.decode_client(frame))


@contextlib.asynccontextmanager
async def scripted_server() -> AsyncIterator[ScriptedServer]:
    peer = ScriptedServer()
    async with serve(peer._session, "127.0.0.1", 0, process_request=peer._route) as server:
        host, port = next(iter(server.sockets)).getsockname()[:2]
        peer.http = f"http://{host}:{port}"
        peer.url = f"ws://{host}:{port}{p.PATH}"
        yield peer
