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

The session's tools go out as OpenAI ``tools`` (a name's dots become underscores: OpenAI
function names are ``[a-zA-Z0-9_-]``), and a streamed ``tool_calls`` is assembled from
its pieces, mapped back to the tool and checked against its schema
(:func:`model.tools.validate`) before the session hears of it: a call that does not
validate fails the turn and is never acted on. A turn that acted goes back to the server
as an assistant message with ``tool_calls`` and a ``tool`` message with its result.
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
from dataclasses import dataclass, replace
from typing import Any, cast
from urllib.parse import urlsplit

from model.chat import SPOKEN_SYSTEM_PROMPT, with_system_prompt
from model.confirm import template
from model.engine import ChatMessage, GenerationStats
from model.tools import Tool, ToolCall, ToolError, split_call, validate

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
    # OpenAI's tool_choice: "auto" (the model decides), "required", "none", or one of
    # the session's tool names, which forces that call (llama-cpp-python's server streams
    # calls only so: it refuses "auto" with "stream")
    tool_choice: str = "auto"


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
    options: ChatServerOptions,
    conversation: Sequence[ChatMessage],
    max_tokens: int,
    tools: Sequence[Tool] = (),
) -> bytes:
    messages = with_system_prompt(conversation, options.system_prompt)
    names = wire_names(tools)
    body: dict[str, Any] = {
        "model": options.model,
        "messages": wire_messages(messages, names),
        "max_tokens": max_tokens,
        "stream": True,
        # the last chunk then carries the reply's token count (usage.completion_tokens)
        "stream_options": {"include_usage": True},
    }
    if tools:
        body["tools"] = [
            # ``confirm`` is this server's own: the chat server asks nobody
            {"type": "function", "function": {**replace(t, confirm=False).schema(), "name": wire}}
            for wire, t in names.items()
        ]
        body["tool_choice"] = _tool_choice(options.tool_choice, names)
    return json.dumps(body).encode()


def wire_names(tools: Sequence[Tool]) -> dict[str, Tool]:
    """Each tool by its OpenAI function name: dots become underscores (``timer.set``:
    ``timer_set``); a name that two tools would share takes a number (``_2``)."""
    names: dict[str, Tool] = {}
    for tool in tools:
        wire, n = tool.name.replace(".", "_"), 2
        while wire in names:
            wire, n = f"{tool.name.replace('.', '_')}_{n}", n + 1
        names[wire] = tool
    return names


def _wire_name(name: str, names: dict[str, Tool]) -> str:
    return next((w for w, t in names.items() if t.name == name), name.replace(".", "_"))


def _tool_choice(choice: str, names: dict[str, Tool]) -> str | dict[str, Any]:
    if choice in ("auto", "required", "none"):
        return choice
    if not any(t.name == choice for t in names.values()):
        raise ChatServerError(f"tool_choice {choice!r} is none of the session's tools")
    return {"type": "function", "function": {"name": _wire_name(choice, names)}}


def wire_messages(messages: Sequence[ChatMessage], names: dict[str, Tool]) -> list[dict[str, Any]]:
    """The conversation as chat-completions messages. A reply that acted (the session
    keeps it as the call's text, then the words: :func:`model.tools.kept_reply`) is an
    assistant message with ``tool_calls``, followed at once by the ``tool`` message of its
    result (the session's ``{"name", "output"}``), as OpenAI requires: a result that
    came later moves up to it, and a call whose result never came gets an empty one."""
    out: list[dict[str, Any]] = []
    pending = list(messages)
    while pending:
        m = pending.pop(0)
        call, words = split_call(m.content) if m.role == "assistant" else (None, "")
        if call is None:
            if m.role != "tool":
                out.append({"role": m.role, "content": m.content})
            else:  # a result with no call before it: OpenAI takes no such tool message
                name, output = _result(m) or ("a tool", m.content)
                out.append({"role": "user", "content": f"Result of {name}: {output}"})
            continue
        call_id = f"call_{len(out)}"
        function = {"name": _wire_name(call.name, names), "arguments": json.dumps(call.arguments)}
        tool_call = {"id": call_id, "type": "function", "function": function}
        # "" rather than null for a call without words: llama-cpp-python takes only a string
        out.append({"role": "assistant", "content": words, "tool_calls": [tool_call]})
        found = next((r for r in pending if r.role == "tool" and _is_result_of(r, call)), None)
        if found is not None:
            pending.remove(found)
        result = _result(found) if found is not None else None
        output = result[1] if result is not None else ""
        out.append({"role": "tool", "tool_call_id": call_id, "content": output})
    return out


def _is_result_of(message: ChatMessage, call: ToolCall) -> bool:
    result = _result(message)
    return result is not None and result[0] == call.name


def _result(message: ChatMessage) -> tuple[str, str] | None:
    """A ``tool`` message's tool name and output (the session writes them as JSON)."""
    try:
        body = json.loads(message.content)
    except json.JSONDecodeError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return None
    output = body.get("output", "")
    return body["name"], output if isinstance(output, str) else json.dumps(output)


@dataclass(frozen=True)
class CallPiece:
    """What one chunk adds to a streamed tool call: its ``index`` in the reply, and its
    id, function name and a piece of its arguments' JSON text where the chunk has them."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True)
class Delta:
    """What one ``chat.completion.chunk`` adds to the reply."""

    text: str
    finish_reason: str | None
    completion_tokens: int | None  # the usage chunk's
    calls: tuple[CallPiece, ...] = ()


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
    return Delta(text, finish, tokens, _call_pieces(delta.get("tool_calls"), data))


def _call_pieces(raw: object, data: str) -> tuple[CallPiece, ...]:
    if raw is None:
        return ()
    malformed = ChatServerError(f"the chat server sent malformed tool_calls: {data[:200]!r}")
    if not isinstance(raw, list):
        raise malformed
    pieces = []
    for item in raw:
        function = item.get("function") if isinstance(item, dict) else None
        function = {} if function is None else function
        if not isinstance(item, dict) or not isinstance(function, dict):
            raise malformed
        index, call_id = item.get("index", 0), item.get("id")
        name, args = function.get("name"), function.get("arguments") or ""
        if not isinstance(index, int) or not isinstance(args, str):
            raise malformed
        if not all(x is None or isinstance(x, str) for x in (call_id, name)):
            raise malformed
        pieces.append(CallPiece(index, call_id, name, args))
    return tuple(pieces)


@dataclass
class _Call:
    name: str = ""
    arguments: str = ""


def assemble(pieces: Iterable[CallPiece]) -> dict[int, _Call]:
    """The calls the pieces make, by index: a name is given whole (some servers repeat
    it in every piece), the arguments' text is written piece by piece."""
    calls: dict[int, _Call] = {}
    for piece in pieces:
        call = calls.setdefault(piece.index, _Call())
        call.name = piece.name or call.name
        call.arguments += piece.arguments
    return calls


def checked_call(name: str, arguments: str, names: dict[str, Tool]) -> ToolCall:
    """The session's call of the model's ``name(arguments)``; ChatServerError (the call
    is not acted on) for a function that is none of the tools, arguments that are not a
    JSON object, or ones that do not fit the tool's schema."""
    tool = names.get(name)
    if tool is None:
        raise ChatServerError(f"the model called {name!r}, which is none of the session's tools")
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        raise ChatServerError(
            f"the model's call of {tool.name} has arguments that are not JSON: {arguments[:200]!r}"
        ) from None
    if not isinstance(args, dict):
        raise ChatServerError(
            f"the model's call of {tool.name} has arguments that are not an object"
        )
    try:
        validate(tool, args)
    except ToolError as exc:
        raise ChatServerError(f"the model's call was not acted on: {exc}") from None
    return ToolCall(tool.name, args)


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
    supports_tools = True  # through the server's function calling

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
            return (yield from self._exchange(conn, conversation, max_tokens, should_stop, tools))
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
        tools: Sequence[Tool],
    ) -> Generator[str | ToolCall, None, GenerationStats]:
        opts = self.options
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if opts.api_key:
            headers["Authorization"] = f"Bearer {opts.api_key}"
        body = request_body(opts, conversation, max_tokens, tools)
        conn.request("POST", self._endpoint.path, body, headers)
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
            return (yield from self._pieces(response, reader, should_stop, wire_names(tools)))
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
        names: dict[str, Tool],
    ) -> Generator[str | ToolCall, None, GenerationStats]:
        """The reply's text as it comes; a call it makes once the stream is whole (its
        arguments come in pieces), after any text, and the call's plain confirmation
        (``model.confirm.template``) when the model said nothing."""
        url, wait_s = self.options.url, self.options.first_token_timeout_s
        pieces = 0
        calls: list[CallPiece] = []
        tokens: int | None = None  # the server's count, when it sends usage
        finish: str | None = None
        try:
            for data in sse_data(_lines(response)):
                if data == "[DONE]" or should_stop():
                    break
                delta = parse_chunk(data)
                tokens = delta.completion_tokens if delta.completion_tokens is not None else tokens
                finish = delta.finish_reason or finish
                calls += delta.calls
                if delta.text or delta.calls:
                    reader.expect(wait_s, f"the chat server at {url} went silent for {wait_s:g} s")
                if delta.text:
                    pieces += 1
                    yield delta.text
            else:
                if finish is None:
                    raise ChatServerError(f"the chat server at {url} ended the stream mid-reply")
        except _Stopped:  # a read gave up waiting
            pass
        if should_stop():
            return GenerationStats(pieces, pieces, "cancel")
        if calls:  # the session acts on one call a reply: the first
            by_index = assemble(calls)
            first = by_index[min(by_index)]
            call = checked_call(first.name, first.arguments, names)
            yield call
            if not pieces:  # a call made in silence leaves the user guessing
                yield template(call)
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
