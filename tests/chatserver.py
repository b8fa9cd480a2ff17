"""OpenAI-compatible chat-completions servers for the openai-chat engine's tests.

:class:`ScriptedChatServer` is a small real HTTP/1.1 server (``http.server`` in a
thread) whose answers a test writes: a stream of events, a refusal, silence, a stream
that stops and waits. Its real twin is llama.cpp's server (``llama_cpp.server`` on the
SmolLM2 GGUF), which :func:`llama_server` starts where llama-cpp-python is built; both
run in tests/model/test_openai_chat.py, and llama.cpp's in tests/e2e too.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.llamacpp import LLAMA_PYTHON_ENV, llama_cpp_python

DONE = "[DONE]"
# a Python with llama-cpp-python and its server extras (docs/realtime.md says how to build
# one: it compiles llama.cpp)
LLAMA_MODEL = "smollm2"  # the --model_alias the server answers to
# llama.cpp's server samples (temperature 0.8 unless asked otherwise, and the engine does
# not ask) with a seed each request draws from the one before: from a fixed first seed
# (its default, written out) a module's requests get the same replies on every run. The
# first one asked "What is the capital of France?" names Paris; 12 in 20 later ones do.
LLAMA_SEED = 0xFFFF_FFFF


def call_chunk(index: int, name: str | None, arguments: str, finish: str | None = None) -> str:
    """A chunk adding a piece of a streamed tool call (its id and name with the first)."""
    function = {"arguments": arguments} | ({"name": name} if name else {})
    call = {"index": index, "type": "function", "function": function}
    call |= {"id": f"call_{index}"} if name else {}
    choice = {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": finish}
    return json.dumps({"object": "chat.completion.chunk", "choices": [choice]})


def chunk(text: str | None, finish: str | None = None) -> str:
    """A ``chat.completion.chunk`` adding ``text`` (None: a delta without content)."""
    delta = {"role": "assistant"} if text is None else {"content": text}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return json.dumps({"object": "chat.completion.chunk", "choices": [choice]})


def usage(completion_tokens: int) -> str:
    """The last chunk of a stream asked for with ``include_usage``."""
    counts = {"prompt_tokens": 30, "completion_tokens": completion_tokens}
    return json.dumps({"object": "chat.completion.chunk", "choices": [], "usage": counts})


@dataclass(frozen=True)
class Answer:
    """One scripted answer: ``status`` with ``body``, or (``events``) an event stream of
    one chunk per event. ``silent``: read the request and answer nothing; ``hold``:
    after the events, keep the stream open. Either waits until the client goes."""

    status: int = 200
    events: Sequence[str] = ()
    content_type: str = "text/event-stream"
    body: bytes = b""
    silent: bool = False
    hold: bool = False


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ScriptedChatServer:
    """Answers the n-th request with ``answers[n]`` (the last one again after them)."""

    answers: Sequence[Answer]
    requests: list[Request] = field(default_factory=list)
    requested: threading.Event = field(default_factory=threading.Event)
    client_gone: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    @contextlib.contextmanager
    def running(self) -> Iterator[ScriptedChatServer]:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        httpd.daemon_threads = True
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        self.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        try:
            yield self
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join()

    def next_answer(self, request: Request) -> Answer:
        self.requests.append(request)
        self.requested.set()
        return self.answers[min(len(self.requests), len(self.answers)) - 1]


def _handler(server: ScriptedChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked streams, as vLLM's and llama.cpp's

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            answer = server.next_answer(Request(self.path, dict(self.headers), body))
            if answer.silent:
                return self._wait_until_gone()
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            if not answer.events:
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)
                return None
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for data in answer.events:
                self._chunk(f"data: {data}\n\n".encode())
            if answer.hold:
                return self._wait_until_gone()
            self._chunk(b"")  # the last chunk
            return None

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _wait_until_gone(self) -> None:
            """The client sends nothing more: the read ends when it closes."""
            self.wfile.flush()
            with contextlib.suppress(OSError):
                self.rfile.read(1)
            server.client_gone.set()
            self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

    return Handler


def closed_port() -> int:
    """A loopback port nothing listens on (it was bound a moment ago, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def llama_python_or_skip() -> str:
    """A Python with llama-cpp-python (.ci/run builds one); a skip without, a failure in CI."""
    from tests.speech import missing

    if (python := llama_cpp_python()) is None:
        missing(
            f"llama-cpp-python is not built: set ${LLAMA_PYTHON_ENV} to a Python that has "
            "llama-cpp-python[server] (docs/realtime.md, 'A bigger reply model')"
        )
    return python


@dataclass
class LlamaServer:
    proc: subprocess.Popen[bytes]
    url: str  # http://127.0.0.1:PORT/v1
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# llama-cpp-python's chat format that takes OpenAI ``tools`` and writes ``tool_calls``
TOOLS_CHAT_FORMAT = "chatml-function-calling"


def llama_server(
    python: str, gguf: Path, log: Path, timeout_s: float = 300, chat_format: str | None = None
) -> LlamaServer:
    """llama.cpp's OpenAI-compatible server on ``gguf``, on a free loopback port, once
    it answers ``GET /v1/models``; RuntimeError (with its log) when it does not start.
    ``chat_format``: the server's (None: the GGUF's own chat template)."""
    port = closed_port()
    cmd = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", LLAMA_MODEL]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--n_threads", "2", "--n_ctx", "2048"]
    cmd += ["--seed", str(LLAMA_SEED)]
    cmd += ["--chat_format", chat_format] if chat_format else []
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    server = LlamaServer(proc, f"http://127.0.0.1:{port}/v1", log)
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        # a process outside this one: nothing to wait on but its answer, so poll
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{server.url}/models", timeout=5),
        ):
            return server
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"llama.cpp's server did not start; its log:\n{log.read_text()[-4000:]}")
