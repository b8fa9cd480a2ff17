"""``quicksilver serve --engine openai-chat`` against llama.cpp's OpenAI-compatible
server on the SmolLM2 GGUF: a text turn over /v1/voice, streamed from llama.cpp,
spoken by Piper, and one that acts through llama.cpp's function calling. Skipped with
the reason where llama-cpp-python is not built (a failure in CI)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from websockets.asyncio.client import ClientConnection, connect

from server import protocol as p
from tests.chatserver import (
    LLAMA_MODEL,
    TOOLS_CHAT_FORMAT,
    LlamaServer,
    llama_python_or_skip,
    llama_server,
)
from tests.serverproc import start_server

pytestmark = [pytest.mark.e2e, pytest.mark.models]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    python = llama_python_or_skip()
    from model.nn.gguf import find_smollm2_gguf

    server = llama_server(python, find_smollm2_gguf(), tmp_path_factory.mktemp("llama") / "log")
    yield server
    server.stop()


async def test_a_text_turn_is_answered_by_llama_cpp(
    llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    log = tmp_path_factory.mktemp("serve") / "server.log"
    args = ("--engine", "openai-chat", "--llm-url", llama.url, "--llm-model", LLAMA_MODEL)
    srv = start_server(log, *args, "--max-reply-tokens", "48")
    try:
        text = srv.log.read_text()
        assert f"reply engine openai-chat ({LLAMA_MODEL} at {llama.url})" in text
        assert "first sentence): off" in text  # llama.cpp's passes are not ours to pause
        async with connect(srv.url) as ws, asyncio.timeout(120):
            await ws.send(p.encode(p.Start(sample_rate=16000)))
            assert isinstance(p.decode_server(await ws.recv()), p.Ready)
            await ws.send(json.dumps({"type": "text", "text": "What is the capital of France?"}))
            sentences: list[str] = []
            audio = 0
            while True:
                frame = await ws.recv()
                if isinstance(frame, bytes):
                    audio += 1
                    continue
                message = p.decode_server(frame)
                assert not isinstance(message, p.Error), message
                if isinstance(message, p.ReplyText):
                    sentences.append(message.text)
                elif isinstance(message, p.ReplyDone):
                    break
        # llama.cpp's first reply (tests/chatserver.py, LLAMA_SEED) names Paris
        assert "Paris" in message.text and audio > 0, message.text
        assert " ".join(sentences).split() == message.text.split()
    finally:
        assert srv.stop() == 0


@pytest.fixture(scope="module")
def llama_tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    python = llama_python_or_skip()
    from model.nn.gguf import find_smollm2_gguf

    log = tmp_path_factory.mktemp("llama-tools") / "log"
    server = llama_server(python, find_smollm2_gguf(), log, chat_format=TOOLS_CHAT_FORMAT)
    yield server
    server.stop()


async def test_a_turn_acts_through_llama_cpp_s_function_calling(
    llama_tools: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The default tools go to llama.cpp as OpenAI tools; its streamed call (forced:
    llama-cpp-python streams no call the model chose itself) comes back as the v1
    ``action``, validated against timer.set's schema. A number the 135M model writes
    that the user did not say is not acted on (model.ask.unsaid): the reply asks "For
    how long?" and the answer makes the call."""
    log = tmp_path_factory.mktemp("serve-tools") / "server.log"
    args = ("--engine", "openai-chat", "--llm-url", llama_tools.url, "--llm-model", LLAMA_MODEL)
    # the prompt of twelve tool schemas takes a while to prefill on a busy CPU
    args += ("--llm-tool-choice", "timer.set", "--llm-first-token-timeout", "180")
    srv = start_server(log, *args, "--max-reply-tokens", "48")
    try:
        async with connect(srv.url) as ws, asyncio.timeout(300):
            await ws.send(p.encode(p.Start(sample_rate=16000)))
            assert isinstance(p.decode_server(await ws.recv()), p.Ready)
            actions, said = await _turn(ws, "Set a timer for five minutes.")
            if not actions:  # the model's seconds were not the five minutes said
                assert said and said[-1] == "For how long?", said
                actions, said = await _turn(ws, "Five minutes.")
        (action,) = actions
        assert (action.name, action.arguments) == ("timer.set", {"seconds": 300}), action
    finally:
        assert srv.stop() == 0


async def _turn(ws: ClientConnection, text: str) -> tuple[list[p.Action], list[str]]:
    """A typed turn: the actions and the reply's sentences, until the reply is done."""
    await ws.send(json.dumps({"type": "text", "text": text}))
    actions: list[p.Action] = []
    said: list[str] = []
    while True:
        frame = await ws.recv()
        if isinstance(frame, bytes):
            continue
        message = p.decode_server(frame)
        assert not isinstance(message, p.Error), message
        if isinstance(message, p.Action):
            actions.append(message)
        elif isinstance(message, p.ReplyText):
            said.append(message.text)
        elif isinstance(message, p.ReplyDone):
            return actions, said
