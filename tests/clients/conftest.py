"""Client tests: the real server (the end-to-end fixture) and a TCP proxy that can cut it.

The proxy stands for the network between a device and the server: ``drop()`` aborts
every connection through it at once (no close frame, like a car entering a tunnel),
and ``refuse`` makes it turn new connections away (the server is unreachable).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from tests.serverproc import ServerProcess
from tests.speech import missing

if TYPE_CHECKING:
    from playwright.async_api import Page

CHROMIUM = Path("/usr/bin/chromium")  # Debian's (.ci/run installs it)

__all__ = ["Proxy", "ServerProcess"]


class Proxy:
    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        assert parts.hostname is not None and parts.port is not None
        self.host, self.port, self.path = parts.hostname, parts.port, parts.path
        self.live: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.refuse = False
        self.accepted = 0
        self.drops = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}{self.path}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.transport.abort()
            return
        self.accepted += 1
        pair = (writer, up_writer)
        self.live.add(pair)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self.live.discard(pair)
            for w in pair:
                w.transport.abort()

    def drop(self) -> None:
        """Cut every connection now, both ways, without a close handshake."""
        self.drops += 1
        for pair in list(self.live):
            for w in pair:
                w.transport.abort()

    async def close(self) -> None:
        self.drop()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    dst.transport.abort()


@pytest.fixture
async def proxy(server: ServerProcess) -> AsyncIterator[Proxy]:
    px = Proxy(server.url)
    await px.start()
    yield px
    await px.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that asks for Chromium is marked ``browser`` (``-m "not browser"``)."""
    for item in items:
        if "chromium" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)


@pytest.fixture
def chromium() -> Path:
    """Debian's Chromium and playwright, for the page tests (skipped without them on a
    developer's machine, a failure in CI)."""
    if not CHROMIUM.exists():
        missing(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing("the playwright Python package is missing")
    return CHROMIUM


@contextlib.asynccontextmanager
async def browser_page(
    chromium: Path, args: list[str], **page_options: Any
) -> AsyncIterator[tuple[Page, list[str]]]:
    """A page in a Chromium started with ``args``, and the page errors it raises."""
    from playwright.async_api import async_playwright  # only where the page tests run

    errors: list[str] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(chromium), args=args)
        try:
            page = await browser.new_page(**page_options)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page, errors
        finally:
            await browser.close()
