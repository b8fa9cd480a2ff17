"""A real ``redis-server`` on a free loopback port, in a temporary directory.

The fleet's tests (server/store.py, the balancer's failover) run against the Debian
package, never a mock; ``.ci/run`` installs it, and without it CI fails (``missing``).
Its append-only file is written on every command, so a server killed and started
again on the same port still holds what was written before (as a deployment's
Redis with persistence does).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.speech import missing


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RedisServer:
    """One redis-server; :meth:`kill` and :meth:`start` again keep its port and data."""

    binary: str
    directory: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.directory), "--save", "", "--daemonize", "no"]
        args += ["--appendonly", "yes", "--appendfsync", "always"]
        args += ["--logfile", str(self.directory / "redis.log")]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not start: see {self.directory}/redis.log")
            time.sleep(0.02)

    def answers(self) -> bool:
        """Whether it answers PING (a raw RESP exchange: no client library needed)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Gone at once, as a lost machine is (SIGKILL), or shut down (SIGTERM)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.proc = None


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        missing("redis-server is not installed (Debian: apt-get install redis-server)")
    return binary
