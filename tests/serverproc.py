"""A real Quicksilver server process on a free loopback port, for end-to-end tests.

The server runs as its own process (``python -m server.cli serve --port 0``) with the
default offline models, exactly as a user starts it; the tests talk to it with real
``websockets`` clients and real synthesized speech.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_URL = re.compile(r"listening on (ws://\S+)")


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    log: Path

    @property
    def http(self) -> str:
        return self.url.replace("ws://", "http://").rsplit("/v1/", 1)[0]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def start_server(log: Path, *args: str, timeout: float = 300) -> ServerProcess:
    """Start the server and wait for the line with its URL (models load first)."""
    cmd = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    err = log.open("w")
    proc = subprocess.Popen(
        [*cmd, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True
    )
    assert proc.stdout is not None
    found: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if (m := _URL.search(line)) and not found:
                found.append(m.group(1))
                done.set()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(timeout) or not found:
        proc.kill()
        raise RuntimeError(f"server did not start; its log:\n{log.read_text()[-4000:]}")
    return ServerProcess(proc, found[0], log)
