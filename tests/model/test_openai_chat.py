"""The openai-chat reply engine over real sockets: a scripted HTTP server in the test
(tests/chatserver.py) for the failures a real server rarely shows on demand, and its
real twin, llama.cpp's OpenAI-compatible server on the SmolLM2 GGUF, where it is built."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from model.chat import SPOKEN_SYSTEM_PROMPT
from model.confirm import template
from model.engine import ChatMessage, GenerationStats, ReplyEnd, ThreadedReplyEngine, drain
from model.openai_chat import (
    ChatServerError,
    ChatServerOptions,
    OpenAIChatGenerator,
    checked_call,
    endpoint,
    parse_chunk,
    request_body,
    sse_data,
    wire_names,
)
from model.tools import DEFAULT_TOOLS, Param, Tool, ToolCall, kept_reply, render_call
from tests.chatserver import (
    DONE,
    LLAMA_MODEL,
    TOOLS_CHAT_FORMAT,
    Answer,
    LlamaServer,
    ScriptedChatServer,
    call_chunk,
    chunk,
    closed_port,
    llama_python_or_skip,
    llama_server,
    usage,
)

ASK = [ChatMessage("user", "What is the capital of France?")]
PARIS = [chunk(None), chunk("Paris"), chunk(" is the capital."), chunk("", "stop")]


def never() -> bool:
    return False


def generator(url: str, **options: object) -> OpenAIChatGenerator:
    return OpenAIChatGenerator(ChatServerOptions(url, "test-model", **options))  # type: ignore[arg-type]


@pytest.fixture
def scripted(request: pytest.FixtureRequest) -> Iterator[ScriptedChatServer]:
    with ScriptedChatServer(request.param).running() as server:
        yield server


def answers(*answers: Answer) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("scripted", [answers], indirect=True, ids=[""])


# --- the wire format, no socket --------------------------------------------------------


def test_sse_events_join_data_lines_and_skip_comments() -> None:
    lines = [b": keep-alive\r\n", b"data: a\r\n", b"data:b\n", b"\n", b"event: x\n", b"\n"]
    assert list(sse_data([*lines, b"data: [DONE]\n"])) == ["a\nb", "[DONE]"]


def test_a_chunk_gives_its_text_finish_and_usage() -> None:
    assert parse_chunk(chunk("Hi", None)).text == "Hi"
    assert parse_chunk(chunk(None, "length")).finish_reason == "length"
    assert parse_chunk(usage(9)).completion_tokens == 9
    for bad in ("{", "[]", '{"choices": [{}]}', '{"object": "x"}'):
        with pytest.raises(ChatServerError):
            parse_chunk(bad)
    with pytest.raises(ChatServerError, match="mid-reply: overloaded"):
        parse_chunk('{"error": {"message": "overloaded"}}')


def test_the_url_is_the_api_base() -> None:
    assert endpoint("http://h:8000/v1/").path == "/v1/chat/completions"
    assert endpoint("https://api.example.com/v1").port == 443
    for bad in ("ftp://h/v1", "h:8000/v1", "http://h/v1?x=1"):
        with pytest.raises(ValueError, match="URL"):
            endpoint(bad)


# --- a scripted server ------------------------------------------------------------------


@answers(Answer(events=[*PARIS, usage(7), DONE]))
def test_a_reply_streams_piece_by_piece(scripted: ScriptedChatServer) -> None:
    gen = generator(scripted.url, api_key="sk-test")
    pieces, stats = drain(gen.generate(ASK, 48, never))
    assert pieces == ["Paris", " is the capital."]
    assert stats == GenerationStats(7, 2, "end")  # tokens from the server's usage
    (request,) = scripted.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == "Bearer sk-test"
    assert request.body["model"] == "test-model" and request.body["stream"] is True
    assert request.body["max_tokens"] == 48
    assert request.body["messages"] == [
        {"role": "system", "content": SPOKEN_SYSTEM_PROMPT},
        {"role": "user", "content": ASK[0].content},
    ]


@answers(Answer(events=[chunk("One"), chunk(" two", "length"), DONE]))
def test_a_reply_cut_by_the_budget_counts_its_pieces(scripted: ScriptedChatServer) -> None:
    instructions = ChatMessage("system", "Answer in French.")
    pieces, stats = drain(generator(scripted.url).generate([instructions, *ASK], 2, never))
    assert pieces == ["One", " two"] and stats == GenerationStats(2, 2, "budget")
    assert scripted.requests[0].body["messages"][0]["content"] == "Answer in French."
    assert "Authorization" not in scripted.requests[0].headers


def test_a_closed_port_is_a_refusal() -> None:
    gen = generator(f"http://127.0.0.1:{closed_port()}/v1")
    with pytest.raises(ChatServerError, match="refused the connection"):
        drain(gen.generate(ASK, 8, never))


@answers(Answer(silent=True))
def test_a_server_that_never_answers_times_out(scripted: ScriptedChatServer) -> None:
    gen = generator(scripted.url, first_token_timeout_s=0.3)
    with pytest.raises(ChatServerError, match=r"no reply from .* within 0\.3 s"):
        drain(gen.generate(ASK, 8, never))
    assert scripted.client_gone.wait(10)


@answers(Answer(events=[chunk("Still")], hold=True))
def test_a_stream_that_stalls_times_out(scripted: ScriptedChatServer) -> None:
    gen = generator(scripted.url, first_token_timeout_s=0.3)
    it = gen.generate(ASK, 8, never)
    assert next(it) == "Still"
    with pytest.raises(ChatServerError, match=r"went silent for 0\.3 s"):
        next(it)


@answers(
    Answer(401, body=json.dumps({"error": {"message": "Incorrect API key"}}).encode()),
    Answer(502, content_type="text/html", body=b"<h1>Bad Gateway</h1>"),
)
def test_a_refusal_says_the_status_and_the_server_s_message(scripted: ScriptedChatServer) -> None:
    gen = generator(scripted.url)
    with pytest.raises(ChatServerError, match="answered 401 Unauthorized: Incorrect API key"):
        drain(gen.generate(ASK, 8, never))
    with pytest.raises(ChatServerError, match="answered 502 Bad Gateway: <h1>Bad Gateway"):
        drain(gen.generate(ASK, 8, never))


@answers(
    Answer(content_type="application/json", body=b"{}"),
    Answer(events=[chunk("Half"), "{not json"]),
    Answer(events=[chunk("Half")]),  # the stream ends: no finish_reason, no [DONE]
    Answer(events=[chunk("Half"), json.dumps({"error": {"message": "GPU fell off"}})]),
)
def test_what_is_not_a_chat_stream_fails_clearly(scripted: ScriptedChatServer) -> None:
    gen = generator(scripted.url)
    for message in ("not an event stream", "not JSON", "ended the stream mid-reply", "GPU fell"):
        with pytest.raises(ChatServerError, match=message):
            drain(gen.generate(ASK, 8, never))


class Recording(OpenAIChatGenerator):
    """Keeps what its last reply returned."""

    stats: GenerationStats | None = None

    def generate(
        self,
        conversation: Sequence[ChatMessage],
        max_tokens: int,
        should_stop: Callable[[], bool],
        tools: Sequence[Tool] = (),
    ) -> Generator[str | ToolCall, None, GenerationStats]:
        self.stats = yield from super().generate(conversation, max_tokens, should_stop, tools)
        return self.stats


@answers(Answer(events=[chunk("Hello"), chunk(" there")], hold=True))
async def test_cancelling_mid_stream_closes_the_connection(scripted: ScriptedChatServer) -> None:
    """The server holds the stream open after two pieces; closing the reply stream sets
    the stop flag, the engine returns from its wait and hangs up (the server's cue to
    stop generating). Without the stop check in the read it would wait out the
    minute's timeout and fail instead."""
    gen = Recording(ChatServerOptions(scripted.url, "test-model", first_token_timeout_s=60))
    with ThreadPoolExecutor(1) as pool:
        stream = ThreadedReplyEngine(gen, pool).stream(ASK, 64)
        assert [await anext(stream), await anext(stream)] == ["Hello", " there"]
        await stream.aclose()  # what cancelling the turn does to its reply stream
    assert gen.stats == GenerationStats(2, 2, "cancel")
    assert scripted.client_gone.wait(10)


@answers(Answer(silent=True))
def test_a_stop_before_the_first_piece_returns_at_once(scripted: ScriptedChatServer) -> None:
    """Speculative replies are thrown away often: the stop flag must not wait for the
    server's first piece (here: never) or the first-token timeout (here: a minute)."""
    gen = generator(scripted.url, first_token_timeout_s=60)
    pieces, stats = drain(gen.generate(ASK, 8, scripted.requested.is_set))
    assert pieces == [] and stats.stopped_by == "cancel"
    assert scripted.client_gone.wait(10)


# --- tools ------------------------------------------------------------------------------

TIMER = next(t for t in DEFAULT_TOOLS if t.name == "timer.set")
TIMER_CALL = ToolCall("timer.set", {"seconds": 300})
SET_TIMER = [ChatMessage("user", "Set a timer for five minutes.")]
NOT_ACTED_ON = r"not acted on: timer\.set: seconds out of range"


def test_tool_names_map_to_openai_function_names_and_back() -> None:
    names = wire_names([TIMER, Tool("timer_set"), Tool("media-play")])
    assert list(names) == ["timer_set", "timer_set_2", "media-play"]
    assert [t.name for t in names.values()] == ["timer.set", "timer_set", "media-play"]


def test_tools_go_out_as_functions_and_an_acted_turn_as_tool_calls() -> None:
    acted = kept_reply(render_call(TIMER, {"seconds": 300}), "Timer set.")
    result = json.dumps({"name": "timer.set", "output": "started"})
    conversation = [
        *SET_TIMER,
        ChatMessage("assistant", acted),
        ChatMessage("user", "Thanks."),
        ChatMessage("tool", result),  # the result came after the next question
    ]
    options = ChatServerOptions("http://h/v1", "m", tool_choice="timer.set")
    body = json.loads(request_body(options, conversation, 16, [TIMER]))
    assert body["tools"] == [
        {"type": "function", "function": {**TIMER.schema(), "name": "timer_set"}}
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "timer_set"}}
    _, user, assistant, tool, thanks = body["messages"]
    assert user == {"role": "user", "content": "Set a timer for five minutes."}
    (call,) = assistant["tool_calls"]
    assert assistant["content"] == "Timer set."
    assert call["function"] == {"name": "timer_set", "arguments": '{"seconds": 300}'}
    assert tool == {"role": "tool", "tool_call_id": call["id"], "content": "started"}
    assert thanks == {"role": "user", "content": "Thanks."}
    # no tools, no tool fields; an unknown tool_choice is a clear error
    assert "tools" not in json.loads(request_body(options, SET_TIMER, 16))
    with pytest.raises(ChatServerError, match="none of the session's tools"):
        request_body(ChatServerOptions("http://h/v1", "m", tool_choice="x"), SET_TIMER, 16, [TIMER])


def test_a_call_is_checked_against_its_tool_s_schema() -> None:
    names = wire_names(DEFAULT_TOOLS)
    assert checked_call("timer_set", '{"seconds": 300}', names) == TIMER_CALL
    for name, args, why in [
        ("timer_set", '{"seconds": 0}', "seconds out of range"),
        ("timer_set", '{"seconds": "five"}', "seconds must be integer"),
        ("timer_set", "{}", "missing seconds"),
        ("timer_set", '{"seconds": 3', "not JSON"),
        ("timer_set", "[300]", "not an object"),
        ("timer.set", '{"seconds": 300}', "none of the session's tools"),
    ]:
        with pytest.raises(ChatServerError, match=why):
            checked_call(name, args, names)


def _acting(gen: OpenAIChatGenerator, tools: Sequence[Tool]) -> list[str | ToolCall]:
    """What a reply yields up to its end or its error (the error is raised)."""
    items: list[str | ToolCall] = []
    it = gen.generate(SET_TIMER, 32, never, tools)
    try:
        while True:
            items.append(next(it))
    except StopIteration:
        return items


STREAMED_CALL = [
    chunk(None),
    call_chunk(0, "timer_set", '{"sec'),
    call_chunk(0, None, 'onds": 3'),
    call_chunk(0, None, "00}", "tool_calls"),
    DONE,
]


@answers(Answer(events=STREAMED_CALL))
def test_a_streamed_call_is_assembled_and_acted_on(scripted: ScriptedChatServer) -> None:
    # the model said nothing beside its call: its plain confirmation is spoken
    assert _acting(generator(scripted.url), [TIMER]) == [TIMER_CALL, template(TIMER_CALL)]
    assert template(TIMER_CALL) == "Timer set for five minutes."
    assert scripted.requests[0].body["tool_choice"] == "auto"


SPOKEN_CALL = [chunk("Starting a five-minute timer."), *STREAMED_CALL[1:]]


@answers(Answer(events=SPOKEN_CALL))
def test_a_call_after_words_adds_no_confirmation_of_its_own(
    scripted: ScriptedChatServer,
) -> None:
    assert _acting(generator(scripted.url), [TIMER]) == [
        "Starting a five-minute timer.",
        TIMER_CALL,
    ]


INVALID_CALL = [call_chunk(0, "timer_set", '{"seconds": -5}', "tool_calls"), DONE]


@answers(Answer(events=INVALID_CALL))
def test_a_call_that_does_not_validate_is_not_acted_on(scripted: ScriptedChatServer) -> None:
    items: list[str | ToolCall] = []
    with pytest.raises(ChatServerError, match=NOT_ACTED_ON):
        items.extend(generator(scripted.url).generate(SET_TIMER, 32, never, [TIMER]))
    assert items == []


# --- llama.cpp's server: the real twin -----------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    python = llama_python_or_skip()
    from model.nn.gguf import find_smollm2_gguf

    server = llama_server(python, find_smollm2_gguf(), tmp_path_factory.mktemp("llama") / "log")
    yield server
    server.stop()


@pytest.mark.models
def test_llama_cpp_streams_a_reply(llama: LlamaServer) -> None:
    gen = OpenAIChatGenerator(ChatServerOptions(llama.url, LLAMA_MODEL))
    pieces, stats = drain(gen.generate(ASK, 32, never))
    assert len(pieces) > 1, pieces  # streamed, not one body
    # the server's first reply (tests/chatserver.py, LLAMA_SEED): SmolLM2 names Paris
    assert "Paris" in "".join(pieces), pieces
    assert stats.forward_passes == len(pieces)
    assert stats.stopped_by in ("end", "budget") and 0 < stats.tokens <= 32


@pytest.mark.models
async def test_llama_cpp_reply_is_cancelled_mid_stream(llama: LlamaServer) -> None:
    gen = OpenAIChatGenerator(ChatServerOptions(llama.url, LLAMA_MODEL))
    with ThreadPoolExecutor(1) as pool:
        stream = ThreadedReplyEngine(gen, pool).stream(ASK, 200)
        first = await anext(stream)
        assert isinstance(first, str)
        await stream.aclose()
        # the reply thread is free again: the next reply runs to its end
        items = [item async for item in ThreadedReplyEngine(gen, pool).stream(ASK, 8)]
    assert isinstance(items[-1], ReplyEnd) and items[-1].stats.stopped_by == "budget"


@pytest.mark.models
def test_llama_cpp_s_refusal_fails_clearly(llama: LlamaServer) -> None:
    wrong_path = OpenAIChatGenerator(ChatServerOptions(f"{llama.url}/nowhere", LLAMA_MODEL))
    with pytest.raises(ChatServerError, match=r"answered 404 Not Found: "):
        drain(wrong_path.generate(ASK, 8, never))


# --- llama.cpp's server with function calling ------------------------------------------


@pytest.fixture(scope="module")
def llama_tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    python = llama_python_or_skip()
    from model.nn.gguf import find_smollm2_gguf

    log = tmp_path_factory.mktemp("llama-tools") / "log"
    server = llama_server(python, find_smollm2_gguf(), log, chat_format=TOOLS_CHAT_FORMAT)
    yield server
    server.stop()


# the function-calling prompt lists every tool's schema: its prefill on a busy two-core
# machine can outlast the engine's default first-token wait
PREFILL_S = 180.0


def _forced(url: str, tool: str) -> OpenAIChatGenerator:
    """The named call forced: llama-cpp-python streams no call the model chose itself."""
    options = ChatServerOptions(url, LLAMA_MODEL, first_token_timeout_s=PREFILL_S)
    return OpenAIChatGenerator(replace(options, tool_choice=tool))


@pytest.mark.models
def test_llama_cpp_acts_through_its_function_calling(llama_tools: LlamaServer) -> None:
    items = _acting(_forced(llama_tools.url, "timer.set"), DEFAULT_TOOLS)
    calls = [i for i in items if isinstance(i, ToolCall)]
    assert len(calls) == 1 and calls[0].name == "timer.set", items
    assert isinstance(calls[0].arguments["seconds"], int), calls  # validated: >= 1


@pytest.mark.models
def test_llama_cpp_s_call_that_does_not_validate_is_not_acted_on(
    llama_tools: LlamaServer,
) -> None:
    """No integer fits a schema whose minimum is above its maximum; llama.cpp's grammar
    for the call keeps to the types but not the bounds, so the model writes one anyway
    and the engine must refuse it."""
    never_fits = Tool(
        "timer.set",
        "Start a countdown timer.",
        (Param("seconds", "integer", minimum=2, maximum=1),),
    )
    items: list[str | ToolCall] = []
    with pytest.raises(ChatServerError, match=NOT_ACTED_ON):
        for item in _forced(llama_tools.url, "timer.set").generate(
            SET_TIMER, 32, never, [never_fits]
        ):
            items.append(item)
    assert not any(isinstance(i, ToolCall) for i in items)


@pytest.mark.models
def test_llama_cpp_takes_an_acted_turn_and_its_result_back(llama_tools: LlamaServer) -> None:
    acted = kept_reply(render_call(TIMER, {"seconds": 300}), "")
    conversation = [
        *SET_TIMER,
        ChatMessage("assistant", acted),
        ChatMessage("tool", json.dumps({"name": "timer.set", "output": "started"})),
        ChatMessage("user", "Thanks!"),
    ]
    gen = _forced(llama_tools.url, "none")
    pieces, stats = drain(gen.generate(conversation, 16, never, DEFAULT_TOOLS))
    assert pieces and all(isinstance(p, str) for p in pieces), pieces
    assert stats.stopped_by in ("end", "budget")
