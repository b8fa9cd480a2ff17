"""A real Quicksilver server process on a free loopback port, for end-to-end tests.

The server runs as its own process (``python -m cli serve --port 0``) with the
default offline models, exactly as a user starts it; the tests talk to it with real
``websockets`` clients and real synthesized speech.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    from server import protocol as p

ROOT = Path(__file__).resolve().parents[1]
_URL = re.compile(r"listening on (ws://\S+)")


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    log: Path
    reader: threading.Thread  # reads stdout to its end, then closes it

    @property
    def http(self) -> str:
        return self.url.replace("ws://", "http://").rsplit("/v1/", 1)[0]

    def stats(self) -> dict[str, Any]:
        """``GET /stats``: sessions, resumable conversations, event-loop lag, queues."""
        with urllib.request.urlopen(f"{self.http}/stats", timeout=10) as response:
            stats: dict[str, Any] = json.loads(response.read())
        return stats

    async def idle_stats(self, timeout_s: float = 30) -> dict[str, Any]:
        """``/stats`` once the server has seen every connection close. It notices a
        moment after the client; from outside the process there is no event to wait
        on, so this polls until the condition holds."""
        async with asyncio.timeout(timeout_s):
            while (stats := await asyncio.to_thread(self.stats))["sessions"] != 0:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        return stats

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.reader.join(timeout)
        return rc


def start_server(log: Path, *args: str, timeout: float = 600) -> ServerProcess:
    """Start the server and wait for the line with its URL (models load first; in an
    empty ``--cache-dir`` the reply model is built first, a minute or more)."""
    cmd = [sys.executable, "-m", "cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("w") as err:  # the child writes its own copy of the descriptor
        proc = subprocess.Popen(
            [*cmd, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True
        )
    assert proc.stdout is not None
    found: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                if (m := _URL.search(line)) and not found:
                    found.append(m.group(1))
                    done.set()
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not done.wait(timeout) or not found:
        proc.kill()
        proc.wait()
        reader.join()
        raise RuntimeError(f"server did not start; its log:\n{log.read_text()[-4000:]}")
    return ServerProcess(proc, found[0], log, reader)


async def next_event(ws: ClientConnection, timeout_s: float = 60) -> p.ServerMessage:
    """The server's next JSON event, skipping reply audio frames."""
    from server import protocol as p

    async with asyncio.timeout(timeout_s):
        while isinstance(frame := await ws.recv(), bytes):
            pass
    return p.decode_server(frame)
