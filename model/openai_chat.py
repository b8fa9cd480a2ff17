"""A reply engine that streams from an OpenAI-compatible chat-completions server.

For users who outgrow the 135M model: vLLM, SGLang, llama.cpp's server or a hosted API
answers ``POST {url}/chat/completions`` with ``"stream": true``, and this engine yields
the reply's text as the server-sent events bring it (the turn pipeline cuts sentences).
The session's conversation goes out with the spoken-answer system prompt in front
(:func:`model.chat.with_system_prompt`); the server applies its own chat template.

The standard library only: one HTTP/1.1 connection per reply, read by
:mod:`http.client` in the reply worker thread. Every read of the socket waits in steps
of :data:`POLL_S` and checks the stop flag between them, so a cancelled turn (barge-in,
a speculative reply thrown away) lets go within a step, not when the server's next
chunk or a timeout comes; closing the connection also tells the server to stop.
"""

from __future__ import annotations

import http.client
import io
import json
import math
import socket
import ssl
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from model.chat import SPOKEN_SYSTEM_PROMPT, with_system_prompt
from model.engine import ChatMessage, GenerationStats
from model.tools import Tool, ToolCall

POLL_S = 0.05  # how long one wait for bytes lasts before the stop flag is checked again
MAX_LINE = 1 << 20  # longest line of the event stream
MAX_ERROR_BODY = 4096  # bytes of a refusal's body read for its message


class ChatServerError(RuntimeError):
    """The chat server is unreachable, refused the request, timed out, or answered
    something that is not a chat-completions stream. The turn fails with this message."""


@dataclass(frozen=True)
class ChatServerOptions:
    url: str  # the API's base, to which "/chat/completions" is added: http://HOST:PORT/v1
    model: str  # the server's name for the model ("model" of the request)
    api_key: str | None = None  # sent as "Authorization: Bearer KEY"
    connect_timeout_s: float = 5.0
    # the longest wait for the first piece of a reply, and for each next one
    first_token_timeout_s: float = 15.0
    system_prompt: str = SPOKEN_SYSTEM_PROMPT


@dataclass(frozen=True)
class _Endpoint:
    https: bool
    host: str
    port: int
    path: str  # of the chat-completions resource


def endpoint(url: str) -> _Endpoint:
    """Where ``POST {url}/chat/completions`` goes; ValueError for a URL that is not
    http(s)://HOST[:PORT][/PATH] (a query or fragment has no place in a base URL)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the chat server URL must be http(s)://HOST[:PORT]/PATH, not {url!r}")
    if parts.query or parts.fragment or parts.username:
        raise ValueError(f"the chat server URL {url!r} has a query, fragment or user name")
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    return _Endpoint(https, parts.hostname, port, parts.path.rstrip("/") + "/chat/completions")


def request_body(
    options: ChatServerOptions, conversation: Sequence[ChatMessage], max_tokens: int
) -> bytes:
    messages = with_system_prompt(conversation, options.system_prompt)
    body = {
        "model": options.model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "max_tokens": max_tokens,
        "stream": True,
        # the last chunk then carries the reply's token count (usage.completion_tokens)
        "stream_options": {"include_usage": True},
    }
    return json.dumps(body).encode()


@dataclass(frozen=True)
class Delta:
    """What one ``chat.completion.chunk`` adds to the reply."""

    text: str
    finish_reason: str | None
    completion_tokens: int | None  # the usage chunk's


def parse_chunk(data: str) -> Delta:
    """One event's data as a chunk; ChatServerError when it is not one (an ``error``
    object is how OpenAI-compatible servers report a failure after the 200)."""
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        raise ChatServerError(
            f"the chat server sent an event that is not JSON: {data[:200]!r}"
        ) from None
    if not isinstance(chunk, dict):
        raise ChatServerError(
            f"the chat server sent an event that is not an object: {data[:200]!r}"
        )
    if "error" in chunk:
        raise ChatServerError(f"the chat server failed mid-reply: {_error_message(chunk)}")
    choices, usage = chunk.get("choices"), chunk.get("usage")
    if not isinstance(choices, list):
        raise ChatServerError(f"the chat server sent a chunk without choices: {data[:200]!r}")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    tokens = tokens if isinstance(tokens, int) else None
    if not choices:  # the usage chunk
        return Delta("", None, tokens)
    choice = choices[0]
    delta = choice.get("delta") if isinstance(choice, dict) else None
    if not isinstance(delta, dict):
        raise ChatServerError(f"the chat server sent a choice without a delta: {data[:200]!r}")
    text = delta.get("content") or ""
    finish = choice.get("finish_reason")
    if not isinstance(text, str) or not (finish is None or isinstance(finish, str)):
        raise ChatServerError(f"the chat server sent a malformed delta: {data[:200]!r}")
    return Delta(text, finish, tokens)


def sse_data(lines: Iterable[bytes]) -> Iterator[str]:
    """The data of each server-sent event (WHATWG HTML, "Server-sent events"): lines
    of ``field: value``, an event ends at a blank line, its data lines joined by
    newlines; comments (a line starting with ":") and other fields carry nothing here."""
    data: list[str] = []
    for raw in lines:
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise ChatServerError("the chat server's event stream is not UTF-8") from None
        if not line:
            if data:
                yield "\n".join(data)
            data = []
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value.removeprefix(" "))
    if data:
        yield "\n".join(data)


class _Stopped(Exception):
    """``should_stop()`` became true while a read waited for the server."""


class _PollingReader(io.RawIOBase):
    """The connection's socket as a raw stream whose reads wait in steps of
    :data:`POLL_S`, between which they give up when ``should_stop()`` says so
    (:class:`_Stopped`) or the deadline has passed (ChatServerError ``timeout``)."""

    def __init__(self, sock: socket.socket, should_stop: Callable[[], bool]) -> None:
        super().__init__()
        self._sock = sock
        self._should_stop = should_stop
        self.deadline = math.inf
        self.timeout = "the chat server timed out"
        # recv_into may time out and be called again (a plain or a TLS socket alike)
        sock.settimeout(POLL_S)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            try:
                return self._sock.recv_into(buffer)
            except TimeoutError:
                if self._should_stop():
                    raise _Stopped from None
                if time.monotonic() > self.deadline:
                    raise ChatServerError(self.timeout) from None

    def expect(self, within_s: float, timeout: str) -> None:
        """The next bytes must come within ``within_s``, or reads fail with ``timeout``."""
        self.deadline = time.monotonic() + within_s
        self.timeout = timeout


class _ReaderSocket:
    """What :class:`http.client.HTTPResponse` reads a response from: its ``makefile``."""

    def __init__(self, reader: _PollingReader) -> None:
        self._reader = reader

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self._reader)


class OpenAIChatGenerator:
    """A :class:`model.engine.TextGenerator` that asks a chat-completions server.

    It holds only its options; each reply has its own connection, so calls from
    several threads share nothing."""

    name = "openai-chat"
    # the remote model's own function calling is not wired to the session's tools yet
    supports_tools = False

    def __init__(self, options: ChatServerOptions) -> None:
        self.options = options
        self._endpoint = endpoint(options.url)  # a bad URL fails at start, not per turn

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Tool] = (),
    ) -> Generator[str | ToolCall, None, GenerationStats]:
        conn = self._connect()
        try:
            return (yield from self._exchange(conn, conversation, max_tokens, should_stop))
        except _Stopped:
            return GenerationStats(0, 0, "cancel")
        except (OSError, http.client.HTTPException) as exc:
            raise ChatServerError(f"the chat server at {self.options.url} failed: {exc!r}") from exc
        finally:
            conn.close()  # a reply cut short: the server sees the connection go and stops

    def _connect(self) -> http.client.HTTPConnection:
        ep, url, timeout_s = self._endpoint, self.options.url, self.options.connect_timeout_s
        conn: http.client.HTTPConnection
        if ep.https:
            context = ssl.create_default_context()
            conn = http.client.HTTPSConnection(ep.host, ep.port, timeout=timeout_s, context=context)
        else:
            conn = http.client.HTTPConnection(ep.host, ep.port, timeout=timeout_s)
        try:
            conn.connect()
        except TimeoutError:
            raise ChatServerError(
                f"no connection to the chat server at {url} within {timeout_s:g} s"
            ) from None
        except ConnectionRefusedError:
            raise ChatServerError(
                f"the chat server at {url} refused the connection (is it running?)"
            ) from None
        except OSError as exc:
            raise ChatServerError(f"cannot connect to the chat server at {url}: {exc}") from None
        return conn

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
    ) -> Generator[str, None, GenerationStats]:
        opts = self.options
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if opts.api_key:
            headers["Authorization"] = f"Bearer {opts.api_key}"
        conn.request(
            "POST", self._endpoint.path, request_body(opts, conversation, max_tokens), headers
        )
        assert conn.sock is not None
        reader = _PollingReader(conn.sock, should_stop)
        wait_s = opts.first_token_timeout_s
        reader.expect(wait_s, f"no reply from the chat server at {opts.url} within {wait_s:g} s")
        response = http.client.HTTPResponse(
            cast(socket.socket, _ReaderSocket(reader)), method="POST"
        )
        try:
            response.begin()
            self._check(response)
            return (yield from self._pieces(response, reader, should_stop))
        finally:
            response.close()

    def _check(self, response: http.client.HTTPResponse) -> None:
        """ChatServerError unless the server answered 200 with an event stream."""
        url = self.options.url
        if response.status != 200:
            detail = _refusal(response.read(MAX_ERROR_BODY))
            raise ChatServerError(
                f"the chat server at {url} answered {response.status} {response.reason}: {detail}"
            )
        kind = response.getheader("Content-Type", "")
        if not kind.startswith("text/event-stream"):
            raise ChatServerError(
                f"the chat server at {url} answered {kind or 'no Content-Type'}, not an event "
                "stream (does it stream chat completions?)"
            )

    def _pieces(
        self,
        response: http.client.HTTPResponse,
        reader: _PollingReader,
        should_stop: Callable[[], bool],
    ) -> Generator[str, None, GenerationStats]:
        url, wait_s = self.options.url, self.options.first_token_timeout_s
        pieces = 0
        tokens: int | None = None  # the server's count, when it sends usage
        finish: str | None = None
        try:
            for data in sse_data(_lines(response)):
                if data == "[DONE]" or should_stop():
                    break
                delta = parse_chunk(data)
                tokens = delta.completion_tokens if delta.completion_tokens is not None else tokens
                finish = delta.finish_reason or finish
                if delta.text:
                    pieces += 1
                    reader.expect(wait_s, f"the chat server at {url} went silent for {wait_s:g} s")
                    yield delta.text
            else:
                if finish is None:
                    raise ChatServerError(f"the chat server at {url} ended the stream mid-reply")
        except _Stopped:  # a read gave up waiting
            pass
        if should_stop():
            return GenerationStats(pieces, pieces, "cancel")
        count = tokens if tokens is not None else pieces
        return GenerationStats(count, pieces, "budget" if finish == "length" else "end")


def _lines(response: http.client.HTTPResponse) -> Iterator[bytes]:
    while line := response.readline(MAX_LINE):
        if len(line) == MAX_LINE and not line.endswith(b"\n"):
            raise ChatServerError(f"the chat server sent a line longer than {MAX_LINE} bytes")
        yield line


def _error_message(body: object) -> str:
    """``error.message`` of an OpenAI-style error object, else the body itself."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return str(message) if message else json.dumps(body)[:300]


def _refusal(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        return _error_message(json.loads(text))
    except json.JSONDecodeError:
        return text[:300] or "(no body)"
